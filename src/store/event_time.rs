//! A timeline entry's event time as stored: as its distance from its
//! operation's request time when the operation has a request, else whole.
//!
//! An event time is milliseconds since the epoch, six bytes as a
//! variable-length integer; an operation's events come within seconds or
//! minutes of its request, one to three bytes from it. The request time is
//! the state's (`RequestInfo::requested_at`), set by the first request
//! applied and never changed (as format 8 relies on for the request's
//! fields), so an entry written against it reads back against the same
//! time for as long as the operation is stored. An entry written before
//! the operation had a request (an event that came first) keeps its time
//! whole.

use serde::{Deserialize, Serialize, Serializer};

use crate::core::OperationState;

/// The name serde gives the stored enum (postcard writes only the variant's
/// number: 0 whole, 1 from the request).
const NAME: &str = "StoredTime";

/// An entry's event time `at` as written for operation `op` (as it is
/// after the entry's record).
pub(super) struct TimeRef<'a> {
    pub at: i64,
    pub op: &'a OperationState,
}

impl Serialize for TimeRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.op.request.as_ref().and_then(|r| self.at.checked_sub(r.requested_at)) {
            Some(since) => s.serialize_newtype_variant(NAME, 1, "SinceRequest", &since),
            None => s.serialize_newtype_variant(NAME, 0, "At", &self.at),
        }
    }
}

/// [`TimeRef`] read back.
#[derive(Debug, Deserialize)]
#[serde(rename = "StoredTime")]
pub(super) enum StoredTime {
    At(i64),
    SinceRequest(i64),
}

impl StoredTime {
    /// The event time, for the operation whose state is `op`; `None` when
    /// it is written from a request `op` does not have (a damaged store).
    pub fn resolved(self, op: &OperationState) -> Option<i64> {
        match self {
            StoredTime::At(at) => Some(at),
            StoredTime::SinceRequest(since) => op.request.as_ref()?.requested_at.checked_add(since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operation::RequestInfo;
    use crate::core::Event;

    fn op(requested_at: Option<i64>) -> OperationState {
        let mut op = OperationState::new(&Event::deadline_reached("op-1", "e-1", "sync", 0));
        op.request = requested_at.map(|requested_at| RequestInfo {
            requested_at,
            expected_version: None,
            expected_fingerprint: None,
            idempotency_key: None,
            idempotent: false,
            destination: "d".into(),
            confirm_within_ms: 1,
            max_attempts: 1,
        });
        op
    }

    fn round_trip(at: i64, written: &OperationState, read: &OperationState) -> (usize, Option<i64>) {
        let bytes = postcard::to_allocvec(&TimeRef { at, op: written }).unwrap();
        (bytes.len(), postcard::from_bytes::<StoredTime>(&bytes).unwrap().resolved(read))
    }

    #[test]
    fn an_event_time_reads_back_from_its_request_or_whole() {
        let t = 1_796_560_000_000;
        let requested = op(Some(t));
        // Seconds after the request (or before it: an event that came
        // late), in few bytes.
        assert_eq!(round_trip(t + 1_500, &requested, &requested), (3, Some(t + 1_500)));
        assert_eq!(round_trip(t - 20, &requested, &requested), (2, Some(t - 20)));
        // Written before the operation had a request: whole, and read back
        // whole once it has one.
        let (len, back) = round_trip(t - 5, &op(None), &requested);
        assert_eq!((len, back), (7, Some(t - 5)));
        // Distances that do not fit are written whole.
        assert_eq!(round_trip(i64::MIN, &op(Some(i64::MAX)), &op(Some(i64::MAX))).1, Some(i64::MIN));
        // From a request the state does not have: refused.
        assert_eq!(round_trip(t + 1, &requested, &op(None)).1, None);
    }
}
