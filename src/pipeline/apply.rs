//! Applying one consumed batch to the state: decode each record, run the
//! core against the stored state, note the timeline and the metrics, and
//! gather everything the batch changed into one store [`Batch`].
//!
//! A batch's partitions are split into lanes applied at once (on rayon's
//! pool, see [`crate::parallel`]): every key of the state is scoped by partition, so lanes share
//! nothing but the store (read only until the batch is written) and the
//! metrics (atomic counters), and the result is the one a single thread
//! gives, up to the order of outputs of different partitions (which Kafka
//! does not order either).
//!
//! No Kafka in here. The run loop ([`super::Pipeline`]) feeds it what the
//! consumer returned and then writes, publishes and acknowledges; the
//! rebuild bench (`benches/rebuild.rs`) feeds it records from memory, so it
//! measures exactly the work the pipeline does per record.

use std::collections::BTreeMap;

use indexmap::{Equivalent, IndexMap};
use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

use tracing::{debug, warn};

use super::{PipelineError, Stats};
use crate::codec::{Codec, DecodeError};
use crate::config::{Config, Topics};
use crate::core::{self, Disposition, EntityState, Event, OperationState, Output, Policy, SourcePos};
use crate::metrics::{self, Metrics};
use crate::records::Record;
use crate::records::{authenticity, dead_letter, decode_record, output_record};
use crate::signature::ControlKeys;
use crate::store::changelog::Target;
use crate::store::timeline::{self, Arrival};
use crate::store::{Batch, Encoded, Store, TimelineHead};

/// What a batch needs besides its records; borrowed from the pipeline.
pub struct Applier<'a> {
    /// The state store, read for the state the batch changes (the caller writes
    /// the result).
    pub store: &'a Store,
    /// The core's policy.
    pub policy: &'a Policy,
    /// Decodes the input and encodes the outputs.
    pub codec: &'a Codec,
    /// Verify the signatures of control events (their verdict goes to the
    /// core as data, see [`crate::core::trust`]).
    pub keys: &'a ControlKeys,
    /// Where outputs and dead letters go.
    pub topics: &'a Topics,
    /// Records larger than this are dead-lettered
    /// ([`crate::config::Consumer::max_record_bytes`]).
    pub max_record_bytes: usize,
    /// Counted per record and per output.
    pub metrics: &'a Metrics,
    /// Most threads applying one batch (see [`crate::config::Consumer::apply_lanes`]).
    pub lanes: usize,
    /// Outputs are counted (stats, metrics, timeline) but neither encoded
    /// nor stored, and no changelog records are made: a replay that
    /// publishes nothing.
    pub discard_outputs: bool,
}

/// Fewest records a lane takes: below that handing work to another thread
/// costs more than it saves (a hand-over is microseconds, so is a record).
const MIN_LANE_RECORDS: usize = 256;

/// A batch applied in memory, ready to be written.
#[derive(Debug, Default)]
pub struct Applied {
    /// State, timers, offsets, timeline (encoded) and the outputs to publish.
    pub batch: Encoded,
    /// Each partition the batch advanced, with its next offset.
    pub touched: BTreeMap<i32, i64>,
    /// `DeadlineReached` events consumed back: (operation, due time).
    pub deadlines: Vec<(String, i64)>,
}

/// An operation during a batch: the timer it had in the index before the
/// batch (to move it in the index once, at the end), its state, and its
/// timeline's head (stored with it).
struct OpSlot {
    timer_before: Option<i64>,
    state: Option<OperationState>,
    timeline: TimelineHead,
}

/// A batch's operations or entities by `(partition, id)`. Kept in the
/// order they were loaded, which is key order (see
/// [`Applier::decode_and_load`]) but for the operations a request
/// supersedes, loaded later and appended: the batch then writes them
/// (nearly) sorted, and its stable sort by key (see `Batch::encode`, which
/// alone decides the write order) has next to nothing to do.
type Slots<V> = IndexMap<(i32, String), V, FxBuildHasher>;

