//! `review`: the exception queue — operations waiting for a person, oldest
//! first, with what the reconciler recommends — and beside it the cases
//! waiting for a machine action.
//!
//! Every verdict whose action needs a person (MANUAL_REVIEW, and
//! COMPENSATE for a duplicate effect) puts the operation in state
//! MANUAL_REVIEW, so the queue is exactly the operations in that state.
//! AMBIGUOUS/PROBE and MISSING/REQUEUE are for machines: those cases wait
//! for their follow-up ([`Waiting::Machine`]), and come to the queue when
//! it passes unanswered. A person may decide them before.

use serde::{Deserialize, Serialize};

use super::explain::allowed_decisions;
use crate::core::event::Decision;
use crate::core::{Action, OperationState, Outcome, RepairAction, Status, Supersession};
use crate::store::{Store, StoreError};

/// Whose move a case waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// In MANUAL_REVIEW: the review queue.
    #[default]
    Person,
    /// A PROBE or REQUEUE verdict waits to be answered before its follow-up.
    Machine,
}

impl Waiting {
    /// Every value, in the order `--waiting` lists them.
    pub const ALL: [Waiting; 2] = [Waiting::Person, Waiting::Machine];

    /// The name `--waiting` takes and the JSON shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Waiting::Person => "person",
            Waiting::Machine => "machine",
        }
    }
}

/// Which cases to list.
#[derive(Debug, Clone, Default)]
pub struct ReviewFilter {
    /// Only this operation type.
    pub operation_type: Option<String>,
    /// Only cases whose last verdict has this outcome.
    pub outcome: Option<Outcome>,
    /// Only cases waiting for at least this long.
    pub older_than_ms: Option<i64>,
    /// The review queue (default) or the cases waiting for a machine action.
    pub waiting: Waiting,
}

/// One case of the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReviewItem {
    /// The operation waiting.
    pub operation_id: String,
    /// The entity it belongs to.
    pub entity_id: String,
    /// Its type.
    pub operation_type: String,
    /// The input partition holding it.
    pub partition: i32,
    /// Where it stands in the state machine.
    pub state: Status,
    /// Whose move it is.
    pub waiting: Waiting,
    /// Event time the case started waiting: it entered review, or its
    /// machine action was recommended.
    pub since: i64,
    /// `now - since`, in milliseconds.
    pub age_ms: i64,
    /// The last verdict's outcome.
    pub outcome: Option<Outcome>,
    /// The last verdict's action.
    pub recommended_action: Option<Action>,
    /// The last verdict's one-sentence reason.
    pub reason: String,
    /// The last verdict's id.
    pub verdict_id: Option<String>,
    /// Highest attempt number seen.
    pub attempts: i32,
    /// Version the effect must carry (from the `Requested`).
    pub expected_version: Option<i64>,
    /// Version last observed at the destination.
    pub observed_version: Option<i64>,
    /// Distinct remote ids observed; a second one is a duplicate effect.
    pub remote_ids: Vec<String>,
    /// What `resolve` accepts for it.
    pub allowed_decisions: Vec<Decision>,
    /// The machine action awaited (PROBE or REQUEUE), for machine cases.
    pub follow_up_action: Option<RepairAction>,
    /// When the reconciler follows up if no new evidence arrives.
    pub follow_up_at: Option<i64>,
    /// Automatic requeues so far.
    pub requeues: u32,
    /// The retry a worker scheduled, while it is pending.
    pub next_attempt_at: Option<i64>,
    /// A newer request replaced the operation (a case in review stays,
    /// marked; it is never requeued).
    pub superseded_by: Option<Supersession>,
}

/// Whose move `op` waits for, if anyone's.
fn waiting(op: &OperationState) -> Option<Waiting> {
    if op.status == Status::ManualReview {
        Some(Waiting::Person)
    } else if op.awaits_evidence() && op.follow_up.is_some() {
        Some(Waiting::Machine)
    } else {
        None
    }
}

fn item(p: i32, op: OperationState, waiting: Waiting, now: i64) -> ReviewItem {
    let v = op.last_verdict.as_ref();
    let since = match waiting {
        Waiting::Person => op.review_since,
        Waiting::Machine => v.map(|v| v.decided_at),
    }
    .unwrap_or(op.last_event_at);
    ReviewItem {
        allowed_decisions: allowed_decisions(&op),
        partition: p,
        state: op.status,
        waiting,
        since,
        follow_up_action: op.follow_up.map(|f| f.action),
        follow_up_at: op.follow_up.map(|f| f.at),
        requeues: op.requeues,
        next_attempt_at: op.next_attempt_at,
        superseded_by: op.superseded_by,
        age_ms: now.saturating_sub(since).max(0),
        outcome: v.map(|v| v.outcome),
        recommended_action: v.map(|v| v.action),
        reason: v.map_or_else(String::new, |v| v.reason.clone()),
        verdict_id: v.map(|v| v.verdict_id.clone()),
        attempts: op.attempts,
        expected_version: op.request.as_ref().and_then(|r| r.expected_version),
        observed_version: op.observed_version,
        remote_ids: op.remote_ids,
        operation_id: op.operation_id,
        entity_id: op.entity_id,
        operation_type: op.operation_type,
    }
}

/// The cases `filter` selects at wall-clock time `now` (ms), oldest first.
///
/// Scans every operation of the store (no index): fine for an operator's
/// request, not for a hot loop.
pub fn review(store: &Store, filter: &ReviewFilter, now: i64) -> Result<Vec<ReviewItem>, StoreError> {
    let mut out = Vec::new();
    for p in store.partitions()? {
        for op in store.ops_of(p)? {
            if waiting(&op) != Some(filter.waiting)
                || filter.operation_type.as_ref().is_some_and(|t| *t != op.operation_type)
            {
                continue;
            }
            let it = item(p, op, filter.waiting, now);
            if filter.outcome.is_some_and(|o| it.outcome != Some(o))
                || filter.older_than_ms.is_some_and(|d| it.age_ms < d)
            {
                continue;
            }
            out.push(it);
        }
    }
    out.sort_by(|a, b| (a.since, &a.operation_id).cmp(&(b.since, &b.operation_id)));
    Ok(out)
}
