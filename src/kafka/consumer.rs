//! The consumer-group member. It reports facts and leaves the decisions
//! to the pipeline: which partitions it owns, where each was told to start
//! (the offset the pipeline keeps beside its state, asked for through
//! [`StartOffsets`]), the group's committed offset of each newly assigned
//! partition, and which partitions were revoked. Group offsets are
//! committed only past acknowledged outputs (see
//! [`GroupConsumer::commit_for_visibility`]); the pipeline uses the
//! committed offsets to restore a moved partition silently.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError::ClientCreation;
use rdkafka::error::KafkaResult;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset};
use tracing::{info, warn};

use super::batch_queue::{BatchQueue, ConsumeError};
use super::{client_config, KafkaError, CONSUMER_DEFAULTS};
use crate::records::Record;

/// A partition the group handed this member, as the member found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    /// Where consumption starts: the offset the pipeline keeps beside its
    /// state (`None`: the beginning of the partition).
    pub start: Option<i64>,
    /// The group's committed offset of the partition, if it has one (and it
    /// could be read).
    pub committed: Option<i64>,
}

/// What the rebalance callback tells the run loop.
#[derive(Debug, Default)]
pub struct Assignment {
    /// Owned partitions and the next offset to apply in each.
    pub owned: BTreeMap<i32, i64>,
    /// Partitions revoked since the loop last looked.
    pub revoked: BTreeSet<i32>,
    /// Partitions assigned since the loop last looked, with their facts.
    pub assigned: BTreeMap<i32, Assigned>,
    /// A rebalance step failed: the instance must stop rather than run
    /// with an assignment it does not really have.
    pub fatal: Option<String>,
    /// The group has handed this member an assignment (possibly empty) at
    /// least once: before that it cannot be ready.
    pub received: bool,
}

/// A handle on the partitions the member owns now, for the HTTP server and
/// the fleet announcer (cheap to clone).
#[derive(Clone)]
pub struct Ownership(Arc<Mutex<Assignment>>);

impl Ownership {
    /// The partitions owned now.
    pub fn owned(&self) -> BTreeSet<i32> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).owned.keys().copied().collect()
    }
}

/// Where an assigned partition starts (`start` `None`: at its beginning),
/// from the member's own state, and the committed offset the member may
/// trust, given the partition and the group's committed offset of it (if
/// any); an error stops the member.
pub type StartOffsets = Box<dyn Fn(i32, Option<i64>) -> Result<Assigned, String> + Send + Sync>;

/// Run in the revoke callback before the partitions are released. It
/// finishes the batches in flight (waits for their acknowledgements) and
/// returns the next offsets to commit for them, or `None` when there is
/// nothing acknowledged to commit.
pub type RevokeHook = Box<dyn FnMut() -> Option<BTreeMap<i32, i64>> + Send>;

