//! How an operation's applied revisions (`OperationState::applied_seqs`)
//! are stored: the record of every revision is written with the state at
//! each batch that touches the operation, so its bytes are paid again and
//! again (write-ahead log, flushes, the changelog record).
//!
//! Each record is its revision, its event id and its body's digest. The
//! event id takes one of three forms:
//! - a UUID in its canonical text form (lowercase hex, hyphenated: the
//!   event ids of most services) as its 16 bytes, 17 instead of 37;
//! - else, an id that begins as the previous record's does (revision
//!   order) as the length of that common beginning and the rest: the ids
//!   of one operation's events often share it (`order-452.requested`,
//!   `order-452.started`);
//! - else its text.
//!
//! The digest is written as its 8 bytes rather than as a variable-length
//! integer (a digest is uniformly spread: 10 bytes as one nearly always).
//! Read back, every id is the same text byte for byte; a record that cannot
//! have been written (a beginning longer than the previous id, or cut inside
//! a character; revisions out of order) is refused, and so are records whose
//! ids would take more than [`MAX_ID_BYTES`] in all (a damaged value could
//! otherwise repeat a long id at a few bytes a record, and take gigabytes
//! to read).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use super::ids::{canonical_uuid, uuid_text};
use super::operation::SeqRecord;
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most bytes of event ids one operation's records may read back to:
/// far more than any operation stores (its value is one changelog record,
/// held below a producer's message size), little enough to allocate.
const MAX_ID_BYTES: usize = 64 << 20;

/// The fewest bytes shared with the previous id worth writing as
/// [`StoredEventId::AfterPrevious`] (its length takes a byte).
const MIN_SHARED: usize = 2;

/// An event id as written.
#[derive(Serialize, Deserialize)]
#[serde(rename = "StoredEventId")]
enum StoredEventId<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Uuid([u8; 16]),
    /// The first `.0` bytes of the previous record's id, then `.1`.
    AfterPrevious(usize, #[serde(borrow)] Cow<'a, str>),
}

impl<'a> StoredEventId<'a> {
    /// The form of `id` after a record whose id is `previous`: its 16
    /// bytes if it is a UUID, else what it shares with `previous` and the
    /// rest if that is [`MIN_SHARED`] bytes or more, else its text.
    fn of(id: &'a str, previous: &str) -> StoredEventId<'a> {
        if let Some(bytes) = canonical_uuid(id) {
            return StoredEventId::Uuid(bytes);
        }
        let mut shared = id.bytes().zip(previous.bytes()).take_while(|(a, b)| a == b).count();
        while !(id.is_char_boundary(shared) && previous.is_char_boundary(shared)) {
            shared -= 1;
        }
        if shared >= MIN_SHARED {
            StoredEventId::AfterPrevious(shared, Cow::Borrowed(&id[shared..]))
        } else {
            StoredEventId::Text(Cow::Borrowed(id))
        }
    }

    /// The id's text after a record whose id is `previous`; `None` when it
    /// shares more of it than there is, or cuts a character.
    fn into_string(self, previous: &str) -> Option<String> {
        match self {
            StoredEventId::Text(text) => Some(text.into_owned()),
            StoredEventId::Uuid(bytes) => Some(uuid_text(bytes)),
            StoredEventId::AfterPrevious(shared, rest) => {
                let start = previous.get(..shared)?;
                let mut id = String::with_capacity(shared + rest.len());
                id.push_str(start);
                id.push_str(&rest);
                Some(id)
            }
        }
    }
}

/// Writes `records` in revision order, each as (revision, id, digest).
pub fn serialize<S: Serializer>(records: &BTreeMap<i64, SeqRecord>, s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(records.len()))?;
    let mut previous = "";
    for (revision, r) in records {
        seq.serialize_element(&(revision, StoredEventId::of(&r.event_id, previous), r.body_hash.to_le_bytes()))?;
        previous = &r.event_id;
    }
    seq.end()
}

/// Reads what [`serialize`] wrote.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<i64, SeqRecord>, D::Error> {
    d.deserialize_seq(Records)
}

struct Records;

