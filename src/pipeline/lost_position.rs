//! A stored position outside the input's log.
//!
//! Each partition starts where its state says it got to (see [`super::restore`]).
//! That position means something only while the log it counts in is the
//! same log: a topic deleted and created again (a development stack
//! restarted without its broker's volume, a topic rebuilt by hand), a log
//! truncated by an unclean leader election, or retention that deleted
//! records never applied while the instance was stopped all leave the
//! stored position pointing past the log's end or before its start.
//! Consuming on from the log's start as Kafka clients do by default
//! (`auto.offset.reset`) would either skip what the new log holds (its
//! offsets restart below the stored one, which the restore rule then takes
//! for records already published) or build state without the deleted
//! records, and say nothing of either.
//!
//! So the position is checked against the log's range when a partition is
//! assigned, and the consumer runs with `auto.offset.reset = error`, so a
//! position that leaves the log while running is reported too (see
//! `GroupConsumer::poll_batch`). What happens then is the operator's
//! choice, [`OnLostPosition`]: stop with the facts (the default), restore
//! the partition's state from the changelog, or forget it and read the log
//! from its start.

use std::time::Duration;

use tracing::{error, info, warn};

use super::restore::{RestoreError, Restorer};
use crate::config::OnLostPosition;
use crate::kafka::consumer::Assigned;
use crate::kafka::reader::{stream_partition, StreamError};
use crate::kafka::KafkaError;
use crate::records::ProducerRecord;

/// A partition's stored position outside its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostPosition {
    /// The input topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Whose position: `"stored"` (the state's own) or `"group's committed"`.
    pub whose: &'static str,
    /// The position outside the log.
    pub stored: i64,
    /// The log's first offset.
    pub low: i64,
    /// The log's end (the next offset to be written); below zero when
    /// it could not be read.
    pub high: i64,
    /// What was tried already (empty, or `"; ..."`).
    pub note: String,
}

impl std::fmt::Display for LostPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let LostPosition { topic, partition, whose, stored, low, high, note } = self;
        let where_ = if *high < 0 {
            "outside the log"
        } else if stored > high {
            "past the log's end (the topic was deleted and created again, or truncated)"
        } else {
            "before the log's start (retention deleted records never applied)"
        };
        let log = if *high < 0 {
            "the log's range could not be read".to_owned()
        } else if high > low {
            format!("the log holds offsets {low} to {}", high - 1)
        } else {
            format!("the log is empty, its next offset {high}")
        };
        write!(
            f,
            "partition {partition} of {topic}: the {whose} position {stored} is {where_}; {log}{note}. \
             The reconciler stopped rather than skip records or build state without them. \
             Choose with [consumer] on_lost_position: \"restore\" restores the partition's state from the changelog \
             and goes on from its position if the log holds it; \"reset\" forgets the partition's state, clears it \
             from the changelog and reads the log from its start, publishing what it decides (right when the topic \
             was created again); or put back the topic the state belongs to"
        )
    }
}

impl std::error::Error for LostPosition {}

/// Whether a partition starting at `start` (`None`: its beginning) with the
/// group's `committed` offset lost its position in a log holding
/// `(low, high)`: the start past the end or before the start, or the
/// committed offset past the end (a restore up to it would take the new
/// log's records for ones already published).
pub fn check(
    topic: &str,
    partition: i32,
    start: Option<i64>,
    committed: Option<i64>,
    (low, high): (i64, i64),
) -> Option<LostPosition> {
    let lost = |whose, stored| LostPosition {
        topic: topic.to_owned(),
        partition,
        whose,
        stored,
        low,
        high,
        note: String::new(),
    };
    match (start, committed) {
        (Some(s), _) if s > high || s < low => Some(lost("stored", s)),
        (_, Some(c)) if c > high => Some(lost("group's committed", c)),
        _ => None,
    }
}

/// How long the log's range may take to read at assignment.
const RANGE_PATIENCE: Duration = Duration::from_secs(10);

impl Restorer {
    /// Where assigned `partition` starts and up to where it restores
    /// silently: [`Restorer::start_offset`], checked against the input's
    /// log, and the configured choice carried out when it is outside.
    pub fn assign(&self, partition: i32, committed: Option<i64>) -> Result<Assigned, RestoreError> {
        let start = self.start_offset(partition, committed)?;
        let log = match self.watermarks.range(&self.input, partition, RANGE_PATIENCE) {
            Ok(range) => range,
            Err(e) => {
                // The consumer reports a position outside the log when it
                // fetches (`auto.offset.reset = error`): not a silent skip.
                warn!(partition, error = %e, "Cannot read the input's range to check the stored position; the fetch will report one outside the log");
                return Ok(Assigned { start, committed });
            }
        };
        let Some(lost) = check(&self.input, partition, start, committed, log) else {
            return Ok(Assigned { start, committed });
        };
        self.metrics.restore.lost_position(self.on_lost_position.as_str());
        let chosen = match self.on_lost_position {
            OnLostPosition::Fail => Err(RestoreError::LostPosition(lost)),
            OnLostPosition::Restore => self.restore_lost(lost, log),
            OnLostPosition::Reset => self.reset_lost(lost),
        };
        if let Err(RestoreError::LostPosition(lost)) = &chosen {
            *self.lost.lock().unwrap_or_else(|e| e.into_inner()) = Some(lost.clone());
        }
        chosen
    }

