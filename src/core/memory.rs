//! An in-memory driver of the core: operations and entities in maps.
//!
//! Used by the golden scenarios, the property tests, the benches and the
//! replay-without-Kafka path. The RocksDB store drives the same `apply`.

use std::collections::HashMap;

use super::detect::{apply, supersede, Disposition};
use super::event::{Event, SourcePos};
use super::operation::{EntityState, OperationState};
use super::output::Output;
use super::policy::Policy;
use super::trust::Authenticity;

/// All state of one reconciler, kept in memory. (Hash maps: a B-tree of
/// these large values spends its time shifting them; nothing here depends
/// on iteration order, `due_timers` sorts.)
#[derive(Debug, Clone, Default)]
pub struct MemoryEngine {
    /// Every operation still in retention, by operation id.
    pub ops: HashMap<String, OperationState>,
    /// The shared facts of every entity with an operation in `ops`, by entity id.
    pub entities: HashMap<String, EntityState>,
}

impl MemoryEngine {
    /// An empty state, as at the start of a replay.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one event, appending its outputs to `out`: the event's own,
    /// then those of the older operations its request supersedes. The event
    /// is taken as authentic (a test's or a replay's own input); see
    /// [`MemoryEngine::process_checked`].
    pub fn process(&mut self, policy: &Policy, ev: Event, pos: SourcePos, out: &mut Vec<Output>) -> Disposition {
        self.process_checked(policy, ev, Authenticity::Signed, pos, out)
    }

    /// [`MemoryEngine::process`] of an event whose signature check said `auth`.
    pub fn process_checked(
        &mut self,
        policy: &Policy,
        ev: Event,
        auth: Authenticity,
        pos: SourcePos,
        out: &mut Vec<Output>,
    ) -> Disposition {
        let mut slot = self.ops.remove(&ev.operation_id);
        let op_id = ev.operation_id.clone();
        let entity_id = ev.entity_id.clone();
        let entity = self.entities.entry(entity_id.clone()).or_default();
        let step = apply(policy, &mut slot, entity, ev, auth, pos, out);
        if let Some(op) = slot {
            self.ops.insert(op_id, op);
        }
        for s in &step.supersede {
            let mut older = self.ops.remove(&s.operation_id);
            supersede(policy, &mut older, entity, s, out);
            if let Some(op) = older {
                self.ops.insert(s.operation_id.clone(), op);
            }
        }
        if entity.is_unused() {
            self.entities.remove(&entity_id);
        }
        step.disposition
    }

    /// The due timers at event time `now`, as the pipeline's wheel would
    /// publish them: `DeadlineReached` events in (time, operation) order.
    pub fn due_timers(&self, now: i64) -> Vec<Event> {
        let mut due: Vec<(i64, &OperationState)> =
            self.ops.values().filter_map(|op| op.timer_at.filter(|t| *t <= now).map(|t| (t, op))).collect();
        due.sort_by(|a, b| (a.0, &a.1.operation_id).cmp(&(b.0, &b.1.operation_id)));
        due.into_iter()
            .map(|(t, op)| Event::deadline_reached(&op.operation_id, &op.entity_id, &op.operation_type, t))
            .collect()
    }

    /// Fires every timer due at or before `until`, as the pipeline's wheel
    /// would, until none is left (a fired timer may set a later one).
    /// `pos` gives each `DeadlineReached` its place in the log.
    pub fn run_timers(
        &mut self,
        policy: &Policy,
        until: i64,
        mut pos: impl FnMut() -> SourcePos,
        out: &mut Vec<Output>,
    ) {
        loop {
            let due = self.due_timers(until);
            if due.is_empty() {
                return;
            }
            for ev in due {
                self.process(policy, ev, pos(), out);
            }
        }
    }

    /// Applies `events` as one partition's log (offsets 1, 2, ...), then
    /// fires every timer due by `timers_until`: the whole pipeline, minus
    /// Kafka. Used to predict what the broker pipeline must produce.
    pub fn replay(
        &mut self,
        policy: &Policy,
        events: impl IntoIterator<Item = Event>,
        timers_until: i64,
        out: &mut Vec<Output>,
    ) {
        let mut offset = 0;
        let mut next = move || {
            offset += 1;
            SourcePos { partition: 0, offset }
        };
        for ev in events {
            self.process(policy, ev, next(), out);
        }
        self.run_timers(policy, timers_until, next, out);
    }
}
