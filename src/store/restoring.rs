//! Restoring a partition's state from its changelog ([`super::changelog`]).
//!
//! # Batches cut short
//!
//! The changelog records of a batch end, in each partition, with the
//! partition's offsets record. Under `at_least_once` they are published
//! without a transaction, so an owner that crashes (or loses the
//! partition) while publishing them can leave the first records of a batch
//! in the changelog without its offsets record: a *tail* of writes whose
//! batch the state never finished. Applying the tail would give a state
//! that has part of a batch under the offset before it, and the next owner
//! would apply that batch's records again on top of it (an event seen
//! twice). So [`Restoring`] notes where the last offsets record was read;
//! when records follow it, [`Restored::tail`] says so, the caller restores
//! again up to that record (a changelog read twice, only after such a
//! crash), and publishes [`Restored::undo`]: the tail's keys set back to the
//! values they have there. Whoever restores later reads the tail followed
//! by its undo, and the batch applied again after that, in log order.
//!
//! Why the values under the tail are still there to read: compaction never
//! cleans the active segment, and a tail followed by no record stays in it.
//! Once the undo follows, the tail's records are superseded by it.
//!
//! # The timer index
//!
//! The changelog carries no timers. Each operation record applied moves
//! its operation's timer in the index, from the timer of the value it
//! replaces (read from the store, or from the writes staged but not yet
//! written) to the timer of its new value: applied in log order, the index
//! ends as the operations' writer left it.

use rocksdb::WriteBatch;
use rustc_hash::FxHashMap;

use super::changelog::{change, record, Change, Unreadable};
use super::encoded::Family;
use super::keys;
use super::rocks::{Store, StoreError, FORMAT, OFFSETS, TIMERS};
use crate::records::ProducerRecord;

/// A partition's state being replaced by its changelog: the first record
/// deletes what the store held of the partition, the records are written
/// in chunks as they come, and the next offset goes last. A crash midway
/// leaves the partition without an offset, so the next assignment
/// restores it again from the start; the partition is never half old,
/// half new with an offset that claims otherwise.
pub struct Restoring<'a> {
    store: &'a Store,
    partition: i32,
    wb: WriteBatch,
    offset: Option<i64>,
    records: u64,
    /// The changelog position after the last offsets record read.
    complete_to: Option<i64>,
    /// The writes read since then: `(family, store key)`.
    tail: Vec<(Family, Vec<u8>)>,
    timers: TimerMoves,
    /// Bytes staged before they are written ([`RESTORE_CHUNK_BYTES`]).
    chunk_bytes: usize,
}

/// The timer keys of the operations staged in a write batch not yet
/// written (a store read would miss them): operation key → its timer key.
#[derive(Default)]
struct TimerMoves {
    staged: FxHashMap<Vec<u8>, Option<Vec<u8>>>,
}

impl TimerMoves {
    /// Moves the timer of operation `key` of `partition` to the one of
    /// `value` (`None`: the operation is deleted), in `wb`.
    fn apply(
        &mut self,
        store: &Store,
        wb: &mut WriteBatch,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let before = match self.staged.get(key) {
            Some(t) => t.clone(),
            None => match store.get_raw(Family::Ops, key)? {
                Some(v) => store.timer_of(partition, key, &v)?.map(|(k, _)| k),
                None => None,
            },
        };
        let after = value.map(|v| store.timer_of(partition, key, v)).transpose()?.flatten();
        let cf = store.cf(TIMERS);
        if let Some(k) = before.as_ref().filter(|k| after.as_ref().map(|(a, _)| a) != Some(*k)) {
            wb.delete_cf(cf, k);
        }
        if let Some((k, v)) = &after {
            wb.put_cf(cf, k, v);
        }
        self.staged.insert(key.to_vec(), after.map(|(k, _)| k));
        Ok(())
    }

    /// The staged writes were written: the store answers for them now.
    fn written(&mut self) {
        self.staged.clear();
    }
}

/// Bytes of restored records written in one RocksDB write.
const RESTORE_CHUNK_BYTES: usize = 8 << 20;

/// What a restore left.
#[derive(Debug, PartialEq, Eq)]
pub struct Restored {
    /// The next input offset the restored state includes; `None` when the
    /// changelog had nothing (the store is left as it was) or no offsets
    /// record (the partition is left empty).
    pub next: Option<i64>,
    /// Writes were read after the last offsets record: the changelog
    /// position to restore up to instead (see the module doc).
    pub tail: Option<Tail>,
}

/// The writes of a batch whose changelog was cut short.
#[derive(Debug, PartialEq, Eq)]
pub struct Tail {
    /// The changelog position just after the last complete batch (the
    /// partition's first position when there is none).
    pub complete_to: Option<i64>,
    keys: Vec<(Family, Vec<u8>)>,
}

impl Tail {
    /// The tail of changelog `records` of `partition` read after the last
    /// offsets record (a standby's catch-up).
    pub fn of_records(partition: i32, records: &[(Vec<u8>, Option<Vec<u8>>)]) -> Tail {
        let keys = records
            .iter()
            // Only the writes count: the input an offsets record names
            // is not checked here ("" matches no named one).
            .filter_map(|(k, v)| match change(partition, "", k, v.as_deref()) {
                Ok(Change::Write { family, key, .. }) => Some((family, key.to_vec())),
                _ => None,
            })
            .collect();
        Tail { complete_to: None, keys }
    }

