//! Domain events: what services say happened to an operation.
//!
//! These are the decoded, validated form of `reconciler.v1.OperationEvent`
//! (see `schemas/operation_event.avsc`). The core only ever sees these types;
//! the codec is the one place that knows the wire format.

use serde::{Deserialize, Serialize};

use super::names::named_enum;

/// Where a record came from in the input log. Carried into verdicts and
/// anomalies so that every output can be traced back to its input offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct SourcePos {
    /// Input partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
}

/// One lifecycle event of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unique per emission: the layer-1 deduplication key.
    pub event_id: String,
    /// Stable, immutable id of the requested job.
    pub operation_id: String,
    /// The affected entity; equals the record key, so an entity's events
    /// share a partition and its order.
    pub entity_id: String,
    /// E.g. `sync_customer`; selects the per-type policy.
    pub operation_type: String,
    /// Revision of the operation record; `None` for outside observations.
    #[serde(default)]
    pub seq: Option<i64>,
    /// Event time in milliseconds since the epoch.
    pub occurred_at: i64,
    /// The emitting service (`reconciler` for the events it writes itself).
    pub producer: String,
    /// What happened.
    pub body: Body,
}

named_enum! {
    /// Whether a failed attempt may succeed when retried.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum ErrorClass {
        /// Retried up to `max_attempts`.
        Transient => "TRANSIENT",
        /// Retrying will not help: the operation goes to manual review.
        Permanent => "PERMANENT",
    }
}

named_enum! {
    /// Where a piece of evidence came from.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum EvidenceSource {
        /// The worker's own report of the call's result.
        WorkerResponse => "WORKER_RESPONSE",
        /// A query of the destination (what a PROBE asks for).
        DestinationQuery => "DESTINATION_QUERY",
        /// A receipt sent back by the destination.
        Receipt => "RECEIPT",
        /// A result file delivered by the destination.
        ResultFile => "RESULT_FILE",
    }
}

named_enum! {
    /// Why a query of the destination gave no answer (`ProbeFailed`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum ProbeErrorClass {
        /// No answer within the destination's timeout.
        Timeout => "TIMEOUT",
        /// Connection refused or reset, or a 5xx.
        Unavailable => "UNAVAILABLE",
        /// 429 (or its equivalent) past the retry budget.
        Throttled => "THROTTLED",
        /// The destination refused the query (a 4xx other than "absent", an SQL error).
        Rejected => "REJECTED",
        /// An answer without the configured fields, or with the wrong types.
        MalformedAnswer => "MALFORMED_ANSWER",
        /// The destination's circuit breaker was open.
        CircuitOpen => "CIRCUIT_OPEN",
        /// No `[destinations.<name>]` for the operation's destination.
        UnknownDestination => "UNKNOWN_DESTINATION",
    }
}

named_enum! {
    /// A person's decision for an operation in manual review.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    pub enum Decision {
        /// The effect is there and correct: CONFIRMED.
        Confirm => "CONFIRM",
        /// Submit the job again: RETRY_SCHEDULED, followed up like an automatic requeue.
        Requeue => "REQUEUE",
        /// Undo the duplicate effect (only after a DUPLICATE_EFFECT verdict): COMPENSATED.
        Compensate => "COMPENSATE",
        /// Nothing more to do: CLOSED.
        Close => "CLOSE",
    }
}

/// The expectation recorded when the operation is requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Requested {
    /// Version of the entity the effect must carry; `None` when only a
    /// fingerprint (or existence) is checked.
    #[serde(default)]
    pub expected_version: Option<i64>,
    /// Fingerprint (e.g. a content hash) the effect must carry; `None` when
    /// not checked.
    #[serde(default)]
    pub expected_fingerprint: Option<String>,
    /// Key sent to the destination so that a repeated call does not repeat
    /// the effect; without one an uncertain outcome cannot be probed.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Repeating the call is safe: decides whether an overdue or absent
    /// effect may be requeued.
    pub idempotent: bool,
    /// The external system that must hold the effect.
    pub destination: String,
    /// How long after the request the effect must be confirmed; `None` uses
    /// the per-type or global default (see [`super::Policy::confirm_within`]).
    #[serde(default)]
    pub confirm_within_ms: Option<i64>,
    /// Attempts allowed before a transient failure goes to manual review;
    /// `None` uses the per-type or global default.
    #[serde(default)]
    pub max_attempts: Option<i32>,
}

/// Evidence that the effect exists at the destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectObserved {
    /// Identifier of the effect at the destination; a second distinct one
    /// means a duplicate effect.
    #[serde(default)]
    pub remote_id: Option<String>,
    /// Version the destination holds; compared with the expected version.
    #[serde(default)]
    pub observed_version: Option<i64>,
    /// Fingerprint the destination holds; compared with the expected fingerprint.
    #[serde(default)]
    pub observed_fingerprint: Option<String>,
    /// Where this evidence came from.
    pub source: EvidenceSource,
    /// A safe reference to the evidence (query id, receipt id, file name);
    /// redacted before it is stored.
    #[serde(default)]
    pub evidence_ref: Option<String>,
}

