//! Restore on rebalance, and the zombie fence.
//!
//! # Restore
//!
//! Each instance keeps its own RocksDB, and in it the next offset it applied
//! of every partition it ever owned. When a partition moves to an instance,
//! that local copy may be missing (offset 0) or stale (the partition was
//! owned here earlier and processed elsewhere since). Re-processing the gap
//! normally would be *correct* (the core is deterministic: every output is
//! byte-identical to the one the previous owner published) but would flood
//! downstream with every old verdict again.
//!
//! So on assignment the consumer also reads the group's committed offset of
//! the partition. The pipeline commits a group offset only after the outputs
//! of every record below it were acknowledged by the broker (see
//! `Pipeline::finish_in_flight`; a member whose partitions are revoked
//! finishes its batches in flight and commits before releasing them), so
//! everything below the committed offset has
//! already been published by some owner. The new owner therefore applies the
//! records from its local offset up to the committed offset to its state
//! **without publishing** (outputs and dead letters dropped), then processes
//! normally from there. The restore target is below the high watermark at
//! assignment, so a restoring partition counts as not caught up: `/readyz`
//! says not ready until it is done, and its timers do not fire (the
//! pipeline's catch-up rule), so a restore never publishes a
//! `DeadlineReached` twice.
//!
//! Guarantee: after a partition moves, the new owner's state at offset `n`
//! equals the state an uninterrupted single instance would have at `n`
//! (state is a function of the log prefix), and the outputs it publishes
//! start at the group's committed offset. Outputs between the committed
//! offset and what the previous owner had published are published again,
//! byte-identical with the same ids (at-least-once delivery). If the
//! committed offset cannot be read, nothing is restored silently: the
//! partition is processed from the local offset with publishing, which only
//! repeats byte-identical outputs.
//!
//! (Under `exactly_once` the committed offset moves only with a committed
//! transaction, so the same holds there.)
//!
//! # From the changelog
//!
//! Replaying the input needs its whole history since the local offset: on
//! a new machine that is the whole topic, which retention deletes (and
//! which takes hours to replay at scale). So before any of that, a
//! partition whose local state is missing or behind the group's committed
//! offset is restored from the state changelog ([`crate::store::changelog`],
//! [`Restorer::start_offset`]): its changelog partition is read to the end
//! into the store, replacing what the store held of it, and consumption
//! starts at the offset the changelog records. The changelog of a batch is
//! published only after the batch's outputs are acknowledged, and the
//! group offset is committed only after that, so the changelog's offset is
//! at or past the committed one: nothing is left to restore silently, and
//! nothing the changelog holds lacks its published outputs. An empty
//! changelog (none yet, or none configured) leaves the input replay above.
//! The full rebuild stays `replay`.
//!
//! Local state is kept only while the changelog holds everything it holds:
//! changelog records that could not be published (a crash before, or the
//! partition revoked meanwhile) make the instance forget the partition's
//! local state, so that it is restored from the changelog (and its batches
//! since re-applied, byte-identical) rather than kept with changes the
//! changelog lacks.
//!
//! # Zombie fence
//!
//! A member that stalls (SIGSTOP, swap, a long GC-like pause) longer than
//! `session.timeout.ms` is expelled from the group, and its partitions go to
//! another member; when it resumes it may hold a batch built before the
//! stall. Before a batch is written, [`Fence::check`] drops it when
//! librdkafka reports the assignment lost, or when more than the session
//! timeout passed since the run loop's *previous* poll (so a stop before or
//! during this poll is caught too: after a resume the fetcher may hand out
//! records before the heartbeat learns of the expulsion). The member cannot
//! know whether it is still a member without a heartbeat, and a loop
//! iteration is never that slow otherwise; a false alarm only re-consumes
//! the batch. A dropped batch writes nothing, and its partitions are
//! rewound to their stored offsets, so it is consumed again if the
//! partitions are still ours. What remains: a member that stops *after* the
//! check and before its publish completes writes that one batch's state and
//! outputs. The state is local (the next owner restores from the log, not
//! from it) and the outputs are byte-identical to the ones the new owner
//! publishes for the same offsets, so no reader sees a divergent verdict.
//! Under `guarantee = "exactly_once"` the rule is checked again right
//! before the transaction commits, and the broker fences the rest (see
//! [`crate::kafka::transaction`]); the same restore path also mends a store
//! one batch behind its committed transaction (see `exactly_once.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::OnLostPosition;
use crate::kafka::producer::Publisher;
use crate::kafka::reader::{stream_partition, StreamError};
use crate::kafka::watermarks::Watermarks;
use crate::kafka::KafkaError;
use crate::metrics::{Metrics, RestoreSource};
use crate::store::{Claims, Restored, Store, StoreError, Tail};