/// Seeks assigned partitions to the offsets the pipeline keeps.
pub struct GroupContext {
    start_offsets: StartOffsets,
    topic: String,
    /// The topic as librdkafka takes it, for forwarding its partitions.
    topic_c: CString,
    /// The facts the run loop reads.
    pub assignment: Arc<Mutex<Assignment>>,
    revoke_hook: Mutex<Option<RevokeHook>>,
    /// Where assigned partitions' records are forwarded (set once the
    /// client exists; owned by the [`GroupConsumer`], which drops it before
    /// the client).
    records: OnceLock<Weak<BatchQueue>>,
    /// Rebalances and commit results served: a poll of the consumer's queue
    /// that served one returns nothing, like a poll of an empty queue, and
    /// this tells the two apart.
    events: AtomicU64,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn commit_callback(&self, _result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        self.events.fetch_add(1, Ordering::Relaxed);
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                let committed = self.committed(consumer, &partitions);
                // Start offsets first, without the lock: finding one may
                // restore a partition's state (minutes for a large one),
                // and the state gauges and health checks read the
                // assignment meanwhile. Several partitions at once (as many
                // as rayon's pool runs): restores are independent, each
                // reads its own changelog partition into its own key range.
                let jobs: Vec<_> = partitions
                    .iter()
                    .map(|&p| {
                        let c = committed.get(&p).copied();
                        move || (p, (self.start_offsets)(p, c))
                    })
                    .collect();
                let starts: Result<Vec<(i32, Assigned)>, String> = crate::parallel::run_all(jobs)
                    .into_iter()
                    .map(|(p, found)| {
                        found.map(|n| (p, n)).map_err(|e| format!("the start offset of partition {p}: {e}"))
                    })
                    .collect();
                let mut a = self.assignment.lock().expect("not poisoned");
                a.received = true;
                let starts = match starts {
                    Ok(s) => s,
                    Err(why) => {
                        a.fatal = Some(why);
                        return;
                    }
                };
                for (p, facts) in starts {
                    let offset = facts.start.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, offset) {
                        warn!(partition = p, error = %e, "Cannot set the start offset");
                    }
                    a.owned.insert(p, facts.start.unwrap_or(0));
                    a.revoked.remove(&p);
                    a.assigned.insert(p, facts);
                    info!(partition = p, next_offset = ?facts.start, committed = ?facts.committed, "Partition assigned");
                }
                // Forwarded before the assignment, so that their fetch
                // starts into the batch queue (librdkafka keeps a
                // forwarding the application set when a fetch starts).
                // A fetch stop clears a forwarding, and one still pending
                // would leave its partition forwarded nowhere; with the
                // eager protocol used here the revoke callback's unassign
                // has stopped every partition before the group assigns
                // again, so none is pending. Forwarded again after the
                // assignment all the same, which covers a stop that
                // finished meanwhile.
                if let Err(why) = self.forward(consumer, &partitions) {
                    a.fatal = Some(why);
                    return;
                }
                if let Err(e) = consumer.assign(tpl) {
                    a.fatal = Some(format!("assigning partitions: {e}"));
                } else if let Err(why) = self.forward(consumer, &partitions) {
                    a.fatal = Some(why);
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let mut a = self.assignment.lock().expect("not poisoned");
                // Commit what is acknowledged before letting go: the new
                // owner restores silently up to the group's offsets, so a
                // commit sent after the release would make it publish the
                // batch in flight again.
                // Unless the assignment is already lost (the session
                // expired: the partitions may be another member's by now).
                // A commit then would set the new owner's offset back, and
                // the batch's changelog would land after the new owner's
                // records; the run loop forgets those partitions instead.
                let lost = consumer.assignment_lost();
                if lost {
                    warn!("Assignment lost (session expired); releasing the partitions without committing the batch in flight");
                }
                let finished = (!lost)
                    .then(|| self.revoke_hook.lock().expect("not poisoned").as_mut().and_then(|hook| hook()))
                    .flatten();
                if let Some(offsets) = finished {
                    if let Err(e) = consumer.commit(&offsets_list(&self.topic, &offsets), CommitMode::Sync) {
                        warn!(error = %e, "Committing offsets before releasing partitions failed; the new owner may repeat outputs");
                    }
                }
                for e in tpl.elements() {
                    a.owned.remove(&e.partition());
                    a.assigned.remove(&e.partition());
                    a.revoked.insert(e.partition());
                    info!(partition = e.partition(), "Partition revoked; no more writes for it");
                }
                if let Err(e) = consumer.unassign() {
                    a.fatal = Some(format!("releasing revoked partitions: {e}"));
                }
            }
            other => warn!(error = ?other, "Rebalance error"),
        }
    }
}

impl GroupContext {
    /// Forwards `partitions` to the batch queue.
    fn forward(&self, consumer: &BaseConsumer<Self>, partitions: &[i32]) -> Result<(), String> {
        // Gone only while the consumer is being dropped (nothing is read then).
        let Some(queue) = self.records.get().and_then(Weak::upgrade) else { return Ok(()) };
        let rk = consumer.client().native_ptr();
        for &p in partitions {
            // SAFETY: `rk` is the live client the queue was made for (it
            // is calling back into this context).
            if !unsafe { queue.forward(rk, &self.topic_c, p) } {
                return Err(format!("forwarding partition {p} of {} to the batch queue", self.topic));
            }
        }
        Ok(())
    }

