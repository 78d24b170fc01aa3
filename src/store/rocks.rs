//! The RocksDB implementation of the store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::encoded::{Encoded, Family, OpSummary, Part, StoredOp, StoredOpWithTimeline, Write};
use super::keys;
use super::restoring::Restoring;
use super::timeline::{Head, Timeline, TimelineEntry, TIMELINE_CAP};
use super::{Batch, TimerEntry};
use crate::config::StoreTuning;
use crate::core::{EntityState, OperationState};
use crate::records::ProducerRecord;

pub(super) const OPS: &str = "ops";
pub(super) const ENTITIES: &str = "entities";
pub(super) const TIMERS: &str = "timers";
pub(super) const OFFSETS: &str = "offsets";
const OUTBOX: &str = "outbox";
const META: &str = "meta";
pub(super) const TIMELINE: &str = "timeline";
const FAMILIES: [&str; 7] = [OPS, ENTITIES, TIMERS, OFFSETS, OUTBOX, META, TIMELINE];

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB failed (IO, a lock held by another process, ...).
    #[error("RocksDB: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// The volume of the state directory is full: RocksDB could not write
    /// there (the write-ahead log, a flush, a compaction). Nothing written
    /// after the last stored batch counts, and no offset past it was
    /// committed: the instance goes on from there once it has room.
    #[error(
        "the state directory {dir} is out of disk space: the state store needs free space on its volume to write; free some (or move the directory to a larger volume) and start again"
    )]
    NoSpace {
        /// The state directory.
        dir: String,
        /// RocksDB's error (the file it was writing).
        #[source]
        source: rocksdb::Error,
    },
    /// A value or key that does not decode: the store was damaged or
    /// written by something else.
    #[error("corrupt {what} in the state store: {reason}")]
    Corrupt {
        /// What was read.
        what: &'static str,
        /// Why it does not decode.
        reason: String,
    },
    /// The directory holds the state of another input topic.
    #[error("state directory {dir} belongs to input topic {found:?}, not {expected:?}")]
    WrongTopic {
        /// The state directory.
        dir: String,
        /// The input topic its state was built from.
        found: String,
        /// The input topic configured now.
        expected: String,
    },
    /// The directory is not a state store this version wrote.
    #[error(
        "state directory {dir} has no column family {family}: it was never opened by this version of `reconciler run`"
    )]
    MissingFamily {
        /// The state directory.
        dir: String,
        /// The column family missing.
        family: &'static str,
    },
    /// A changelog record written by a version with another store format.
    #[error("the changelog holds store format {found}, this version reads format {expected}")]
    ChangelogFormat {
        /// The format of the record.
        found: u32,
        /// The format this version reads.
        expected: u32,
    },
    /// The changelog holds the state of another input topic (two pipelines
    /// share one changelog topic name).
    #[error("the changelog holds the state of input topic {found:?}, not {expected:?}: give each input its own [topics] changelog")]
    ChangelogInput {
        /// The input its offsets record names.
        found: String,
        /// This store's input.
        expected: String,
    },
    /// The directory holds a store format this version does not read.
    #[error(
        "state directory {dir} holds store format {found}, this version reads format {expected}: rebuild it with `reconciler replay` into a new directory (or delete it to rebuild from the log)"
    )]
    Format {
        /// The state directory.
        dir: String,
        /// The format it holds.
        found: u32,
        /// The format this version reads.
        expected: u32,
    },
}

/// RocksDB's error `e` about the store in `dir`: [`StoreError::NoSpace`]
/// when its volume is full (RocksDB reports ENOSPC as an IO error with the
/// system's text for it), else as it came.
fn rocks_error(dir: &Path, e: rocksdb::Error) -> StoreError {
    if e.kind() == rocksdb::ErrorKind::IOError && e.to_string().contains("No space left on device") {
        StoreError::NoSpace { dir: dir.display().to_string(), source: e }
    } else {
        StoreError::Rocks(e)
    }
}