    /// `on_lost_position = "restore"`: the partition's state from the
    /// changelog, if its position is in the log.
    fn restore_lost(&self, mut lost: LostPosition, log: (i64, i64)) -> Result<Assigned, RestoreError> {
        let partition = lost.partition;
        warn!(%lost, "Lost position: restoring the partition's state from the changelog");
        self.store.forget_partition(partition)?;
        if self.topic.is_none() {
            lost.note = "; on_lost_position = \"restore\" needs a changelog, and [topics] changelog is off".into();
            return Err(RestoreError::LostPosition(lost));
        }
        // No committed offset: the restore reads the changelog whatever
        // the group says.
        let start = self.start_offset(partition, None)?;
        match (start, check(&self.input, partition, start, None, log)) {
            (Some(next), None) => {
                info!(partition, next_offset = next, "Lost position: restored from the changelog");
                // The group's offset is trusted only inside the log.
                Ok(Assigned { start: Some(next), committed: None })
            }
            // (The store holds nothing of it: forgotten above, nothing restored.)
            (None, _) => {
                lost.note = "; the changelog holds no state of it to restore".into();
                Err(RestoreError::LostPosition(lost))
            }
            (Some(next), Some(_)) => {
                self.store.forget_partition(partition)?;
                lost.note = format!("; the changelog's position, {next}, is outside the log too");
                Err(RestoreError::LostPosition(lost))
            }
        }
    }

    /// `on_lost_position = "reset"`: the partition's state forgotten, here
    /// and in the changelog, and the log read from its start.
    fn reset_lost(&self, lost: LostPosition) -> Result<Assigned, RestoreError> {
        let partition = lost.partition;
        error!(%lost, "Lost position: forgetting the partition's state and reading the log from its start");
        if let Some(topic) = &self.topic {
            let cleared = self.clear(topic, partition).map_err(|source| RestoreError::Clear { partition, source })?;
            info!(partition, keys = cleared, "Lost position: the partition's state cleared from the changelog");
        }
        self.store.forget_partition(partition)?;
        Ok(Assigned { start: None, committed: None })
    }

    /// Publishes a tombstone for every key of `partition` in the changelog
    /// and waits for them: a later restore of the partition must not bring
    /// back the state it had in the lost log. How many keys it cleared.
    fn clear(&self, topic: &str, partition: i32) -> Result<usize, KafkaError> {
        let range = self.watermarks.range(topic, partition, RANGE_PATIENCE)?;
        let mut keys = std::collections::BTreeSet::new();
        stream_partition(&self.kafka, topic, partition, range, self.stall, |key, value, _| {
            match (key, value) {
                (Some(k), Some(_)) => keys.insert(k.to_vec()),
                (Some(k), None) => keys.remove(k),
                (None, _) => false,
            };
            Ok::<(), std::convert::Infallible>(())
        })
        .map_err(|e| match e {
            StreamError::Kafka(e) => e,
            StreamError::Visit(never) => match never {},
        })?;
        let tombstones: Vec<ProducerRecord> = keys
            .into_iter()
            .map(|key| ProducerRecord { topic: topic.to_owned(), key: Some(key), value: None, headers: Vec::new() })
            .collect();
        self.publisher_for_changelog()?.publish_all(tombstones.iter().map(|r| (r, Some(partition))))?;
        Ok(tombstones.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_inside_the_log_is_kept() {
        for (start, committed) in
            [(None, None), (Some(0), None), (Some(10), Some(10)), (Some(5), Some(8)), (None, Some(10))]
        {
            assert_eq!(check("in", 0, start, committed, (0, 10)), None, "{start:?} {committed:?}");
        }
        // The log's end is a position: the next record goes there.
        assert_eq!(check("in", 0, Some(10), None, (3, 10)), None);
        assert_eq!(check("in", 0, Some(3), None, (3, 10)), None);
    }

    #[test]
    fn a_position_outside_the_log_is_lost_with_its_facts() {
        let past = check("in", 2, Some(1755), Some(1755), (0, 500)).unwrap();
        assert_eq!((past.partition, past.whose, past.stored, past.low, past.high), (2, "stored", 1755, 0, 500));
        let text = past.to_string();
        for words in [
            "partition 2 of in",
            "1755",
            "past the log's end",
            "offsets 0 to 499",
            "on_lost_position",
            "\"restore\"",
            "\"reset\"",
        ] {
            assert!(text.contains(words), "{words}: {text}");
        }
        let before = check("in", 0, Some(4), None, (100, 200)).unwrap();
        assert!(before.to_string().contains("before the log's start"), "{before}");
        // No state here, but the group's offset is past the end: a silent
        // restore up to it would swallow the new log's records.
        let group = check("in", 1, None, Some(900), (0, 20)).unwrap();
        assert_eq!((group.whose, group.stored), ("group's committed", 900));
        let empty = check("in", 0, Some(7), None, (0, 0)).unwrap().to_string();
        assert!(empty.contains("the log is empty, its next offset 0"), "{empty}");
    }
}
