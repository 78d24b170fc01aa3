//! `explain`: one operation's state, expected against observed evidence,
//! and its timeline (every record that arrived for it, in arrival order).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::core::event::Decision;
use crate::core::operation::LastVerdict;
use crate::core::{FollowUp, OperationState, Status, Supersession};
use crate::store::{Store, StoreError, TimelineEntry};

/// What the operation was supposed to do (from its `Requested`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Expected {
    /// Event time of the `Requested`: the confirmation window starts here.
    pub requested_at: i64,
    /// Version the effect must carry.
    pub version: Option<i64>,
    /// Fingerprint the effect must carry.
    pub fingerprint: Option<String>,
    /// Key a PROBE or REQUEUE reuses.
    pub idempotency_key: Option<String>,
    /// Repeating the call is safe, so a missing effect may be requeued.
    pub idempotent: bool,
    /// The external system that must hold the effect.
    pub destination: String,
    /// Confirmation window, resolved (the event's, the type's or the default).
    pub confirm_within_ms: i64,
    /// Attempt limit, resolved (the event's, the type's or the default).
    pub max_attempts: i32,
}

/// What the evidence so far shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Observed {
    /// Version last observed at the destination.
    pub version: Option<i64>,
    /// Fingerprint last observed at the destination.
    pub fingerprint: Option<String>,
    /// Distinct remote ids observed, in order; a second one is a duplicate
    /// effect.
    pub remote_ids: Vec<String>,
    /// Highest attempt number seen.
    pub attempts: i32,
    /// An attempt was seen (Started, AttemptFailed or OutcomeUnknown).
    pub started: bool,
    /// Event time of the latest event that reached the state machine.
    pub last_event_at: i64,
}

/// Counters of the operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Counts {
    /// Events applied to the state.
    pub events_applied: i64,
    /// Duplicate deliveries and emissions seen.
    pub duplicates_seen: i64,
    /// Events that arrived ahead of their turn.
    pub out_of_order_seen: i64,
    /// Events waiting in the reorder buffer now.
    pub held_now: usize,
    /// Events recorded as orphans, waiting for their `Requested`.
    pub orphaned_now: usize,
    /// Verdicts issued.
    pub verdicts: u32,
}

/// One timeline entry with what the whole timeline says about it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimelineRow {
    /// The entry as stored.
    #[serde(flatten)]
    pub entry: TimelineEntry,
    /// 1 for the first arrival of this event_id, 2 for the first
    /// redelivery, ...
    pub delivery: u32,
    /// How many times this event_id arrived (in the retained timeline).
    pub deliveries: u32,
    /// A held event still waiting (reorder buffer or orphaned); false for a
    /// held event applied later, once its gap filled or was given up.
    pub still_held: bool,
}

/// Everything `explain` shows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Explanation {
    /// The operation explained.
    pub operation_id: String,
    /// The entity it belongs to (the records' key).
    pub entity_id: String,
    /// Its type (selects the per-type policy).
    pub operation_type: String,
    /// The input partition holding it and its state.
    pub partition: i32,
    /// Where it stands in the state machine.
    pub state: Status,
    /// The confirmation deadline while it is armed (spent once judged
    /// overdue or replaced by a follow-up).
    pub deadline_at: Option<i64>,
    /// The machine action awaited and when it is followed up.
    pub follow_up: Option<FollowUp>,
    /// Automatic requeues so far.
    pub requeues: u32,
    /// The retry a worker scheduled, while it is pending.
    pub next_attempt_at: Option<i64>,
    /// The newer operation that replaced this one.
    pub superseded_by: Option<Supersession>,
    /// The next timer of the operation (deadline, follow-up, reorder
    /// window or end of retention); `None` only in manual review.
    pub next_timer_at: Option<i64>,
    /// Event time it entered manual review.
    pub review_since: Option<i64>,
    /// Event time it became terminal; retention counts from it.
    pub terminal_at: Option<i64>,
    /// `None` while the `Requested` has not arrived.
    pub expected: Option<Expected>,
    /// What the evidence so far shows.
    pub observed: Observed,
    /// Events applied, duplicates, out-of-order, held and orphaned events,
    /// verdicts.
    pub counts: Counts,
    /// The latest verdict, if any.
    pub last_verdict: Option<LastVerdict>,
    /// Decisions `resolve` would accept now (empty once terminal).
    pub allowed_decisions: Vec<Decision>,
    /// Every record that arrived for it, in arrival order (the last
    /// [`TIMELINE_CAP`](crate::store::timeline::TIMELINE_CAP)).
    pub timeline: Vec<TimelineRow>,
    /// Early timeline entries overwritten by the per-operation cap.
    pub timeline_dropped: u64,
}