/// A `(partition, id)` key of [`Slots`] borrowed from an event: looking
/// one up this way copies no id (it did, once per record, for each map).
/// Hashes as the owned key does: the same fields in the same order, a
/// `&str` hashing as the `String` with its contents.
#[derive(Hash)]
struct Key<'k>(i32, &'k str);

impl Equivalent<(i32, String)> for Key<'_> {
    fn equivalent(&self, key: &(i32, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// The value of `(p, id)` in `slots`; when it has none yet, `load`s it and
/// keeps it there (the id copied only then).
fn slot_or_load<'m, V>(
    slots: &'m mut Slots<V>,
    p: i32,
    id: &str,
    load: impl FnOnce() -> Result<V, PipelineError>,
) -> Result<&'m mut V, PipelineError> {
    let i = match slots.get_index_of(&Key(p, id)) {
        Some(i) => i,
        None => slots.insert_full((p, id.to_owned()), load()?).0,
    };
    Ok(&mut slots[i])
}

impl Applied {
    /// Adds a lane's result (of other partitions) to this one.
    fn absorb(&mut self, other: Applied) {
        self.batch.absorb(other.batch);
        self.touched.extend(other.touched);
        self.deadlines.extend(other.deadlines);
    }
}

/// Splits the partitions of `records` (owned ones, in `next`) into at most
/// `lanes` groups of about equal record counts: the largest partition goes
/// to the lightest lane first. Returns each record's lane by partition.
fn plan_lanes(records: &[Record], next: &BTreeMap<i32, i64>, lanes: usize) -> (usize, FxHashMap<i32, usize>) {
    let mut counts: FxHashMap<i32, usize> = FxHashMap::default();
    for r in records.iter().filter(|r| next.contains_key(&r.partition)) {
        *counts.entry(r.partition).or_default() += 1;
    }
    let total: usize = counts.values().sum();
    let lanes = lanes.min(counts.len()).min(total / MIN_LANE_RECORDS).max(1);
    let mut by_size: Vec<(i32, usize)> = counts.into_iter().collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut load = vec![0usize; lanes];
    let mut lane_of = FxHashMap::default();
    for (p, n) in by_size {
        let lightest = (0..lanes).min_by_key(|&l| (load[l], l)).expect("at least one lane");
        load[lightest] += n;
        lane_of.insert(p, lightest);
    }
    (lanes, lane_of)
}

