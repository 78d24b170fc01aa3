//! The state changelog: every write of a batch to the store, as
//! records of a compacted topic, so that the state of a partition can be
//! rebuilt on another machine without the input's history.
//!
//! # Records
//!
//! One record per store write, to the changelog partition equal to the
//! input partition, but for the timer index: it follows from the
//! operations (each holds its timer), so whoever applies a changelog
//! rebuilds it as the operations arrive (see [`super::restoring`]). A
//! timer moves with nearly every operation write (set at the request,
//! moved to retention at the close), so this leaves out about one record
//! in three. The key is `[format, family] ++ store key`; the value
//! is the stored value byte for byte, or null (a tombstone) for a delete.
//! Compaction then keeps the latest value of every key, and tombstones
//! remove what retention removed; what is left of a partition is exactly
//! its store range. The offsets record (`family = offsets`) carries the
//! next input offset the state includes, followed by the name of the input
//! topic: two pipelines of different inputs pointed at one changelog topic
//! (a changelog named in the settings does not follow `[topics] events`) would
//! otherwise restore each other's state. A restore that meets another
//! input's offsets record stops (and the partition replays its input);
//! an offsets record of 8 bytes, without the name (as older versions
//! wrote it), is accepted.
//! It is a check, not a separation: both pipelines write the same offsets
//! keys, so once compaction keeps only the latest one the other input may
//! no longer show. Each input needs a changelog of its own.
//!
//! The format byte is the store's value format ([`super::rocks::FORMAT`]):
//! a changelog written by a version with another layout is never restored
//! into this one (the restore stops and the partition replays the input).
//!
//! An operation's latest timeline entries are in its value, so they cost
//! no record of their own (see [`super::timeline`]). An operation that
//! leaves retention takes the entries out of its value with it in one
//! RocksDB range delete; the changelog has no range tombstone, so that
//! becomes one tombstone per ring slot the operation used there (none for
//! most operations).
//!
//! # When the records are published
//!
//! After the outputs of their batch are acknowledged, never before (see
//! `Pipeline::finish_in_flight`): a state restored from the changelog then
//! never includes a batch whose outputs might be lost with the machine
//! that held its outbox. Under `exactly_once` they go in the batch's
//! transaction with its outputs and offsets. Until they are acknowledged
//! the outbox notes which partitions have unpublished changelog records
//! (one of each partition's records, not all: a restart does not publish
//! them, it forgets those partitions' local state, which is then restored
//! from the changelog and re-applied from the input). A crash *while* they
//! are published leaves a batch cut short, which the next restore leaves
//! out and sets back ([`super::restoring`]).

use super::encoded::{Family, Part, Write};
use super::keys;
use crate::records::ProducerRecord;

/// The family byte of a changelog key.
fn tag(family: Family) -> u8 {
    match family {
        Family::Timeline => b'l',
        Family::Ops => b'o',
        Family::Entities => b'e',
        Family::Timers => b't',
        Family::Offsets => b'n',
    }
}

/// The family of a changelog key's family byte.
pub(crate) fn family_of(tag: u8) -> Option<Family> {
    Some(match tag {
        b'l' => Family::Timeline,
        b'o' => Family::Ops,
        b'e' => Family::Entities,
        b't' => Family::Timers,
        b'n' => Family::Offsets,
        _ => return None,
    })
}

/// The store format as the changelog's first key byte.
fn format_byte() -> u8 {
    u8::try_from(super::rocks::FORMAT).expect("store formats fit a byte")
}

fn key(family: Family, store_key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + store_key.len());
    k.push(format_byte());
    k.push(tag(family));
    k.extend_from_slice(store_key);
    k
}

/// Where a batch's changelog records go: the changelog topic, and the input
/// topic its offsets records name.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The changelog topic.
    pub topic: &'a str,
    /// The input topic of the state.
    pub input: &'a str,
}