/// The layout of the values in the store. 2: an operation's value carries
/// its timeline total; the outbox holds one value per batch. 3: follow-ups,
/// requeue counts, scheduled retries and supersession in the operation;
/// operation counts and open operations in the entity. 4: an operation's
/// latest timeline entries in its value (see [`super::timeline`]), and no
/// timers in the changelog (see [`super::changelog`]). 5: a timeline
/// entry stores its body's fields, not their rendered summary, and names
/// its verdicts' and anomalies' event only when that is not its own (see
/// [`super::summary`]); an operation keeps an applied event's id once, in
/// its revision's record (`OperationState::seen_event_ids`). 6: an
/// operation's latest verdict follows its state, and names the timeline
/// entry that holds its id and reason rather than holding them again (see
/// [`super::encoded::LastVerdictRef`]); its state leaves out its id and
/// type, which its key and its summary hold. 7: a timeline entry stores a
/// verdict's reason as its template's number and arguments (see
/// [`super::reason`]). 8: a timeline entry names its own event by its
/// revision when that event claimed it (see [`super::stored_id`]), and a
/// request's fields as the operation's request when they are those (see
/// [`super::summary`]): the state holds both already. 9: an operation's
/// applied revisions store each event id as its 16 bytes when it is a
/// UUID, or as the length it shares with the previous revision's id and
/// the rest, and each body digest as its 8 bytes (`core::applied`); a
/// timeline entry stores its event time as its distance from the
/// operation's request time when the operation has one (see
/// [`super::event_time`]).
pub(super) const FORMAT: u32 = 9;

/// The size of a store ([`Store::size`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSize {
    /// Estimated keys per column family.
    pub keys: Vec<(&'static str, u64)>,
    /// Estimated bytes of live data in the store's files.
    pub live_file_bytes: u64,
    /// Bytes in memtables (not yet flushed).
    pub memtable_bytes: u64,
}

/// How a store makes its writes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logging {
    /// Every batch goes to the write-ahead log first (synced if `sync`):
    /// a crash keeps every batch the write returned for.
    Wal { sync: bool },
    /// No write-ahead log, flushes atomic across column families: a crash
    /// goes back to the last flush, with state and offsets together. For a
    /// rebuild, which starts over (or re-reads the log from the stored
    /// offsets) anyway: the input topic is the log.
    Rebuild,
}

/// The durable state of one reconciler instance.
pub struct Store {
    pub(super) db: DB,
    /// The state directory (named by errors about its volume).
    dir: std::path::PathBuf,
    logging: Logging,
    next_outbox_seq: AtomicU64,
    /// The input topic the state is of (its changelog's offsets records
    /// name it, see [`super::changelog`]).
    pub(super) topic: String,
    /// Per partition, the earliest due time of the timers written since
    /// the last [`Store::take_timer_puts`] (`i64::MIN` after a restore,
    /// which does not list them): whoever scans for due timers from a later
    /// point than a partition's start learns here where it must go back to
    /// (see `pipeline::timers`).
    timer_puts: Mutex<BTreeMap<i32, i64>>,
}

/// Keeps the earlier of `at` and the time `times` holds for `partition`.
fn keep_earliest(times: &mut BTreeMap<i32, i64>, partition: i32, at: i64) {
    times.entry(partition).and_modify(|t| *t = (*t).min(at)).or_insert(at);
}

/// A key and a value, as a write batch takes them.
pub(super) type KeyValue = (Vec<u8>, Vec<u8>);

/// A stored timeline entry of operation `op`, as readers see it.
fn decode_entry(bytes: &[u8], op: &OperationState) -> Result<TimelineEntry, StoreError> {
    super::timeline::decode_entry(bytes, op).map_err(|reason| StoreError::Corrupt { what: "timeline entry", reason })
}

fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt { what, reason: e.to_string() })
}

/// A fixed-size part read back (`part`), or the store is corrupt.
fn short<T>(what: &'static str, part: Option<T>, bytes: &[u8]) -> Result<T, StoreError> {
    part.ok_or_else(|| StoreError::Corrupt { what, reason: format!("{} bytes is too short", bytes.len()) })
}

/// Stored operation `id`'s value: its state and its timeline's head.
fn op_with_head(id: &str, bytes: &[u8]) -> Result<(OperationState, Head), StoreError> {
    decode::<StoredOpWithTimeline>("operation", bytes)?.split(id).map_err(corrupt_op)
}

/// A stored operation that decodes but could not have been written so
/// (`reason` says how).
fn corrupt_op(reason: &str) -> StoreError {
    StoreError::Corrupt { what: "operation", reason: reason.into() }
}

/// Stored operation `id`'s state alone (its latest verdict completed from
/// its timeline entry when the value keeps it there), without copying the
/// timeline's head.
fn state_of(id: &str, bytes: &[u8]) -> Result<OperationState, StoreError> {
    let (op, rest) = decode_with_rest::<StoredOp>("operation", bytes)?;
    op.into_state(id, rest).map_err(corrupt_op)
}

/// The operation id of an operations key (its state does not store it).
fn op_id(key: &[u8]) -> Result<&str, StoreError> {
    keys::scoped_id(key)
        .ok_or_else(|| StoreError::Corrupt { what: "operation key", reason: "not an operation id".into() })
}

