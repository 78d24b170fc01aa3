//! The knobs the core decides with: deadlines, retry limits, reorder window,
//! retention, mode and redaction. Built from the config file by the binary;
//! the core itself never reads files or the environment.

use std::collections::BTreeMap;

use super::redact::Redactor;

/// Per-operation-type overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypePolicy {
    pub confirm_within_ms: Option<i64>,
    pub max_attempts: Option<i32>,
}

/// Everything the core needs to decide, fixed for a run.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Confirmation window when neither the event nor the type names one.
    pub default_confirm_within_ms: i64,
    /// Attempts allowed when neither the event nor the type names a limit.
    pub default_max_attempts: i32,
    pub types: BTreeMap<String, TypePolicy>,
    /// How long (event time) an event ahead of its turn waits for the gap to fill.
    pub reorder_window_ms: i64,
    /// How many events one operation may hold; past that the oldest gap is given up.
    pub reorder_max_held: usize,
    /// How long a terminal operation is kept (event time) before removal.
    pub retention_ms: i64,
    /// `act` mode: publish repair commands for automatable actions.
    pub act: bool,
    pub redactor: Redactor,
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
            act: false,
            redactor: Redactor::default(),
        }
    }
}

impl Policy {
    /// The confirmation window: per event, else per type, else the default (SPEC §7).
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
}