/// Restores partitions from the state changelog on assignment.
pub struct Restorer {
    /// The `[kafka]` settings.
    pub kafka: BTreeMap<String, String>,
    /// The changelog topic; `None`: no changelog.
    pub topic: Option<String>,
    /// This process created the changelog topic at start-up: a partition
    /// the group has no committed offset for has nothing in it worth a
    /// query (anything another member wrote since is of batches it did
    /// not commit, which are applied again anyway).
    pub created: bool,
    /// Its watermark queries.
    pub watermarks: Arc<Watermarks>,
    /// The store restored into.
    pub store: Arc<Store>,
    /// Where restores are counted.
    pub metrics: Arc<Metrics>,
    /// Wall clock: when a restore started, for its gauge.
    pub clock: Clock,
    /// A restore that makes no progress for this long fails.
    pub stall: Duration,
    /// Publishes the undo of a batch cut short (`None` under
    /// `exactly_once`, where none can be).
    pub undo: Option<Arc<Publisher>>,
    /// The partitions the pipeline writes: an assigned partition is
    /// claimed before its offset is read, so that a standby replica of it
    /// here stops writing first.
    pub claims: Claims,
    /// The input topic, whose log the start offsets count in.
    pub input: String,
    /// What a partition whose stored position is outside the input's log
    /// does (see [`super::lost_position`]).
    pub on_lost_position: OnLostPosition,
    /// The largest record the producer of the changelog's tombstones takes.
    pub max_bytes: usize,
    /// Where a lost position that stops the assignment is left for the run
    /// loop, which reports it as itself rather than as a failed rebalance.
    pub lost: Arc<std::sync::Mutex<Option<super::lost_position::LostPosition>>>,
}

impl Restorer {
    /// Where assigned `partition` starts, given the group's `committed`
    /// offset: the local offset, unless the local state is missing or behind
    /// `committed` and the changelog has the partition's state, which then
    /// replaces it. A changelog that cannot be read (unreachable, another
    /// store format, damaged) leaves the input replay. Fails when the undo
    /// of a batch cut short cannot be published (see [`crate::store::Restored`]):
    /// the partition is then left empty, so that no state is ever built on
    /// top of a changelog that still ends with a partial batch.
    pub fn start_offset(&self, partition: i32, committed: Option<i64>) -> Result<Option<i64>, RestoreError> {
        let standby_at = self.claims.claim(partition);
        self.metrics.restore.assigned(partition);
        if let (Some(from), Some(topic)) = (standby_at, &self.topic) {
            match self.catch_up(topic, partition, from) {
                Ok(next) => {
                    self.metrics.restore.restored(RestoreSource::Standby);
                    return Ok(next);
                }
                Err(Failure::Read(e)) => {
                    warn!(partition, error = %e, "Catching up the standby state failed; restoring the partition instead");
                    self.store.forget_partition(partition)?;
                }
                Err(Failure::Undo(e)) => return self.undo_failed(partition, e),
            }
        }
        let local = self.store.next_offset(partition)?;
        let behind = local.is_none() || committed.is_some_and(|c| Some(c) > local);
        let worth_asking = !(self.created && committed.is_none());
        if let (true, true, Some(topic)) = (behind, worth_asking, &self.topic) {
            match self.restore(topic, partition) {
                Ok(Some(next)) => {
                    self.metrics.restore.restored(RestoreSource::Changelog);
                    return Ok(Some(next));
                }
                Ok(None) => {}
                Err(Failure::Read(e)) => {
                    warn!(partition, error = %e, "Restoring from the changelog failed; replaying the input instead")
                }
                Err(Failure::Undo(e)) => return self.undo_failed(partition, e),
            }
        }
        // (Re-read: a failed restore leaves the partition empty.)
        let local = self.store.next_offset(partition)?;
        let source = if target(local, committed).is_some() { RestoreSource::Input } else { RestoreSource::Local };
        self.metrics.restore.restored(source);
        Ok(local)
    }

