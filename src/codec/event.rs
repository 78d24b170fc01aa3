//! `OperationEvent` from a decoded Avro value, and its validation (what an
//! input record must satisfy before the core sees it; one that does not is
//! a dead letter).
//!
//! Written out by hand rather than through serde: the body is a union of
//! records, and an explicit walk gives an error that names the exact field.

use apache_avro::types::Value;

use super::error::DecodeError;
use crate::core::event::{
    Body, Decision, EffectObserved, ErrorClass, Event, EvidenceSource, ProbeErrorClass, Requested,
};

type Fields = Vec<(String, Value)>;

fn invalid(field: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError::InvalidField { field, reason: reason.into() }
}

/// Takes a named field out of a record's fields.
fn take(fields: &mut Fields, name: &'static str) -> Result<Value, DecodeError> {
    let i = fields.iter().position(|(n, _)| n == name).ok_or_else(|| invalid(name, "missing"))?;
    Ok(std::mem::replace(&mut fields[i].1, Value::Null))
}

fn unwrap_union(v: Value) -> Value {
    match v {
        Value::Union(_, inner) => *inner,
        other => other,
    }
}

fn string(fields: &mut Fields, name: &'static str) -> Result<String, DecodeError> {
    match unwrap_union(take(fields, name)?) {
        Value::String(s) => Ok(s),
        other => Err(invalid(name, format!("expected a string, found {other:?}"))),
    }
}

fn opt_string(fields: &mut Fields, name: &'static str) -> Result<Option<String>, DecodeError> {
    match unwrap_union(take(fields, name)?) {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        other => Err(invalid(name, format!("expected null or a string, found {other:?}"))),
    }
}

fn opt_long(fields: &mut Fields, name: &'static str) -> Result<Option<i64>, DecodeError> {
    match unwrap_union(take(fields, name)?) {
        Value::Null => Ok(None),
        Value::Long(n) | Value::TimestampMillis(n) => Ok(Some(n)),
        Value::Int(n) => Ok(Some(n.into())),
        other => Err(invalid(name, format!("expected null or a long, found {other:?}"))),
    }
}

fn long(fields: &mut Fields, name: &'static str) -> Result<i64, DecodeError> {
    opt_long(fields, name)?.ok_or_else(|| invalid(name, "expected a long, found null"))
}

fn opt_int(fields: &mut Fields, name: &'static str) -> Result<Option<i32>, DecodeError> {
    match unwrap_union(take(fields, name)?) {
        Value::Null => Ok(None),
        Value::Int(n) => Ok(Some(n)),
        other => Err(invalid(name, format!("expected null or an int, found {other:?}"))),
    }
}

fn int(fields: &mut Fields, name: &'static str) -> Result<i32, DecodeError> {
    opt_int(fields, name)?.ok_or_else(|| invalid(name, "expected an int, found null"))
}

fn boolean(fields: &mut Fields, name: &'static str) -> Result<bool, DecodeError> {
    match take(fields, name)? {
        Value::Boolean(b) => Ok(b),
        other => Err(invalid(name, format!("expected a boolean, found {other:?}"))),
    }
}

fn symbol(fields: &mut Fields, name: &'static str) -> Result<String, DecodeError> {
    match take(fields, name)? {
        Value::Enum(_, s) => Ok(s),
        other => Err(invalid(name, format!("expected an enum symbol, found {other:?}"))),
    }
}

fn string_array(fields: &mut Fields, name: &'static str) -> Result<Vec<String>, DecodeError> {
    match take(fields, name)? {
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                other => Err(invalid(name, format!("expected strings, found {other:?}"))),
            })
            .collect(),
        other => Err(invalid(name, format!("expected an array, found {other:?}"))),
    }
}

/// The variant of `all` whose schema symbol is the field's.
fn variant<T: Copy>(
    fields: &mut Fields,
    name: &'static str,
    all: &[T],
    as_str: fn(T) -> &'static str,
) -> Result<T, DecodeError> {
    let s = symbol(fields, name)?;
    all.iter().copied().find(|v| as_str(*v) == s).ok_or_else(|| invalid(name, format!("unknown symbol {s}")))
}

fn source(fields: &mut Fields) -> Result<EvidenceSource, DecodeError> {
    variant(fields, "source", &EvidenceSource::ALL, EvidenceSource::as_str)
}

