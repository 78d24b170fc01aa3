//! The event a probe request ends in: what the destination said, as an
//! `EffectObserved` or `EffectAbsent` of source DESTINATION_QUERY, or a
//! `ProbeFailed`. Pure: the time comes in as an argument.
//!
//! The event id depends only on the command (one answer per probe
//! request), so a command delivered twice can only ever yield the same id;
//! the worker's store makes sure it also yields the same body.

use crate::clock::format_time;
use crate::core::event::{Body, EffectObserved, Event, EvidenceSource};
use crate::core::redact::Redactor;
use crate::core::verdict::derive_id;
use crate::core::RepairCommand;

use super::destination::{Answer, Finding, ProbeError};

/// The `producer` of every event the worker writes.
pub const PRODUCER: &str = "reconciler-probe";

/// How a probe request ended: an answer after `attempts` queries, or the
/// last error after `attempts` queries (0 when none could be sent).
pub type Outcome = Result<(u32, Answer), (u32, ProbeError)>;

/// The id of the answer to command `command_id`.
pub fn answer_id(command_id: &str) -> String {
    derive_id(&["probe-answer", command_id])
}

/// The event that answers `cmd`, written at `at` (ms). Free text goes
/// through `redactor`, as the core would do on reading it.
pub fn answer_event(cmd: &RepairCommand, outcome: &Outcome, at: i64, redactor: &Redactor) -> Event {
    let evidence = |attempts: u32, query: &str| {
        let text = format!(
            "probe {} of {} (attempt {attempts}) at {}: {query}",
            cmd.command_id,
            cmd.destination,
            format_time(at)
        );
        Some(redactor.redact(&text).into_owned())
    };
    let body = match outcome {
        Ok((attempts, Answer { finding: Finding::Present { remote_id, version, fingerprint }, query })) => {
            Body::EffectObserved(EffectObserved {
                remote_id: remote_id.clone(),
                observed_version: *version,
                observed_fingerprint: fingerprint.clone(),
                source: EvidenceSource::DestinationQuery,
                evidence_ref: evidence(*attempts, query),
            })
        }
        Ok((attempts, Answer { finding: Finding::Absent, query })) => {
            Body::EffectAbsent { source: EvidenceSource::DestinationQuery, evidence_ref: evidence(*attempts, query) }
        }
        Err((attempts, e)) => Body::ProbeFailed {
            attempt: i32::try_from(*attempts).unwrap_or(i32::MAX),
            error_class: e.class,
            detail: redactor.redact(&format!("{} of {}: {}", cmd.command_id, cmd.destination, e.detail)).into_owned(),
        },
    };
    Event {
        event_id: answer_id(&cmd.command_id),
        operation_id: cmd.operation_id.clone(),
        entity_id: cmd.entity_id.clone(),
        operation_type: cmd.operation_type.clone(),
        seq: None,
        occurred_at: at,
        producer: PRODUCER.to_owned(),
        body,
    }
}

/// A PROBE command of the unit tests: `crm`, idempotency key `k`, expected
/// version 7.
#[cfg(test)]
pub(crate) fn probe_command(command_id: &str) -> RepairCommand {
    RepairCommand {
        command_id: command_id.into(),
        verdict_id: "v".into(),
        operation_id: "op".into(),
        entity_id: "e".into(),
        operation_type: "t".into(),
        action: crate::core::RepairAction::Probe,
        idempotency_key: Some("k".into()),
        destination: "crm".into(),
        expected_version: Some(7),
        expected_fingerprint: None,
        issued_at: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::ProbeErrorClass;

    fn cmd() -> RepairCommand {
        probe_command("c-1")
    }

    #[test]
    fn one_id_per_command_whatever_the_answer() {
        let r = Redactor::default();
        let found = Ok((1, Answer { finding: Finding::Absent, query: "GET x -> 404".into() }));
        let failed = Err((4, ProbeError::new(ProbeErrorClass::Timeout, "no answer")));
        let a = answer_event(&cmd(), &found, 5, &r);
        let b = answer_event(&cmd(), &failed, 9, &r);
        assert_eq!(a.event_id, b.event_id);
        assert_eq!(a.event_id, answer_id("c-1"));
        assert_ne!(a.event_id, answer_id("c-2"));
        assert_eq!((a.seq, a.entity_id.as_str(), a.producer.as_str()), (None, "e", PRODUCER));
        assert!(matches!(b.body, Body::ProbeFailed { attempt: 4, error_class: ProbeErrorClass::Timeout, .. }));
        let Body::EffectAbsent { evidence_ref: Some(e), .. } = a.body else { panic!("{a:?}") };
        assert!(e.contains("c-1") && e.contains("GET x -> 404") && e.contains("attempt 1"), "{e}");
    }
}