/// Stored operation `id`'s value (`None`: not stored) as its state and its
/// timeline's head; one rule for the reads of one key and of many.
fn op_or_empty(id: &str, value: Option<&[u8]>) -> Result<(Option<OperationState>, Head), StoreError> {
    match value {
        Some(b) => op_with_head(id, b).map(|(state, head)| (Some(state), head)),
        None => Ok((None, Head::default())),
    }
}

/// A stored entity's value (`None`: not stored, no facts).
fn entity_or_empty(value: Option<&[u8]>) -> Result<EntityState, StoreError> {
    value.map(|b| decode("entity", b)).transpose().map(Option::unwrap_or_default)
}

/// Decodes a `T` from the start of `bytes`, ignoring the rest.
fn decode_prefix<'b, T: Deserialize<'b>>(what: &'static str, bytes: &'b [u8]) -> Result<T, StoreError> {
    decode_with_rest(what, bytes).map(|(v, _)| v)
}

/// Decodes a `T` from the start of `bytes`; the bytes after it.
fn decode_with_rest<'b, T: Deserialize<'b>>(what: &'static str, bytes: &'b [u8]) -> Result<(T, &'b [u8]), StoreError> {
    postcard::take_from_bytes(bytes).map_err(|e| StoreError::Corrupt { what, reason: e.to_string() })
}

impl Store {
    /// Opens (or creates) the store in `dir` for input topic `topic`, with
    /// the default memory budget.
    pub fn open(dir: &Path, topic: &str, sync: bool) -> Result<Store, StoreError> {
        Store::open_with(dir, topic, sync, &StoreTuning::default())
    }

    /// Opens (or creates) the store with the memory budget `tuning`.
    pub fn open_with(dir: &Path, topic: &str, sync: bool, tuning: &StoreTuning) -> Result<Store, StoreError> {
        Store::open_logged(dir, topic, Logging::Wal { sync }, tuning)
    }

    /// Opens (or creates) a store to rebuild by replaying the input topic
    /// (`reconciler replay`): its writes skip the write-ahead log, as
    /// Kafka Streams' and Flink's RocksDB state does (the input topic is
    /// the log), and its flushes are atomic, so a crash leaves the state
    /// of the last flush with the offsets that produced it. Call
    /// [`Store::flush`] when the rebuild is done.
    pub fn open_for_rebuild(dir: &Path, topic: &str, tuning: &StoreTuning) -> Result<Store, StoreError> {
        Store::open_logged(dir, topic, Logging::Rebuild, tuning)
    }

