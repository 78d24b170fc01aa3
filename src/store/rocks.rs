//! The RocksDB implementation of the store.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::keys;
use super::timeline::{Timeline, TimelineEntry, TIMELINE_CAP};
use super::{Batch, OutboxRecord, TimerEntry, Tuning};
use crate::core::{EntityState, OperationState, Status};

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
    #[error(
        "state directory {dir} holds store format {found}, this version reads format {expected}: rebuild it with `reconciler replay` into a new directory (or delete it to rebuild from the log)"
    )]
    Format { dir: String, found: u32, expected: u32 },
}

/// The layout of the values in the store. 2: an operation's value carries
/// its timeline total; the outbox holds one value per batch.
const FORMAT: u32 = 2;

/// An operation as stored: how many timeline entries it has received in
/// all (read with the state, so recording the timeline needs no read of its
/// own), the few fields the metrics scan reads (decoded without the rest),
/// then the state.
#[derive(Serialize)]
struct StoredOpRef<'a> {
    timeline_total: u64,
    summary: OpSummary,
    state: &'a OperationState,
}

#[derive(Deserialize)]
struct StoredOp {
    timeline_total: u64,
    _summary: OpSummary,
    state: OperationState,
}

/// What the state gauges need of an operation; stored in front of its
/// state so that a scan decodes only this (no event ids, no held events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSummary {
    pub operation_type: String,
    pub status: Status,
    pub requested_at: Option<i64>,
    /// When it entered manual review (else its last event time).
    pub review_since: i64,
}

impl OpSummary {
    fn of(op: &OperationState) -> OpSummary {
        OpSummary {
            operation_type: op.operation_type.clone(),
            status: op.status,
            requested_at: op.request.as_ref().map(|r| r.requested_at),
            review_since: op.review_since.unwrap_or(op.last_event_at),
        }
    }
}

