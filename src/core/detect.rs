//! Detection before state: duplicates, order, conflicts, the
//! reorder buffer and orphans. This is also the core's entry point, [`apply`].
//!
//! Every event ends in exactly one [`Disposition`]; nothing is dropped
//! without a trace.

use std::collections::btree_map::Entry;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::deadline;
use super::event::{Body, Event, SourcePos};
use super::names::named_enum;
use super::operation::{EntityState, HeldEvent, OperationState, SeqRecord, Trigger};
use super::output::{AnomalyKind, Output, Status, Supersession};
use super::policy::Policy;
use super::trust::{self, Authenticity};
use super::verdict::anomaly;

/// Most missing revisions a SEQ_GAP anomaly lists one by one.
pub const MAX_NAMED_MISSING: usize = 100;

named_enum! {
    /// How one input event was accounted for.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Disposition {
        /// Applied to the operation's state.
        Applied => "applied",
        /// A duplicate delivery or emission: state unchanged.
        Duplicate => "duplicate",
        /// Waiting in the reorder buffer.
        Held => "held",
        /// Flagged (late, conflicting, invalid): recorded, state never regresses.
        Anomalous => "anomalous",
        /// A timer for an operation that no longer exists (left retention).
        Ignored => "ignored",
    }
}

/// What applying one event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// How the event was accounted for.
    pub disposition: Disposition,
    /// Operations of the entity the event's request replaces (older ones,
    /// or the request's own when a newer version is already open): the
    /// driver loads each and hands it to [`supersede`], in order.
    pub supersede: Vec<Supersede>,
}

/// A request for a higher version replaces an older operation of the same
/// entity, operation type and destination (supersede).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Supersede {
    /// The older operation.
    pub operation_id: String,
    /// The newer one.
    pub by: Supersession,
    /// The `Requested` just applied (of either): the verdict's trigger.
    pub trigger_event_id: String,
    /// Event time of that `Requested`: the verdict's `decided_at`.
    pub at: i64,
    /// Log position of that `Requested`: the verdict's trigger position.
    pub pos: SourcePos,
}

impl Step {
    fn only(disposition: Disposition) -> Step {
        Step { disposition, supersede: Vec::new() }
    }
}

/// Applies one event to its operation (`slot`, `None` if unknown) and the
/// entity's shared facts, appending every decision to `out`. `auth` is what
/// the record's signature proved (see [`super::trust`]): under
/// `policy.signed_control`, a control event that is not
/// [`Authenticity::Signed`] changes nothing and is flagged
/// FORGED_CONTROL_EVENT.
///
/// Pure: the result depends only on the arguments. Afterwards
/// `slot.timer_at` is the operation's next timer (or the slot is `None` when
/// the operation left retention), and the entity's facts account for the
/// operation (`entity.is_unused()` says when they can be removed too).
pub fn apply(
    policy: &Policy,
    slot: &mut Option<OperationState>,
    entity: &mut EntityState,
    mut ev: Event,
    auth: Authenticity,
    pos: SourcePos,
    out: &mut Vec<Output>,
) -> Step {
    redact_body(policy, &mut ev.body);
    if trust::refused(policy, &ev.body, auth) {
        // Before anything else: not even its event id is remembered (the
        // genuine event with that id must still be applied when it comes).
        out.push(Output::Anomaly(trust::forged(slot.as_ref(), &ev, pos, auth)));
        return Step::only(Disposition::Anomalous);
    }
    if let Body::DeadlineReached { deadline } = ev.body {
        let Some(op) = slot.as_mut() else {
            return Step::only(Disposition::Ignored);
        };
        // Timers are idempotent by time and never deduplicated by id: the
        // same due time can come up again (a re-armed deadline, a new
        // gap with the same window end), and a timer firing twice (a
        // restart between publishing and consuming it) changes nothing.
        if deadline::on_timer(op, policy, entity, &ev, pos, deadline, out) {
            entity.forget(&op.operation_id);
            *slot = None;
        } else {
            op.timer_at = deadline::next_timer(op, policy);
            entity.track(op);
        }
        return Step::only(Disposition::Applied);
    }
    if let Some(op) = slot.as_mut().filter(|op| op.entity_id != ev.entity_id) {
        // The operation belongs to another entity: its facts (and the
        // supersede rule) must not mix. Recorded, nothing applied.
        let detail = format!(
            "{} names entity {}, but operation {} belongs to entity {}.",
            ev.body.name(),
            ev.entity_id,
            op.operation_id,
            op.entity_id
        );
        out.push(Output::Anomaly(anomaly(AnomalyKind::InvalidTransition, op, &ev, pos, detail, Vec::new())));
        return Step::only(Disposition::Anomalous);
    }
    // A request may replace older operations of the entity (or be replaced
    // by a newer one): only worth a copy of its id when there are others.
    let request = match &ev.body {
        Body::Requested(_) if entity.open.iter().any(|o| o.operation_id != ev.operation_id) => {
            Some(ev.event_id.clone())
        }
        _ => None,
    };
    let op = match slot {
        Some(op) => op,
        None => {
            entity.operations += 1;
            slot.insert(OperationState::new(&ev))
        }
    };
    if op.has_taken_in(&ev.event_id) {
        return Step::only(duplicate_delivery(op, &ev, pos, out));
    }
    op.seen_event_ids.insert(ev.event_id.clone());
    let at = ev.occurred_at;
    // Event time moves with every event: give up gaps whose window closed.
    expire_held(op, policy, entity, at, pos, out);
    let disposition = admit(op, policy, entity, ev, pos, out, true);
    drain(op, policy, entity, out);
    let supersede = match (request, disposition) {
        (Some(event_id), Disposition::Applied) => superseded(op, entity, &event_id, at, pos),
        _ => Vec::new(),
    };
    op.timer_at = deadline::next_timer(op, policy);
    entity.track(op);
    Step { disposition, supersede }
}

