//! What the core decides: verdicts, anomalies and repair commands.
//!
//! Mirrors `schemas/verdict.avsc`, `schemas/anomaly.avsc` and
//! `schemas/repair_command.avsc`; the codec checks the two never drift.

use serde::{Deserialize, Serialize};

use super::event::Decision;

/// State of an operation (seed 000's explicit states, plus `Unrequested` for
/// operations whose events arrived before their `Requested`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Pending,
    Processing,
    RetryScheduled,
    AwaitingConfirmation,
    Confirmed,
    ManualReview,
    Compensated,
    NotApplicable,
    Closed,
    Unrequested,
}

impl Status {
    /// All states, in schema order.
    pub const ALL: [Status; 10] = [
        Status::Pending,
        Status::Processing,
        Status::RetryScheduled,
        Status::AwaitingConfirmation,
        Status::Confirmed,
        Status::ManualReview,
        Status::Compensated,
        Status::NotApplicable,
        Status::Closed,
        Status::Unrequested,
    ];

    /// States in which the operation still waits for evidence that its
    /// effect happened (the "unconfirmed" operations).
    pub fn awaits_evidence(self) -> bool {
        matches!(self, Status::Pending | Status::Processing | Status::RetryScheduled | Status::AwaitingConfirmation)
    }

    /// Terminal states are kept for the retention period, then removed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Confirmed | Status::Compensated | Status::NotApplicable | Status::Closed)
    }

    /// The schema symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Processing => "PROCESSING",
            Status::RetryScheduled => "RETRY_SCHEDULED",
            Status::AwaitingConfirmation => "AWAITING_CONFIRMATION",
            Status::Confirmed => "CONFIRMED",
            Status::ManualReview => "MANUAL_REVIEW",
            Status::Compensated => "COMPENSATED",
            Status::NotApplicable => "NOT_APPLICABLE",
            Status::Closed => "CLOSED",
            Status::Unrequested => "UNREQUESTED",
        }
    }
}

/// What the evidence proves about the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Correct,
    Missing,
    Divergent,
    Ambiguous,
    NotApplicable,
    DuplicateEffect,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Correct,
        Outcome::Missing,
        Outcome::Divergent,
        Outcome::Ambiguous,
        Outcome::NotApplicable,
        Outcome::DuplicateEffect,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Correct => "CORRECT",
            Outcome::Missing => "MISSING",
            Outcome::Divergent => "DIVERGENT",
            Outcome::Ambiguous => "AMBIGUOUS",
            Outcome::NotApplicable => "NOT_APPLICABLE",
            Outcome::DuplicateEffect => "DUPLICATE_EFFECT",
        }
    }
}

/// The safe action for an outcome (SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    None,
    Requeue,
    Probe,
    ManualReview,
    Close,
    Compensate,
}

impl Action {
    pub const ALL: [Action; 6] =
        [Action::None, Action::Requeue, Action::Probe, Action::ManualReview, Action::Close, Action::Compensate];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "NONE",
            Action::Requeue => "REQUEUE",
            Action::Probe => "PROBE",
            Action::ManualReview => "MANUAL_REVIEW",
            Action::Close => "CLOSE",
            Action::Compensate => "COMPENSATE",
        }
    }

    /// Actions a machine may carry out on its own (`mode = "act"`).
    pub fn is_automatable(self) -> bool {
        matches!(self, Action::Requeue | Action::Probe)
    }
}

/// The manual decision recorded in a verdict's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualDecisionRecord {
    pub actor: String,
    pub decision: Decision,
    pub note: String,
    pub evidence_checked: Vec<String>,
}

/// The evidence behind a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub expected_version: Option<i64>,
    pub expected_fingerprint: Option<String>,
    pub observed_version: Option<i64>,
    pub observed_fingerprint: Option<String>,
    pub remote_ids: Vec<String>,
    pub idempotency_key: Option<String>,
    pub attempts: i32,
    pub requested_at: Option<i64>,
    pub last_event_at: i64,
    pub events_applied: i64,
    pub duplicates_seen: i64,
    pub out_of_order_seen: i64,
    pub trigger_partition: i32,
    pub trigger_offset: i64,
    pub manual_decision: Option<ManualDecisionRecord>,
    /// Automatic requeues of the operation so far (SPEC §11: at most
    /// `max_requeues` in all).
    pub requeues: i32,
    /// When the reconciler follows up a PROBE or REQUEUE verdict if no new
    /// evidence arrives by then (event time).
    pub follow_up_at: Option<i64>,
    /// The retry the worker scheduled (`AttemptFailed.next_attempt_at`),
    /// while the operation waits for it.
    pub next_attempt_at: Option<i64>,
    /// The newer operation that replaced this one (SPEC §11, supersede).
    pub superseded_by: Option<Supersession>,
    /// Why a follow-up sent the operation to manual review.
    pub escalation: Option<Escalation>,
}

