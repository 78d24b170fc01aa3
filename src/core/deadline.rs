//! Timers: when an operation next needs the clock, and what
//! happens when that time comes.
//!
//! The core never reads a clock. It says when it wants to be woken
//! (`next_timer`); the pipeline indexes that time, and when the wall clock
//! passes it, publishes a `DeadlineReached` event into the log. Only when
//! that event is consumed does `on_timer` judge, so a replay of the log
//! reproduces every timeout exactly.

use super::detect::expire_held;
use super::event::{Event, SourcePos};
use super::operation::{EntityState, OperationState};
use super::output::{Output, Status};
use super::policy::Policy;

/// The earliest event time at which `op` needs a `DeadlineReached`: its
/// confirmation deadline, the follow-up of a machine action, the end of a
/// reorder window, or the end of retention.
///
/// Every operation that is not in MANUAL_REVIEW has one (the
/// reconciliation does not stop at the first verdict); the property tests
/// check it after every event.
pub fn next_timer(op: &OperationState, policy: &Policy) -> Option<i64> {
    let mut due: Option<i64> = None;
    let mut consider = |t: i64| due = Some(due.map_or(t, |d| d.min(t)));
    if op.awaits_evidence() {
        if let (false, Some(d)) = (op.overdue_judged, op.deadline_at) {
            consider(d);
        }
        if let Some(f) = op.follow_up {
            consider(f.at);
        }
    }
    for h in &op.held {
        consider(h.hold_until);
    }
    if let Some(t) = retention_end(op, policy) {
        consider(t);
    }
    due
}

/// When a finished (or abandoned, never requested) operation may be removed:
/// `retention_ms` after it became terminal or after its last event, whichever
/// is later. An entity's facts go with its last operation, so they too are
/// kept at least `retention_ms` after the entity's last event.
fn retention_end(op: &OperationState, policy: &Policy) -> Option<i64> {
    if op.status.is_terminal() {
        op.terminal_at.map(|t| t.max(op.last_event_at).saturating_add(policy.retention_ms))
    } else if op.status == Status::Unrequested && op.held.is_empty() {
        Some(op.last_event_at.saturating_add(policy.retention_ms))
    } else {
        None
    }
}

/// Handles a consumed `DeadlineReached` for time `deadline`: gives up
/// expired reorder gaps, judges an overdue operation, follows up a machine
/// action nobody answered, and returns true when the operation has left
/// retention and must be removed.
pub(crate) fn on_timer(
    op: &mut OperationState,
    policy: &Policy,
    entity: &mut EntityState,
    ev: &Event,
    pos: SourcePos,
    deadline: i64,
    out: &mut Vec<Output>,
) -> bool {
    expire_held(op, policy, entity, deadline, pos, out);
    let overdue = op.deadline_at.is_some_and(|d| d <= deadline);
    if op.awaits_evidence() && !op.overdue_judged && overdue {
        op.judge_overdue(policy, ev, pos, out);
    }
    if op.awaits_evidence() && op.follow_up.is_some_and(|f| f.at <= deadline) {
        op.follow_up_due(policy, ev, pos, out);
    }
    retention_end(op, policy).is_some_and(|t| t <= deadline)
}
