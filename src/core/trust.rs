//! The trust boundary on the input topic: which events
//! only the reconciler and its operators may write, and what becomes of one
//! that does not prove it.
//!
//! Every service that may publish lifecycle events to the input topic could
//! also publish a `DeadlineReached` (forcing overdue verdicts early, or
//! removing a terminal operation) or a `ManualDecision` (closing a case
//! without the token, the actor check and the audit of the panel). Those
//! *control* events are therefore signed by their writer (an HMAC over the
//! record's topic, key and value, see `crate::signature`); the pipeline checks the
//! signature and hands the core its [`Authenticity`] as data, so the core
//! stays pure and a replay with the same keys decides the same.

use serde::{Deserialize, Serialize};

use super::event::{Body, Event, SourcePos};
use super::names::named_enum;
use super::operation::OperationState;
use super::output::{Anomaly, AnomalyKind};
use super::policy::Policy;
use super::verdict::anomaly_id;

named_enum! {
    /// What the signature check said of an input record.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Authenticity {
        /// Signed with one of the configured control keys.
        Signed => "signed",
        /// No signature at all.
        Unsigned => "unsigned",
        /// A signature no configured key made (forged, altered, or signed
        /// with a key rotated out).
        BadSignature => "bad_signature",
    }
}

/// Whether events with `body` may only come from the reconciler itself or
/// its operator tools: the timer wheel's `DeadlineReached`, the operators'
/// `ManualDecision`, the probe worker's `ProbeFailed`. Everything else is a
/// service's account of its own work (an `EffectObserved` from a destination
/// query may come from a service as well as from the probe).
pub fn is_control(body: &Body) -> bool {
    matches!(body, Body::DeadlineReached { .. } | Body::ManualDecision { .. } | Body::ProbeFailed { .. })
}

/// Whether the core refuses an event with `body` whose signature check said
/// `auth`: a control event not signed, under `policy.signed_control`.
pub fn refused(policy: &Policy, body: &Body, auth: Authenticity) -> bool {
    policy.signed_control && auth != Authenticity::Signed && is_control(body)
}

/// The FORGED_CONTROL_EVENT anomaly of control event `ev`, refused because
/// of `auth`. `op` is its operation, when it exists (for the expected seq);
/// the event is never applied, so nothing else of the state is touched.
pub(crate) fn forged(op: Option<&OperationState>, ev: &Event, pos: SourcePos, auth: Authenticity) -> Anomaly {
    let why = match auth {
        Authenticity::Unsigned => "carries no signature",
        _ => "carries a signature no configured control key made",
    };
    let detail = format!(
        "{} from producer {:?} {why}: not applied. Control events are accepted only when signed with a key of security.control_keys.",
        ev.body.name(),
        ev.producer
    );
    Anomaly {
        anomaly_id: anomaly_id(AnomalyKind::ForgedControlEvent, &ev.event_id, pos),
        kind: AnomalyKind::ForgedControlEvent,
        operation_id: ev.operation_id.clone(),
        entity_id: ev.entity_id.clone(),
        operation_type: ev.operation_type.clone(),
        event_id: ev.event_id.clone(),
        seq: ev.seq,
        expected_seq: op.map(|o| o.next_seq),
        missing_seqs: Vec::new(),
        detected_at: ev.occurred_at,
        detail,
        source_partition: pos.partition,
        source_offset: pos.offset,
        producer: Some(ev.producer.clone()),
    }
}