/// Supersede: the operations a just applied request replaces. When an open
/// operation of the same entity, type and destination expects a higher
/// version, the request itself is the older one: it is replaced at once.
fn superseded(op: &OperationState, entity: &EntityState, event_id: &str, at: i64, pos: SourcePos) -> Vec<Supersede> {
    let Some(req) = op.request.as_ref() else { return Vec::new() };
    let Some(version) = req.expected_version else { return Vec::new() };
    let same: Vec<_> = entity
        .open
        .iter()
        .filter(|o| {
            o.operation_id != op.operation_id
                && o.operation_type == op.operation_type
                && o.destination == req.destination
        })
        .filter_map(|o| o.expected_version.map(|v| (v, &o.operation_id)))
        .collect();
    let supersede = |target: &str, by: Supersession| Supersede {
        operation_id: target.to_owned(),
        by,
        trigger_event_id: event_id.to_owned(),
        at,
        pos,
    };
    if let Some((v, id)) = same.iter().filter(|(v, _)| *v > version).max() {
        let by = Supersession { operation_id: (*id).clone(), expected_version: Some(*v) };
        return vec![supersede(&op.operation_id, by)];
    }
    let by = Supersession { operation_id: op.operation_id.clone(), expected_version: Some(version) };
    same.iter().filter(|(v, _)| *v < version).map(|(_, id)| supersede(id, by.clone())).collect()
}

/// Applies `s` to the operation it names (`slot`, loaded by the driver
/// from the same partition): an open one is closed NOT_APPLICABLE / CLOSE,
/// one in review is marked. Returns whether it changed (the driver then
/// notes it in the operation's timeline).
pub fn supersede(
    policy: &Policy,
    slot: &mut Option<OperationState>,
    entity: &mut EntityState,
    s: &Supersede,
    out: &mut Vec<Output>,
) -> bool {
    let Some(op) = slot.as_mut() else { return false };
    let trigger = Trigger { event_id: &s.trigger_event_id, at: s.at, pos: s.pos };
    let changed = op.supersede(policy, &s.by, trigger, out);
    op.timer_at = deadline::next_timer(op, policy);
    entity.track(op);
    changed
}

fn duplicate_delivery(op: &mut OperationState, ev: &Event, pos: SourcePos, out: &mut Vec<Output>) -> Disposition {
    op.duplicates_seen += 1;
    let detail = format!("Event {} was delivered again (at-least-once redelivery).", ev.event_id);
    out.push(Output::Anomaly(anomaly(AnomalyKind::DuplicateDelivery, op, ev, pos, detail, Vec::new())));
    Disposition::Duplicate
}

fn redact_body(policy: &Policy, body: &mut Body) {
    let r = &policy.redactor;
    match body {
        Body::AttemptFailed { detail, .. } | Body::OutcomeUnknown { detail, .. } | Body::ProbeFailed { detail, .. } => {
            r.redact_in_place(detail)
        }
        Body::EffectObserved(o) => {
            if let Some(e) = o.evidence_ref.as_mut() {
                r.redact_in_place(e)
            }
        }
        Body::EffectAbsent { evidence_ref: Some(e), .. } => r.redact_in_place(e),
        Body::ManualDecision { note, .. } => r.redact_in_place(note),
        _ => {}
    }
}

/// Stable digest of a body, to tell a re-emission from a conflicting one.
pub(crate) fn body_hash(body: &Body) -> u64 {
    let mut buf = [0u8; 512];
    match postcard::to_slice(body, &mut buf) {
        Ok(bytes) => xxh3_64(bytes),
        // Larger than the stack buffer: same bytes, allocated.
        Err(_) => xxh3_64(&postcard::to_allocvec(body).expect("bodies serialize")),
    }
}

