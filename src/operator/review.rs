//! `review`: the exception queue — operations waiting for a person, oldest
//! first, with what the reconciler recommends.
//!
//! Every verdict whose action needs a person (MANUAL_REVIEW, and
//! COMPENSATE for a duplicate effect) puts the operation in state
//! MANUAL_REVIEW, so the queue is exactly the operations in that state.
//! AMBIGUOUS/PROBE and MISSING/REQUEUE are for machines and stay out.

use serde::Serialize;

use super::explain::allowed_decisions;
use crate::core::event::Decision;
use crate::core::{Action, OperationState, Outcome, Status};
use crate::store::{Store, StoreError};

/// Which review cases to list.
#[derive(Debug, Clone, Default)]
pub struct ReviewFilter {
    pub operation_type: Option<String>,
    pub outcome: Option<Outcome>,
    /// Only cases in review for at least this long.
    pub older_than_ms: Option<i64>,
}

/// One case of the queue.
#[derive(Debug, Clone, Serialize)]
pub struct ReviewItem {
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    pub partition: i32,
    pub state: Status,
    /// Event time the operation entered review.
    pub since: i64,
    /// `now - since`, in milliseconds.
    pub age_ms: i64,
    pub outcome: Option<Outcome>,
    pub recommended_action: Option<Action>,
    /// The last verdict's one-sentence reason.
    pub reason: String,
    pub verdict_id: Option<String>,
    pub attempts: i32,
    pub expected_version: Option<i64>,
    pub observed_version: Option<i64>,
    pub remote_ids: Vec<String>,
    /// What `resolve` accepts for it.
    pub allowed_decisions: Vec<Decision>,
}

fn item(p: i32, op: OperationState, now: i64) -> ReviewItem {
    let since = op.review_since.unwrap_or(op.last_event_at);
    let v = op.last_verdict.as_ref();
    ReviewItem {
        allowed_decisions: allowed_decisions(&op),
        partition: p,
        state: op.status,
        since,
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

/// The review queue at wall-clock time `now` (ms), oldest first.
///
/// Scans every operation of the store (no index): fine for an operator's
/// request, not for a hot loop.
pub fn review(store: &Store, filter: &ReviewFilter, now: i64) -> Result<Vec<ReviewItem>, StoreError> {
    let mut out = Vec::new();
    for p in store.partitions()? {
        for op in store.ops_of(p)? {
            if op.status != Status::ManualReview
                || filter.operation_type.as_ref().is_some_and(|t| *t != op.operation_type)
            {
                continue;
            }
            let it = item(p, op, now);
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
