//! A timeline entry's summary: the body's structured fields as the entry
//! stores them, rendered into one line of text when the entry is read.
//!
//! Every arrival of an event writes its entry (into its operation's value,
//! which each batch rewrites whole, logs ahead, flushes and publishes as a
//! changelog record), while an entry is read only by `explain` and the
//! HTTP API. So the entry keeps the fields, which take a few bytes each,
//! and not the sentence built from them, which cost a `format!` on the hot
//! path and dozens of bytes per entry; the variant also names the body,
//! which the entry therefore does not store as a string either. With the
//! event ids an entry leaves implicit (see [`super::timeline`]), an
//! operation's value on the default loadgen workload is a fifth smaller:
//! 726 bytes against 896 (`REBUILD_SIZES=1` in `benches/rebuild.rs`).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::core::event::{Body, Decision, ErrorClass, EvidenceSource, ProbeErrorClass};
use crate::core::operation::RequestInfo;
use crate::core::Supersede;

/// What a timeline entry shows of its event's body. `S` is `&str` when
/// written (borrowed from the event) and `String` when read back. Free text
/// that may carry personal data (`detail`, `evidence_ref`, a decision's
/// note) is left out. Appending a variant keeps the stored entries
/// readable; reordering or changing one is a store format change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Fields<S> {
    Requested {
        expected_version: Option<i64>,
        expected_fingerprint: Option<S>,
        idempotent: bool,
        idempotency_key: Option<S>,
        destination: S,
    },
    Started {
        attempt: i32,
        worker: S,
    },
    AttemptFailed {
        attempt: i32,
        error_class: ErrorClass,
        error_code: S,
        next_attempt_at: Option<i64>,
    },
    OutcomeUnknown {
        attempt: i32,
    },
    EffectObserved {
        source: EvidenceSource,
        remote_id: Option<S>,
        observed_version: Option<i64>,
        observed_fingerprint: Option<S>,
    },
    EffectAbsent {
        source: EvidenceSource,
    },
    Compensated {
        actor: S,
        reason: S,
    },
    Cancelled {
        reason: S,
    },
    ManualDecision {
        actor: S,
        decision: Decision,
    },
    DeadlineReached {
        deadline: i64,
    },
    ProbeFailed {
        attempt: i32,
        error_class: ProbeErrorClass,
        detail: S,
    },
    /// The entry an older operation gets when a newer request supersedes
    /// it: the newer operation's `Requested`, seen from the older one.
    Superseded {
        operation_id: S,
        expected_version: Option<i64>,
    },
    /// A `Requested` whose fields are its operation's request as the state
    /// holds them (`OperationState::request`, set by the first request
    /// applied and never changed after): one byte instead of the fields,
    /// which the state already stores. Read back as [`Fields::Requested`]
    /// ([`Fields::resolved`]).
    OfTheRequest,
}

impl<'a> Fields<&'a str> {
    /// The fields of `body`, borrowed.
    pub(super) fn of(body: &'a Body) -> Self {
        match body {
            Body::Requested(r) => Fields::Requested {
                expected_version: r.expected_version,
                expected_fingerprint: r.expected_fingerprint.as_deref(),
                idempotent: r.idempotent,
                idempotency_key: r.idempotency_key.as_deref(),
                destination: &r.destination,
            },
            Body::Started { attempt, worker } => Fields::Started { attempt: *attempt, worker },
            Body::AttemptFailed { attempt, error_class, error_code, next_attempt_at, .. } => Fields::AttemptFailed {
                attempt: *attempt,
                error_class: *error_class,
                error_code,
                next_attempt_at: *next_attempt_at,
            },
            Body::OutcomeUnknown { attempt, .. } => Fields::OutcomeUnknown { attempt: *attempt },
            Body::EffectObserved(o) => Fields::EffectObserved {
                source: o.source,
                remote_id: o.remote_id.as_deref(),
                observed_version: o.observed_version,
                observed_fingerprint: o.observed_fingerprint.as_deref(),
            },
            Body::EffectAbsent { source, .. } => Fields::EffectAbsent { source: *source },
            Body::Compensated { actor, reason } => Fields::Compensated { actor, reason },
            Body::Cancelled { reason } => Fields::Cancelled { reason },
            Body::ManualDecision { actor, decision, .. } => Fields::ManualDecision { actor, decision: *decision },
            Body::DeadlineReached { deadline } => Fields::DeadlineReached { deadline: *deadline },
            Body::ProbeFailed { attempt, error_class, detail } => {
                Fields::ProbeFailed { attempt: *attempt, error_class: *error_class, detail }
            }
        }
    }