    /// The producer for records into the changelog outside a batch: the
    /// undo's, or under `exactly_once` (where a batch's changelog is in its
    /// transaction) one of its own.
    pub(super) fn publisher_for_changelog(&self) -> Result<Arc<Publisher>, KafkaError> {
        match &self.undo {
            Some(p) => Ok(p.clone()),
            None => Ok(Arc::new(Publisher::for_pipeline(&self.kafka, self.max_bytes)?)),
        }
    }

    /// The undo of a batch cut short in `partition` was not published: the
    /// partition is left empty and the assignment fails.
    fn undo_failed(&self, partition: i32, source: KafkaError) -> Result<Option<i64>, RestoreError> {
        self.store.forget_partition(partition)?;
        Err(RestoreError::Undo { partition, source })
    }

    /// Publishes the undo of `tail` (the store holding `partition` as it
    /// was before it, at `next`) and waits for it, so that it is in the
    /// changelog before any batch of this owner.
    fn publish_undo(&self, topic: &str, partition: i32, tail: &Tail, next: Option<i64>) -> Result<(), Failure> {
        let undo = self.store.undo(partition, tail, next, topic)?;
        match &self.undo {
            Some(publisher) => {
                publisher.publish_all(undo.iter().map(|r| (r, Some(partition)))).map_err(Failure::Undo)?;
                self.metrics.restore.set_back(undo.len());
            }
            // Under exactly_once a batch's changelog is in its transaction:
            // a reader never sees part of one.
            None => warn!(partition, "A batch cut short in a transactional changelog: left out, not set back"),
        }
        Ok(())
    }

    /// Reads `partition`'s changelog into the store; the offset it restored
    /// to, or `None` when the changelog holds nothing of it. A batch cut
    /// short at the end is left out and set back in the changelog.
    fn restore(&self, topic: &str, partition: i32) -> Result<Option<i64>, Failure> {
        // On the long-lived client: most partitions have nothing to read
        // (a reader of their own costs a connection and a metadata query).
        let range =
            self.watermarks.range(topic, partition, Duration::from_secs(10)).map_err(|e| Failure::Read(e.into()))?;
        if range.1 <= range.0 {
            return Ok(None);
        }
        let started = Instant::now();
        let m = &self.metrics.restore;
        m.restore_started(partition, (self.clock)() as f64 / 1000.0);
        let mut records = 0;
        let mut result = self.read(topic, partition, range, &mut records).map_err(Failure::Read);
        if let Ok(Restored { tail: Some(tail), .. }) = &result {
            let to = tail.complete_to.unwrap_or(range.0);
            warn!(
                partition,
                writes = tail.len(),
                complete_to = to,
                "The changelog ends with a batch cut short (its owner stopped while publishing it): restoring up to the batch before, and setting the cut batch's writes back in the changelog"
            );
            result = self.set_back(topic, partition, (range.0, to), tail, &mut records);
        }
        m.restore_finished(partition, started.elapsed().as_secs_f64(), records);
        let next = result?.next;
        if let Some(next) = next {
            info!(
                partition,
                records,
                next_offset = next,
                seconds = started.elapsed().as_secs_f64(),
                "Partition restored from the changelog"
            );
        }
        Ok(next)
    }