/// A newer request that replaces an older operation: same entity,
/// operation type and destination, higher expected version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supersession {
    pub operation_id: String,
    pub expected_version: Option<i64>,
}

/// Why a follow-up escalated an operation to manual review (SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Escalation {
    /// A PROBE verdict got no answer (no new evidence) within the follow-up window.
    ProbeUnanswered,
    /// The operation was requeued `max_requeues` times and is still not confirmed.
    RequeuesExhausted,
}

impl Escalation {
    pub const ALL: [Escalation; 2] = [Escalation::ProbeUnanswered, Escalation::RequeuesExhausted];

    /// The schema symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            Escalation::ProbeUnanswered => "PROBE_UNANSWERED",
            Escalation::RequeuesExhausted => "REQUEUES_EXHAUSTED",
        }
    }
}

/// The judgement of one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub verdict_id: String,
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    pub outcome: Outcome,
    pub action: Action,
    pub state: Status,
    pub reason: String,
    pub decided_at: i64,
    pub trigger_event_id: String,
    pub evidence: Evidence,
}

/// The nine kinds of SPEC §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AnomalyKind {
    DuplicateDelivery,
    DuplicateEmission,
    ConflictingTransition,
    OutOfOrder,
    SeqGap,
    LateEvent,
    InvalidTransition,
    OrphanEvent,
    StaleVersion,
}

impl AnomalyKind {
    pub const ALL: [AnomalyKind; 9] = [
        AnomalyKind::DuplicateDelivery,
        AnomalyKind::DuplicateEmission,
        AnomalyKind::ConflictingTransition,
        AnomalyKind::OutOfOrder,
        AnomalyKind::SeqGap,
        AnomalyKind::LateEvent,
        AnomalyKind::InvalidTransition,
        AnomalyKind::OrphanEvent,
        AnomalyKind::StaleVersion,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::DuplicateDelivery => "DUPLICATE_DELIVERY",
            AnomalyKind::DuplicateEmission => "DUPLICATE_EMISSION",
            AnomalyKind::ConflictingTransition => "CONFLICTING_TRANSITION",
            AnomalyKind::OutOfOrder => "OUT_OF_ORDER",
            AnomalyKind::SeqGap => "SEQ_GAP",
            AnomalyKind::LateEvent => "LATE_EVENT",
            AnomalyKind::InvalidTransition => "INVALID_TRANSITION",
            AnomalyKind::OrphanEvent => "ORPHAN_EVENT",
            AnomalyKind::StaleVersion => "STALE_VERSION",
        }
    }
}

/// A forensic record of something wrong with an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    pub anomaly_id: String,
    pub kind: AnomalyKind,
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    pub event_id: String,
    pub seq: Option<i64>,
    pub expected_seq: Option<i64>,
    pub missing_seqs: Vec<i64>,
    pub detected_at: i64,
    pub detail: String,
    pub source_partition: i32,
    pub source_offset: i64,
}

/// A repair safe to automate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RepairAction {
    Requeue,
    Probe,
}

impl RepairAction {
    /// The schema symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairAction::Requeue => "REQUEUE",
            RepairAction::Probe => "PROBE",
        }
    }
}

/// Published in `act` mode for REQUEUE and PROBE verdicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairCommand {
    pub command_id: String,
    pub verdict_id: String,
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    pub action: RepairAction,
    pub idempotency_key: Option<String>,
    pub destination: String,
    pub expected_version: Option<i64>,
    pub expected_fingerprint: Option<String>,
    pub issued_at: i64,
}

/// One decision of the core, in the order it was made. (Variants differ in
/// size; outputs are short-lived and never stored in bulk.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    Verdict(Verdict),
    Anomaly(Anomaly),
    Command(RepairCommand),
}

impl Output {
    /// The record key on the output topic: the entity, so outputs share the
    /// partitioning of the input.
    pub fn entity_id(&self) -> &str {
        match self {
            Output::Verdict(v) => &v.entity_id,
            Output::Anomaly(a) => &a.entity_id,
            Output::Command(c) => &c.entity_id,
        }
    }
}