/// The partition holding `operation_id` and its state, if this store has it.
pub fn locate(store: &Store, operation_id: &str) -> Result<Option<(i32, OperationState)>, StoreError> {
    let Some(p) = store.op_partition(operation_id)? else { return Ok(None) };
    Ok(store.get_op(p, operation_id)?.map(|op| (p, op)))
}

/// Decisions `op` accepts now, by the core's own rule.
pub fn allowed_decisions(op: &OperationState) -> Vec<Decision> {
    Decision::ALL.into_iter().filter(|d| op.check_decision(*d).is_ok()).collect()
}

/// Explains `operation_id`; `None` when the store does not know it (never
/// seen here, or removed after retention).
pub fn explain(store: &Store, operation_id: &str) -> Result<Option<Explanation>, StoreError> {
    let Some(partition) = store.op_partition(operation_id)? else { return Ok(None) };
    explain_in(store, partition, operation_id)
}

/// [`explain`] of `operation_id` in `partition` (see
/// [`Store::op_partition`]); `None` when that partition does not hold it.
pub fn explain_in(store: &Store, partition: i32, operation_id: &str) -> Result<Option<Explanation>, StoreError> {
    let Some(op) = store.get_op(partition, operation_id)? else { return Ok(None) };
    let timeline = store.timeline(partition, operation_id)?;
    let mut arrivals: HashMap<&str, u32> = HashMap::new();
    for e in &timeline.entries {
        *arrivals.entry(e.event_id.as_str()).or_default() += 1;
    }
    let waiting = |id: &str| op.held.iter().chain(&op.orphaned).any(|h| h.event.event_id == id);
    let mut seen: HashMap<&str, u32> = HashMap::new();
    let rows = timeline
        .entries
        .iter()
        .map(|e| {
            let n = seen.entry(e.event_id.as_str()).or_default();
            *n += 1;
            TimelineRow {
                entry: e.clone(),
                delivery: *n,
                deliveries: arrivals[e.event_id.as_str()],
                still_held: e.disposition == crate::core::Disposition::Held && waiting(&e.event_id),
            }
        })
        .collect();
    let expected = op.request.as_ref().map(|r| Expected {
        requested_at: r.requested_at,
        version: r.expected_version,
        fingerprint: r.expected_fingerprint.clone(),
        idempotency_key: r.idempotency_key.clone(),
        idempotent: r.idempotent,
        destination: r.destination.clone(),
        confirm_within_ms: r.confirm_within_ms,
        max_attempts: r.max_attempts,
    });
    Ok(Some(Explanation {
        operation_id: op.operation_id.clone(),
        entity_id: op.entity_id.clone(),
        operation_type: op.operation_type.clone(),
        partition,
        state: op.status,
        deadline_at: op.deadline_at.filter(|_| op.awaits_evidence() && !op.overdue_judged),
        follow_up: op.follow_up,
        requeues: op.requeues,
        next_attempt_at: op.next_attempt_at,
        superseded_by: op.superseded_by.clone(),
        next_timer_at: op.timer_at,
        review_since: op.review_since,
        terminal_at: op.terminal_at,
        expected,
        observed: Observed {
            version: op.observed_version,
            fingerprint: op.observed_fingerprint.clone(),
            remote_ids: op.remote_ids.clone(),
            attempts: op.attempts,
            started: op.started,
            last_event_at: op.last_event_at,
        },
        counts: Counts {
            events_applied: op.events_applied,
            duplicates_seen: op.duplicates_seen,
            out_of_order_seen: op.out_of_order_seen,
            held_now: op.held.len(),
            orphaned_now: op.orphaned.len(),
            verdicts: op.verdict_count,
        },
        allowed_decisions: allowed_decisions(&op),
        last_verdict: op.last_verdict,
        timeline: rows,
        timeline_dropped: timeline.dropped(),
    }))
}