/// Classifies an event that is not a duplicate delivery and applies, holds
/// or flags it. `fresh` is false when the event comes out of the buffer (its
/// arrival was already accounted for).
fn admit(
    op: &mut OperationState,
    policy: &Policy,
    entity: &mut EntityState,
    ev: Event,
    pos: SourcePos,
    out: &mut Vec<Output>,
    fresh: bool,
) -> Disposition {
    let hash = body_hash(&ev.body);
    if let Some(s) = ev.seq {
        // Another event already claimed this revision (applied or held)?
        let claimed = if s < op.next_seq {
            op.applied_seqs.get(&s).map(|r| (r.event_id.clone(), r.body_hash))
        } else {
            op.held
                .iter()
                .find(|h| h.event.seq == Some(s))
                .map(|h| (h.event.event_id.clone(), body_hash(&h.event.body)))
        };
        if let Some((other_id, other_hash)) = claimed {
            return same_revision(op, policy, &ev, pos, &other_id, other_hash == hash, out);
        }
        if s < op.next_seq && op.status != Status::Unrequested {
            let detail = format!(
                "Revision {s} arrived after revision {} was applied; recorded, state not regressed.",
                op.next_seq - 1
            );
            out.push(Output::Anomaly(anomaly(AnomalyKind::LateEvent, op, &ev, pos, detail, Vec::new())));
            return Disposition::Anomalous;
        }
    }
    let is_request = matches!(ev.body, Body::Requested(_));
    let waits_for_request = op.status == Status::Unrequested && !is_request;
    // A request is never held: it creates the operation whatever its seq.
    let ahead = ev.seq.is_some_and(|s| s > op.next_seq) && !(is_request && op.status == Status::Unrequested);
    if waits_for_request || ahead {
        if fresh && ahead {
            op.out_of_order_seen += 1;
            let detail = format!(
                "Revision {} arrived while revision {} was expected; held until the gap fills.",
                ev.seq.unwrap_or_default(),
                op.next_seq
            );
            out.push(Output::Anomaly(anomaly(AnomalyKind::OutOfOrder, op, &ev, pos, detail, Vec::new())));
        }
        let hold_until = ev.occurred_at.saturating_add(policy.reorder_window_ms);
        op.held.push(HeldEvent { event: ev, pos, hold_until });
        if op.held.len() > policy.reorder_max_held {
            give_up_oldest_gap(op, policy, entity, pos, out);
        }
        return Disposition::Held;
    }
    apply_now(op, policy, entity, ev, pos, hash, out)
}

/// A second event for an already claimed revision: the same body is a
/// duplicate emission, another body a conflicting transition (a race
/// between workers).
fn same_revision(
    op: &mut OperationState,
    policy: &Policy,
    ev: &Event,
    pos: SourcePos,
    other_id: &str,
    same_body: bool,
    out: &mut Vec<Output>,
) -> Disposition {
    let s = ev.seq.unwrap_or_default();
    if same_body {
        op.duplicates_seen += 1;
        let detail =
            format!("Revision {s} was emitted again as {} (first as {other_id}) with the same body.", ev.event_id);
        out.push(Output::Anomaly(anomaly(AnomalyKind::DuplicateEmission, op, ev, pos, detail, Vec::new())));
        Disposition::Duplicate
    } else {
        let detail = format!(
            "Revision {s} was written twice with different bodies ({other_id}, then {} {}): two writers transitioned the same revision.",
            ev.event_id,
            ev.body.name()
        );
        out.push(Output::Anomaly(anomaly(AnomalyKind::ConflictingTransition, op, ev, pos, detail.clone(), Vec::new())));
        op.conflict(policy, ev, pos, detail, out);
        Disposition::Anomalous
    }
}

fn apply_now(
    op: &mut OperationState,
    policy: &Policy,
    entity: &mut EntityState,
    ev: Event,
    pos: SourcePos,
    hash: u64,
    out: &mut Vec<Output>,
) -> Disposition {
    let from = op.status;
    let ok = op.transition(policy, entity, &ev, pos, out);
    if let Some(s) = ev.seq {
        // The id moves from the ids taken in to its revision's record: each
        // id is stored once (see `OperationState::seen_event_ids`).
        match op.applied_seqs.entry(s) {
            Entry::Vacant(slot) => {
                let event_id = op.seen_event_ids.take(&ev.event_id).unwrap_or_else(|| ev.event_id.clone());
                slot.insert(SeqRecord { event_id, body_hash: hash });
            }
            // Not reached (a claimed revision is never applied again). Were
            // it, the record would stay the first claimer's, which the
            // timeline entries of that event name (`store::timeline`), and
            // this id would stay among the ids taken in.
            Entry::Occupied(_) => {
                op.seen_event_ids.insert(ev.event_id.clone());
            }
        }
        op.next_seq = op.next_seq.max(s.saturating_add(1));
    }
    op.last_event_at = op.last_event_at.max(ev.occurred_at);
    if ok {
        op.events_applied += 1;
        Disposition::Applied
    } else {
        let detail = format!("{} cannot follow state {}.", ev.body.name(), from.as_str());
        out.push(Output::Anomaly(anomaly(AnomalyKind::InvalidTransition, op, &ev, pos, detail, Vec::new())));
        Disposition::Anomalous
    }
}

