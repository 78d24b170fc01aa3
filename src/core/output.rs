//! What the core decides: verdicts, anomalies and repair commands.
//!
//! Mirrors `schemas/verdict.avsc`, `schemas/anomaly.avsc` and
//! `schemas/repair_command.avsc`; the codec checks the two never drift.

use serde::{Deserialize, Serialize};

use super::event::Decision;
use super::names::named_enum;
use super::reason::Reason;

named_enum! {
    /// State of an operation (the lifecycle's explicit states, plus
    /// `Unrequested` for operations whose events arrived before their
    /// `Requested`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum Status {
        /// Requested, no attempt seen yet: overdue means never started.
        Pending => "PENDING",
        /// A worker started an attempt.
        Processing => "PROCESSING",
        /// A new attempt is expected: a transient failure below the attempt
        /// limit, or a requeue (automatic or decided by a person).
        RetryScheduled => "RETRY_SCHEDULED",
        /// The call may or may not have taken effect (e.g. a timeout after
        /// sending): only evidence or a probe can tell.
        AwaitingConfirmation => "AWAITING_CONFIRMATION",
        /// The expected effect was proven (terminal).
        Confirmed => "CONFIRMED",
        /// A person must decide; no timer or machine action follows it up.
        ManualReview => "MANUAL_REVIEW",
        /// The effect was undone by a business operation (terminal).
        Compensated => "COMPENSATED",
        /// Cancelled or superseded by a newer version (terminal).
        NotApplicable => "NOT_APPLICABLE",
        /// Closed by a person's decision (terminal).
        Closed => "CLOSED",
        /// Events arrived but the `Requested` did not (yet): nothing is judged.
        Unrequested => "UNREQUESTED",
    }
}

impl Status {
    /// States in which the operation still waits for evidence that its
    /// effect happened (the "unconfirmed" operations).
    pub fn awaits_evidence(self) -> bool {
        matches!(self, Status::Pending | Status::Processing | Status::RetryScheduled | Status::AwaitingConfirmation)
    }

    /// Terminal states are kept for the retention period, then removed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Confirmed | Status::Compensated | Status::NotApplicable | Status::Closed)
    }
}

named_enum! {
    /// What the evidence proves about the effect.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum Outcome {
        /// The effect exists with the expected version / fingerprint.
        Correct => "CORRECT",
        /// The effect is proven absent, or was never attempted by the deadline.
        Missing => "MISSING",
        /// The effect exists with other data; never overwritten automatically.
        Divergent => "DIVERGENT",
        /// The effect may exist and nothing proves it either way; never requeued.
        Ambiguous => "AMBIGUOUS",
        /// The operation was cancelled or superseded: nothing to check.
        NotApplicable => "NOT_APPLICABLE",
        /// The effect exists more than once (two distinct remote ids).
        DuplicateEffect => "DUPLICATE_EFFECT",
    }
}

named_enum! {
    /// The safe action for an outcome: what to do about it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum Action {
        /// Nothing to do: the effect is correct.
        None => "NONE",
        /// Submit the job again: safe only when idempotent or never started.
        Requeue => "REQUEUE",
        /// Ask the destination by idempotency key whether the effect exists.
        Probe => "PROBE",
        /// A person must decide (see the review queue).
        ManualReview => "MANUAL_REVIEW",
        /// Close the operation: it no longer applies.
        Close => "CLOSE",
        /// Undo the duplicate effect.
        Compensate => "COMPENSATE",
    }
}

impl Action {
    /// Actions a machine may carry out on its own (`mode = "act"`).
    pub fn is_automatable(self) -> bool {
        matches!(self, Action::Requeue | Action::Probe)
    }
}

/// The manual decision recorded in a verdict's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualDecisionRecord {
    /// Who decided.
    pub actor: String,
    /// What was decided.
    pub decision: Decision,
    /// Why, as the person wrote it (redacted).
    pub note: String,
    /// What the person checked before deciding.
    pub evidence_checked: Vec<String>,
}