impl<'de> Visitor<'de> for Records {
    type Value = BTreeMap<i64, SeqRecord>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an operation's applied revisions")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut records = BTreeMap::new();
        let mut id_bytes = 0usize;
        while let Some((revision, id, digest)) = seq.next_element::<(i64, StoredEventId<'de>, [u8; 8])>()? {
            let previous = records.last_key_value().map(|(at, r): (&i64, &SeqRecord)| (*at, r.event_id.as_str()));
            if previous.is_some_and(|(at, _)| at >= revision) {
                return Err(de::Error::custom("applied revisions out of order"));
            }
            let event_id = id
                .into_string(previous.map_or("", |(_, id)| id))
                .ok_or_else(|| de::Error::custom("an event id shares more of the previous one than it has"))?;
            id_bytes = id_bytes.saturating_add(event_id.len());
            if id_bytes > MAX_ID_BYTES {
                return Err(de::Error::custom("more event id bytes than any operation stores"));
            }
            records.insert(revision, SeqRecord { event_id, body_hash: u64::from_le_bytes(digest) });
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The records as stored, within a struct as the state holds them.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Held(#[serde(with = "super")] BTreeMap<i64, SeqRecord>);

    fn records(ids: &[(i64, &str)]) -> BTreeMap<i64, SeqRecord> {
        let hash = |at: i64| (at as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ids.iter().map(|(at, id)| (*at, SeqRecord { event_id: (*id).to_owned(), body_hash: hash(*at) })).collect()
    }

    fn round_trip(r: &BTreeMap<i64, SeqRecord>) -> (usize, BTreeMap<i64, SeqRecord>) {
        let bytes = postcard::to_allocvec(&Held(r.clone())).unwrap();
        (bytes.len(), postcard::from_bytes::<Held>(&bytes).unwrap().0)
    }

    /// What the derived form (a map of the records) takes.
    fn derived_len(r: &BTreeMap<i64, SeqRecord>) -> usize {
        postcard::to_allocvec(r).unwrap().len()
    }

    #[test]
    fn ids_read_back_as_their_text_in_fewer_bytes() {
        let uuid = "6f1c9a52-3c0e-4f7e-9d8b-0b7a52e1c4a9";
        let cases = [
            // One operation's ids sharing their beginning (loadgen's form).
            records(&[(1, "op-000042.req"), (2, "op-000042.start"), (3, "op-000042.obs")]),
            // UUIDs, the usual form.
            records(&[(1, uuid), (2, "0b7a52e1-3c0e-4f7e-9d8b-6f1c9a52c4a9")]),
            // An id that is all of the previous, or a beginning of it.
            records(&[(1, "ab"), (2, "abc"), (3, "ab"), (4, ""), (5, "ab")]),
            // Shared bytes ending inside a character: cut before it.
            records(&[(1, "x-é1"), (2, "x-è2"), (3, "日本1"), (4, "日本2")]),
            // Uppercase or unbraced UUIDs stay text.
            records(&[(7, "6F1C9A52-3C0E-4F7E-9D8B-0B7A52E1C4A9"), (9, "6f1c9a523c0e4f7e9d8b0b7a52e1c4a9")]),
            BTreeMap::new(),
        ];
        for r in &cases {
            let (len, back) = round_trip(r);
            assert_eq!(&back, r);
            assert!(len <= derived_len(r), "{len} > {} for {r:?}", derived_len(r));
        }
        let (shared, _) = round_trip(&cases[0]);
        assert!(shared + 20 <= derived_len(&cases[0]), "{shared} against {}", derived_len(&cases[0]));
        let (uuids, _) = round_trip(&cases[1]);
        assert!(uuids + 40 <= derived_len(&cases[1]), "{uuids} against {}", derived_len(&cases[1]));
    }

    #[test]
    fn records_that_cannot_have_been_written_are_refused() {
        let written = |elements: &[(i64, StoredEventId<'_>, [u8; 8])]| postcard::to_allocvec(&elements).unwrap();
        let read = |bytes: Vec<u8>| postcard::from_bytes::<Held>(&bytes).map(|h| h.0);
        let text = |s: &'static str| StoredEventId::Text(Cow::Borrowed(s));
        let after = |n: usize, s: &'static str| StoredEventId::AfterPrevious(n, Cow::Borrowed(s));
        assert!(read(written(&[(1, text("op-1.a"), [0; 8]), (2, after(5, "b"), [1; 8])])).is_ok());
        // More shared than the previous id has.
        assert!(read(written(&[(1, text("op-1.a"), [0; 8]), (2, after(7, "b"), [1; 8])])).is_err());
        // Sharing with no previous record.
        assert!(read(written(&[(1, after(1, "b"), [1; 8])])).is_err());
        // Cutting a character of the previous id.
        assert!(read(written(&[(1, text("é"), [0; 8]), (2, after(1, "x"), [1; 8])])).is_err());
        // One long id repeated at a few bytes a record, past the bound.
        let mut repeated = vec![(0, StoredEventId::Text(Cow::Owned("x".repeat(1 << 20))), [0; 8])];
        repeated.extend((1..=64).map(|r| (r, after(1 << 20, ""), [0; 8])));
        assert!(read(written(&repeated[..63])).is_ok());
        assert!(read(written(&repeated)).is_err());
        // Revisions out of order, or twice.
        assert!(read(written(&[(2, text("a"), [0; 8]), (1, text("b"), [1; 8])])).is_err());
        assert!(read(written(&[(2, text("a"), [0; 8]), (2, text("b"), [1; 8])])).is_err());
    }

    proptest! {
        #[test]
        fn any_records_read_back_as_written(
            r in proptest::collection::btree_map(
                any::<i64>(),
                ("(op-[0-9]{1,3}[.-])?[a-zé日]{0,4}", any::<u64>()),
                0..6,
            )
        ) {
            let r: BTreeMap<i64, SeqRecord> =
                r.into_iter().map(|(at, (event_id, body_hash))| (at, SeqRecord { event_id, body_hash })).collect();
            let (_, back) = round_trip(&r);
            prop_assert_eq!(back, r);
        }
    }
}