    /// The fields of the `Requested` that set the operation's request `r`.
    pub(super) fn of_request(r: &'a RequestInfo) -> Self {
        Fields::Requested {
            expected_version: r.expected_version,
            expected_fingerprint: r.expected_fingerprint.as_deref(),
            idempotent: r.idempotent,
            idempotency_key: r.idempotency_key.as_deref(),
            destination: &r.destination,
        }
    }

    /// The fields of the entry `s` gives the operation it supersedes.
    pub(super) fn superseded(s: &'a Supersede) -> Self {
        Fields::Superseded { operation_id: &s.by.operation_id, expected_version: s.by.expected_version }
    }
}

impl<S: AsRef<str>> Fields<S> {
    /// The body's union branch name, as in the schema.
    pub(super) fn body(&self) -> &'static str {
        match self {
            Fields::Requested { .. } | Fields::Superseded { .. } | Fields::OfTheRequest => "Requested",
            Fields::Started { .. } => "Started",
            Fields::AttemptFailed { .. } => "AttemptFailed",
            Fields::OutcomeUnknown { .. } => "OutcomeUnknown",
            Fields::EffectObserved { .. } => "EffectObserved",
            Fields::EffectAbsent { .. } => "EffectAbsent",
            Fields::Compensated { .. } => "Compensated",
            Fields::Cancelled { .. } => "Cancelled",
            Fields::ManualDecision { .. } => "ManualDecision",
            Fields::DeadlineReached { .. } => "DeadlineReached",
            Fields::ProbeFailed { .. } => "ProbeFailed",
        }
    }

    /// The fields in one line, as `explain` and the API show them.
    pub(super) fn render(&self) -> String {
        /// An optional field: its value, or `-`.
        struct Opt<T>(Option<T>);
        impl<T: std::fmt::Display> std::fmt::Display for Opt<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match &self.0 {
                    Some(v) => v.fmt(f),
                    None => f.write_str("-"),
                }
            }
        }
        let mut out = String::new();
        let written = match self {
            Fields::Requested { expected_version, expected_fingerprint, idempotent, idempotency_key, destination } => {
                write!(
                    out,
                    "expects version {} fingerprint {}; {}idempotent; key {}; to {}",
                    Opt(*expected_version),
                    Opt(text(expected_fingerprint)),
                    if *idempotent { "" } else { "not " },
                    Opt(text(idempotency_key)),
                    destination.as_ref()
                )
            }
            Fields::Started { attempt, worker } => write!(out, "attempt {attempt} by {}", worker.as_ref()),
            Fields::AttemptFailed { attempt, error_class, error_code, next_attempt_at } => {
                write!(out, "attempt {attempt} failed {error_class:?} ({})", error_code.as_ref()).and_then(|()| {
                    match next_attempt_at {
                        Some(t) => write!(out, "; next attempt at {}", crate::clock::format_time(*t)),
                        None => Ok(()),
                    }
                })
            }
            Fields::OutcomeUnknown { attempt } => write!(out, "attempt {attempt}: outcome unknown"),
            Fields::EffectObserved { source, remote_id, observed_version, observed_fingerprint } => write!(
                out,
                "{source:?} saw remote id {} version {} fingerprint {}",
                Opt(text(remote_id)),
                Opt(*observed_version),
                Opt(text(observed_fingerprint))
            ),
            Fields::EffectAbsent { source } => write!(out, "{source:?} found no effect"),
            Fields::Compensated { actor, reason } => {
                write!(out, "compensated by {}: {}", actor.as_ref(), reason.as_ref())
            }
            Fields::Cancelled { reason } => write!(out, "cancelled: {}", reason.as_ref()),
            Fields::ManualDecision { actor, decision } => {
                write!(out, "{} by {}", decision.as_str(), actor.as_ref())
            }
            Fields::DeadlineReached { deadline } => write!(out, "deadline {deadline} reached"),
            Fields::ProbeFailed { attempt, error_class, detail } => {
                write!(out, "probe failed after {attempt} attempt(s): {} ({})", error_class.as_str(), detail.as_ref())
            }
            Fields::Superseded { operation_id, expected_version } => {
                write!(out, "superseded by operation {} (version {})", operation_id.as_ref(), Opt(*expected_version))
            }
            // Read back resolved (`Fields::resolved`), so not shown so.
            Fields::OfTheRequest => out.write_str("the operation's request"),
        };
        written.expect("writing to a string");
        out
    }
}