    /// The group's committed offsets of `partitions` (those it has). An
    /// error leaves them out: the pipeline then restores nothing silently
    /// and only repeats byte-identical outputs (its restore rule).
    fn committed(&self, consumer: &BaseConsumer<Self>, partitions: &[i32]) -> BTreeMap<i32, i64> {
        committed_offsets(consumer, &self.topic, partitions.iter().copied()).unwrap_or_else(|e| {
            warn!(error = %e, "Cannot read the group's committed offsets; partitions will not restore silently");
            BTreeMap::new()
        })
    }
}

/// How long a read of the group's committed offsets may wait for the
/// coordinator.
const COMMITTED_PATIENCE: Duration = Duration::from_secs(10);

/// The committed offsets of the consumer's group in `partitions` of
/// `topic` (those that have one).
pub fn committed_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
) -> KafkaResult<BTreeMap<i32, i64>> {
    committed_offsets_within(consumer, topic, partitions, COMMITTED_PATIENCE)
}

/// The committed offsets of group `group_id` in the first `partitions`
/// partitions of `topic` (those that have one), read without joining it.
pub fn group_offsets(
    kafka: &BTreeMap<String, String>,
    group_id: &str,
    topic: &str,
    partitions: usize,
) -> Result<BTreeMap<i32, i64>, KafkaError> {
    let client: BaseConsumer = client_config(&CONSUMER_DEFAULTS, kafka, &[("group.id", group_id)])
        .create()
        .map_err(KafkaError::client("creating a client to read the group's offsets"))?;
    let partitions = (0..partitions).map(|p| i32::try_from(p).unwrap_or(i32::MAX));
    committed_offsets(&client, topic, partitions)
        .map_err(KafkaError::client(format!("the offsets of group {group_id}")))
}

/// [`committed_offsets`], waiting at most `timeout`.
fn committed_offsets_within<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partitions: impl IntoIterator<Item = i32>,
    timeout: Duration,
) -> KafkaResult<BTreeMap<i32, i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, p);
    }
    Ok(consumer
        .committed_offsets(tpl, timeout)?
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The offsets list of `offsets` (partition → next offset) in `topic`.
pub(super) fn offsets_list(topic: &str, offsets: &BTreeMap<i32, i64>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (p, next) in offsets {
        if let Err(e) = tpl.add_partition_offset(topic, *p, Offset::Offset(*next)) {
            warn!(partition = p, offset = next, error = %e, "Not committing an invalid offset");
        }
    }
    tpl
}

/// Partitions whose position librdkafka moved past a record not handed
/// out yet, with that record's offset.
///
/// The batch read (`rd_kafka_q_serve_rkmessages`) sets a partition's
/// position past every message it returns, a consumer error too, and the
/// fetcher gives a partition's error the offset it was fetching. Taken as
/// is, the position would then claim a record the member never handed out,
/// and an idle pipeline moves its stored offsets to the position (past
/// transaction markers: `Pipeline::skip_markers`), so the record would be
/// skipped when the fetch retried it. (rust-rdkafka's one-message poll
/// moved the position for records only.) Until a record at that offset or
/// later is handed out, the position reported is capped at it.
#[derive(Debug, Default)]
struct ErrorHolds(BTreeMap<i32, i64>);

impl ErrorHolds {
    /// Errors seen in a batch read, as (partition, offset); an offset below
    /// zero names no record.
    fn errors(&mut self, errors: &[ConsumeError]) {
        for &ConsumeError { partition: p, offset, .. } in errors.iter().filter(|e| e.offset >= 0) {
            let hold = self.0.entry(p).or_insert(offset);
            *hold = (*hold).min(offset);
        }
    }

    /// Records handed out: a hold ends at the first record at or past it.
    fn handed(&mut self, records: &[Record]) {
        if self.0.is_empty() {
            return;
        }
        for r in records {
            if self.0.get(&r.partition).is_some_and(|hold| r.offset >= *hold) {
                self.0.remove(&r.partition);
            }
        }
    }

    /// Forgets the partitions not in `owned` (a new assignment starts a
    /// fetch of its own).
    fn keep_owned(&mut self, owned: &BTreeMap<i32, i64>) {
        self.0.retain(|p, _| owned.contains_key(p));
    }

    /// `positions` capped at the holds.
    fn cap(&self, positions: &mut BTreeMap<i32, i64>) {
        for (p, hold) in &self.0 {
            if let Some(pos) = positions.get_mut(p) {
                *pos = (*pos).min(*hold);
            }
        }
    }
}

/// Longest a wait for records goes without serving the consumer's own
/// queue (rebalances, commit results) while the member owns no partition:
/// the first assignment, at start-up, decides when the first output comes.
const EVENTS_SLICE: Duration = Duration::from_millis(10);

/// The same once the member owns partitions. A record wakes the wait at
/// once whatever the slice; the slice only bounds how late a rebalance or
/// a commit result is served while the input is quiet, and an idle loop
/// wakes once per slice: at 10 ms that was a hundred times a second, 0.5 %
/// of a core for nothing (`scripts/bench-idle.sh`, BENCHMARKS.md).
const EVENTS_SLICE_ASSIGNED: Duration = Duration::from_millis(50);

/// What a partition whose fetch position is outside its log does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfRange {
    /// [`GroupConsumer::poll_batch`] fails with
    /// [`KafkaError::PositionOutOfRange`]: the member's position belongs
    /// to its state, which a jump would leave behind.
    Stop,
    /// Consumption goes on from the log's start (a reader whose position
    /// is only a bookmark).
    FromStart,
}