/// Applies held events whose turn has come (and, once the request is
/// known, the orphans recorded before it).
fn drain(op: &mut OperationState, policy: &Policy, entity: &mut EntityState, out: &mut Vec<Output>) {
    if op.status != Status::Unrequested && !op.orphaned.is_empty() {
        let orphans = std::mem::take(&mut op.orphaned);
        op.held.splice(0..0, orphans);
    }
    while op.status != Status::Unrequested {
        let next = op.next_seq;
        let i = op
            .held
            .iter()
            .position(|h| h.event.seq == Some(next))
            .or_else(|| op.held.iter().position(|h| h.event.seq.is_none_or(|s| s < next)));
        let Some(i) = i else { break };
        let h = op.held.remove(i);
        admit(op, policy, entity, h.event, h.pos, out, false);
    }
}

/// Gives up every gap whose reorder window closed by event time `now`.
pub(crate) fn expire_held(
    op: &mut OperationState,
    policy: &Policy,
    entity: &mut EntityState,
    now: i64,
    pos: SourcePos,
    out: &mut Vec<Output>,
) {
    while op.held.iter().any(|h| h.hold_until <= now) {
        if op.status == Status::Unrequested {
            let (expired, kept) = std::mem::take(&mut op.held).into_iter().partition(|h| h.hold_until <= now);
            op.held = kept;
            for h in expired {
                orphan(op, policy, h, pos, out);
            }
        } else {
            give_up_oldest_gap(op, policy, entity, pos, out);
        }
    }
}

/// Records an event whose request never came within the window. It is kept
/// (up to the reorder bound) so that a request arriving even later still
/// sees the whole history instead of judging a half-known operation.
fn orphan(op: &mut OperationState, policy: &Policy, h: HeldEvent, pos: SourcePos, out: &mut Vec<Output>) {
    let detail = format!(
        "{} for operation {} arrived but its Requested never did within the reorder window.",
        h.event.body.name(),
        op.operation_id
    );
    out.push(Output::Anomaly(anomaly(AnomalyKind::OrphanEvent, op, &h.event, pos, detail, Vec::new())));
    op.orphaned.push(h);
    if op.orphaned.len() > policy.reorder_max_held {
        op.orphaned.remove(0);
    }
}

/// Stops waiting for the revisions in front of the lowest held one: names
/// them in a SEQ_GAP and applies what was held (or, before the request,
/// records the oldest held event as an orphan).
fn give_up_oldest_gap(
    op: &mut OperationState,
    policy: &Policy,
    entity: &mut EntityState,
    pos: SourcePos,
    out: &mut Vec<Output>,
) {
    if op.status == Status::Unrequested {
        let h = op.held.remove(0);
        orphan(op, policy, h, pos, out);
        return;
    }
    let Some(i) = (0..op.held.len()).min_by_key(|&i| op.held[i].event.seq.unwrap_or(i64::MIN)) else {
        return;
    };
    let h = op.held.remove(i);
    if let Some(s) = h.event.seq {
        // Name at most MAX_NAMED_MISSING revisions: a producer that jumps
        // from 2 to 10^12 must not make the anomaly (or memory) explode.
        let missing: Vec<i64> =
            (op.next_seq..s).filter(|m| !op.applied_seqs.contains_key(m)).take(MAX_NAMED_MISSING).collect();
        let count = s - op.next_seq;
        let detail = if count as usize > missing.len() {
            format!(
                "{count} revisions from {} to {} never arrived within the reorder window; revision {s} applied anyway.",
                op.next_seq,
                s - 1
            )
        } else {
            format!("Revisions {missing:?} never arrived within the reorder window; revision {s} applied anyway.")
        };
        out.push(Output::Anomaly(anomaly(AnomalyKind::SeqGap, op, &h.event, pos, detail, missing)));
        op.next_seq = s;
    }
    admit(op, policy, entity, h.event, h.pos, out, false);
    drain(op, policy, entity, out);
}
