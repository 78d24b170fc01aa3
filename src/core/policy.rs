//! The knobs the core decides with: deadlines, retry limits, reorder window,
//! retention, mode and redaction. Built from the config file by the binary;
//! the core itself never reads files or the environment.

use std::collections::BTreeMap;

use super::redact::Redactor;

/// Per-operation-type overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypePolicy {
    /// Confirmation window of the type, when the event names none.
    pub confirm_within_ms: Option<i64>,
    /// Attempt limit of the type, when the event names none.
    pub max_attempts: Option<i32>,
    /// How long after a PROBE or REQUEUE verdict the operation is followed
    /// up (overrides [`Policy::follow_up_ms`]).
    pub follow_up_ms: Option<i64>,
    /// Automatic requeues allowed in all (overrides [`Policy::max_requeues`]).
    pub max_requeues: Option<u32>,
}

/// Everything the core needs to decide, fixed for a run.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Confirmation window when neither the event nor the type names one.
    pub default_confirm_within_ms: i64,
    /// Attempts allowed when neither the event nor the type names a limit.
    pub default_max_attempts: i32,
    /// Overrides by operation type (`operation_type` of the events).
    pub types: BTreeMap<String, TypePolicy>,
    /// How long (event time) an event ahead of its turn waits for the gap to fill.
    pub reorder_window_ms: i64,
    /// How many events one operation may hold; past that the oldest gap is given up.
    pub reorder_max_held: usize,
    /// How long a terminal operation is kept (event time) before removal.
    pub retention_ms: i64,
    /// How long after a PROBE or REQUEUE verdict the operation is followed
    /// up when no new evidence came; `None`: one confirmation window of the
    /// operation.
    pub follow_up_ms: Option<i64>,
    /// How many times in all an operation is requeued automatically before
    /// it goes to manual review.
    pub max_requeues: u32,
    /// `act` mode: publish repair commands for automatable actions.
    pub act: bool,
    /// Cleans `detail`, `evidence_ref` and `note` before anything is stored
    /// or published.
    pub redactor: Redactor,
    /// Control events (`DeadlineReached`, `ManualDecision`, `ProbeFailed`)
    /// are applied only when signed (see [`super::trust`]); off only with
    /// `security.allow_unsigned_control`. Off in [`Policy::default`], which
    /// the core's own tests use: the configuration's default is on.
    pub signed_control: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            default_confirm_within_ms: 5 * 60 * 1000,
            default_max_attempts: 3,
            types: BTreeMap::new(),
            reorder_window_ms: 30 * 1000,
            reorder_max_held: 64,
            retention_ms: 7 * 24 * 3600 * 1000,
            follow_up_ms: None,
            max_requeues: 2,
            act: false,
            redactor: Redactor::default(),
            signed_control: false,
        }
    }
}

impl Policy {
    /// The confirmation window: per event, else per type, else the default.
    pub fn confirm_within(&self, operation_type: &str, from_event: Option<i64>) -> i64 {
        from_event
            .or_else(|| self.types.get(operation_type).and_then(|t| t.confirm_within_ms))
            .unwrap_or(self.default_confirm_within_ms)
    }

    /// The attempt limit: per event, else per type, else the default.
    pub fn max_attempts(&self, operation_type: &str, from_event: Option<i32>) -> i32 {
        from_event
            .or_else(|| self.types.get(operation_type).and_then(|t| t.max_attempts))
            .unwrap_or(self.default_max_attempts)
    }

    /// The follow-up window of an operation whose confirmation window is
    /// `confirm_within_ms`: per type, else `[time] follow_up_ms`, else that
    /// window.
    pub fn follow_up(&self, operation_type: &str, confirm_within_ms: i64) -> i64 {
        self.types.get(operation_type).and_then(|t| t.follow_up_ms).or(self.follow_up_ms).unwrap_or(confirm_within_ms)
    }

    /// Automatic requeues allowed in all: per type, else the default.
    pub fn max_requeues(&self, operation_type: &str) -> u32 {
        self.types.get(operation_type).and_then(|t| t.max_requeues).unwrap_or(self.max_requeues)
    }
}