/// The evidence behind a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Version the effect must carry, from the request.
    pub expected_version: Option<i64>,
    /// Fingerprint the effect must carry, from the request.
    pub expected_fingerprint: Option<String>,
    /// Version last observed at the destination.
    pub observed_version: Option<i64>,
    /// Fingerprint last observed at the destination.
    pub observed_fingerprint: Option<String>,
    /// Distinct remote ids observed, in order of observation; more than one
    /// is a duplicate effect.
    pub remote_ids: Vec<String>,
    /// The operation's idempotency key: what a PROBE or REQUEUE reuses.
    pub idempotency_key: Option<String>,
    /// Highest attempt number seen.
    pub attempts: i32,
    /// Event time of the request; `None` if it never arrived.
    pub requested_at: Option<i64>,
    /// Event time of the latest event applied to the operation (or of the
    /// trigger, if later).
    pub last_event_at: i64,
    /// Events applied to the operation so far.
    pub events_applied: i64,
    /// Duplicate deliveries and emissions seen so far.
    pub duplicates_seen: i64,
    /// Events that arrived ahead of their turn so far.
    pub out_of_order_seen: i64,
    /// Input partition of the trigger: with the offset, where to find it in the log.
    pub trigger_partition: i32,
    /// Input offset of the trigger.
    pub trigger_offset: i64,
    /// Present when a person decided this verdict.
    pub manual_decision: Option<ManualDecisionRecord>,
    /// Automatic requeues of the operation so far (at most `max_requeues`
    /// in all).
    pub requeues: i32,
    /// When the reconciler follows up a PROBE or REQUEUE verdict if no new
    /// evidence arrives by then (event time).
    pub follow_up_at: Option<i64>,
    /// The retry the worker scheduled (`AttemptFailed.next_attempt_at`),
    /// while the operation waits for it.
    pub next_attempt_at: Option<i64>,
    /// The newer operation that replaced this one (supersede).
    pub superseded_by: Option<Supersession>,
    /// Why a follow-up sent the operation to manual review.
    pub escalation: Option<Escalation>,
}

/// A newer request that replaces an older operation: same entity,
/// operation type and destination, higher expected version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supersession {
    /// The newer operation.
    pub operation_id: String,
    /// The version it expects (higher than the replaced one's).
    pub expected_version: Option<i64>,
}

named_enum! {
    /// Why a follow-up escalated an operation to manual review.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum Escalation {
        /// A PROBE verdict got no answer (no new evidence) within the follow-up window.
        ProbeUnanswered => "PROBE_UNANSWERED",
        /// The operation was requeued `max_requeues` times and is still not confirmed.
        RequeuesExhausted => "REQUEUES_EXHAUSTED",
    }
}

/// The judgement of one operation, published on the verdicts topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Deterministic id (UUIDv5): a replay or a re-publish gives the same id,
    /// so consumers can deduplicate.
    pub verdict_id: String,
    /// The judged operation.
    pub operation_id: String,
    /// The affected entity; also the record key.
    pub entity_id: String,
    /// The operation's type (selects the per-type policy).
    pub operation_type: String,
    /// What the evidence proves.
    pub outcome: Outcome,
    /// What to do about it.
    pub action: Action,
    /// The operation's state after this verdict.
    pub state: Status,
    /// One human sentence explaining the verdict (and, for the store,
    /// the template it was made of).
    pub reason: Reason,
    /// Event time of the trigger, never the wall clock: replay reproduces it.
    pub decided_at: i64,
    /// The event whose application produced this verdict.
    pub trigger_event_id: String,
    /// What led to the verdict.
    pub evidence: Evidence,
}