impl Fields<String> {
    /// The fields as shown: [`Fields::OfTheRequest`] becomes the fields of
    /// the operation's request `request`; `None` when it has none (a
    /// damaged store).
    pub(super) fn resolved(self, request: Option<&RequestInfo>) -> Option<Fields<String>> {
        match self {
            Fields::OfTheRequest => {
                let written = postcard::to_allocvec(&Fields::of_request(request?)).ok()?;
                postcard::from_bytes(&written).ok()
            }
            fields => Some(fields),
        }
    }
}

/// An optional text field, borrowed.
fn text<S: AsRef<str>>(v: &Option<S>) -> Option<&str> {
    v.as_ref().map(AsRef::as_ref)
}

#[cfg(test)]
mod tests {
    use super::Fields;
    use crate::core::event::{Body, Decision, EffectObserved, ErrorClass, EvidenceSource, ProbeErrorClass, Requested};

    /// Stored, read back and rendered: each body gives the line the
    /// timeline showed when it stored the rendered text (format 4), and
    /// the body's own name.
    #[test]
    fn each_body_reads_back_as_the_line_it_always_showed() {
        let requested = |fp: Option<&str>, key: Option<&str>, idempotent| {
            Body::Requested(Requested {
                expected_version: Some(7),
                expected_fingerprint: fp.map(Into::into),
                idempotency_key: key.map(Into::into),
                idempotent,
                destination: "crm".into(),
                ..Requested::default()
            })
        };
        let observed = |remote_id: Option<&str>, version, fp: Option<&str>| {
            Body::EffectObserved(EffectObserved {
                remote_id: remote_id.map(Into::into),
                observed_version: version,
                observed_fingerprint: fp.map(Into::into),
                source: EvidenceSource::DestinationQuery,
                evidence_ref: Some("q-1".into()),
            })
        };
        let cases = [
            (
                requested(Some("fp-1"), Some("k-1"), true),
                "expects version 7 fingerprint fp-1; idempotent; key k-1; to crm",
            ),
            (requested(None, None, false), "expects version 7 fingerprint -; not idempotent; key -; to crm"),
            (Body::Started { attempt: 2, worker: "w-1".into() }, "attempt 2 by w-1"),
            (
                Body::AttemptFailed {
                    attempt: 1,
                    error_class: ErrorClass::Transient,
                    error_code: "503".into(),
                    detail: "busy".into(),
                    next_attempt_at: Some(0),
                },
                "attempt 1 failed Transient (503); next attempt at 1970-01-01T00:00:00.000Z",
            ),
            (
                Body::AttemptFailed {
                    attempt: 3,
                    error_class: ErrorClass::Permanent,
                    error_code: "400".into(),
                    detail: String::new(),
                    next_attempt_at: None,
                },
                "attempt 3 failed Permanent (400)",
            ),
            (Body::OutcomeUnknown { attempt: 1, detail: "timeout".into() }, "attempt 1: outcome unknown"),
            (
                observed(Some("r1"), Some(7), Some("fp-1")),
                "DestinationQuery saw remote id r1 version 7 fingerprint fp-1",
            ),
            (observed(None, None, None), "DestinationQuery saw remote id - version - fingerprint -"),
            (Body::EffectAbsent { source: EvidenceSource::Receipt, evidence_ref: None }, "Receipt found no effect"),
            (Body::Compensated { actor: "ops".into(), reason: "dup".into() }, "compensated by ops: dup"),
            (Body::Cancelled { reason: "gone".into() }, "cancelled: gone"),
            (
                Body::ManualDecision {
                    actor: "alice".into(),
                    decision: Decision::Requeue,
                    note: "private".into(),
                    evidence_checked: vec!["crm".into()],
                },
                "REQUEUE by alice",
            ),
            (Body::DeadlineReached { deadline: 42 }, "deadline 42 reached"),
            (
                Body::ProbeFailed { attempt: 3, error_class: ProbeErrorClass::Timeout, detail: "no answer".into() },
                "probe failed after 3 attempt(s): TIMEOUT (no answer)",
            ),
        ];
        for (body, line) in cases {
            let bytes = postcard::to_allocvec(&Fields::of(&body)).unwrap();
            let read: Fields<String> = postcard::from_bytes(&bytes).unwrap();
            assert_eq!((read.body(), read.render().as_str()), (body.name(), line));
        }
        let superseded = Fields::Superseded { operation_id: "op-2".to_owned(), expected_version: None };
        assert_eq!(
            (superseded.body(), superseded.render().as_str()),
            ("Requested", "superseded by operation op-2 (version -)")
        );
    }
}