/// Writes in key order; a stable sort, so of two writes to one key the
/// later still wins.
fn by_key<'a, T: ?Sized>(items: impl Iterator<Item = (Vec<u8>, &'a T)>) -> Vec<(Vec<u8>, &'a T)> {
    let mut v: Vec<_> = items.collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// One reusable buffer for the values of a batch: postcard's own
/// `to_allocvec` grows a new vector per value.
struct Encoder(Vec<u8>);

impl Encoder {
    fn bytes<T: Serialize + ?Sized>(&mut self, v: &T) -> &[u8] {
        let mut buf = std::mem::take(&mut self.0);
        buf.clear();
        self.0 = postcard::to_extend(v, buf).expect("state types serialize");
        &self.0
    }
}

/// The durable state of one reconciler instance.
pub struct Store {
    pub(super) db: DB,
    sync: bool,
    next_outbox_seq: AtomicU64,
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

/// Decodes a `T` from the start of `bytes`, ignoring the rest.
fn decode_prefix<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::take_from_bytes(bytes).map(|(v, _)| v).map_err(|source| StoreError::Corrupt { what, source })
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
        // No compression for the levels that are rewritten soonest (flushes
        // and L0→L1 compactions): LZ4 there was ~4% of the pipeline's CPU.
        // Deeper levels, where the bulk of the data settles, use LZ4.
        use rocksdb::DBCompressionType::{Lz4, None as Plain};
        opts.set_compression_per_level(&[Plain, Plain, Lz4, Lz4, Lz4, Lz4, Lz4]);
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
        if !store.topic_matches(dir, topic)? {
            store.db.put_cf(store.cf(META), b"topic", topic.as_bytes())?;
        }
        store.check_format(dir)?;
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
        store.topic_matches(dir, topic)?;
        // A reader must not misread another version's values either.
        store.format_matches(dir)?;
        Ok(store)
    }

    /// An error if the store belongs to another input topic; whether it
    /// names one at all (a new store does not yet).
    fn topic_matches(&self, dir: &Path, topic: &str) -> Result<bool, StoreError> {
        match self.db.get_cf(self.cf(META), b"topic")? {
            Some(found) if found != topic.as_bytes() => Err(StoreError::WrongTopic {
                dir: dir.display().to_string(),
                found: String::from_utf8_lossy(&found).into_owned(),
                expected: topic.to_owned(),
            }),
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }

    /// Refuses a store written in another format; marks a new one.
    fn check_format(&self, dir: &Path) -> Result<(), StoreError> {
        self.format_matches(dir)?;
        self.db.put_cf(self.cf(META), b"format", FORMAT.to_be_bytes())?;
        Ok(())
    }

    /// An error unless the store is of [`FORMAT`] (or has applied nothing).
    fn format_matches(&self, dir: &Path) -> Result<(), StoreError> {
        let found = match self.db.get_cf(self.cf(META), b"format")? {
            Some(v) => u32::from_be_bytes(v[..4].try_into().expect("4-byte format")),
            // Before the marker: format 1, unless nothing was ever applied.
            None if self.partitions()?.is_empty() => FORMAT,
            None => 1,
        };
        if found != FORMAT {
            return Err(StoreError::Format { dir: dir.display().to_string(), found, expected: FORMAT });
        }
        Ok(())
    }

    /// A secondary instance: reads what the primary wrote since the last call.
    pub fn catch_up(&self) -> Result<(), StoreError> {
        self.db.try_catch_up_with_primary()?;
        Ok(())
    }

    pub(super) fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    pub fn get_op(&self, partition: i32, operation_id: &str) -> Result<Option<OperationState>, StoreError> {
        Ok(self.load_op(partition, operation_id)?.0)
    }

    /// An operation's state with the number of timeline entries it has
    /// received in all (0 when there is no such operation).
    pub fn load_op(&self, partition: i32, operation_id: &str) -> Result<(Option<OperationState>, u64), StoreError> {
        let stored = self
            .db
            .get_pinned_cf(self.cf(OPS), keys::scoped(partition, operation_id))?
            .map(|b| decode::<StoredOp>("operation", &b))
            .transpose()?;
        Ok(stored.map_or((None, 0), |s| (Some(s.state), s.timeline_total)))
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
        self.scan_op_values(partition, |v| Ok(visit(decode::<StoredOp>("operation", v)?.state)))
    }

    /// Visits the summaries of the operations of `partition` (decoding
    /// nothing else); stops early when `visit` returns false.
    pub fn scan_summaries(&self, partition: i32, mut visit: impl FnMut(OpSummary) -> bool) -> Result<(), StoreError> {
        self.scan_op_values(partition, |v| {
            let (_, summary) = decode_prefix::<(u64, OpSummary)>("operation", v)?;
            Ok(visit(summary))
        })
    }

    /// The stored values of the operations of `partition`, in key order,
    /// until `visit` returns false.
    fn scan_op_values(
        &self,
        partition: i32,
        mut visit: impl FnMut(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let prefix = keys::partition_prefix(partition);
        for item in self.db.iterator_cf(self.cf(OPS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || !visit(&v)? {
                break;
            }
        }
        Ok(())
    }

    /// How many outputs are stored but not yet acknowledged (each batch's
    /// value starts with its record count).
    pub fn outbox_len(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut it = self.db.raw_iterator_cf(self.cf(OUTBOX));
        it.seek_to_first();
        while let Some(v) = it.value() {
            n += decode_prefix::<u64>("outbox batch", v)? as usize;
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
        Ok(self.load_op(partition, operation_id)?.1)
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

    /// Outputs written but not yet acknowledged by the broker, in order,
    /// each with the outbox sequence number of its batch.
    pub fn pending_outbox(&self) -> Result<Vec<(u64, OutboxRecord)>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(OUTBOX), IteratorMode::Start) {
            let (k, v) = item?;
            let seq = u64::from_be_bytes(k[..8].try_into().expect("8-byte outbox keys"));
            let records: Vec<OutboxRecord> = decode("outbox batch", &v)?;
            out.extend(records.into_iter().map(|r| (seq, r)));
        }
        Ok(out)
    }

    /// Writes a batch atomically. Returns the outbox sequence numbers of its
    /// outputs (to forget once acknowledged): one per batch, none when the
    /// batch has no outputs.
    pub fn commit(&self, batch: &Batch) -> Result<std::ops::Range<u64>, StoreError> {
        let mut wb = WriteBatch::default();
        let mut enc = Encoder(Vec::with_capacity(1024));
        // Handles looked up once, not per write (each is a lookup by name).
        let (timeline_cf, ops_cf, entities_cf, timers_cf) =
            (self.cf(TIMELINE), self.cf(OPS), self.cf(ENTITIES), self.cf(TIMERS));
        // Each family's writes go in in key order: the memtable's skip list
        // then finds every insert next to the previous one (unsorted, the
        // skip list's searches were a fifth of the rebuild's CPU).
        let timeline = by_key(
            batch
                .timeline
                .iter()
                .map(|(p, id, entry)| (keys::timeline_entry(*p, id, (entry.ordinal % TIMELINE_CAP) as u32), entry)),
        );
        for (key, entry) in timeline {
            wb.put_cf(timeline_cf, key, enc.bytes(entry));
        }
        for (key, (p, id, state, timeline_total)) in by_key(batch.ops.iter().map(|op| (keys::scoped(op.0, &op.1), op)))
        {
            match state {
                Some(state) => wb.put_cf(
                    ops_cf,
                    key,
                    enc.bytes(&StoredOpRef { timeline_total: *timeline_total, summary: OpSummary::of(state), state }),
                ),
                None => {
                    wb.delete_cf(ops_cf, key);
                    // Out of retention: its timeline goes with it (after
                    // this batch's entries, which it removes too).
                    wb.delete_range_cf(timeline_cf, keys::timeline_head(*p, id), keys::timeline_end(*p, id));
                }
            }
        }
        for (key, (_, _, state)) in by_key(batch.entities.iter().map(|e| (keys::scoped(e.0, &e.1), e))) {
            wb.put_cf(entities_cf, key, enc.bytes(state));
        }
        for (key, _) in by_key(batch.timers_removed.iter().map(|(p, at, op)| (keys::timer(*p, *at, op), &()))) {
            wb.delete_cf(timers_cf, key);
        }
        for (key, (_, t)) in by_key(batch.timers_added.iter().map(|e| (keys::timer(e.0, e.1.at, &e.1.operation_id), e)))
        {
            wb.put_cf(timers_cf, key, enc.bytes(t));
        }
        for (p, next) in &batch.offsets {
            wb.put_cf(self.cf(OFFSETS), keys::partition_prefix(*p), next.to_be_bytes());
        }
        // The whole outbox of the batch as one value: one memtable entry
        // per batch rather than one per output.
        let seqs = if batch.outbox.is_empty() {
            0..0
        } else {
            let seq = self.next_outbox_seq.fetch_add(1, Ordering::SeqCst);
            wb.put_cf(self.cf(OUTBOX), seq.to_be_bytes(), enc.bytes(&batch.outbox));
            seq..seq + 1
        };
        self.write(wb)?;
        Ok(seqs)
    }

    /// Forgets outputs the broker acknowledged.
    pub fn ack_outbox(&self, seqs: std::ops::Range<u64>) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(self.cf(OUTBOX), seqs.start.to_be_bytes(), seqs.end.to_be_bytes());
        self.write(wb)
    }

    /// Writes `wb` atomically (synced when the store was opened so).
    fn write(&self, wb: WriteBatch) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(self.sync);
        self.db.write_opt(wb, &wo)?;
        Ok(())
    }
}