named_enum! {
    /// What was wrong with an event: the kinds of anomaly (see
    /// [`super::detect`] and [`super::trust`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum AnomalyKind {
        /// An event_id already taken in, delivered again (at-least-once redelivery).
        DuplicateDelivery => "DUPLICATE_DELIVERY",
        /// A new event_id for an already claimed revision, with the same body.
        DuplicateEmission => "DUPLICATE_EMISSION",
        /// A new event_id for an already claimed revision, with another body:
        /// two writers transitioned the same revision (a race between workers).
        ConflictingTransition => "CONFLICTING_TRANSITION",
        /// A revision ahead of the next expected: held until the gap fills.
        OutOfOrder => "OUT_OF_ORDER",
        /// The gap did not fill within the reorder window: applied anyway,
        /// the missing revisions named.
        SeqGap => "SEQ_GAP",
        /// A revision below what is already applied: recorded, state never regresses.
        LateEvent => "LATE_EVENT",
        /// A body that cannot follow the current state.
        InvalidTransition => "INVALID_TRANSITION",
        /// An event whose operation's `Requested` never arrived within the window.
        OrphanEvent => "ORPHAN_EVENT",
        /// An effect for an entity version older than one already confirmed.
        StaleVersion => "STALE_VERSION",
        /// A control event (DeadlineReached, ManualDecision, ProbeFailed)
        /// without a valid signature: not applied (see `core::trust`).
        ForgedControlEvent => "FORGED_CONTROL_EVENT",
    }
}

/// A forensic record of something wrong with an event, published
/// on the anomalies topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// Deterministic id (UUIDv5 of the kind, the flagged event and the
    /// position of the record that caused the detection).
    pub anomaly_id: String,
    /// What was detected.
    pub kind: AnomalyKind,
    /// The operation the event belongs to.
    pub operation_id: String,
    /// The affected entity; also the record key.
    pub entity_id: String,
    /// The operation's type.
    pub operation_type: String,
    /// The event that was flagged.
    pub event_id: String,
    /// The flagged event's seq.
    pub seq: Option<i64>,
    /// The next seq the operation expected when the event was flagged.
    pub expected_seq: Option<i64>,
    /// For SEQ_GAP: the revisions that never arrived (at most
    /// [`MAX_NAMED_MISSING`](super::detect::MAX_NAMED_MISSING)).
    pub missing_seqs: Vec<i64>,
    /// Event time of the flagged event.
    pub detected_at: i64,
    /// One human sentence.
    pub detail: String,
    /// Input partition of the record that caused the detection (for a
    /// SEQ_GAP or ORPHAN_EVENT, possibly a later record or a timer).
    pub source_partition: i32,
    /// Input offset of the record that caused the detection.
    pub source_offset: i64,
    /// For FORGED_CONTROL_EVENT, the flagged event's `producer` (who claims
    /// to have written it); `None` for the other kinds.
    #[serde(default)]
    pub producer: Option<String>,
}

named_enum! {
    /// A repair safe to automate.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum RepairAction {
        /// Submit the job again, with the original idempotency key.
        Requeue => "REQUEUE",
        /// Ask the destination, by idempotency key, whether the effect exists.
        Probe => "PROBE",
    }
}

/// Published for PROBE verdicts in every mode, for REQUEUE verdicts in `act`
/// mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairCommand {
    /// Deterministic id (UUIDv5 of the verdict id): a re-published command
    /// can be recognised by the worker.
    pub command_id: String,
    /// The verdict that called for this repair.
    pub verdict_id: String,
    /// The operation to repair.
    pub operation_id: String,
    /// The affected entity; also the record key.
    pub entity_id: String,
    /// The operation's type.
    pub operation_type: String,
    /// What to do.
    pub action: RepairAction,
    /// The original idempotency key, to be reused so a repeated call does
    /// not repeat the effect.
    pub idempotency_key: Option<String>,
    /// The destination to call or query.
    pub destination: String,
    /// Version the effect must carry.
    pub expected_version: Option<i64>,
    /// Fingerprint the effect must carry.
    pub expected_fingerprint: Option<String>,
    /// Event time of the verdict.
    pub issued_at: i64,
}

/// One decision of the core, in the order it was made. (Variants differ in
/// size; outputs are short-lived and never stored in bulk.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    /// For the verdicts topic.
    Verdict(Verdict),
    /// For the anomalies topic.
    Anomaly(Anomaly),
    /// For the commands topic: PROBE requests in both modes, REQUEUE
    /// commands in `act` mode.
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
