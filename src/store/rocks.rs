//! The RocksDB implementation of the store.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::keys;
use super::timeline::{Timeline, TimelineEntry, TIMELINE_CAP};
use super::{Batch, OutboxRecord, TimerEntry, Tuning};
use crate::core::{EntityState, OperationState};

const OPS: &str = "ops";
const ENTITIES: &str = "entities";
const TIMERS: &str = "timers";
const OFFSETS: &str = "offsets";
const OUTBOX: &str = "outbox";
const META: &str = "meta";
const TIMELINE: &str = "timeline";
const FAMILIES: [&str; 7] = [OPS, ENTITIES, TIMERS, OFFSETS, OUTBOX, META, TIMELINE];

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt {what} in the state store: {source}")]
    Corrupt { what: &'static str, source: postcard::Error },
    #[error("state directory {dir} belongs to input topic {found:?}, not {expected:?}")]
    WrongTopic { dir: String, found: String, expected: String },
    #[error(
        "state directory {dir} has no column family {family}: it was never opened by this version of `reconciler run`"
    )]
    MissingFamily { dir: String, family: &'static str },
}

/// The durable state of one reconciler instance.
pub struct Store {
    db: DB,
    sync: bool,
    next_outbox_seq: AtomicU64,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("state types serialize")
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

impl Store {
    /// Opens (or creates) the store in `dir` for input topic `topic`, with
    /// the default memory budget.
    pub fn open(dir: &Path, topic: &str, sync: bool) -> Result<Store, StoreError> {
        Store::open_with(dir, topic, sync, &Tuning::default())
    }

    /// Opens (or creates) the store with the memory budget `tuning`.
    pub fn open_with(dir: &Path, topic: &str, sync: bool, tuning: &Tuning) -> Result<Store, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let cache = Cache::new_lru_cache(tuning.block_cache_mb.max(1) << 20);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Most lookups are for operations not stored yet (a new request):
        // a bloom filter answers those without reading blocks.
        table.set_bloom_filter(10.0, false);
        opts.set_block_based_table_factory(&table);
        let budget = tuning.write_buffer_mb.max(4) << 20;
        opts.set_db_write_buffer_size(budget);
        opts.set_write_buffer_size(budget / 4);
        opts.set_max_write_buffer_number(2);
        let cfs = FAMILIES.iter().map(|n| ColumnFamilyDescriptor::new(*n, opts.clone()));
        let db = DB::open_cf_descriptors(&opts, dir, cfs)?;
        let store = Store { db, sync, next_outbox_seq: AtomicU64::new(0) };
        let meta = store.cf(META);
        match store.db.get_cf(meta, b"topic")? {
            Some(found) if found != topic.as_bytes() => {
                return Err(StoreError::WrongTopic {
                    dir: dir.display().to_string(),
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: topic.to_owned(),
                })
            }
            Some(_) => {}
            None => store.db.put_cf(meta, b"topic", topic.as_bytes())?,
        }
        let last = store.db.iterator_cf(store.cf(OUTBOX), IteratorMode::End).next().transpose()?;
        let next = last.map_or(0, |(k, _)| u64::from_be_bytes(k[..8].try_into().expect("8-byte outbox keys")) + 1);
        store.next_outbox_seq.store(next, Ordering::SeqCst);
        Ok(store)
    }

    /// Opens the store in `dir` as a RocksDB secondary instance: a
    /// read-only view that works while `reconciler run` holds the directory
    /// (RocksDB allows one writer). `scratch` is the secondary's own
    /// directory for its info log. Call [`Store::catch_up`] to see writes
    /// made since.
    pub fn open_secondary(dir: &Path, scratch: &Path, topic: &str) -> Result<Store, StoreError> {
        let mut opts = Options::default();
        // Required by secondary instances: every file stays open.
        opts.set_max_open_files(-1);
        let existing = DB::list_cf(&opts, dir)?;
        if let Some(family) = FAMILIES.iter().find(|f| !existing.iter().any(|e| e == *f)) {
            return Err(StoreError::MissingFamily { dir: dir.display().to_string(), family });
        }
        let db = DB::open_cf_as_secondary(&opts, dir, scratch, FAMILIES)?;
        let store = Store { db, sync: false, next_outbox_seq: AtomicU64::new(0) };
        if let Some(found) = store.db.get_cf(store.cf(META), b"topic")? {
            if found != topic.as_bytes() {
                return Err(StoreError::WrongTopic {
                    dir: dir.display().to_string(),
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: topic.to_owned(),
                });
            }
        }
        Ok(store)
    }