impl<'a> Target<'a> {
    /// Where `topics` send the changelog, if they have one.
    pub fn of(topics: &'a crate::config::Topics) -> Option<Target<'a>> {
        topics.changelog().map(|topic| Target { topic, input: &topics.events })
    }
}

/// The value of an offsets record: the next offset, then the input topic.
pub(crate) fn offsets_value(next: i64, input: &str) -> Vec<u8> {
    let mut v = keys::offset(next).to_vec();
    v.extend_from_slice(input.as_bytes());
    v
}

/// The changelog record of one store write (`value` `None`: a delete).
pub(crate) fn record(topic: &str, family: Family, store_key: &[u8], value: Option<&[u8]>) -> ProducerRecord {
    ProducerRecord {
        topic: topic.to_owned(),
        key: Some(key(family, store_key)),
        value: value.map(<[u8]>::to_vec),
        headers: Vec::new(),
    }
}

/// The changelog records of `part`'s writes, in write order, for `topic`.
/// Each partition's records end with its offsets record (the batch's
/// offsets are its last writes): see [`super::restoring`] for why.
pub(crate) fn records(part: &Part, to: Target<'_>) -> Vec<ProducerRecord> {
    let bytes = &part.bytes;
    let record = |family, store_key: &[u8], value: Option<&[u8]>| record(to.topic, family, store_key, value);
    let mut out = Vec::with_capacity(part.writes.len());
    for w in &part.writes {
        match w {
            Write::Put { family: Family::Timers, .. } | Write::Delete { family: Family::Timers, .. } => {}
            Write::Put { family: Family::Offsets, key, value } => {
                let next = keys::offset_of(&bytes[value.clone()]).expect("an offsets write holds an offset");
                out.push(record(Family::Offsets, &bytes[key.clone()], Some(&offsets_value(next, to.input))))
            }
            Write::Put { family, key, value } => {
                out.push(record(*family, &bytes[key.clone()], Some(&bytes[value.clone()])))
            }
            Write::Delete { family, key } => out.push(record(*family, &bytes[key.clone()], None)),
            Write::DeleteRange { family, from, slots, .. } => {
                // `from` is the timeline head: the slots are its entries.
                for slot in 0..*slots {
                    let mut k = bytes[from.clone()].to_vec();
                    k.extend_from_slice(&slot.to_be_bytes());
                    out.push(record(*family, &k, None));
                }
            }
        }
    }
    out
}

/// Whether `record` is an offsets record (the last of its batch in its
/// partition).
pub fn is_offsets(record: &ProducerRecord) -> bool {
    record.key.as_deref().is_some_and(is_offsets_key)
}

/// Whether `key` is the key of an offsets record.
pub fn is_offsets_key(key: &[u8]) -> bool {
    key.get(1) == Some(&tag(Family::Offsets))
}

/// The input partition of a changelog record (its changelog partition
/// too), from its key; `None` for a key this version did not write.
pub fn partition_of(key: &[u8]) -> Option<i32> {
    keys::partition_of(key.get(2..)?)
}

/// A changelog record read back: what it does to the store.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    /// Put (`Some`) or delete the store key in the family.
    Write { family: Family, key: &'a [u8], value: Option<&'a [u8]> },
    /// The next input offset the state includes.
    Offset(i64),
}

/// Why a changelog record cannot be restored.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// Written by a version with another store format.
    Format(u8),
    /// The state of another input topic (named).
    OtherInput(String),
    /// Not a key or value this layout has.
    Malformed,
}

/// What `key` and `value` of a changelog record of `partition` of the
/// state of input topic `input` do.
pub(crate) fn change<'a>(
    partition: i32,
    input: &str,
    key: &'a [u8],
    value: Option<&'a [u8]>,
) -> Result<Change<'a>, Unreadable> {
    let (&format, rest) = key.split_first().ok_or(Unreadable::Malformed)?;
    if format != format_byte() {
        return Err(Unreadable::Format(format));
    }
    let (&tag, store_key) = rest.split_first().ok_or(Unreadable::Malformed)?;
    let family = family_of(tag).ok_or(Unreadable::Malformed)?;
    if keys::partition_of(store_key) != Some(partition) {
        return Err(Unreadable::Malformed);
    }
    if family == Family::Offsets {
        let v = value.ok_or(Unreadable::Malformed)?;
        let (offset, named) = (v.get(..8).ok_or(Unreadable::Malformed)?, &v[8..]);
        if !named.is_empty() && named != input.as_bytes() {
            return Err(Unreadable::OtherInput(String::from_utf8_lossy(named).into_owned()));
        }
        return keys::offset_of(offset).map(Change::Offset).ok_or(Unreadable::Malformed);
    }
    Ok(Change::Write { family, key: store_key, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Batch;

    #[test]
    fn every_write_becomes_one_record_and_reads_back_as_that_write() {
        let mut b = Batch::default();
        b.put_entity(2, "e-1".into(), Some(Default::default()));
        b.put_entity(2, "e-2".into(), None);
        b.set_offset(2, 41);
        let encoded = b.encode(Some(Target { topic: "s", input: "in" }));
        let recs = &encoded.parts[0].outbox;
        assert_eq!(recs.len(), 3);
        assert!(recs.iter().all(|r| r.topic == "s" && partition_of(r.key.as_deref().unwrap()) == Some(2)));
        let changes: Vec<_> =
            recs.iter().map(|r| change(2, "in", r.key.as_deref().unwrap(), r.value.as_deref()).unwrap()).collect();
        assert!(matches!(changes[0], Change::Write { family: Family::Entities, value: Some(_), .. }));
        assert_eq!(
            changes[1],
            Change::Write { family: Family::Entities, key: &keys::scoped(2, "e-2"), value: None },
            "a delete is a tombstone"
        );
        assert_eq!(changes[2], Change::Offset(41));
        // Another partition's record, another format, garbage: refused.
        let k = recs[2].key.as_deref().unwrap();
        assert_eq!(change(3, "in", k, recs[2].value.as_deref()), Err(Unreadable::Malformed));
        let mut old = k.to_vec();
        old[0] = format_byte() - 1;
        assert_eq!(change(2, "in", &old, recs[2].value.as_deref()), Err(Unreadable::Format(format_byte() - 1)));
        assert_eq!(change(2, "in", b"", None), Err(Unreadable::Malformed));
        assert_eq!(change(2, "in", &[format_byte(), b'?', 0, 0, 0, 2], None), Err(Unreadable::Malformed));
        // The state of another input; an offsets record of before the name.
        assert_eq!(change(2, "other", k, recs[2].value.as_deref()), Err(Unreadable::OtherInput("in".into())));
        assert_eq!(change(2, "other", k, Some(&keys::offset(41))), Ok(Change::Offset(41)));
    }

    #[test]
    fn no_changelog_topic_no_records() {
        let mut b = Batch::default();
        b.set_offset(0, 1);
        assert!(b.encode(None).parts[0].outbox.is_empty());
    }
}
