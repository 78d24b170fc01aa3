//! `resolve`: a person's decision on a review case, as a `ManualDecision`
//! event in the input log. State is never edited here: the pipeline applies
//! the decision when it consumes it, like any other event, so the decision
//! is replayed, audited and shown in the operation's timeline.
//!
//! The decision is checked first with the core's own rule
//! ([`OperationState::check_decision`]); the pipeline checks it again when
//! it applies it (the state may have moved on in between: then the event is
//! recorded as an INVALID_TRANSITION and the timeline shows it).

use serde::Serialize;
use uuid::Uuid;

use super::explain::locate;
use super::OperatorError;
use crate::codec::Codec;
use crate::core::event::{Body, Decision, Event};
use crate::core::OperationState;
use crate::kafka::producer::Publisher;
use crate::records::ProducerRecord;
use crate::signature::ControlKeys;
use crate::store::Store;

/// Namespace of manual-decision event ids.
const NAMESPACE: Uuid = Uuid::from_u128(0x3b0d_52a4_91c7_4e0c_8f6e_7d21_aa90_5c13);

/// The `producer` of decisions published by the operator tools.
pub const PRODUCER: &str = "reconciler-operator";

/// A decision as a person enters it.
#[derive(Debug, Clone)]
pub struct ResolveRequest {
    /// The operation decided on.
    pub operation_id: String,
    /// What to do: confirm, requeue, compensate or close (the decision of a
    /// `ManualDecision` event).
    pub decision: Decision,
    /// Who decides; must not be empty.
    pub actor: String,
    /// Why; must not be empty. Redacted like other free text before it is
    /// stored.
    pub note: String,
    /// What was checked before deciding.
    pub evidence_checked: Vec<String>,
}

/// A checked decision, ready to publish.
#[derive(Debug, Clone, Serialize)]
pub struct PreparedDecision {
    /// The operation's partition: the event goes there, beside its state.
    pub partition: i32,
    /// The `ManualDecision` event; its id follows from the verdict under
    /// review and the decision's content.
    pub event: Event,
}

/// Checks `req` against the operation's state in `store` and builds its
/// event, stamped with wall-clock time `now` (ms).
///
/// The event id is derived from the verdict under review (the last verdict)
/// and the decision's content: sending the same decision twice yields one
/// event id, which the core then counts as a duplicate delivery.
pub fn prepare(store: &Store, req: &ResolveRequest, now: i64) -> Result<PreparedDecision, OperatorError> {
    if req.actor.trim().is_empty() {
        return Err(OperatorError::Invalid("the actor (who decides) must not be empty".into()));
    }
    if req.note.trim().is_empty() {
        return Err(OperatorError::Invalid("the note (why) must not be empty".into()));
    }
    let (partition, op) =
        locate(store, &req.operation_id)?.ok_or_else(|| OperatorError::NotFound(req.operation_id.clone()))?;
    check(&op, req.decision)?;
    let last = op.last_verdict.as_ref().map_or("", |v| v.verdict_id.as_str());
    let parts =
        [&op.operation_id, last, req.decision.as_str(), &req.actor, &req.note, &req.evidence_checked.join("\u{1e}")];
    let event_id = crate::core::ids::v5(&NAMESPACE, &parts);
    let event = Event {
        event_id,
        operation_id: op.operation_id.clone(),
        entity_id: op.entity_id.clone(),
        operation_type: op.operation_type.clone(),
        // An outside observation, not a revision of the operation record.
        seq: None,
        occurred_at: now,
        producer: PRODUCER.to_owned(),
        body: Body::ManualDecision {
            actor: req.actor.clone(),
            decision: req.decision,
            note: req.note.clone(),
            evidence_checked: req.evidence_checked.clone(),
        },
    };
    Ok(PreparedDecision { partition, event })
}

/// The core's refusal as an operator error.
pub fn check(op: &OperationState, decision: Decision) -> Result<(), OperatorError> {
    op.check_decision(decision).map_err(|refusal| OperatorError::Refused {
        operation_id: op.operation_id.clone(),
        decision: decision.as_str(),
        refusal,
        allowed: super::explain::allowed_decisions(op),
    })
}

/// The record to publish to input topic `topic`: keyed by entity_id and
/// signed with `keys` (the pipeline applies only signed decisions).
pub fn record(
    codec: &Codec,
    keys: &ControlKeys,
    topic: &str,
    d: &PreparedDecision,
) -> Result<ProducerRecord, OperatorError> {
    Ok(crate::records::signed(crate::records::event_record(codec, topic, &d.event)?, keys))
}

/// Publishes a prepared decision, signed with `keys`, to the operation's
/// partition of `topic` and waits for the broker's acknowledgement.
pub fn publish(
    publisher: &Publisher,
    codec: &Codec,
    keys: &ControlKeys,
    topic: &str,
    d: &PreparedDecision,
) -> Result<(), OperatorError> {
    let rec = record(codec, keys, topic, d)?;
    publisher.publish_all([(&rec, Some(d.partition))])?;
    // The note stays out of the log: it is free text, redacted only when
    // the pipeline stores it.
    if let Body::ManualDecision { actor, decision, .. } = &d.event.body {
        tracing::info!(
            operation_id = %d.event.operation_id,
            entity_id = %d.event.entity_id,
            event_id = %d.event.event_id,
            decision = decision.as_str(),
            actor = %actor,
            partition = d.partition,
            "Manual decision published"
        );
    }
    Ok(())
}
