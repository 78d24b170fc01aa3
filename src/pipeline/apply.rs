//! Applying one consumed batch to the state: decode each record, run the
//! core against the stored state, note the timeline and the metrics, and
//! gather everything the batch changed into one store [`Batch`].
//!
//! No Kafka in here. The run loop ([`super::Pipeline`]) feeds it what the
//! consumer returned and then writes, publishes and acknowledges; the
//! rebuild bench (`benches/rebuild.rs`) feeds it records from memory, so it
//! measures exactly the work the pipeline does per record.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use tracing::{debug, info};

use super::{dead_letter, decode_record, output_record, PipelineError, Stats};
use crate::codec::Codec;
use crate::config::Topics;
use crate::core::{self, Disposition, EntityState, OperationState, Output, Policy, SourcePos};
use crate::kafka::Record;
use crate::metrics::{self, Metrics};
use crate::operator::timeline::{self, Arrival};
use crate::store::{Batch, Store};

/// What a batch needs besides its records; borrowed from the pipeline.
pub struct Applier<'a> {
    pub store: &'a Store,
    pub policy: &'a Policy,
    pub codec: &'a Codec,
    pub topics: &'a Topics,
    pub max_record_bytes: usize,
    pub metrics: &'a Metrics,
}

/// A batch applied in memory, ready to be written.
#[derive(Debug, Default)]
pub struct Applied {
    /// State, timers, offsets, timeline and the outputs to publish.
    pub batch: Batch,
    /// Each partition the batch advanced, with its next offset.
    pub touched: BTreeMap<i32, i64>,
    /// `DeadlineReached` events consumed back: (operation, due time).
    pub deadlines: Vec<(String, i64)>,
}

/// An operation during a batch: the timer it had in the index before the
/// batch (to move it in the index once, at the end), its state, and how
/// many timeline entries it has received.
struct OpSlot {
    timer_before: Option<i64>,
    state: Option<OperationState>,
    timeline_total: u64,
}

impl Applier<'_> {
    /// Applies `records` in order. `next` holds the next offset to apply of
    /// each owned partition (records of other partitions, and records below
    /// it, are skipped: never applied twice) and is advanced. Records below
    /// `restore_until` of their partition are applied silently: a previous
    /// owner already published their outputs.
    pub fn apply(
        &self,
        records: &[Record],
        next: &mut BTreeMap<i32, i64>,
        restore_until: &BTreeMap<i32, i64>,
        stats: &mut Stats,
    ) -> Result<Applied, PipelineError> {
        let mut ops: HashMap<(i32, String), OpSlot> = HashMap::new();
        let mut entities: HashMap<(i32, String), EntityState> = HashMap::new();
        let mut applied = Applied::default();
        let mut outputs = Vec::new();
        for r in records {
            let Some(expected) = next.get(&r.partition).copied() else { continue };
            if r.offset < expected {
                continue; // applied before a restart or a seek: never twice
            }
            next.insert(r.partition, r.offset + 1);
            applied.touched.insert(r.partition, r.offset + 1);
            stats.records += 1;
            crate::faults::point("pipeline::mid_batch");
            let silent = crate::restore::silent(restore_until, r.partition, r.offset);
            if silent {
                stats.restored += 1;
                crate::faults::point("pipeline::restoring");
            }
            let ev = match decode_record(self.codec, self.max_record_bytes, r) {
                Ok(ev) => ev,
                Err(e) => {
                    debug!(partition = r.partition, offset = r.offset, class = e.class(), error = %e, "Dead-lettering a record");
                    *stats.dead_letters.entry(e.class()).or_default() += 1;
                    if !silent {
                        self.metrics.dead_letter(e.class());
                        applied.batch.publish(dead_letter(&self.topics.dlq, r, &e));
                    }
                    continue;
                }
            };
            if let core::Body::DeadlineReached { deadline } = ev.body {
                applied.deadlines.push((ev.operation_id.clone(), deadline));
            }
            let p = r.partition;
            let op = match ops.entry((p, ev.operation_id.clone())) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    let (state, timeline_total) = self.store.load_op(p, &ev.operation_id)?;
                    v.insert(OpSlot { timer_before: state.as_ref().and_then(|s| s.timer_at), state, timeline_total })
                }
            };
            let slot = &mut op.state;
            let entity = match entities.entry((p, ev.entity_id.clone())) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => v.insert(self.store.get_entity(p, &ev.entity_id)?),
            };
            let pos = SourcePos { partition: p, offset: r.offset };
            let arrival = Arrival::of(&ev, pos, self.policy);
            let failed = metrics::failure_class(&ev.body);
            let d = core::apply(self.policy, slot, entity, ev, pos, &mut outputs);
            self.metrics.event(d, failed, slot.as_ref());
            timeline::record(&mut applied.batch, &mut op.timeline_total, arrival, d, &outputs, slot.is_some());
            *stats.by_disposition.entry(d.as_str()).or_default() += 1;
            if let (Disposition::Held, Some(op)) = (d, slot.as_ref()) {
                debug!(operation_id = %op.operation_id, entity_id = %op.entity_id, partition = p, offset = r.offset, "Event held for reordering");
            }
            if silent {
                outputs.clear();
            }
            for o in outputs.drain(..) {
                self.metrics.output(&o);
                match &o {
                    Output::Verdict(v) => {
                        stats.verdicts += 1;
                        info!(operation_id = %v.operation_id, entity_id = %v.entity_id, outcome = v.outcome.as_str(), action = v.action.as_str(), "Verdict");
                    }
                    Output::Anomaly(a) => {
                        stats.anomalies += 1;
                        debug!(operation_id = %a.operation_id, entity_id = %a.entity_id, kind = a.kind.as_str(), "Anomaly");
                    }
                    Output::Command(_) => stats.commands += 1,
                }
                applied.batch.publish(output_record(self.codec, self.topics, &o)?);
            }
        }
        let batch = &mut applied.batch;
        for ((p, op_id), op) in ops {
            batch.move_timer(p, &op_id, op.timer_before, op.state.as_ref());
            batch.put_op(p, op_id, op.state, op.timeline_total);
        }
        for ((p, id), e) in entities {
            batch.put_entity(p, id, e);
        }
        for (p, n) in &applied.touched {
            batch.set_offset(*p, *n);
        }
        Ok(applied)
    }
}