/// The body union's branches, in schema order.
const BODY_BRANCHES: [&str; 11] = [
    "Requested",
    "Started",
    "AttemptFailed",
    "OutcomeUnknown",
    "EffectObserved",
    "EffectAbsent",
    "Compensated",
    "Cancelled",
    "ManualDecision",
    "DeadlineReached",
    "ProbeFailed",
];

fn body(v: Value) -> Result<Body, DecodeError> {
    let Value::Union(index, inner) = v else {
        return Err(invalid("body", "expected a union"));
    };
    let Value::Record(mut f) = *inner else {
        return Err(invalid("body", "expected a record branch"));
    };
    let f = &mut f;
    let branch = BODY_BRANCHES.get(index as usize).copied().unwrap_or("?");
    Ok(match branch {
        "Requested" => Body::Requested(Requested {
            expected_version: opt_long(f, "expected_version")?,
            expected_fingerprint: opt_string(f, "expected_fingerprint")?,
            idempotency_key: opt_string(f, "idempotency_key")?,
            idempotent: boolean(f, "idempotent")?,
            destination: string(f, "destination")?,
            confirm_within_ms: opt_long(f, "confirm_within_ms")?,
            max_attempts: opt_int(f, "max_attempts")?,
        }),
        "Started" => Body::Started { attempt: int(f, "attempt")?, worker: string(f, "worker")? },
        "AttemptFailed" => Body::AttemptFailed {
            attempt: int(f, "attempt")?,
            error_class: variant(f, "error_class", &ErrorClass::ALL, ErrorClass::as_str)?,
            error_code: string(f, "error_code")?,
            detail: string(f, "detail")?,
            next_attempt_at: opt_long(f, "next_attempt_at")?,
        },
        "OutcomeUnknown" => Body::OutcomeUnknown { attempt: int(f, "attempt")?, detail: string(f, "detail")? },
        "EffectObserved" => Body::EffectObserved(EffectObserved {
            remote_id: opt_string(f, "remote_id")?,
            observed_version: opt_long(f, "observed_version")?,
            observed_fingerprint: opt_string(f, "observed_fingerprint")?,
            source: source(f)?,
            evidence_ref: opt_string(f, "evidence_ref")?,
        }),
        "EffectAbsent" => Body::EffectAbsent { source: source(f)?, evidence_ref: opt_string(f, "evidence_ref")? },
        "Compensated" => Body::Compensated { actor: string(f, "actor")?, reason: string(f, "reason")? },
        "Cancelled" => Body::Cancelled { reason: string(f, "reason")? },
        "ManualDecision" => Body::ManualDecision {
            actor: string(f, "actor")?,
            decision: variant(f, "decision", &Decision::ALL, Decision::as_str)?,
            note: string(f, "note")?,
            evidence_checked: string_array(f, "evidence_checked")?,
        },
        "DeadlineReached" => Body::DeadlineReached { deadline: long(f, "deadline")? },
        "ProbeFailed" => Body::ProbeFailed {
            attempt: int(f, "attempt")?,
            error_class: variant(f, "error_class", &ProbeErrorClass::ALL, ProbeErrorClass::as_str)?,
            detail: string(f, "detail")?,
        },
        _ => return Err(invalid("body", format!("unknown union branch {index}"))),
    })
}

/// Builds an [`Event`] from a value of the current `OperationEvent` schema.
pub(super) fn event_from_value(v: Value) -> Result<Event, DecodeError> {
    let Value::Record(mut f) = v else {
        return Err(invalid("OperationEvent", "expected a record"));
    };
    let f = &mut f;
    Ok(Event {
        event_id: string(f, "event_id")?,
        operation_id: string(f, "operation_id")?,
        entity_id: string(f, "entity_id")?,
        operation_type: string(f, "operation_type")?,
        seq: opt_long(f, "seq")?,
        occurred_at: long(f, "occurred_at")?,
        producer: string(f, "producer")?,
        body: body(take(f, "body")?)?,
    })
}

/// Input validation of a decoded event: non-empty ids, seq ≥ 1.
pub(super) fn validate(ev: &Event) -> Result<(), DecodeError> {
    for (field, value) in [
        ("event_id", &ev.event_id),
        ("operation_id", &ev.operation_id),
        ("entity_id", &ev.entity_id),
        ("operation_type", &ev.operation_type),
    ] {
        if value.trim().is_empty() {
            return Err(invalid(field, "must not be empty"));
        }
    }
    if let Some(s) = ev.seq {
        if s < 1 {
            return Err(invalid("seq", format!("must be at least 1, found {s}")));
        }
    }
    if let Body::Requested(r) = &ev.body {
        if let Some(w) = r.confirm_within_ms.filter(|w| *w <= 0) {
            return Err(invalid("confirm_within_ms", format!("must be positive, found {w}")));
        }
        if let Some(m) = r.max_attempts.filter(|m| *m < 1) {
            return Err(invalid("max_attempts", format!("must be at least 1, found {m}")));
        }
    }
    Ok(())
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> Value) -> Value {
    match v {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(x) => Value::Union(1, Box::new(f(x))),
    }
}