    /// Restores `partition` again over `range` (up to the last complete
    /// batch), then publishes the undo of `tail`.
    fn set_back(
        &self,
        topic: &str,
        partition: i32,
        range: (i64, i64),
        tail: &Tail,
        records: &mut u64,
    ) -> Result<Restored, Failure> {
        let again = if range.1 > range.0 {
            self.read(topic, partition, range, records).map_err(Failure::Read)?
        } else {
            self.store.forget_partition(partition)?;
            Restored { next: None, tail: None }
        };
        self.publish_undo(topic, partition, tail, again.next)?;
        Ok(again)
    }

    /// Applies `partition`'s changelog from position `from` (where the
    /// standby replica here had written up to) to its end, a batch at a
    /// time; a batch cut short at the end is set back as in a restore.
    /// The next offset the state includes.
    fn catch_up(&self, topic: &str, partition: i32, from: i64) -> Result<Option<i64>, Failure> {
        let (low, high) =
            self.watermarks.range(topic, partition, Duration::from_secs(10)).map_err(|e| Failure::Read(e.into()))?;
        if from < low {
            let gone = format!("changelog {topic}/{partition} starts at {low}, past the standby's position {from}");
            return Err(Failure::Read(StreamError::Kafka(KafkaError::Timeout(gone))));
        }
        let started = Instant::now();
        let mut held: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut read = 0u64;
        if high > from {
            stream_partition(&self.kafka, topic, partition, (from, high), self.stall, |key, value, _| {
                read += 1;
                let key = key.unwrap_or_default();
                let boundary = crate::store::changelog::is_offsets_key(key);
                held.push((key.to_vec(), value.map(<[u8]>::to_vec)));
                if boundary {
                    self.store.apply_changelog(partition, &held)?;
                    held.clear();
                }
                Ok::<(), StoreError>(())
            })
            .map_err(Failure::Read)?;
        }
        let next = self.store.next_offset(partition)?;
        if !held.is_empty() {
            warn!(partition, writes = held.len(), "The changelog ends with a batch cut short: setting it back");
            self.publish_undo(topic, partition, &Tail::of_records(partition, &held), next)?;
        }
        self.metrics.restore.restore_finished(partition, started.elapsed().as_secs_f64(), read);
        info!(partition, records = read, from, next_offset = ?next, "Partition taken over from its standby replica here");
        Ok(next)
    }

    /// Streams `range` of the changelog partition into the store.
    fn read(
        &self,
        topic: &str,
        partition: i32,
        range: (i64, i64),
        records: &mut u64,
    ) -> Result<Restored, StreamError<StoreError>> {
        let m = &self.metrics.restore;
        let mut into = self.store.restoring(partition);
        let high = range.1;
        let read = stream_partition(&self.kafka, topic, partition, range, self.stall, |key, value, remaining| {
            if remaining % 4096 == 0 {
                m.restore_progress(partition, remaining);
            }
            crate::crash::point(crate::crash::CrashPoint::Restoring);
            into.apply(high - 1 - remaining, key.unwrap_or_default(), value)
        });
        *records += into.records();
        match read {
            Ok(_) => into.finish().map_err(StreamError::Visit),
            Err(e) => {
                if into.records() > 0 {
                    into.abandon().map_err(StreamError::Visit)?;
                }
                Err(e)
            }
        }
    }
}

/// Why a restore from the changelog failed.
enum Failure {
    /// The changelog could not be read or restored: the input replay is
    /// left.
    Read(StreamError<StoreError>),
    /// A batch cut short could not be set back.
    Undo(KafkaError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Read(StreamError::Visit(e))
    }
}

