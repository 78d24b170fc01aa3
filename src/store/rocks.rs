//! The RocksDB implementation of the store.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::keys;
use super::{Batch, OutboxRecord, TimerEntry, Tuning};
use crate::core::{EntityState, OperationState};

const OPS: &str = "ops";
const ENTITIES: &str = "entities";
const TIMERS: &str = "timers";
const OFFSETS: &str = "offsets";
const OUTBOX: &str = "outbox";
const META: &str = "meta";
const FAMILIES: [&str; 6] = [OPS, ENTITIES, TIMERS, OFFSETS, OUTBOX, META];

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt {what} in the state store: {source}")]
    Corrupt { what: &'static str, source: postcard::Error },
    #[error("state directory {dir} belongs to input topic {found:?}, not {expected:?}")]
    WrongTopic { dir: String, found: String, expected: String },
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
        let prefix = keys::partition_prefix(partition);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(OPS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push(decode("operation", &v)?);
        }
        Ok(out)
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
    pub fn commit(&self, batch: Batch) -> Result<std::ops::Range<u64>, StoreError> {
        let mut wb = WriteBatch::default();
        for (p, id, state) in &batch.ops {
            let key = keys::scoped(*p, id);
            match state {
                Some(s) => wb.put_cf(self.cf(OPS), key, encode(s)),
                None => wb.delete_cf(self.cf(OPS), key),
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