impl<'a> Applier<'a> {
    /// The operation `operation_id` of partition `p` during a batch: from
    /// the batch's own map, else loaded from the store.
    fn slot<'m>(
        &self,
        ops: &'m mut Slots<OpSlot>,
        p: i32,
        operation_id: &str,
    ) -> Result<&'m mut OpSlot, PipelineError> {
        slot_or_load(ops, p, operation_id, || {
            let (state, timeline) = self.store.load_op(p, operation_id)?;
            Ok(OpSlot { timer_before: state.as_ref().and_then(|s| s.timer_at), state, timeline })
        })
    }

    /// Decodes the records of `records` that [`Applier::apply_lane`] will
    /// apply (`None` for those it skips: of a partition not in `next`, or
    /// below its next offset; this is the one place that rule is decided)
    /// and loads the operations and entities they name into `ops` and
    /// `entities`, in one batched store read each rather than one read per
    /// key as the records come (the operations a request supersedes are
    /// still read one by one: they are rare).
    fn decode_and_load(
        &self,
        records: &[&Record],
        next: &BTreeMap<i32, i64>,
        ops: &mut Slots<OpSlot>,
        entities: &mut Slots<EntityState>,
    ) -> Result<Vec<Option<Result<Event, DecodeError>>>, PipelineError> {
        let mut expected = next.clone();
        let decoded: Vec<_> = records
            .iter()
            .map(|r| {
                let e = expected.get_mut(&r.partition)?;
                if r.offset < *e {
                    return None;
                }
                *e = r.offset + 1;
                Some(decode_record(self.codec, self.max_record_bytes, r))
            })
            .collect();
        let sized = || FxHashSet::with_capacity_and_hasher(records.len(), Default::default());
        let (mut op_ids, mut entity_ids) = (sized(), sized());
        for (r, ev) in records.iter().zip(&decoded) {
            if let Some(Ok(ev)) = ev {
                op_ids.insert((r.partition, ev.operation_id.as_str()));
                entity_ids.insert((r.partition, ev.entity_id.as_str()));
            }
        }
        // In key order, so that the store's batched reads need not sort
        // them (see `Store::load_ops`).
        let mut op_ids: Vec<_> = op_ids.into_iter().collect();
        op_ids.sort_unstable();
        ops.reserve(op_ids.len());
        for ((p, id), (state, timeline)) in op_ids.iter().zip(self.store.load_ops(&op_ids)?) {
            let slot = OpSlot { timer_before: state.as_ref().and_then(|s| s.timer_at), state, timeline };
            ops.insert((*p, (*id).to_owned()), slot);
        }
        let mut entity_ids: Vec<_> = entity_ids.into_iter().collect();
        entity_ids.sort_unstable();
        entities.reserve(entity_ids.len());
        for ((p, id), e) in entity_ids.iter().zip(self.store.get_entities(&entity_ids)?) {
            entities.insert((*p, (*id).to_owned()), e);
        }
        Ok(decoded)
    }

    /// Counts, logs and (unless `silent` or discarding) stores for
    /// publishing the outputs of one step, emptying `outputs`.
    fn emit(
        &self,
        outputs: &mut Vec<Output>,
        silent: bool,
        batch: &mut Batch,
        stats: &mut Stats,
    ) -> Result<(), PipelineError> {
        if silent {
            outputs.clear();
        }
        for o in outputs.drain(..) {
            self.metrics.output(&o);
            match &o {
                Output::Verdict(v) => {
                    stats.verdicts += 1;
                    // At debug, like anomalies: the verdict topic is the audit
                    // trail, and a default run wrote a line per verdict (its
                    // CPU cost was below what the bench resolves: BENCHMARKS.md).
                    debug!(operation_id = %v.operation_id, entity_id = %v.entity_id, outcome = v.outcome.as_str(), action = v.action.as_str(), "Verdict");
                }
                Output::Anomaly(a) => {
                    stats.anomalies += 1;
                    debug!(operation_id = %a.operation_id, entity_id = %a.entity_id, kind = a.kind.as_str(), "Anomaly");
                }
                Output::Command(_) => stats.commands += 1,
            }
            if !self.discard_outputs {
                batch.publish(output_record(self.codec, self.topics, &o)?);
            }
        }
        Ok(())
    }

    /// The applier `cfg` describes (topics, record size limit, lanes),
    /// storing its outputs for publishing.
    pub fn new(
        cfg: &'a Config,
        store: &'a Store,
        policy: &'a Policy,
        codec: &'a Codec,
        keys: &'a ControlKeys,
        metrics: &'a Metrics,
    ) -> Self {
        Applier {
            store,
            policy,
            codec,
            keys,
            topics: &cfg.topics,
            max_record_bytes: cfg.consumer.max_record_bytes,
            metrics,
            lanes: cfg.consumer.apply_lanes(),
            discard_outputs: false,
        }
    }

    /// Applies `records` in order (per partition), on up to `self.lanes`
    /// threads; see [`Applier::apply_lane`] for what `next` and
    /// `restore_until` mean.
    pub fn apply(
        &self,
        records: &[Record],
        next: &mut BTreeMap<i32, i64>,
        restore_until: &BTreeMap<i32, i64>,
        stats: &mut Stats,
    ) -> Result<Applied, PipelineError> {
        let (lanes, lane_of) = plan_lanes(records, next, self.lanes);
        if lanes == 1 {
            return self.apply_lane(records.iter(), next, restore_until, stats);
        }
        let mut work: Vec<(Vec<&Record>, BTreeMap<i32, i64>)> = vec![(Vec::new(), BTreeMap::new()); lanes];
        for r in records {
            if let Some(&l) = lane_of.get(&r.partition) {
                work[l].0.push(r);
            }
        }
        for (p, &l) in &lane_of {
            work[l].1.insert(*p, next[p]);
        }
        let jobs: Vec<_> = work
            .into_iter()
            .map(|(records, mut next)| {
                move || {
                    let mut stats = Stats::default();
                    let applied = self.apply_lane(records.into_iter(), &mut next, restore_until, &mut stats);
                    (applied, next, stats)
                }
            })
            .collect();
        let results = crate::parallel::run_all(jobs);
        let mut merged = Applied::default();
        for (applied, lane_next, lane_stats) in results {
            next.extend(lane_next);
            stats.absorb(lane_stats);
            merged.absorb(applied?);
        }
        Ok(merged)
    }

    /// Applies `records` in order. `next` holds the next offset to apply of
    /// each owned partition (records of other partitions, and records below
    /// it, are skipped: never applied twice) and is advanced. Records below
    /// `restore_until` of their partition are applied silently: a previous
    /// owner already published their outputs.
    fn apply_lane<'r>(
        &self,
        records: impl Iterator<Item = &'r Record>,
        next: &mut BTreeMap<i32, i64>,
        restore_until: &BTreeMap<i32, i64>,
        stats: &mut Stats,
    ) -> Result<Applied, PipelineError> {
        let mut ops: Slots<OpSlot> = Slots::default();
        let mut entities: Slots<EntityState> = Slots::default();
        let records: Vec<&Record> = records.collect();
        let decoded = self.decode_and_load(&records, next, &mut ops, &mut entities)?;
        let mut batch = Batch::with_capacity(records.len());
        let mut applied = Applied::default();
        let mut outputs = Vec::new();
        for (r, decoded) in records.into_iter().zip(decoded) {
            // Not owned, or applied before a restart or a seek: never twice.
            let Some(decoded) = decoded else { continue };
            next.insert(r.partition, r.offset + 1);
            applied.touched.insert(r.partition, r.offset + 1);
            stats.records += 1;
            crate::crash::point(crate::crash::CrashPoint::MidBatch);
            let silent = crate::pipeline::restore::silent(restore_until, r.partition, r.offset);
            if silent {
                stats.restored += 1;
                crate::crash::point(crate::crash::CrashPoint::Restoring);
            }
            let ev = match decoded {
                Ok(ev) => ev,
                Err(e) => {
                    debug!(partition = r.partition, offset = r.offset, class = e.class(), error = %e, "Dead-lettering a record");
                    *stats.dead_letters.entry(e.class()).or_default() += 1;
                    if !silent {
                        self.metrics.dead_letter(e.class());
                        if !self.discard_outputs {
                            batch.publish(dead_letter(&self.topics.dlq, r, &e));
                        }
                    }
                    continue;
                }
            };
            let auth = authenticity(self.keys, r, &ev);
            let forged = core::trust::refused(self.policy, &ev.body, auth);
            if let (core::Body::DeadlineReached { deadline }, false) = (&ev.body, forged) {
                applied.deadlines.push((ev.operation_id.clone(), *deadline));
            }
            let p = r.partition;
            let op = self.slot(&mut ops, p, &ev.operation_id)?;
            let slot = &mut op.state;
            let entity =
                slot_or_load(&mut entities, p, &ev.entity_id, || Ok(self.store.get_entity(p, &ev.entity_id)?))?;
            let pos = SourcePos { partition: p, offset: r.offset };
            let arrival = Arrival::of(&ev, pos, self.policy);
            let arrival = if forged { arrival.without_decision() } else { arrival };
            let failed = metrics::Failure::of(&ev.body);
            if forged && !silent {
                self.metrics.forged_control_event(ev.body.name(), auth);
                warn!(partition = p, offset = r.offset, producer = %ev.producer, body = ev.body.name(), event_id = %ev.event_id, authenticity = auth.as_str(), "A control event without a valid signature: not applied (FORGED_CONTROL_EVENT)");
            }
            // Only a timer removes an operation (out of retention).
            let removable = matches!(ev.body, core::Body::DeadlineReached { .. }) && slot.is_some();
            let removable = removable.then(|| ev.operation_id.clone());
            let step = core::apply(self.policy, slot, entity, ev, auth, pos, &mut outputs);
            let d = step.disposition;
            self.metrics.event(d, failed, slot.as_ref());
            if let (Some(id), None) = (removable, slot.as_ref()) {
                // Its timeline goes now: a new operation of the same id
                // later in the batch starts one of its own.
                batch.drop_timeline(p, &id, std::mem::take(&mut op.timeline));
            }
            timeline::record(&mut batch, &mut op.timeline, arrival, d, &outputs, slot.as_ref());
            *stats.by_disposition.entry(d.as_str()).or_default() += 1;
            if let (Disposition::Held, Some(op)) = (d, slot.as_ref()) {
                debug!(operation_id = %op.operation_id, entity_id = %op.entity_id, partition = p, offset = r.offset, "Event held for reordering");
            }
            self.emit(&mut outputs, silent, &mut batch, stats)?;
            // The operations its request replaced (supersede), each noted in
            // its own timeline.
            for s in &step.supersede {
                let older = self.slot(&mut ops, p, &s.operation_id)?;
                let changed = core::supersede(self.policy, &mut older.state, entity, s, &mut outputs);
                if let (true, Some(op)) = (changed, older.state.as_ref()) {
                    let closed = op.status.is_terminal();
                    self.metrics.superseded(closed);
                    debug!(operation_id = %op.operation_id, entity_id = %op.entity_id, by = %s.by.operation_id, closed, "Operation superseded");
                    let arrival = Arrival::superseded(s);
                    timeline::record(&mut batch, &mut older.timeline, arrival, d, &outputs, Some(op));
                }
                self.emit(&mut outputs, silent, &mut batch, stats)?;
            }
        }
        batch.reserve(ops.len(), entities.len());
        for ((p, op_id), op) in ops {
            batch.move_timer(p, &op_id, op.timer_before, op.state.as_ref());
            batch.put_op(p, op_id, op.state, op.timeline);
        }
        for ((p, id), e) in entities {
            // Its facts go with its last operation (bounded state).
            batch.put_entity(p, id, (!e.is_unused()).then_some(e));
        }
        for (p, n) in &applied.touched {
            batch.set_offset(*p, *n);
        }
        // Encoded here, on the lane's thread, which also frees the states;
        // the changelog records too (none when nothing is published).
        applied.batch = batch.encode(Target::of(self.topics).filter(|_| !self.discard_outputs));
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A borrowed key finds the slot of the owned key it equals, and only
    /// that one (it must hash as the owned key does).
    #[test]
    fn a_borrowed_key_finds_its_slot() {
        let mut slots: Slots<u32> = Slots::default();
        for (i, (p, id)) in [(3, "op-1"), (4, "op-1"), (3, "op-2"), (3, "")].into_iter().enumerate() {
            slots.insert((p, id.to_owned()), i as u32);
        }
        assert_eq!(slots.get(&Key(3, "op-1")), Some(&0));
        assert_eq!(slots.get(&Key(4, "op-1")), Some(&1));
        assert_eq!(slots.get(&Key(3, "op-2")), Some(&2));
        assert_eq!(slots.get(&Key(3, "")), Some(&3));
        assert_eq!(slots.get(&Key(4, "op-2")), None);
        assert_eq!(slots.get(&Key(3, "op-")), None);
    }

    /// Six partitions of equal size over two lanes: three each. (That
    /// lanes give the result of one thread is tests/offline/lanes.rs.)
    #[test]
    fn partitions_are_spread_over_the_lanes_by_size() {
        let records: Vec<Record> = [0, 1, 2, 3, 4, 5]
            .iter()
            .flat_map(|&p| {
                (0..MIN_LANE_RECORDS as i64).map(move |o| Record {
                    topic: "".into(),
                    partition: p,
                    offset: o,
                    timestamp: None,
                    key: None,
                    value: None,
                    headers: Vec::new(),
                })
            })
            .collect();
        let (lanes, lane_of) = plan_lanes(&records, &(0..6).map(|p| (p, 0)).collect::<BTreeMap<_, _>>(), 2);
        assert_eq!(lanes, 2);
        assert_eq!(lane_of.values().filter(|&&l| l == 0).count(), 3, "three partitions a lane");
        // Below the smallest lane's worth of records, one lane.
        assert_eq!(plan_lanes(&records[..MIN_LANE_RECORDS], &(0..6).map(|p| (p, 0)).collect(), 2).0, 1);
    }
}
