//! Building verdicts, anomalies and repair commands with deterministic ids.
//!
//! Ids are UUIDv5 of the facts that caused the output (operation, trigger
//! event, position in the log), never of a clock or a random source: the
//! same input gives the same ids, so a replay or an at-least-once re-publish
//! produces byte-identical records.

use uuid::Uuid;

use super::event::{Event, EvidenceSource, SourcePos};
use super::operation::{LastVerdict, OperationState, Trigger};
use super::output::{
    Action, Anomaly, AnomalyKind, Escalation, Evidence, Outcome, Output, RepairAction, RepairCommand, Verdict,
};
use super::policy::Policy;
use super::reason::Reason;

/// Namespace of every id the reconciler derives.
const NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_9a52_3c0e_4f7e_9d8b_0b7a_52e1_c4a9);

/// The id in the reconciler's namespace of `parts` (see [`super::ids`]).
pub(crate) fn derive_id(parts: &[&str]) -> String {
    super::ids::v5(&NAMESPACE, parts)
}

/// What a transition decided, before the evidence is attached.
pub(crate) struct VerdictDraft<'a> {
    pub trigger: Trigger<'a>,
    pub outcome: Outcome,
    pub action: Action,
    pub reason: Reason,
    pub escalation: Option<Escalation>,
}

impl<'a> VerdictDraft<'a> {
    pub fn new(trigger: Trigger<'a>, outcome: Outcome, action: Action, reason: Reason) -> Self {
        VerdictDraft { trigger, outcome, action, reason, escalation: None }
    }

    /// The verdict of a follow-up that sent the operation to review.
    pub fn escalated(self, why: Escalation) -> Self {
        VerdictDraft { escalation: Some(why), ..self }
    }
}

/// Issues a verdict for `op` (and, in act mode, its repair command).
pub(crate) fn emit(op: &mut OperationState, policy: &Policy, d: VerdictDraft<'_>, out: &mut Vec<Output>) {
    let mut index = itoa::Buffer::new();
    let verdict_id = derive_id(&["verdict", &op.operation_id, d.trigger.event_id, index.format(op.verdict_count)]);
    op.verdict_count += 1;
    let req = op.request.as_ref();
    let evidence = Evidence {
        expected_version: req.and_then(|r| r.expected_version),
        expected_fingerprint: req.and_then(|r| r.expected_fingerprint.clone()),
        observed_version: op.observed_version,
        observed_fingerprint: op.observed_fingerprint.clone(),
        remote_ids: op.remote_ids.clone(),
        idempotency_key: req.and_then(|r| r.idempotency_key.clone()),
        attempts: op.attempts,
        requested_at: req.map(|r| r.requested_at),
        last_event_at: op.last_event_at.max(d.trigger.at),
        events_applied: op.events_applied,
        duplicates_seen: op.duplicates_seen,
        out_of_order_seen: op.out_of_order_seen,
        trigger_partition: d.trigger.pos.partition,
        trigger_offset: d.trigger.pos.offset,
        manual_decision: op.manual.clone(),
        requeues: op.requeues as i32,
        follow_up_at: op.follow_up.map(|f| f.at),
        next_attempt_at: op.next_attempt_at,
        superseded_by: op.superseded_by.clone(),
        escalation: d.escalation,
    };
    let verdict = Verdict {
        verdict_id: verdict_id.clone(),
        operation_id: op.operation_id.clone(),
        entity_id: op.entity_id.clone(),
        operation_type: op.operation_type.clone(),
        outcome: d.outcome,
        action: d.action,
        state: op.status,
        reason: d.reason.clone(),
        decided_at: d.trigger.at,
        trigger_event_id: d.trigger.event_id.to_owned(),
        evidence,
    };
    op.last_verdict = Some(LastVerdict {
        verdict_id: verdict_id.clone(),
        outcome: d.outcome,
        action: d.action,
        reason: d.reason.into_string(),
        decided_at: d.trigger.at,
    });
    out.push(Output::Verdict(verdict));
    // A probe only reads the destination, so its command is published in
    // observe mode too (the probe worker answers it); a requeue changes the
    // world and waits for act mode.
    if d.action == Action::Probe || (policy.act && d.action.is_automatable()) {
        let action = if d.action == Action::Requeue { RepairAction::Requeue } else { RepairAction::Probe };
        let req = op.request.as_ref();
        out.push(Output::Command(RepairCommand {
            command_id: derive_id(&["command", &verdict_id]),
            verdict_id,
            operation_id: op.operation_id.clone(),
            entity_id: op.entity_id.clone(),
            operation_type: op.operation_type.clone(),
            action,
            idempotency_key: req.and_then(|r| r.idempotency_key.clone()),
            destination: req.map(|r| r.destination.clone()).unwrap_or_default(),
            expected_version: req.and_then(|r| r.expected_version),
            expected_fingerprint: req.and_then(|r| r.expected_fingerprint.clone()),
            issued_at: d.trigger.at,
        }));
    }
}

/// The deterministic id of a `kind` anomaly about event `event_id`,
/// detected while processing the record at `pos`.
pub(crate) fn anomaly_id(kind: AnomalyKind, event_id: &str, pos: SourcePos) -> String {
    let (mut partition, mut offset) = (itoa::Buffer::new(), itoa::Buffer::new());
    derive_id(&["anomaly", kind.as_str(), event_id, partition.format(pos.partition), offset.format(pos.offset)])
}

/// An anomaly about `flagged`, detected while processing the record at `pos`.
pub(crate) fn anomaly(
    kind: AnomalyKind,
    op: &OperationState,
    flagged: &Event,
    pos: SourcePos,
    detail: String,
    missing_seqs: Vec<i64>,
) -> Anomaly {
    Anomaly {
        anomaly_id: anomaly_id(kind, &flagged.event_id, pos),
        kind,
        operation_id: op.operation_id.clone(),
        entity_id: op.entity_id.clone(),
        operation_type: op.operation_type.clone(),
        event_id: flagged.event_id.clone(),
        seq: flagged.seq,
        expected_seq: Some(op.next_seq),
        missing_seqs,
        detected_at: flagged.occurred_at,
        detail,
        source_partition: pos.partition,
        source_offset: pos.offset,
        producer: None,
    }
}

/// How a source is named in a verdict's reason.
pub(crate) fn source_name(source: EvidenceSource) -> &'static str {
    match source {
        EvidenceSource::WorkerResponse => "worker response",
        EvidenceSource::DestinationQuery => "destination query",
        EvidenceSource::Receipt => "receipt",
        EvidenceSource::ResultFile => "result file",
    }
}