    /// A secondary instance: reads what the primary wrote since the last call.
    pub fn catch_up(&self) -> Result<(), StoreError> {
        self.db.try_catch_up_with_primary()?;
        Ok(())
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    pub fn get_op(&self, partition: i32, operation_id: &str) -> Result<Option<OperationState>, StoreError> {
        self.db
            .get_pinned_cf(self.cf(OPS), keys::scoped(partition, operation_id))?
            .map(|b| decode("operation", &b))
            .transpose()
    }

    pub fn get_entity(&self, partition: i32, entity_id: &str) -> Result<EntityState, StoreError> {
        Ok(self
            .db
            .get_pinned_cf(self.cf(ENTITIES), keys::scoped(partition, entity_id))?
            .map(|b| decode("entity", &b))
            .transpose()?
            .unwrap_or_default())
    }

    /// The next offset to consume in `partition`, if any was applied.
    pub fn next_offset(&self, partition: i32) -> Result<Option<i64>, StoreError> {
        Ok(self
            .db
            .get_cf(self.cf(OFFSETS), keys::partition_prefix(partition))?
            .map(|b| i64::from_be_bytes(b[..8].try_into().expect("8-byte offsets"))))
    }

    /// Timers of `partition` due at or before `now`, earliest first.
    pub fn due_timers(&self, partition: i32, now: i64, limit: usize) -> Result<Vec<TimerEntry>, StoreError> {
        let start = keys::partition_prefix(partition);
        let upper = keys::timer_upper(partition, now);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(TIMERS), IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item?;
            if k.as_ref() >= upper.as_slice() || out.len() >= limit {
                break;
            }
            out.push(decode("timer", &v)?);
        }
        Ok(out)
    }

    /// Every operation of `partition` (for explain, review and digests).
    pub fn ops_of(&self, partition: i32) -> Result<Vec<OperationState>, StoreError> {
        let mut out = Vec::new();
        self.scan_ops(partition, |op| {
            out.push(op);
            true
        })?;
        Ok(out)
    }

