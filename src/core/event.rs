//! Domain events: what services say happened to an operation.
//!
//! These are the decoded, validated form of `reconciler.v1.OperationEvent`
//! (see `schemas/operation_event.avsc`). The core only ever sees these types;
//! the codec is the one place that knows the wire format.

use serde::{Deserialize, Serialize};

/// Where a record came from in the input log. Carried into verdicts and
/// anomalies so that every output can be traced back to its input offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct SourcePos {
    pub partition: i32,
    pub offset: i64,
}

/// One lifecycle event of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub event_id: String,
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    /// Revision of the operation record; `None` for outside observations.
    #[serde(default)]
    pub seq: Option<i64>,
    /// Event time in milliseconds since the epoch.
    pub occurred_at: i64,
    pub producer: String,
    pub body: Body,
}

/// Whether a failed attempt may succeed when retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorClass {
    Transient,
    Permanent,
}

/// Where a piece of evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EvidenceSource {
    WorkerResponse,
    DestinationQuery,
    Receipt,
    ResultFile,
}

/// A person's decision for an operation in manual review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Decision {
    Confirm,
    Requeue,
    Compensate,
    Close,
}

impl Decision {
    pub const ALL: [Decision; 4] = [Decision::Confirm, Decision::Requeue, Decision::Compensate, Decision::Close];

    /// The schema symbol.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Confirm => "CONFIRM",
            Decision::Requeue => "REQUEUE",
            Decision::Compensate => "COMPENSATE",
            Decision::Close => "CLOSE",
        }
    }
}

/// The expectation recorded when the operation is requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Requested {
    #[serde(default)]
    pub expected_version: Option<i64>,
    #[serde(default)]
    pub expected_fingerprint: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub idempotent: bool,
    pub destination: String,
    #[serde(default)]
    pub confirm_within_ms: Option<i64>,
    #[serde(default)]
    pub max_attempts: Option<i32>,
}

/// Evidence that the effect exists at the destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectObserved {
    #[serde(default)]
    pub remote_id: Option<String>,
    #[serde(default)]
    pub observed_version: Option<i64>,
    #[serde(default)]
    pub observed_fingerprint: Option<String>,
    pub source: EvidenceSource,
    #[serde(default)]
    pub evidence_ref: Option<String>,
}

/// What happened: one branch of the `body` union.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    Requested(Requested),
    Started {
        attempt: i32,
        worker: String,
    },
    AttemptFailed {
        attempt: i32,
        error_class: ErrorClass,
        error_code: String,
        detail: String,
        #[serde(default)]
        next_attempt_at: Option<i64>,
    },
    OutcomeUnknown {
        attempt: i32,
        detail: String,
    },
    EffectObserved(EffectObserved),
    EffectAbsent {
        source: EvidenceSource,
        #[serde(default)]
        evidence_ref: Option<String>,
    },
    Compensated {
        actor: String,
        reason: String,
    },
    Cancelled {
        reason: String,
    },
    ManualDecision {
        actor: String,
        decision: Decision,
        note: String,
        #[serde(default)]
        evidence_checked: Vec<String>,
    },
    DeadlineReached {
        deadline: i64,
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
        }
    }
}

impl Event {
    /// The event the reconciler writes when a timer of `operation_id` is due.
    ///
    /// Its id depends only on the operation and the due time, so a timer that
    /// fires twice (a restart, a rebalance) yields the same event twice, which
    /// the core then recognises as a duplicate delivery.
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