    /// Writes in the tail.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the tail is empty (never, for a tail a restore reports).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl<'a> Restoring<'a> {
    pub(super) fn new(store: &'a Store, partition: i32) -> Restoring<'a> {
        Restoring {
            store,
            partition,
            wb: WriteBatch::default(),
            offset: None,
            records: 0,
            complete_to: None,
            tail: Vec::new(),
            timers: TimerMoves::default(),
            chunk_bytes: RESTORE_CHUNK_BYTES,
        }
    }

    /// Writes every `bytes` of staged records (tests: chunk boundaries).
    #[cfg(test)]
    pub(crate) fn in_chunks_of(self, bytes: usize) -> Restoring<'a> {
        Restoring { chunk_bytes: bytes, ..self }
    }

    /// Applies the changelog record at position `at` of the partition
    /// (`value` `None`: a tombstone).
    pub fn apply(&mut self, at: i64, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        if self.records == 0 {
            // Written at once: the timers' moves then read this restore's
            // writes only.
            self.store.wipe_partition(self.partition, &mut self.wb);
            self.store.write(std::mem::take(&mut self.wb))?;
        }
        self.records += 1;
        match stage(self.store, &mut self.wb, &mut self.timers, self.partition, key, value)? {
            Change::Offset(next) => {
                self.offset = Some(next);
                self.complete_to = Some(at + 1);
                self.tail.clear();
            }
            Change::Write { family, key, .. } => self.tail.push((family, key.to_vec())),
        }
        if self.wb.size_in_bytes() >= self.chunk_bytes {
            self.store.write(std::mem::take(&mut self.wb))?;
            self.store.note_rewritten(self.partition);
            self.timers.written();
        }
        Ok(())
    }

    /// Changelog records applied so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the rest and the next offset (see [`Restored`]). With a tail,
    /// the state written holds it: restore again up to
    /// [`Tail::complete_to`] before using it.
    pub fn finish(mut self) -> Result<Restored, StoreError> {
        if let Some(next) = self.offset {
            self.wb.put_cf(self.store.cf(OFFSETS), keys::partition_prefix(self.partition), keys::offset(next));
        } else if self.records > 0 {
            self.store.wipe_partition(self.partition, &mut self.wb);
        }
        self.store.write(std::mem::take(&mut self.wb))?;
        self.store.note_rewritten(self.partition);
        let tail = (!self.tail.is_empty()).then_some(Tail { complete_to: self.complete_to, keys: self.tail });
        Ok(Restored { next: self.offset, tail })
    }

    /// Gives up: the partition is left empty (it then replays the input).
    pub fn abandon(mut self) -> Result<(), StoreError> {
        self.wb.clear();
        self.store.wipe_partition(self.partition, &mut self.wb);
        self.store.write(std::mem::take(&mut self.wb))
    }
}

/// Reads changelog record `key`/`value` of `partition` and, for a write,
/// adds it to `wb` (with its timer's move, for an operation); what the
/// record is.
fn stage<'k>(
    store: &Store,
    wb: &mut WriteBatch,
    timers: &mut TimerMoves,
    partition: i32,
    key: &'k [u8],
    value: Option<&'k [u8]>,
) -> Result<Change<'k>, StoreError> {
    let found = change(partition, &store.topic, key, value).map_err(|e| match e {
        Unreadable::Format(found) => StoreError::ChangelogFormat { found: found.into(), expected: FORMAT },
        Unreadable::OtherInput(found) => StoreError::ChangelogInput { found, expected: store.topic.clone() },
        Unreadable::Malformed => StoreError::Corrupt {
            what: "changelog record",
            reason: format!("key {key:02x?} is not a changelog key of partition {partition}"),
        },
    })?;
    if let Change::Write { family, key, value } = &found {
        if *family == Family::Ops {
            timers.apply(store, wb, partition, key, *value)?;
        }
        let cf = store.cf(family.name());
        match value {
            Some(v) => wb.put_cf(cf, key, v),
            None => wb.delete_cf(cf, key),
        }
    }
    Ok(found)
}

impl Store {
    /// A standby replica's write (see [`crate::fleet::standby`]): the
    /// changelog `records` of `partition` in one atomic write. When the
    /// last one is an offsets record (a batch boundary), the partition's
    /// offset moves to it; otherwise the offset is deleted, so that a
    /// state holding part of a batch never has an offset that claims
    /// otherwise (the pipeline then restores the partition). Returns the
    /// offset written, if any.
    pub fn apply_changelog(
        &self,
        partition: i32,
        records: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<Option<i64>, StoreError> {
        let mut wb = WriteBatch::default();
        let mut timers = TimerMoves::default();
        let mut offset = None;
        for (key, value) in records {
            offset = match stage(self, &mut wb, &mut timers, partition, key, value.as_deref())? {
                Change::Offset(next) => Some(next),
                Change::Write { .. } => None,
            };
        }
        let offsets = self.cf(OFFSETS);
        match offset {
            Some(next) => wb.put_cf(offsets, keys::partition_prefix(partition), keys::offset(next)),
            None => wb.delete_cf(offsets, keys::partition_prefix(partition)),
        }
        self.write(wb)?;
        self.note_rewritten(partition);
        Ok(offset)
    }

    /// The changelog records that set `tail`'s keys back to what the store
    /// holds of them now (restored up to [`Tail::complete_to`]), followed
    /// by the offsets record of `next` when there is one, for `topic`.
    pub fn undo(
        &self,
        partition: i32,
        tail: &Tail,
        next: Option<i64>,
        topic: &str,
    ) -> Result<Vec<ProducerRecord>, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(tail.keys.len() + 1);
        for (family, key) in &tail.keys {
            if seen.insert((*family, key.as_slice())) {
                let now = self.get_raw(*family, key)?;
                out.push(record(topic, *family, key, now.as_deref()));
            }
        }
        if let Some(next) = next {
            let value = super::changelog::offsets_value(next, &self.topic);
            out.push(record(topic, Family::Offsets, &keys::partition_prefix(partition), Some(&value)));
        }
        Ok(out)
    }
}