impl OutOfRange {
    fn auto_offset_reset(self) -> &'static str {
        match self {
            OutOfRange::Stop => "error",
            OutOfRange::FromStart => "earliest",
        }
    }
}

/// A subscribed consumer that hands out batches of owned records.
pub struct GroupConsumer {
    /// The assigned partitions' records (see [`batch_queue`]). Declared
    /// before the consumer: fields drop in order, and the queue must go
    /// before the client does.
    records: Arc<BatchQueue>,
    /// Positions an error moved past a record (see [`ErrorHolds`]).
    holds: Mutex<ErrorHolds>,
    consumer: BaseConsumer<GroupContext>,
    /// The one topic it subscribes to, shared by every record it hands out.
    topic: Arc<str>,
    /// The facts of the group's rebalances, shared with the run loop.
    pub assignment: Arc<Mutex<Assignment>>,
}

impl GroupConsumer {
    /// A handle on the partitions owned now.
    pub fn ownership(&self) -> Ownership {
        Ownership(self.assignment.clone())
    }

    /// Joins group `group_id` on `topic`; assigned partitions start where
    /// `start_offsets` says.
    pub fn new(
        kafka: &BTreeMap<String, String>,
        group_id: &str,
        topic: &str,
        start_offsets: StartOffsets,
        out_of_range: OutOfRange,
    ) -> Result<Self, KafkaError> {
        let assignment = Arc::new(Mutex::new(Assignment::default()));
        let creation = |why: String| KafkaError::client("creating the consumer")(ClientCreation(why));
        let topic_c = CString::new(topic).map_err(|_| creation(format!("topic name {topic:?} holds a NUL")))?;
        let ctx = GroupContext {
            start_offsets,
            topic: topic.to_owned(),
            topic_c,
            assignment: assignment.clone(),
            revoke_hook: Mutex::new(None),
            records: OnceLock::new(),
            events: AtomicU64::new(0),
        };
        let consumer: BaseConsumer<GroupContext> = client_config(
            &CONSUMER_DEFAULTS,
            kafka,
            &[
                ("group.id", group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", out_of_range.auto_offset_reset()),
                ("enable.partition.eof", "false"),
                // Records of a service that publishes in transactions:
                // those of aborted ones are never applied.
                ("isolation.level", "read_committed"),
                // Eager rebalancing: the callback assigns whole sets.
                ("partition.assignment.strategy", "range,roundrobin"),
            ],
        )
        .create_with_context(ctx)
        .map_err(KafkaError::client("creating the consumer"))?;
        // SAFETY: the client is live, and the queue is dropped before it
        // (field order of `GroupConsumer`).
        let records = unsafe { BatchQueue::new(consumer.client().native_ptr()) }
            .map(Arc::new)
            .ok_or_else(|| creation("librdkafka refused a queue for the consumer's records".into()))?;
        // Before subscribing: no rebalance can come earlier.
        let _ = consumer.context().records.set(Arc::downgrade(&records));
        consumer.subscribe(&[topic]).map_err(KafkaError::client(format!("subscribing to {topic}")))?;
        Ok(GroupConsumer { records, holds: Mutex::default(), consumer, topic: Arc::from(topic), assignment })
    }

    /// Up to `max` records, waiting at most `wait` for the first and then
    /// taking what is already fetched, and whether partitions were revoked
    /// meanwhile. Records of revoked partitions are left out (the new owner
    /// consumes them).
    pub fn poll_batch(&self, max: usize, wait: Duration) -> Result<(Vec<Record>, bool), KafkaError> {
        // Room for a full batch up front (growing copied every record
        // again at each doubling), within reason for huge `max`es.
        let mut out = Vec::with_capacity(max.min(8192));
        let until = Instant::now() + wait;
        let mut errors = Vec::new();
        loop {
            self.serve_events(&mut out);
            let room = max.saturating_sub(out.len());
            self.records.take(&mut out, room, Duration::ZERO, &self.topic, &mut errors);
            let left = until.saturating_duration_since(Instant::now());
            if !out.is_empty() || left.is_zero() {
                break;
            }
            // Wait for the first record a slice at a time, serving the
            // consumer's queue between slices: a rebalance (the first
            // assignment, at start-up) waits at most one slice.
            let slice = if self.assignment.lock().expect("not poisoned").owned.is_empty() {
                EVENTS_SLICE
            } else {
                EVENTS_SLICE_ASSIGNED
            };
            if self.records.take(&mut out, 1, left.min(slice), &self.topic, &mut errors) > 0 {
                let room = max.saturating_sub(out.len());
                self.records.take(&mut out, room, Duration::ZERO, &self.topic, &mut errors);
                break;
            }
        }
        {
            let mut holds = self.holds.lock().expect("not poisoned");
            holds.errors(&errors);
            holds.handed(&out);
        }
        let mut a = self.assignment.lock().expect("not poisoned");
        if let Some(why) = a.fatal.take() {
            return Err(KafkaError::Rebalance(why));
        }
        // A position that left the log (see `OutOfRange::Stop`), in a
        // partition still owned: its fetch stopped, and going on would
        // hide it.
        if let Some(e) =
            errors.iter().find(|e| e.code == RDKafkaErrorCode::AutoOffsetReset && a.owned.contains_key(&e.partition))
        {
            return Err(KafkaError::PositionOutOfRange {
                topic: self.topic.to_string(),
                partition: e.partition,
                offset: e.offset,
                reason: "the broker answered that the offset is out of range".into(),
            });
        }
        let revoked = !a.revoked.is_empty();
        if revoked {
            let owned = &a.owned;
            out.retain(|r| owned.contains_key(&r.partition));
            self.holds.lock().expect("not poisoned").keep_owned(owned);
            a.revoked.clear();
        }
        Ok((out, revoked))
    }

    /// Serves the consumer's own queue until it is empty: rebalances (the
    /// context's callback), commit results, errors, and any record that
    /// reached it before its partition was forwarded (appended to `out`
    /// ahead of the batch queue's, which come after them in their
    /// partition).
    fn serve_events(&self, out: &mut Vec<Record>) {
        let events = &self.consumer.context().events;
        loop {
            let served = events.load(Ordering::Relaxed);
            match self.consumer.poll(Duration::ZERO) {
                Some(Ok(m)) => out.push(Record::of_topic(&m, self.topic.clone())),
                Some(Err(e)) => warn!(error = %e, "Consumer error"),
                None if events.load(Ordering::Relaxed) == served => return,
                None => {}
            }
        }
    }

    /// Sets what runs before revoked partitions are released (see [`RevokeHook`]).
    pub fn on_revoke(&self, hook: RevokeHook) {
        *self.consumer.context().revoke_hook.lock().expect("not poisoned") = Some(hook);
    }

    /// Commits group offsets past applied batches whose outputs are
    /// acknowledged: lag for tools, and the point up to which a new owner
    /// restores silently. Only partitions still owned: a late commit for a
    /// partition that moved would set its new owner's offset back.
    pub fn commit_for_visibility(&self, offsets: &BTreeMap<i32, i64>) {
        let owned: BTreeMap<i32, i64> = {
            let a = self.assignment.lock().expect("not poisoned");
            offsets.iter().filter(|(p, _)| a.owned.contains_key(p)).map(|(p, n)| (*p, *n)).collect()
        };
        if owned.is_empty() {
            return;
        }
        if let Err(e) = self.consumer.commit(&offsets_list(&self.topic, &owned), CommitMode::Async) {
            warn!(error = %e, "Committing group offsets failed (lag display only)");
        }
    }

    /// The group's committed offsets of `partitions` (those that have
    /// one), waiting at most `timeout` for the coordinator.
    pub fn committed(
        &self,
        partitions: impl IntoIterator<Item = i32>,
        timeout: Duration,
    ) -> Result<BTreeMap<i32, i64>, KafkaError> {
        committed_offsets_within(&self.consumer, &self.topic, partitions, timeout)
            .map_err(KafkaError::client("reading the group's committed offsets"))
    }

    /// The member's group metadata (generation, member id) for a
    /// transaction's offsets; `None` before the member joined.
    pub fn group_metadata(&self) -> Option<rdkafka::consumer::ConsumerGroupMetadata> {
        self.consumer.group_metadata()
    }

    /// Whether librdkafka knows that this member lost its assignment (the
    /// group expelled it) before the rebalance callback ran.
    pub fn assignment_lost(&self) -> bool {
        self.consumer.assignment_lost()
    }

    /// Moves `partitions` back to the given next offsets (a fenced batch is
    /// consumed again if the partitions are still ours). Errors are only
    /// logged: a partition that is no longer assigned is re-seeked by the
    /// next assignment anyway.
    pub fn rewind(&self, partitions: &BTreeMap<i32, i64>) {
        for (p, next) in partitions {
            if let Err(e) = self.consumer.seek(&self.topic, *p, Offset::Offset(*next), Duration::from_secs(5)) {
                warn!(partition = p, error = %e, "Cannot rewind a fenced partition");
            }
        }
    }

    /// The consumer's position in `partition` (next offset it will hand
    /// out, past transaction markers), if known.
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.positions().get(&partition).copied()
    }