    /// Visits the operations of `partition` one at a time, without holding
    /// them all in memory; stops early when `visit` returns false.
    pub fn scan_ops(&self, partition: i32, mut visit: impl FnMut(OperationState) -> bool) -> Result<(), StoreError> {
        let prefix = keys::partition_prefix(partition);
        for item in self.db.iterator_cf(self.cf(OPS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || !visit(decode("operation", &v)?) {
                break;
            }
        }
        Ok(())
    }

    /// How many outputs are stored but not yet acknowledged (keys only).
    pub fn outbox_len(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut it = self.db.raw_iterator_cf(self.cf(OUTBOX));
        it.seek_to_first();
        while it.valid() {
            n += 1;
            it.next();
        }
        it.status()?;
        Ok(n)
    }

    /// Partitions this store has consumed from (it holds state for no other).
    pub fn partitions(&self) -> Result<Vec<i32>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(OFFSETS), IteratorMode::Start) {
            let (k, _) = item?;
            out.push(u32::from_be_bytes(k[..4].try_into().expect("4-byte partition keys")) as i32);
        }
        Ok(out)
    }

    /// How many timeline entries `operation_id` has received in all.
    pub fn timeline_total(&self, partition: i32, operation_id: &str) -> Result<u64, StoreError> {
        Ok(self
            .db
            .get_pinned_cf(self.cf(TIMELINE), keys::timeline_head(partition, operation_id))?
            .map_or(0, |b| u64::from_be_bytes(b[..8].try_into().expect("8-byte timeline heads"))))
    }

    /// An operation's retained timeline, in arrival order.
    pub fn timeline(&self, partition: i32, operation_id: &str) -> Result<Timeline, StoreError> {
        let total = self.timeline_total(partition, operation_id)?;
        let start = keys::timeline_entry(partition, operation_id, 0);
        let end = keys::timeline_end(partition, operation_id);
        let mut entries: Vec<TimelineEntry> = Vec::new();
        for item in self.db.iterator_cf(self.cf(TIMELINE), IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item?;
            if k.as_ref() >= end.as_slice() {
                break;
            }
            entries.push(decode("timeline entry", &v)?);
        }
        entries.sort_by_key(|e| e.ordinal);
        Ok(Timeline { total, entries })
    }

    /// Every key and value of the operation and entity state, in key order
    /// (for digests): `f(family, key, value)`.
    pub fn scan_state(&self, mut f: impl FnMut(&str, &[u8], &[u8])) -> Result<(), StoreError> {
        for family in [OPS, ENTITIES] {
            for item in self.db.iterator_cf(self.cf(family), IteratorMode::Start) {
                let (k, v) = item?;
                f(family, &k, &v);
            }
        }
        Ok(())
    }

    /// Outputs written but not yet acknowledged by the broker, in order.
    pub fn pending_outbox(&self) -> Result<Vec<(u64, OutboxRecord)>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(OUTBOX), IteratorMode::Start) {
            let (k, v) = item?;
            out.push((
                u64::from_be_bytes(k[..8].try_into().expect("8-byte outbox keys")),
                decode("outbox record", &v)?,
            ));
        }
        Ok(out)
    }

    /// Writes a batch atomically. Returns the outbox sequence numbers of its
    /// outputs (to delete once acknowledged).
    pub fn commit(&self, batch: &Batch) -> Result<std::ops::Range<u64>, StoreError> {
        let mut wb = WriteBatch::default();
        for (p, id, entry) in &batch.timeline {
            let slot = (entry.ordinal % TIMELINE_CAP) as u32;
            wb.put_cf(self.cf(TIMELINE), keys::timeline_entry(*p, id, slot), encode(entry));
        }
        for (p, id, total) in &batch.timeline_heads {
            wb.put_cf(self.cf(TIMELINE), keys::timeline_head(*p, id), total.to_be_bytes());
        }
        for (p, id, state) in &batch.ops {
            let key = keys::scoped(*p, id);
            match state {
                Some(s) => wb.put_cf(self.cf(OPS), key, encode(s)),
                None => {
                    wb.delete_cf(self.cf(OPS), key);
                    // Out of retention: its timeline goes with it.
                    wb.delete_range_cf(self.cf(TIMELINE), keys::timeline_head(*p, id), keys::timeline_end(*p, id));
                }
            }
        }
        for (p, id, state) in &batch.entities {
            wb.put_cf(self.cf(ENTITIES), keys::scoped(*p, id), encode(state));
        }
        for (p, at, op) in &batch.timers_removed {
            wb.delete_cf(self.cf(TIMERS), keys::timer(*p, *at, op));
        }
        for (p, t) in &batch.timers_added {
            wb.put_cf(self.cf(TIMERS), keys::timer(*p, t.at, &t.operation_id), encode(t));
        }
        for (p, next) in &batch.offsets {
            wb.put_cf(self.cf(OFFSETS), keys::partition_prefix(*p), next.to_be_bytes());
        }
        let n = batch.outbox.len() as u64;
        let first = self.next_outbox_seq.fetch_add(n, Ordering::SeqCst);
        for (i, rec) in batch.outbox.iter().enumerate() {
            wb.put_cf(self.cf(OUTBOX), (first + i as u64).to_be_bytes(), encode(rec));
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.sync);
        self.db.write_opt(wb, &wo)?;
        Ok(first..first + n)
    }

    /// Forgets outputs the broker acknowledged.
    pub fn ack_outbox(&self, seqs: std::ops::Range<u64>) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(self.cf(OUTBOX), seqs.start.to_be_bytes(), seqs.end.to_be_bytes());
        let mut wo = WriteOptions::default();
        wo.set_sync(self.sync);
        self.db.write_opt(wb, &wo)?;
        Ok(())
    }
}
