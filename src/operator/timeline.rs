//! Recording the timeline on the hot path. The pipeline takes an
//! [`Arrival`] of each event before the core consumes it and hands it back
//! with the disposition and outputs ([`record`]); the entry goes into the
//! batch written with the state.
//!
//! Cost per batch: one small put per record. How many entries an
//! operation has received is kept beside its state (no read of its own).

use crate::core::event::{Body, Event, SourcePos};
use crate::core::output::ManualDecisionRecord;
use crate::core::{Disposition, Output, Policy};
use crate::store::timeline::{AnomalyNote, VerdictNote};
use crate::store::{Batch, TimelineEntry};

/// What the timeline keeps of an event, taken before `core::apply`
/// consumes it.
#[derive(Debug, Clone)]
pub struct Arrival {
    operation_id: String,
    pos: SourcePos,
    event_id: String,
    seq: Option<i64>,
    body: &'static str,
    occurred_at: i64,
    producer: String,
    summary: String,
    manual: Option<ManualDecisionRecord>,
}

impl Arrival {
    /// The operation the event belongs to.
    pub fn operation_id(&self) -> &str {
        &self.operation_id
    }

    /// Takes what the timeline needs of `ev` (the decision note redacted as
    /// the core redacts it).
    pub fn of(ev: &Event, pos: SourcePos, policy: &Policy) -> Arrival {
        let manual = match &ev.body {
            Body::ManualDecision { actor, decision, note, evidence_checked } => Some(ManualDecisionRecord {
                actor: actor.clone(),
                decision: *decision,
                note: policy.redactor.redact(note).into_owned(),
                evidence_checked: evidence_checked.clone(),
            }),
            _ => None,
        };
        Arrival {
            operation_id: ev.operation_id.clone(),
            pos,
            event_id: ev.event_id.clone(),
            seq: ev.seq,
            body: ev.body.name(),
            occurred_at: ev.occurred_at,
            producer: ev.producer.clone(),
            summary: summary(&ev.body),
            manual,
        }
    }
}

/// The structured fields of a body in one line. Free text that may carry
/// personal data (`detail`, `evidence_ref`) is left out.
pub fn summary(body: &Body) -> String {
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    match body {
        Body::Requested(r) => format!(
            "expects version {} fingerprint {}; {}idempotent; key {}; to {}",
            opt(r.expected_version),
            r.expected_fingerprint.as_deref().unwrap_or("-"),
            if r.idempotent { "" } else { "not " },
            r.idempotency_key.as_deref().unwrap_or("-"),
            r.destination
        ),
        Body::Started { attempt, worker } => format!("attempt {attempt} by {worker}"),
        Body::AttemptFailed { attempt, error_class, error_code, .. } => {
            format!("attempt {attempt} failed {error_class:?} ({error_code})")
        }
        Body::OutcomeUnknown { attempt, .. } => format!("attempt {attempt}: outcome unknown"),
        Body::EffectObserved(o) => format!(
            "{:?} saw remote id {} version {} fingerprint {}",
            o.source,
            o.remote_id.as_deref().unwrap_or("-"),
            opt(o.observed_version),
            o.observed_fingerprint.as_deref().unwrap_or("-")
        ),
        Body::EffectAbsent { source, .. } => format!("{source:?} found no effect"),
        Body::Compensated { actor, reason } => format!("compensated by {actor}: {reason}"),
        Body::Cancelled { reason } => format!("cancelled: {reason}"),
        Body::ManualDecision { actor, decision, .. } => format!("{} by {actor}", decision.as_str()),
        Body::DeadlineReached { deadline } => format!("deadline {deadline} reached"),
    }
}

/// Records in `batch` what became of arrival `a`: its disposition and the
/// outputs its processing produced. `total` is how many entries the
/// operation has received so far (stored with its state); it is advanced.
/// `exists` is whether the operation still exists afterwards (a timer for a
/// removed operation leaves no trace that nothing would delete).
pub fn record(
    batch: &mut Batch,
    total: &mut u64,
    a: Arrival,
    disposition: Disposition,
    outputs: &[Output],
    exists: bool,
) {
    if !exists {
        return;
    }
    let p = a.pos.partition;
    let mut anomalies = Vec::new();
    let mut verdicts = Vec::new();
    for o in outputs {
        match o {
            Output::Anomaly(x) => {
                anomalies.push(AnomalyNote { kind: x.kind, event_id: x.event_id.clone(), detail: x.detail.clone() })
            }
            Output::Verdict(v) => verdicts.push(VerdictNote {
                verdict_id: v.verdict_id.clone(),
                outcome: v.outcome,
                action: v.action,
                state: v.state,
                reason: v.reason.clone(),
                trigger_event_id: v.trigger_event_id.clone(),
            }),
            Output::Command(_) => {}
        }
    }
    let entry = TimelineEntry {
        ordinal: *total,
        partition: p,
        offset: a.pos.offset,
        event_id: a.event_id,
        seq: a.seq,
        body: a.body.to_owned(),
        occurred_at: a.occurred_at,
        producer: a.producer,
        disposition,
        summary: a.summary,
        anomalies,
        verdicts,
        manual: a.manual,
    };
    *total += 1;
    batch.add_timeline(p, a.operation_id, entry);
}