fn opt_str(v: &Option<String>) -> Value {
    opt(v.clone(), Value::String)
}

fn rec(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// An enum value: the symbol's index (the variant's declaration index) and name.
fn enum_value(index: usize, name: &str) -> Value {
    Value::Enum(index as u32, name.to_owned())
}

fn source_value(s: EvidenceSource) -> Value {
    enum_value(s as usize, s.as_str())
}

/// The value of an [`Event`] in the current `OperationEvent` schema.
///
/// Built by hand, like the decoder: the Avro library's direct serde writer
/// cannot follow the schema's named-type references (EvidenceSource is
/// defined once and referenced again), the value writer can.
pub(super) fn event_to_value(ev: &Event) -> Value {
    let s = |x: &str| Value::String(x.to_owned());
    let body = match &ev.body {
        Body::Requested(r) => rec(vec![
            ("expected_version", opt(r.expected_version, Value::Long)),
            ("expected_fingerprint", opt_str(&r.expected_fingerprint)),
            ("idempotency_key", opt_str(&r.idempotency_key)),
            ("idempotent", Value::Boolean(r.idempotent)),
            ("destination", s(&r.destination)),
            ("confirm_within_ms", opt(r.confirm_within_ms, Value::Long)),
            ("max_attempts", opt(r.max_attempts, Value::Int)),
        ]),
        Body::Started { attempt, worker } => rec(vec![("attempt", Value::Int(*attempt)), ("worker", s(worker))]),
        Body::AttemptFailed { attempt, error_class, error_code, detail, next_attempt_at } => rec(vec![
            ("attempt", Value::Int(*attempt)),
            ("error_class", enum_value(*error_class as usize, error_class.as_str())),
            ("error_code", s(error_code)),
            ("detail", s(detail)),
            ("next_attempt_at", opt(*next_attempt_at, Value::TimestampMillis)),
        ]),
        Body::OutcomeUnknown { attempt, detail } => rec(vec![("attempt", Value::Int(*attempt)), ("detail", s(detail))]),
        Body::EffectObserved(o) => rec(vec![
            ("remote_id", opt_str(&o.remote_id)),
            ("observed_version", opt(o.observed_version, Value::Long)),
            ("observed_fingerprint", opt_str(&o.observed_fingerprint)),
            ("source", source_value(o.source)),
            ("evidence_ref", opt_str(&o.evidence_ref)),
        ]),
        Body::EffectAbsent { source, evidence_ref } => {
            rec(vec![("source", source_value(*source)), ("evidence_ref", opt_str(evidence_ref))])
        }
        Body::Compensated { actor, reason } => rec(vec![("actor", s(actor)), ("reason", s(reason))]),
        Body::Cancelled { reason } => rec(vec![("reason", s(reason))]),
        Body::ManualDecision { actor, decision, note, evidence_checked } => rec(vec![
            ("actor", s(actor)),
            ("decision", enum_value(*decision as usize, decision.as_str())),
            ("note", s(note)),
            ("evidence_checked", Value::Array(evidence_checked.iter().map(|e| s(e)).collect())),
        ]),
        Body::DeadlineReached { deadline } => rec(vec![("deadline", Value::TimestampMillis(*deadline))]),
        Body::ProbeFailed { attempt, error_class, detail } => rec(vec![
            ("attempt", Value::Int(*attempt)),
            ("error_class", enum_value(*error_class as usize, error_class.as_str())),
            ("detail", s(detail)),
        ]),
    };
    let branch = BODY_BRANCHES.iter().position(|b| *b == ev.body.name()).expect("every body is a branch") as u32;
    rec(vec![
        ("event_id", s(&ev.event_id)),
        ("operation_id", s(&ev.operation_id)),
        ("entity_id", s(&ev.entity_id)),
        ("operation_type", s(&ev.operation_type)),
        ("seq", opt(ev.seq, Value::Long)),
        ("occurred_at", Value::TimestampMillis(ev.occurred_at)),
        ("producer", s(&ev.producer)),
        ("body", Value::Union(branch, Box::new(body))),
    ])
}
