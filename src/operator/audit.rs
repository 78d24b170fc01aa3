//! A check of what the state store promises: the reconciliation
//! does not stop at the first verdict, so every operation that is not with
//! a person (MANUAL_REVIEW) has a next timer, and that timer is in the
//! index the timer wheel reads. Run by `reconciler loadgen verify
//! --state-dir` after a workload, and by the tests.

use serde::Serialize;

use crate::core::Status;
use crate::store::{Store, StoreError};

/// An operation that nothing will ever wake again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Untimed {
    /// The partition holding the operation.
    pub partition: i32,
    /// The operation's id.
    pub operation_id: String,
    /// Its state (never MANUAL_REVIEW: those wait for a person, not a timer).
    pub state: Status,
    /// The timer its state names (then missing from the index), if any.
    pub timer_at: Option<i64>,
}

/// Every operation of `store` outside manual review without a timer in
/// the index (empty when the promise holds).
pub fn untimed(store: &Store) -> Result<Vec<Untimed>, StoreError> {
    let mut out = Vec::new();
    for p in store.partitions()? {
        let mut failed = None;
        store.scan_ops(p, |op| {
            if op.status == Status::ManualReview {
                return true;
            }
            let indexed = match op.timer_at {
                Some(at) => match store.timer_indexed(p, at, &op.operation_id) {
                    Ok(found) => found,
                    Err(e) => {
                        failed = Some(e);
                        return false;
                    }
                },
                None => false,
            };
            if !indexed {
                out.push(Untimed {
                    partition: p,
                    operation_id: op.operation_id,
                    state: op.status,
                    timer_at: op.timer_at,
                });
            }
            true
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(out)
}