    /// The consumer's position in every assigned partition where it is
    /// known (one call for all, where a loop over [`Self::position`] would
    /// ask librdkafka once per partition).
    ///
    /// Capped where an error moved a position past a record not handed
    /// out yet (see [`ErrorHolds`]).
    pub fn positions(&self) -> BTreeMap<i32, i64> {
        let Ok(tpl) = self.consumer.position() else { return BTreeMap::new() };
        let mut positions: BTreeMap<i32, i64> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect();
        self.holds.lock().expect("not poisoned").cap(&mut positions);
        positions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, offset: i64) -> Record {
        Record { topic: "t".into(), partition, offset, timestamp: None, key: None, value: None, headers: Vec::new() }
    }

    /// An error caps its partition's position at the record it could not
    /// fetch until that record (or a later one) is handed out; other
    /// partitions, offsets that name no record, and partitions no longer
    /// owned are left alone.
    #[test]
    fn an_error_holds_its_partitions_position_until_the_record_comes() {
        let mut holds = ErrorHolds::default();
        let capped = |h: &ErrorHolds| {
            let mut p: BTreeMap<i32, i64> = [(0, 11), (1, 21), (2, 31)].into();
            h.cap(&mut p);
            p
        };
        // librdkafka moved partition 0 to 11 past an error at 10; -1 names no record.
        let error =
            |partition, offset| ConsumeError { partition, offset, code: RDKafkaErrorCode::BrokerTransportFailure };
        holds.errors(&[error(0, 10), error(1, -1)]);
        assert_eq!(capped(&holds), [(0, 10), (1, 21), (2, 31)].into());
        // A later error keeps the earlier hold.
        holds.errors(&[error(0, 12)]);
        assert_eq!(capped(&holds)[&0], 10);
        // Records of other partitions, or below the hold, keep it.
        holds.handed(&[record(1, 21), record(0, 9)]);
        assert_eq!(capped(&holds)[&0], 10);
        // The record at the hold ends it.
        holds.handed(&[record(0, 10)]);
        assert_eq!(capped(&holds), [(0, 11), (1, 21), (2, 31)].into());
        // A partition that left forgets its hold.
        holds.errors(&[error(2, 30)]);
        assert_eq!(capped(&holds)[&2], 30);
        holds.keep_owned(&[(0, 11)].into());
        assert_eq!(capped(&holds)[&2], 31);
    }
}