/// Why an assigned partition has no start offset.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The undo of a batch cut short in the changelog was not acknowledged.
    #[error("partition {partition}: setting back a batch cut short in the changelog: {source}")]
    Undo {
        /// The partition.
        partition: i32,
        /// Why publishing failed.
        source: KafkaError,
    },
    /// The partition's stored position is outside the input's log.
    #[error(transparent)]
    LostPosition(#[from] super::lost_position::LostPosition),
    /// The state of a partition whose position was lost could not be
    /// cleared from the changelog (`on_lost_position = "reset"`).
    #[error("partition {partition}: clearing its state from the changelog after a lost position: {source}")]
    Clear {
        /// The partition.
        partition: i32,
        /// Why reading or publishing failed.
        source: KafkaError,
    },
}

/// Where a newly assigned partition must restore up to without publishing:
/// the group's committed offset when it is ahead of the local one.
pub fn target(local_next: Option<i64>, committed: Option<i64>) -> Option<i64> {
    match committed {
        Some(c) if c > local_next.unwrap_or(0) => Some(c),
        _ => None,
    }
}

/// Whether the record at `offset` of `partition` is below the partition's
/// restore target (applied to state, not published).
pub fn silent(restore_until: &BTreeMap<i32, i64>, partition: i32, offset: i64) -> bool {
    restore_until.get(&partition).is_some_and(|until| offset < *until)
}

/// Forgets the targets reached by `applied` (partition → next offset).
pub fn advance(restore_until: &mut BTreeMap<i32, i64>, applied: &BTreeMap<i32, i64>) {
    restore_until.retain(|p, until| applied.get(p).is_none_or(|next| next < until));
}

/// The stall rule of the zombie fence.
#[derive(Debug, Clone, Copy)]
pub struct Fence {
    session_timeout: Duration,
}

impl Fence {
    /// `session.timeout.ms` of the `[kafka]` settings (librdkafka's default,
    /// 45 s, when absent or not a number).
    pub fn new(kafka: &BTreeMap<String, String>) -> Fence {
        let ms = kafka.get("session.timeout.ms").and_then(|v| v.parse().ok()).unwrap_or(45_000);
        Fence { session_timeout: Duration::from_millis(ms) }
    }

    /// Whether a batch may still be written, the member having been seen
    /// alive (polling) at `alive_at`: the assignment is not reported lost
    /// and the member did not stall for a session timeout since.
    pub fn check(&self, alive_at: Instant, assignment_lost: bool) -> bool {
        !assignment_lost && alive_at.elapsed() < self.session_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_only_up_to_a_committed_offset_ahead_of_the_local_one() {
        assert_eq!(target(None, Some(40)), Some(40));
        assert_eq!(target(Some(10), Some(40)), Some(40));
        assert_eq!(target(Some(40), Some(40)), None);
        assert_eq!(target(Some(50), Some(40)), None);
        assert_eq!(target(Some(5), None), None);
        assert_eq!(target(None, Some(0)), None);
    }

    #[test]
    fn records_below_the_target_are_silent_until_it_is_reached() {
        let mut until = BTreeMap::from([(1, 10)]);
        assert!(silent(&until, 1, 9));
        assert!(!silent(&until, 1, 10));
        assert!(!silent(&until, 2, 0));
        advance(&mut until, &BTreeMap::from([(1, 9)]));
        assert_eq!(until, BTreeMap::from([(1, 10)]));
        advance(&mut until, &BTreeMap::from([(1, 10)]));
        assert!(until.is_empty());
    }

    #[test]
    fn a_stall_longer_than_the_session_timeout_fences_the_batch() {
        let kafka = BTreeMap::from([("session.timeout.ms".to_owned(), "6000".to_owned())]);
        let fence = Fence::new(&kafka);
        assert!(fence.check(Instant::now(), false));
        assert!(!fence.check(Instant::now(), true));
        let long_ago = Instant::now().checked_sub(Duration::from_secs(7)).unwrap();
        assert!(!fence.check(long_ago, false));
    }
}