/// What happened: one branch of the `body` union.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    /// The job was requested: creates the operation in PENDING.
    Requested(Requested),
    /// A worker started an attempt: PROCESSING.
    Started {
        /// Number of this attempt, from 1.
        attempt: i32,
        /// Identity of the worker running the attempt.
        worker: String,
    },
    /// An attempt failed with a known result: the effect did not happen.
    AttemptFailed {
        /// Number of the attempt that failed, from 1.
        attempt: i32,
        /// Whether a retry may succeed.
        error_class: ErrorClass,
        /// The destination's or worker's error code.
        error_code: String,
        /// Human-readable detail (redacted).
        detail: String,
        /// When the worker plans the next attempt: the operation is not
        /// overdue before it plus the confirmation window.
        #[serde(default)]
        next_attempt_at: Option<i64>,
    },
    /// The call may or may not have taken effect (e.g. a timeout after
    /// sending): AWAITING_CONFIRMATION.
    OutcomeUnknown {
        /// Number of the attempt whose outcome is unknown.
        attempt: i32,
        /// Human-readable detail (redacted).
        detail: String,
    },
    /// Evidence that the effect exists at the destination.
    EffectObserved(EffectObserved),
    /// A reliable query of the destination found no effect.
    EffectAbsent {
        /// Where this evidence came from.
        source: EvidenceSource,
        /// A safe reference to the evidence (redacted).
        #[serde(default)]
        evidence_ref: Option<String>,
    },
    /// The effect was undone by an explicit business operation: COMPENSATED.
    Compensated {
        /// Who compensated.
        actor: String,
        /// Why.
        reason: String,
    },
    /// The operation no longer applies: NOT_APPLICABLE.
    Cancelled {
        /// Why it no longer applies; quoted in the verdict's reason.
        reason: String,
    },
    /// A person decided what to do with an open operation.
    ManualDecision {
        /// Who decided.
        actor: String,
        /// What was decided.
        decision: Decision,
        /// Why (redacted).
        note: String,
        /// What the person checked before deciding.
        #[serde(default)]
        evidence_checked: Vec<String>,
    },
    /// Written by the reconciler when an operation's timer is due; judged
    /// only when consumed, so a replay reproduces it.
    DeadlineReached {
        /// The timer's due time (event time).
        deadline: i64,
    },
    /// Written by the probe worker when its queries of the destination all
    /// failed: no evidence either way. Recorded (explain shows it); the
    /// operation's follow-up deadline escalates the unanswered probe.
    ProbeFailed {
        /// How many queries were made for the probe request.
        attempt: i32,
        /// Why the destination gave no answer.
        error_class: ProbeErrorClass,
        /// What failed, for a person (redacted).
        detail: String,
    },
}

impl Body {
    /// The union branch name, as in the schema; used in messages and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Body::Requested(_) => "Requested",
            Body::Started { .. } => "Started",
            Body::AttemptFailed { .. } => "AttemptFailed",
            Body::OutcomeUnknown { .. } => "OutcomeUnknown",
            Body::EffectObserved(_) => "EffectObserved",
            Body::EffectAbsent { .. } => "EffectAbsent",
            Body::Compensated { .. } => "Compensated",
            Body::Cancelled { .. } => "Cancelled",
            Body::ManualDecision { .. } => "ManualDecision",
            Body::DeadlineReached { .. } => "DeadlineReached",
            Body::ProbeFailed { .. } => "ProbeFailed",
        }
    }
}

impl Event {
    /// The event the reconciler writes when a timer of `operation_id` is due.
    ///
    /// Its id depends only on the operation and the due time, so a timer that
    /// fires twice (a restart, a rebalance) yields the same event twice; the
    /// core recognises the second by its due time (a deadline already past
    /// changes nothing) and flags nothing.
    pub fn deadline_reached(operation_id: &str, entity_id: &str, operation_type: &str, deadline: i64) -> Event {
        Event {
            event_id: deadline_event_id(operation_id, deadline),
            operation_id: operation_id.to_owned(),
            entity_id: entity_id.to_owned(),
            operation_type: operation_type.to_owned(),
            seq: None,
            occurred_at: deadline,
            producer: "reconciler".to_owned(),
            body: Body::DeadlineReached { deadline },
        }
    }
}

/// Deterministic event id of the `DeadlineReached` for `(operation_id, deadline)`.
pub fn deadline_event_id(operation_id: &str, deadline: i64) -> String {
    format!("deadline:{operation_id}:{deadline}")
}