    fn open_logged(dir: &Path, topic: &str, logging: Logging, tuning: &StoreTuning) -> Result<Store, StoreError> {
        let mut opts = Options::default();
        opts.set_atomic_flush(logging == Logging::Rebuild);
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // No compression for what flushes write (level 0, rewritten soonest:
        // LZ4 there was ~4% of the pipeline's CPU); LZ4 for what compactions
        // write. Measured on the 1M-operation rebuild: half the disk (537 MB
        // against 988 MB), half the system time (fewer bytes through the
        // page cache) and ~8% more records/s than leaving level 1 plain.
        use rocksdb::DBCompressionType::{Lz4, None as Plain};
        opts.set_compression_per_level(&[Plain, Lz4, Lz4, Lz4, Lz4, Lz4, Lz4]);
        let cache = Cache::new_lru_cache(tuning.block_cache_mb.max(1) << 20);
        let table = |bloom: bool| {
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            if bloom {
                table.set_bloom_filter(10.0, false);
            }
            table
        };
        opts.set_block_based_table_factory(&table(false));
        let budget = tuning.write_buffer_mb.max(4) << 20;
        opts.set_db_write_buffer_size(budget);
        // Each family's memtable may take half the budget (the budget still
        // caps them all together): the busy families (operations, timeline)
        // then flush fewer, larger files, and a lookup has fewer level-0
        // files to check (~15% fewer instructions in lookups than a quarter).
        opts.set_write_buffer_size(budget / 2);
        opts.set_max_write_buffer_number(2);
        // Compact level 0 at 8 files rather than 4: each level-0 compaction
        // merges into all of the next level (new operations' keys spread
        // over the whole key range), so fewer, larger ones rewrite less.
        // Measured on the rebuild bench: ~12% less CPU, ~10% more records/s.
        opts.set_level_zero_file_num_compaction_trigger(8);
        let cfs = FAMILIES.iter().map(|n| {
            let mut cf = opts.clone();
            // Bloom filters where the hot path looks keys up one by one:
            // most of those lookups are for operations and entities not
            // stored yet (a new request), which a filter answers without
            // reading blocks. The other families are only scanned by range,
            // where a filter is never consulted: building one at every
            // flush and compaction only cost CPU and block cache.
            let looked_up = *n == OPS || *n == ENTITIES;
            cf.set_block_based_table_factory(&table(looked_up));
            if looked_up {
                // The same for the memtables: a lookup of a key not stored
                // yet otherwise walks each memtable's skip list, comparing
                // keys all the way down. (RocksDB's MultiGet skips the filter
                // of a memtable that holds a range delete, such as a
                // partition forgotten or restored: correct, just slower
                // until that memtable is flushed.)
                cf.set_memtable_whole_key_filtering(true);
                cf.set_memtable_prefix_bloom_ratio(0.05);
            }
            ColumnFamilyDescriptor::new(*n, cf)
        });
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| rocks_error(dir, e))?;
        let store = Store {
            db,
            dir: dir.to_owned(),
            logging,
            next_outbox_seq: AtomicU64::new(0),
            topic: topic.to_owned(),
            timer_puts: Mutex::default(),
        };
        if !store.topic_matches(dir, topic)? {
            store.db.put_cf(store.cf(META), b"topic", topic.as_bytes()).map_err(|e| rocks_error(dir, e))?;
        }
        store.check_format(dir)?;
        let last = store.db.iterator_cf(store.cf(OUTBOX), IteratorMode::End).next().transpose()?;
        let next = match last {
            Some((k, _)) => short("outbox key", keys::outbox_seq(&k), &k)? + 1,
            None => 0,
        };
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
        let store = Store {
            db,
            dir: dir.to_owned(),
            logging: Logging::Wal { sync: false },
            next_outbox_seq: AtomicU64::new(0),
            topic: topic.to_owned(),
            timer_puts: Mutex::default(),
        };
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
        self.db.put_cf(self.cf(META), b"format", FORMAT.to_be_bytes()).map_err(|e| rocks_error(dir, e))
    }

    /// An error unless the store is of [`FORMAT`] (or has applied nothing).
    fn format_matches(&self, dir: &Path) -> Result<(), StoreError> {
        let found = match self.db.get_cf(self.cf(META), b"format")? {
            Some(v) => short("format marker", keys::format_of(&v), &v)?,
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

    /// The partition that holds `operation_id`, found by its key alone:
    /// the value is not read, so a damaged one, in a partition a restore is
    /// still writing for instance, does not make the question fail (the
    /// HTTP API asks it to tell an operation another instance owns).
    pub fn op_partition(&self, operation_id: &str) -> Result<Option<i32>, StoreError> {
        for p in self.partitions()? {
            if self.db.get_pinned_cf(self.cf(OPS), keys::scoped(p, operation_id))?.is_some() {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// An operation's state, if `partition` holds it.
    pub fn get_op(&self, partition: i32, operation_id: &str) -> Result<Option<OperationState>, StoreError> {
        self.db
            .get_pinned_cf(self.cf(OPS), keys::scoped(partition, operation_id))?
            .map(|b| state_of(operation_id, &b))
            .transpose()
    }

    /// The timer index entry of stored operation value `value` of
    /// `partition` under `key` (key and value, as [`Batch::move_timer`]
    /// writes it), if it has a timer.
    pub(super) fn timer_of(&self, partition: i32, key: &[u8], value: &[u8]) -> Result<Option<KeyValue>, StoreError> {
        let (op, _) = decode_prefix::<StoredOp>("operation", value)?.into_named(op_id(key)?);
        Ok(op.timer_at.map(|at| {
            let key = keys::timer(partition, at, &op.operation_id);
            let entry = TimerEntry {
                at,
                operation_id: op.operation_id,
                entity_id: op.entity_id,
                operation_type: op.operation_type,
            };
            (key, postcard::to_allocvec(&entry).expect("timers serialize"))
        }))
    }

    /// An operation's state with its timeline's head (empty when there is
    /// no such operation).
    pub fn load_op(&self, partition: i32, operation_id: &str) -> Result<(Option<OperationState>, Head), StoreError> {
        op_or_empty(
            operation_id,
            self.db.get_pinned_cf(self.cf(OPS), keys::scoped(partition, operation_id))?.as_deref(),
        )
    }

    /// [`Store::load_op`] of each `(partition, operation_id)`, in one
    /// batched read (RocksDB's MultiGet: one snapshot, the memtables and
    /// each file's filter and index searched once for all the keys).
    /// `ids` in order (by partition, then id) are read without RocksDB
    /// sorting their keys first; any order gives the same result.
    pub fn load_ops(&self, ids: &[(i32, &str)]) -> Result<Vec<(Option<OperationState>, Head)>, StoreError> {
        self.multi_get(OPS, ids, op_or_empty)
    }

    /// [`Store::get_entity`] of each `(partition, entity_id)`, in one
    /// batched read (see [`Store::load_ops`]).
    pub fn get_entities(&self, ids: &[(i32, &str)]) -> Result<Vec<EntityState>, StoreError> {
        self.multi_get(ENTITIES, ids, |_, v| entity_or_empty(v))
    }

    /// The values of `ids`' keys in `family` (`None`: absent), each
    /// decoded by `read` with its id, in the order of `ids`.
    fn multi_get<T>(
        &self,
        family: &str,
        ids: &[(i32, &str)],
        read: impl Fn(&str, Option<&[u8]>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|(p, id)| keys::scoped(*p, id)).collect();
        // MultiGet sorts the keys unless told they are sorted (its sort
        // through the comparator was a tenth of a batch's reads); checked
        // here, so a caller's order is a saving, never a requirement.
        let sorted = keys.windows(2).all(|w| w[0] <= w[1]);
        // Sized up front: collecting `Result`s cannot tell the length, and
        // an operation's slot is large, so each doubling copied them all.
        let mut out = Vec::with_capacity(keys.len());
        for ((_, id), v) in ids.iter().zip(self.db.batched_multi_get_cf(self.cf(family), &keys, sorted)) {
            out.push(read(id, v?.as_deref())?);
        }
        Ok(out)
    }

    /// An entity's facts in `partition` (empty when it has none).
    pub fn get_entity(&self, partition: i32, entity_id: &str) -> Result<EntityState, StoreError> {
        entity_or_empty(self.db.get_pinned_cf(self.cf(ENTITIES), keys::scoped(partition, entity_id))?.as_deref())
    }

    /// The next offset to consume in `partition`, if any was applied.
    pub fn next_offset(&self, partition: i32) -> Result<Option<i64>, StoreError> {
        self.db
            .get_cf(self.cf(OFFSETS), keys::partition_prefix(partition))?
            .map(|b| short("offset", keys::offset_of(&b), &b))
            .transpose()
    }

    /// Timers of `partition` due at or before `now`, earliest first.
    pub fn due_timers(&self, partition: i32, now: i64, limit: usize) -> Result<Vec<TimerEntry>, StoreError> {
        self.due_timers_from(partition, i64::MIN, now, limit)
    }

    /// Timers of `partition` due from `from` to `now` (both included),
    /// earliest first. Starting past the timers already fired spares the
    /// seek their deletions: every timer moved or fired leaves a tombstone
    /// in front of the live ones until a compaction drops it, and a seek
    /// from the partition's start steps over all of them (half of the
    /// timer scan's samples in a run that fires many).
    pub fn due_timers_from(
        &self,
        partition: i32,
        from: i64,
        now: i64,
        limit: usize,
    ) -> Result<Vec<TimerEntry>, StoreError> {
        let start = keys::timer_from(partition, from);
        let upper = keys::timer_upper(partition, now);
        let mut out = Vec::new();
        // An upper bound rather than a check of each key: timers are put and
        // deleted all the time, and without the bound an iterator that
        // finds nothing due steps over every deleted timer of the
        // partition, due or not, until it reaches a live key (or the next
        // partition's).
        let mut bounded = rocksdb::ReadOptions::default();
        bounded.set_iterate_upper_bound(upper);
        let it = self.db.iterator_cf_opt(self.cf(TIMERS), bounded, IteratorMode::From(&start, Direction::Forward));
        for item in it.take(limit) {
            let (_, v) = item?;
            out.push(decode("timer", &v)?);
        }
        Ok(out)
    }

    /// The earliest due time of the timers written to each partition since
    /// the last call (only writes that completed).
    pub fn take_timer_puts(&self) -> BTreeMap<i32, i64> {
        std::mem::take(&mut *self.timer_puts.lock().expect("not poisoned"))
    }

    /// Notes a write of any timers of `partition` (a restore's, which
    /// moves timers without listing them): its scans start over.
    pub(super) fn note_rewritten(&self, partition: i32) {
        keep_earliest(&mut self.timer_puts.lock().expect("not poisoned"), partition, i64::MIN);
    }

    /// Notes timers written (after the write, never before: a scan that
    /// learned of a timer before it was written could pass it by).
    fn note_timer_puts(&self, puts: BTreeMap<i32, i64>) {
        if puts.is_empty() {
            return;
        }
        let mut notes = self.timer_puts.lock().expect("not poisoned");
        for (p, at) in puts {
            keep_earliest(&mut notes, p, at);
        }
    }

    /// How big the store is now, by RocksDB's own estimates: keys per
    /// column family, bytes of live data in its files, bytes in memtables.
    pub fn size(&self) -> Result<StoreSize, StoreError> {
        let mut size = StoreSize::default();
        for family in FAMILIES {
            let cf = self.cf(family);
            let prop = |name: &str| self.db.property_int_value_cf(cf, name).map(|v| v.unwrap_or(0));
            size.keys.push((family, prop("rocksdb.estimate-num-keys")?));
            size.live_file_bytes += prop("rocksdb.estimate-live-data-size")?;
            size.memtable_bytes += prop("rocksdb.cur-size-all-mem-tables")?;
        }
        Ok(size)
    }

    /// The exact number of keys in each column family, by reading them all:
    /// for benchmarks and diagnostics, not for a hot path.
    pub fn key_counts(&self) -> Result<Vec<(&'static str, u64)>, StoreError> {
        let mut out = Vec::new();
        for family in FAMILIES {
            let mut it = self.db.raw_iterator_cf(self.cf(family));
            it.seek_to_first();
            let mut n = 0;
            while it.valid() {
                n += 1;
                it.next();
            }
            it.status()?;
            out.push((family, n));
        }
        Ok(out)
    }

    /// Whether the timer index holds `operation_id`'s timer at `at`.
    pub fn timer_indexed(&self, partition: i32, at: i64, operation_id: &str) -> Result<bool, StoreError> {
        Ok(self.db.get_pinned_cf(self.cf(TIMERS), keys::timer(partition, at, operation_id))?.is_some())
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
        self.scan_op_values(partition, |key, v| Ok(visit(state_of(op_id(key)?, v)?)))
    }

    /// Visits the summaries of the operations of `partition` (decoding
    /// nothing else); stops early when `visit` returns false. Each summary
    /// borrows its type from the stored value, valid during the call.
    pub fn scan_summaries(
        &self,
        partition: i32,
        mut visit: impl FnMut(OpSummary<&str>) -> bool,
    ) -> Result<(), StoreError> {
        self.scan_op_values(partition, |_, v| {
            let (_, summary) = decode_prefix::<(u64, OpSummary<&str>)>("operation", v)?;
            Ok(visit(summary))
        })
    }

    /// The stored values of the operations of `partition` with their keys
    /// ([`op_id`] reads the id, which the summaries' scan does not need),
    /// in key order, until `visit` returns false.
    fn scan_op_values(
        &self,
        partition: i32,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let prefix = keys::partition_prefix(partition);
        // A scan of every operation (the metrics sampler's, the review
        // queue's) reads blocks the pipeline may never read again: kept out
        // of the block cache, it neither evicts the pipeline's hot blocks
        // nor fills the cache up to its budget on its own.
        let mut once = rocksdb::ReadOptions::default();
        once.fill_cache(false);
        // Keys and values borrowed from the iterator: the boxed copies of
        // `iterator_cf_opt` were two allocations and a copy of the whole
        // value per operation, for a scan that mostly reads its summary.
        let mut it = self.db.raw_iterator_cf_opt(self.cf(OPS), once);
        it.seek(prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !k.starts_with(&prefix) || !visit(k, v)? {
                return Ok(());
            }
            it.next();
        }
        Ok(it.status()?)
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
            out.push(short("offset key", keys::partition_of(&k), &k)?);
        }
        Ok(out)
    }

    /// How many timeline entries `operation_id` has received in all.
    #[cfg(test)]
    pub(crate) fn timeline_total(&self, partition: i32, operation_id: &str) -> Result<u64, StoreError> {
        Ok(self.load_op(partition, operation_id)?.1.total)
    }

    /// An operation's retained timeline, in arrival order: the entries out
    /// of its value (the ring slots of those still retained), then those in
    /// it.
    pub fn timeline(&self, partition: i32, operation_id: &str) -> Result<Timeline, StoreError> {
        // One snapshot for both reads: a batch written in between (the API
        // reads while the pipeline writes) could move entries out of the
        // value into ring slots read before it.
        let snapshot = self.db.snapshot();
        let Some(b) = snapshot.get_cf(self.cf(OPS), keys::scoped(partition, operation_id))? else {
            return Ok(Timeline::default());
        };
        let (op, head) = op_with_head(operation_id, &b)?;
        let retained = head.total.saturating_sub(TIMELINE_CAP)..head.first_inline();
        let mut entries: Vec<TimelineEntry> = Vec::new();
        if !retained.is_empty() {
            let start = keys::timeline_entry(partition, operation_id, 0);
            let end = keys::timeline_end(partition, operation_id);
            for item in snapshot.iterator_cf(self.cf(TIMELINE), IteratorMode::From(&start, Direction::Forward)) {
                let (k, v) = item?;
                if k.as_ref() >= end.as_slice() {
                    break;
                }
                // A slot may still hold an entry the ring has moved past:
                // left unread (what it names may no longer be in the state).
                let ordinal = decode_prefix::<u64>("timeline entry", &v)?;
                if retained.contains(&ordinal) {
                    entries.push(decode_entry(&v, &op)?);
                }
            }
            entries.sort_by_key(|e| e.ordinal);
        }
        for v in &head.latest {
            entries.push(decode_entry(v, &op)?);
        }
        Ok(Timeline { total: head.total, entries })
    }

    /// Every key and value of the operation and entity state, in key order
    /// (for digests): `f(family, key, value, verdict)`, an operation's value
    /// without its timeline entries (the digest leaves timelines out), and
    /// `verdict` its latest verdict's id and reason when one of those
    /// entries holds them rather than the value (the digest covers them).
    pub fn scan_state(&self, mut f: impl FnMut(&str, &[u8], &[u8], Option<(&str, &str)>)) -> Result<(), StoreError> {
        for family in [OPS, ENTITIES] {
            for item in self.db.iterator_cf(self.cf(family), IteratorMode::Start) {
                let (k, v) = item?;
                if family != OPS {
                    f(family, &k, &v, None);
                    continue;
                }
                let (op, rest) = decode_with_rest::<StoredOp>("operation", &v)?;
                let verdict = op.verdict_in_entry(rest).map_err(corrupt_op)?;
                let state = &v[..v.len() - rest.len()];
                f(family, &k, state, verdict.as_ref().map(|(id, reason)| (id.as_str(), reason.as_str())));
            }
        }
        Ok(())
    }

    /// Every key and value of every partition's state (operations,
    /// entities, timers, timelines, offsets), by family in key order: what a
    /// changelog restore must reproduce (tests, diagnostics).
    pub fn scan_partitions_state(&self, mut f: impl FnMut(&str, &[u8], &[u8])) -> Result<(), StoreError> {
        for family in [OPS, ENTITIES, TIMERS, TIMELINE, OFFSETS] {
            for item in self.db.iterator_cf(self.cf(family), IteratorMode::Start) {
                let (k, v) = item?;
                f(family, &k, &v);
            }
        }
        Ok(())
    }

    /// Outputs written but not yet acknowledged by the broker, in order,
    /// each with the outbox sequence number of its batch.
    pub fn pending_outbox(&self) -> Result<Vec<(u64, ProducerRecord)>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(OUTBOX), IteratorMode::Start) {
            let (k, v) = item?;
            let seq = short("outbox key", keys::outbox_seq(&k), &k)?;
            let records: Vec<ProducerRecord> = decode("outbox batch", &v)?;
            out.extend(records.into_iter().map(|r| (seq, r)));
        }
        Ok(out)
    }

    /// Writes a batch atomically; see [`Store::write_encoded`].
    pub fn commit(&self, batch: Batch) -> Result<std::ops::Range<u64>, StoreError> {
        self.write_encoded(&batch.encode(None))
    }

    /// Writes an encoded batch: each part atomically (its partitions' state
    /// and offsets, and its outputs as one outbox value), the parts in
    /// parallel. A crash may thus keep some parts and lose others; each
    /// partition is then either all written or consumed again from its own
    /// stored offset, which gives the same result. Returns the outbox
    /// sequence numbers of the outputs (to forget once acknowledged): one
    /// per part with outputs, in part order.
    pub fn write_encoded(&self, batch: &Encoded) -> Result<std::ops::Range<u64>, StoreError> {
        let with_outputs = batch.parts.iter().filter(|p| !p.outbox.is_empty()).count() as u64;
        let first = if with_outputs == 0 { 0 } else { self.next_outbox_seq.fetch_add(with_outputs, Ordering::SeqCst) };
        let mut next = first;
        let mut seq_of = |p: &Part| {
            (!p.outbox.is_empty()).then(|| {
                next += 1;
                next - 1
            })
        };
        let jobs: Vec<_> = batch
            .parts
            .iter()
            .map(|part| {
                let seq = seq_of(part);
                move || self.write_part(part, seq)
            })
            .collect();
        crate::parallel::run_all(jobs).into_iter().collect::<Result<(), _>>()?;
        Ok(first..first + with_outputs)
    }

    /// Writes one part as one atomic write, its outbox under `seq`.
    fn write_part(&self, part: &Part, seq: Option<u64>) -> Result<(), StoreError> {
        // The part's whole outbox as one value: one memtable entry rather
        // than one per output. Its buffer sized up front (grown a byte at
        // a time, its copies and fresh pages showed in profiles).
        let outbox = seq.map(|seq| {
            let kept = part.stored_outbox();
            let size = 8 + kept.iter().map(|r| r.stored_size()).sum::<usize>();
            let mut value = Vec::with_capacity(size);
            super::append::append(&mut value, &kept);
            (keys::outbox(seq), value)
        });
        // Room for every key and value plus RocksDB's few bytes of framing
        // each: the batch's buffer is then never copied to grow.
        let outbox_bytes = outbox.as_ref().map_or(0, |(k, v)| k.len() + v.len() + 16);
        let mut wb = WriteBatch::with_capacity_bytes(part.bytes.len() + 16 * part.writes.len() + 64 + outbox_bytes);
        // Handles looked up once, not per write (each is a lookup by name).
        let families = [Family::Timeline, Family::Ops, Family::Entities, Family::Timers, Family::Offsets]
            .map(|f| (f, self.cf(f.name())));
        let cf = |family: Family| families.iter().find(|(f, _)| *f == family).expect("every family").1;
        let bytes = &part.bytes;
        let mut timers = BTreeMap::new();
        for w in &part.writes {
            match w {
                Write::Put { family, key, value } => {
                    let key = &bytes[key.clone()];
                    if let Some((p, at)) = (*family == Family::Timers).then(|| keys::timer_due(key)).flatten() {
                        keep_earliest(&mut timers, p, at);
                    }
                    wb.put_cf(cf(*family), key, &bytes[value.clone()])
                }
                Write::Delete { family, key } => wb.delete_cf(cf(*family), &bytes[key.clone()]),
                Write::DeleteRange { family, from, to, .. } => {
                    wb.delete_range_cf(cf(*family), &bytes[from.clone()], &bytes[to.clone()])
                }
            }
        }
        if let Some((key, value)) = outbox {
            wb.put_cf(self.cf(OUTBOX), key, value);
        }
        self.write(wb)?;
        self.note_timer_puts(timers);
        Ok(())
    }

    /// Forgets outputs the broker acknowledged.
    pub fn ack_outbox(&self, seqs: std::ops::Range<u64>) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(self.cf(OUTBOX), keys::outbox(seqs.start), keys::outbox(seqs.end));
        self.write(wb)
    }

    /// Writes `wb` atomically (logged and synced as the store was opened).
    pub(super) fn write(&self, wb: WriteBatch) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        match self.logging {
            Logging::Wal { sync } => wo.set_sync(sync),
            Logging::Rebuild => wo.disable_wal(true),
        }
        self.db.write_opt(wb, &wo).map_err(|e| rocks_error(&self.dir, e))
    }

    /// The stored bytes of `key` in `family`, if any.
    pub(super) fn get_raw(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db.get_cf(self.cf(family.name()), key)?)
    }

    /// Starts restoring `partition` from its changelog (see [`Restoring`]).
    pub fn restoring(&self, partition: i32) -> Restoring<'_> {
        Restoring::new(self, partition)
    }

    /// Forgets everything the store holds of `partition`: its next
    /// assignment restores it (from the changelog, else the input).
    pub fn forget_partition(&self, partition: i32) -> Result<(), StoreError> {
        let mut wb = WriteBatch::default();
        self.wipe_partition(partition, &mut wb);
        self.write(wb)
    }

    /// Deletes everything the store holds of `partition` (not yet durable:
    /// `wb` is written by the caller).
    pub(super) fn wipe_partition(&self, partition: i32, wb: &mut WriteBatch) {
        let (from, to) = (keys::partition_prefix(partition), ((partition as u32) + 1).to_be_bytes());
        for family in [TIMELINE, OPS, ENTITIES, TIMERS, OFFSETS] {
            wb.delete_range_cf(self.cf(family), from, to);
        }
    }

    /// Writes every memtable to disk and waits for it: what a store opened
    /// for a rebuild holds is durable from then on.
    pub fn flush(&self) -> Result<(), StoreError> {
        let families: Vec<_> = FAMILIES.iter().map(|f| self.cf(f)).collect();
        self.db.flush_cfs_opt(&families, &rocksdb::FlushOptions::default()).map_err(|e| rocks_error(&self.dir, e))
    }
}
