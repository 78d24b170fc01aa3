//! The per-operation timeline: every input record taken in for an
//! operation, in arrival order, with what became of it and what it caused.
//!
//! Written in the same atomic batch as the state (so a crash never leaves a
//! timeline that disagrees with the state), read by `explain` and the HTTP
//! API. Bounded: each operation keeps its last [`TIMELINE_CAP`] entries in
//! a ring (slot = ordinal mod cap), and the head records how many arrived in
//! all, so `explain` can say how many early entries were overwritten. An
//! operation that leaves retention takes its timeline with it.

use serde::{Deserialize, Serialize};

use crate::core::output::ManualDecisionRecord;
use crate::core::{Action, AnomalyKind, Disposition, Outcome, Status};

/// Most entries kept per operation. Real operations have a handful of
/// events; the cap only bites for a producer looping on one operation, and
/// then the latest entries are the ones an investigation needs.
pub const TIMELINE_CAP: u64 = 256;

/// An anomaly raised while a record was processed (it may name another
/// event, e.g. a held one given up by SEQ_GAP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnomalyNote {
    pub kind: AnomalyKind,
    pub event_id: String,
    pub detail: String,
}

/// A verdict issued while a record was processed. `trigger_event_id` may be
/// an event released from the reorder buffer by this record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictNote {
    pub verdict_id: String,
    pub outcome: Outcome,
    pub action: Action,
    pub state: Status,
    pub reason: String,
    pub trigger_event_id: String,
}

/// One input record of an operation and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// Arrival order within the operation, from 0.
    pub ordinal: u64,
    pub partition: i32,
    pub offset: i64,
    pub event_id: String,
    pub seq: Option<i64>,
    /// The body's union branch (`Requested`, `Started`, ...).
    pub body: String,
    pub occurred_at: i64,
    pub producer: String,
    pub disposition: Disposition,
    /// The body's structured fields in one line; free text (details,
    /// evidence references) is left out, as it may carry personal data.
    pub summary: String,
    pub anomalies: Vec<AnomalyNote>,
    pub verdicts: Vec<VerdictNote>,
    /// For a `ManualDecision`: who decided what, with the (redacted) note.
    pub manual: Option<ManualDecisionRecord>,
}

/// The timeline as stored: the retained entries in arrival order, and the
/// number of entries that ever arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    pub total: u64,
    pub entries: Vec<TimelineEntry>,
}

impl Timeline {
    /// Entries that arrived but were overwritten by the cap.
    pub fn dropped(&self) -> u64 {
        self.total - self.entries.len() as u64
    }
}
