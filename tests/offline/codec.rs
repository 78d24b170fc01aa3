//! Codec: round trips of every record type and body, schema evolution from
//! the shipped older version, every decode error, no panics on garbage, and
//! the schema files agreeing with the Rust types.

use apache_avro::types::Value;
use apache_avro::Schema;
use proptest::prelude::*;
use reconciler::codec::{validate_key, Codec, DecodeError, SchemaKind};
use reconciler::core::event::{Body, Decision, EffectObserved, ErrorClass, Event, EvidenceSource, Requested};
use reconciler::core::output::*;

fn event(body: Body, seq: Option<i64>) -> Event {
    Event {
        event_id: "e-1".into(),
        operation_id: "op-1".into(),
        entity_id: "cust-1".into(),
        operation_type: "sync_customer".into(),
        seq,
        occurred_at: 1_700_000_000_000,
        producer: "svc".into(),
        body,
    }
}

fn all_bodies() -> Vec<Body> {
    vec![
        Body::Requested(Requested {
            expected_version: Some(7),
            expected_fingerprint: Some("sha:1".into()),
            idempotency_key: Some("k".into()),
            idempotent: true,
            destination: "crm".into(),
            confirm_within_ms: Some(1000),
            max_attempts: Some(5),
        }),
        Body::Requested(Requested { idempotent: false, destination: "crm".into(), ..Default::default() }),
        Body::Started { attempt: 1, worker: "w".into() },
        Body::AttemptFailed {
            attempt: 2,
            error_class: ErrorClass::Transient,
            error_code: "503".into(),
            detail: "busy".into(),
            next_attempt_at: Some(5),
        },
        Body::AttemptFailed {
            attempt: 2,
            error_class: ErrorClass::Permanent,
            error_code: "422".into(),
            detail: "bad".into(),
            next_attempt_at: None,
        },
        Body::OutcomeUnknown { attempt: 1, detail: "timeout".into() },
        Body::EffectObserved(EffectObserved {
            remote_id: Some("r".into()),
            observed_version: Some(7),
            observed_fingerprint: None,
            source: EvidenceSource::Receipt,
            evidence_ref: Some("rcpt".into()),
        }),
        Body::EffectAbsent { source: EvidenceSource::DestinationQuery, evidence_ref: None },
        Body::Compensated { actor: "ops".into(), reason: "refund".into() },
        Body::Cancelled { reason: "deleted".into() },
        Body::ManualDecision {
            actor: "ana".into(),
            decision: Decision::Close,
            note: "n".into(),
            evidence_checked: vec!["a".into()],
        },
        Body::DeadlineReached { deadline: 42 },
    ]
}

#[test]
fn every_body_round_trips() {
    let codec = Codec::new();
    for body in all_bodies() {
        for seq in [None, Some(3)] {
            let ev = event(body.clone(), seq);
            let bytes = codec.encode_event(&ev).unwrap();
            assert_eq!(&bytes[..2], &[0xC3, 0x01]);
            assert_eq!(codec.decode_event(&bytes).unwrap(), ev);
        }
    }
}

fn verdict() -> Verdict {
    Verdict {
        verdict_id: "v".into(),
        operation_id: "op".into(),
        entity_id: "e".into(),
        operation_type: "t".into(),
        outcome: Outcome::DuplicateEffect,
        action: Action::Compensate,
        state: Status::ManualReview,
        reason: "r".into(),
        decided_at: 9,
        trigger_event_id: "x".into(),
        evidence: Evidence {
            expected_version: None,
            expected_fingerprint: Some("f".into()),
            observed_version: Some(1),
            observed_fingerprint: None,
            remote_ids: vec!["a".into(), "b".into()],
            idempotency_key: None,
            attempts: 3,
            requested_at: None,
            last_event_at: 8,
            events_applied: 5,
            duplicates_seen: 2,
            out_of_order_seen: 1,
            trigger_partition: 4,
            trigger_offset: 77,
            manual_decision: Some(ManualDecisionRecord {
                actor: "ana".into(),
                decision: Decision::Compensate,
                note: "n".into(),
                evidence_checked: vec![],
            }),
            requeues: 2,
            follow_up_at: Some(70),
            next_attempt_at: Some(-3),
            superseded_by: Some(Supersession { operation_id: "op-2".into(), expected_version: None }),
            escalation: Some(Escalation::RequeuesExhausted),
        },
    }
}

/// A verdict written by a reconciler still on version 1 of the Verdict
/// schema (no follow-up, supersede or escalation evidence) decodes with
/// the defaults of version 2, for a downstream reader upgraded first.
#[test]
fn verdict_of_schema_version_1_decodes_with_defaults() {
    let codec = Codec::new();
    let v1 = codec.schemas().all().find(|w| w.file == "history/verdict.v1.avsc").expect("v1 shipped");
    let mut old = verdict();
    let added = ["requeues", "follow_up_at", "next_attempt_at", "superseded_by", "escalation"];
    let Value::Record(mut fields) = apache_avro::to_value(&old).unwrap() else { panic!("a record") };
    for (name, value) in fields.iter_mut() {
        if name == "evidence" {
            let Value::Record(ev) = value else { panic!("evidence is a record") };
            ev.retain(|(k, _)| !added.contains(&k.as_str()));
        }
    }
    let value = Value::Record(fields).resolve(&v1.schema).unwrap();
    let mut bytes = v1.header();
    bytes.extend(apache_avro::to_avro_datum(&v1.schema, value).unwrap());
    let decoded = codec.decode_verdict(&bytes).unwrap();
    old.evidence.requeues = 0;
    old.evidence.follow_up_at = None;
    old.evidence.next_attempt_at = None;
    old.evidence.superseded_by = None;
    old.evidence.escalation = None;
    assert_eq!(decoded, old);
}

/// An anomaly written with version 1 of the Anomaly schema (no producer,
/// no FORGED_CONTROL_EVENT) decodes with the producer's default, for a
/// reader upgraded before the topic's writers.
#[test]
fn anomaly_of_schema_version_1_decodes_with_defaults() {
    let codec = Codec::new();
    let v1 = codec.schemas().all().find(|w| w.file == "history/anomaly.v1.avsc").expect("v1 shipped");
    let a = Anomaly {
        anomaly_id: "a".into(),
        kind: AnomalyKind::LateEvent,
        operation_id: "op".into(),
        entity_id: "e".into(),
        operation_type: "t".into(),
        event_id: "ev".into(),
        seq: Some(2),
        expected_seq: Some(4),
        missing_seqs: vec![],
        detected_at: 5,
        detail: "d".into(),
        source_partition: 1,
        source_offset: 2,
        producer: None,
    };
    let Value::Record(mut fields) = apache_avro::to_value(&a).unwrap() else { panic!("a record") };
    fields.retain(|(k, _)| k != "producer");
    let value = Value::Record(fields).resolve(&v1.schema).unwrap();
    let mut bytes = v1.header();
    bytes.extend(apache_avro::to_avro_datum(&v1.schema, value).unwrap());
    assert_eq!(codec.decode_anomaly(&bytes).unwrap(), a);
    // And version 1 has no symbol for the new kind: a v1 reader must be
    // upgraded before FORGED_CONTROL_EVENT can be read (README, schemas).
    let forged = Anomaly { kind: AnomalyKind::ForgedControlEvent, producer: Some("svc".into()), ..a };
    let Value::Record(mut fields) = apache_avro::to_value(&forged).unwrap() else { panic!("a record") };
    fields.retain(|(k, _)| k != "producer");
    assert!(Value::Record(fields).resolve(&v1.schema).is_err(), "v1 cannot hold the new kind");
}

#[test]
fn outputs_round_trip() {
    let codec = Codec::new();
    let v = verdict();
    assert_eq!(codec.decode_verdict(&codec.encode_verdict(&v).unwrap()).unwrap(), v);
    for kind in AnomalyKind::ALL {
        let a = Anomaly {
            anomaly_id: "a".into(),
            kind,
            operation_id: "op".into(),
            entity_id: "e".into(),
            operation_type: "t".into(),
            event_id: "ev".into(),
            seq: Some(2),
            expected_seq: None,
            missing_seqs: vec![2, 3],
            detected_at: 5,
            detail: "d".into(),
            source_partition: 1,
            source_offset: 2,
            producer: (kind == AnomalyKind::ForgedControlEvent).then(|| "svc".into()),
        };
        assert_eq!(codec.decode_anomaly(&codec.encode_anomaly(&a).unwrap()).unwrap(), a);
    }
    let c = RepairCommand {
        command_id: "c".into(),
        verdict_id: "v".into(),
        operation_id: "op".into(),
        entity_id: "e".into(),
        operation_type: "t".into(),
        action: RepairAction::Probe,
        idempotency_key: Some("k".into()),
        destination: "crm".into(),
        expected_version: Some(1),
        expected_fingerprint: None,
        issued_at: 3,
    };
    assert_eq!(codec.decode_command(&codec.encode_command(&c).unwrap()).unwrap(), c);
}

/// Symbols of a named enum anywhere inside a schema's JSON.
fn symbols(file: &str, name: &str) -> Vec<String> {
    fn find(v: &serde_json::Value, name: &str) -> Option<Vec<String>> {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("enum")
                    && m.get("name").and_then(|n| n.as_str()) == Some(name)
                {
                    return Some(
                        m["symbols"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect(),
                    );
                }
                m.values().find_map(|v| find(v, name))
            }
            serde_json::Value::Array(a) => a.iter().find_map(|v| find(v, name)),
            _ => None,
        }
    }
    let path = format!("{}/schemas/{file}", env!("CARGO_MANIFEST_DIR"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    find(&json, name).unwrap_or_else(|| panic!("enum {name} not in {file}"))
}

#[test]
fn schema_enums_match_the_rust_types() {
    let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
    assert_eq!(symbols("verdict.avsc", "Outcome"), names(Outcome::ALL.map(Outcome::as_str).to_vec()));
    assert_eq!(symbols("verdict.avsc", "Action"), names(Action::ALL.map(Action::as_str).to_vec()));
    assert_eq!(symbols("verdict.avsc", "OperationState"), names(Status::ALL.map(Status::as_str).to_vec()));
    assert_eq!(symbols("anomaly.avsc", "AnomalyKind"), names(AnomalyKind::ALL.map(AnomalyKind::as_str).to_vec()));
    assert_eq!(symbols("operation_event.avsc", "Decision"), names(vec!["CONFIRM", "REQUEUE", "COMPENSATE", "CLOSE"]));
}

#[test]
fn every_shipped_schema_file_is_loaded() {
    let dir = format!("{}/schemas", env!("CARGO_MANIFEST_DIR"));
    let mut on_disk = 0;
    for entry in walk(std::path::Path::new(&dir)) {
        if entry.extension().is_some_and(|e| e == "avsc") {
            on_disk += 1;
            let text = std::fs::read_to_string(&entry).unwrap();
            let schema = Schema::parse_str(&text).unwrap();
            let fp = reconciler::codec::SchemaSet::builtin()
                .all()
                .find(|w| w.schema.canonical_form() == schema.canonical_form())
                .map(|w| w.file.clone());
            assert!(fp.is_some(), "{entry:?} is not in the codec's schema set");
        }
    }
    assert_eq!(on_disk, Codec::new().schemas().all().count());
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A record written by a producer still on version 1 of OperationEvent
/// (no `max_attempts`, no `next_attempt_at`) decodes through resolution.
#[test]
fn older_writer_version_decodes() {
    let codec = Codec::new();
    let v1 = codec.schemas().all().find(|w| w.file == "history/operation_event.v1.avsc").expect("v1 shipped");
    let s = |x: &str| Value::String(x.into());
    let null = || Value::Union(0, Box::new(Value::Null));
    let common = |body: Value| {
        Value::Record(vec![
            ("event_id".into(), s("old-1")),
            ("operation_id".into(), s("op-1")),
            ("entity_id".into(), s("cust-1")),
            ("operation_type".into(), s("sync_customer")),
            ("seq".into(), Value::Union(1, Box::new(Value::Long(1)))),
            ("occurred_at".into(), Value::TimestampMillis(5)),
            ("producer".into(), s("legacy")),
            ("body".into(), body),
        ])
    };
    let requested = Value::Union(
        0,
        Box::new(Value::Record(vec![
            ("expected_version".into(), Value::Union(1, Box::new(Value::Long(7)))),
            ("expected_fingerprint".into(), null()),
            ("idempotency_key".into(), null()),
            ("idempotent".into(), Value::Boolean(true)),
            ("destination".into(), s("crm")),
            ("confirm_within_ms".into(), null()),
        ])),
    );
    let failed = Value::Union(
        2,
        Box::new(Value::Record(vec![
            ("attempt".into(), Value::Int(1)),
            ("error_class".into(), Value::Enum(0, "TRANSIENT".into())),
            ("error_code".into(), s("503")),
            ("detail".into(), s("busy")),
        ])),
    );
    for (body, check) in [
        (
            requested,
            Box::new(
                |b: &Body| matches!(b, Body::Requested(r) if r.expected_version == Some(7) && r.max_attempts.is_none()),
            ) as Box<dyn Fn(&Body) -> bool>,
        ),
        (failed, Box::new(|b: &Body| matches!(b, Body::AttemptFailed { next_attempt_at: None, attempt: 1, .. }))),
    ] {
        let mut bytes = vec![0xC3, 0x01];
        bytes.extend_from_slice(&v1.fingerprint.to_le_bytes());
        bytes.extend(apache_avro::to_avro_datum(&v1.schema, common(body)).unwrap());
        let ev = codec.decode_event(&bytes).expect("v1 record decodes");
        assert!(check(&ev.body), "{:?}", ev.body);
        assert_eq!(ev.producer, "legacy");
    }
}

#[test]
fn decode_errors_are_typed() {
    let codec = Codec::new();
    let good = codec.encode_event(&event(Body::Started { attempt: 1, worker: "w".into() }, Some(2))).unwrap();

    assert!(matches!(codec.decode_event(&[]), Err(DecodeError::TruncatedHeader { len: 0, .. })));
    assert!(matches!(codec.decode_event(b"{\"json\": true}"), Err(DecodeError::BadMagic { .. })));
    assert!(matches!(codec.decode_event(&good[..6]), Err(DecodeError::TruncatedHeader { len: 6, .. })));

    let mut unknown = good.clone();
    unknown[2] ^= 0xFF;
    assert!(matches!(codec.decode_event(&unknown), Err(DecodeError::UnknownFingerprint { .. })));

    let truncated = &good[..good.len() - 3];
    let err = codec.decode_event(truncated).unwrap_err();
    assert_eq!(err.class(), "truncated", "{err}");

    let mut trailing = good.clone();
    trailing.push(0);
    assert!(matches!(codec.decode_event(&trailing), Err(DecodeError::TrailingBytes { trailing: 1, .. })));

    let verdict_bytes = codec.encode_verdict(&verdict()).unwrap();
    assert!(matches!(codec.decode_event(&verdict_bytes), Err(DecodeError::WrongSchema { .. })));
    assert_eq!(
        codec
            .schemas()
            .writer_for(&verdict_bytes, SchemaKind::Verdict, reconciler::codec::InputFraming::Both)
            .unwrap()
            .0
            .file,
        "verdict.avsc"
    );

    let mut empty_id = event(Body::Started { attempt: 1, worker: "w".into() }, Some(2));
    empty_id.event_id = " ".into();
    let err = codec.decode_event(&codec.encode_event(&empty_id).unwrap()).unwrap_err();
    assert_eq!(err, DecodeError::InvalidField { field: "event_id", reason: "must not be empty".into() });

    let zero_seq = event(Body::Started { attempt: 1, worker: "w".into() }, Some(0));
    let err = codec.decode_event(&codec.encode_event(&zero_seq).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::InvalidField { field: "seq", .. }), "{err}");

    let zero_window = event(
        Body::Requested(Requested { confirm_within_ms: Some(0), destination: "crm".into(), ..Default::default() }),
        Some(1),
    );
    let err = codec.decode_event(&codec.encode_event(&zero_window).unwrap()).unwrap_err();
    assert!(matches!(err, DecodeError::InvalidField { field: "confirm_within_ms", .. }), "{err}");

    let ev = codec.decode_event(&good).unwrap();
    assert!(validate_key(Some(b"cust-1"), &ev).is_ok());
    assert!(matches!(validate_key(Some(b"cust-2"), &ev), Err(DecodeError::KeyMismatch { .. })));
    assert!(matches!(validate_key(None, &ev), Err(DecodeError::KeyMismatch { .. })));
}

/// Strings take two paths in the direct decoder (ASCII checked cheaply,
/// anything else validated in full): non-ASCII text reads back as written,
/// and bytes that are not UTF-8 are refused with the field named, whether
/// the bad byte is the first or follows valid multi-byte characters.
#[test]
fn strings_are_utf8_checked_on_both_paths() {
    let codec = Codec::new();
    let worker = "wörker-é€";
    let ev = event(Body::Started { attempt: 1, worker: worker.into() }, Some(2));
    let good = codec.encode_event(&ev).unwrap();
    assert_eq!(codec.decode_event(&good).unwrap(), ev);
    let at = good.windows(worker.len()).position(|w| w == worker.as_bytes()).expect("the worker's bytes");
    for (offset, byte) in [(0, 0xFF), (1, 0x80), (worker.len() - 1, 0xC3)] {
        let mut bad = good.clone();
        bad[at + offset] = byte;
        let err = codec.decode_event(&bad).unwrap_err();
        assert_eq!(err.class(), "malformed", "{err}");
        assert!(err.to_string().contains("worker"), "{err}");
        assert!(codec.decode_event_generic(&bad).is_err());
    }
}

/// The DLQ's error message is read by people: no `Some(..)` from Rust.
#[test]
fn key_mismatch_message_names_the_key_as_text() {
    let e = DecodeError::KeyMismatch { key: Some("not-cust-1".into()), entity_id: "cust-1".into() };
    assert_eq!(
        e.to_string(),
        "record key \"not-cust-1\" does not equal entity_id \"cust-1\": producers must key by entity_id"
    );
    let e = DecodeError::KeyMismatch { key: None, entity_id: "cust-1".into() };
    assert!(e.to_string().starts_with("record key (none) does not equal"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random bytes never panic the decoder; they yield a typed error.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Codec::new().decode_event(&bytes);
    }

    /// Random bodies behind a valid header never panic either.
    #[test]
    fn random_body_after_valid_header_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let codec = Codec::new();
        let mut bytes = vec![0xC3, 0x01];
        bytes.extend_from_slice(&codec.schemas().current(SchemaKind::OperationEvent).fingerprint.to_le_bytes());
        bytes.extend(body);
        if let Err(e) = codec.decode_event(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Every prefix of a valid record fails cleanly.
    #[test]
    fn truncations_fail_cleanly(cut in 0usize..60) {
        let codec = Codec::new();
        let good = codec.encode_event(&event(Body::Cancelled { reason: "gone away for good".into() }, Some(4))).unwrap();
        let cut = cut.min(good.len() - 1);
        prop_assert!(codec.decode_event(&good[..cut]).is_err());
    }
}

/// The direct event codec implements exactly the current schema: if
/// operation_event.avsc changes, this fails until binary.rs follows.
#[test]
fn direct_codec_is_written_for_the_current_schema() {
    assert_eq!(
        Codec::new().schemas().current(SchemaKind::OperationEvent).fingerprint,
        Codec::direct_event_fingerprint(),
        "schemas/operation_event.avsc changed: update src/codec/binary.rs and its FINGERPRINT"
    );
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9 ._-]{1,12}", "\\PC{0,20}"]
}

fn arb_body() -> impl Strategy<Value = Body> {
    let src = prop_oneof![
        Just(EvidenceSource::WorkerResponse),
        Just(EvidenceSource::DestinationQuery),
        Just(EvidenceSource::Receipt),
        Just(EvidenceSource::ResultFile)
    ];
    prop_oneof![
        (
            any::<Option<i64>>(),
            proptest::option::of(arb_string()),
            proptest::option::of(arb_string()),
            any::<bool>(),
            arb_string(),
            proptest::option::of(1..i64::MAX),
            proptest::option::of(1..i32::MAX)
        )
            .prop_map(|(v, f, k, i, d, c, m)| Body::Requested(Requested {
                expected_version: v,
                expected_fingerprint: f,
                idempotency_key: k,
                idempotent: i,
                destination: d,
                confirm_within_ms: c,
                max_attempts: m
            })),
        (any::<i32>(), arb_string()).prop_map(|(attempt, worker)| Body::Started { attempt, worker }),
        (any::<i32>(), any::<bool>(), arb_string(), arb_string(), any::<Option<i64>>()).prop_map(|(a, t, c, d, n)| {
            Body::AttemptFailed {
                attempt: a,
                error_class: if t { ErrorClass::Transient } else { ErrorClass::Permanent },
                error_code: c,
                detail: d,
                next_attempt_at: n,
            }
        }),
        (any::<i32>(), arb_string()).prop_map(|(attempt, detail)| Body::OutcomeUnknown { attempt, detail }),
        (
            proptest::option::of(arb_string()),
            any::<Option<i64>>(),
            proptest::option::of(arb_string()),
            src.clone(),
            proptest::option::of(arb_string())
        )
            .prop_map(|(r, v, f, s, e)| Body::EffectObserved(EffectObserved {
                remote_id: r,
                observed_version: v,
                observed_fingerprint: f,
                source: s,
                evidence_ref: e
            })),
        (src, proptest::option::of(arb_string()))
            .prop_map(|(source, evidence_ref)| Body::EffectAbsent { source, evidence_ref }),
        (arb_string(), arb_string()).prop_map(|(actor, reason)| Body::Compensated { actor, reason }),
        arb_string().prop_map(|reason| Body::Cancelled { reason }),
        (arb_string(), 0..4usize, arb_string(), proptest::collection::vec(arb_string(), 0..4)).prop_map(
            |(actor, d, note, evidence_checked)| {
                Body::ManualDecision {
                    actor,
                    decision: [Decision::Confirm, Decision::Requeue, Decision::Compensate, Decision::Close][d],
                    note,
                    evidence_checked,
                }
            }
        ),
        any::<i64>().prop_map(|deadline| Body::DeadlineReached { deadline }),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    (
        "[a-z0-9-]{1,10}",
        "[a-z0-9-]{1,10}",
        "[a-z0-9-]{1,10}",
        "[a-z_]{1,10}",
        proptest::option::of(1i64..i64::MAX),
        any::<i64>(),
        arb_string(),
        arb_body(),
    )
        .prop_map(|(e, o, n, t, seq, at, p, body)| Event {
            event_id: e,
            operation_id: o,
            entity_id: n,
            operation_type: t,
            seq,
            occurred_at: at,
            producer: p,
            body,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The direct codec and apache-avro's generic path write the same bytes
    /// and read them back to the same event.
    #[test]
    fn direct_codec_agrees_with_the_generic_path(ev in arb_event()) {
        let codec = Codec::new();
        let fast = codec.encode_event(&ev).unwrap();
        let generic = codec.encode_event_generic(&ev).unwrap();
        prop_assert_eq!(&fast, &generic);
        prop_assert_eq!(codec.decode_event(&fast).unwrap(), ev.clone());
        prop_assert_eq!(codec.decode_event_generic(&fast).unwrap(), ev);
    }

    /// On every truncation and every corrupted byte the direct decoder is
    /// at least as strict as the generic one, agrees with it whenever it
    /// accepts, and never panics. (Stricter, not equal: apache-avro reads an
    /// end of input where a union index should be as the union's first
    /// branch, so a record cut inside a trailing nullable field decodes there,
    /// with that field silently null; found by this test. The direct
    /// decoder calls it truncated.)
    #[test]
    fn direct_decoder_fails_where_the_generic_one_does(ev in arb_event(), cut in any::<proptest::sample::Index>(), flip in any::<proptest::sample::Index>(), byte in any::<u8>()) {
        let codec = Codec::new();
        let good = codec.encode_event(&ev).unwrap();
        let cut = 10 + cut.index(good.len() - 10);
        let a = codec.decode_event(&good[..cut]);
        prop_assert!(a.is_err(), "a truncated record decoded: {:?}", a);
        if let Err(e) = &a {
            prop_assert_eq!(e.class(), "truncated", "{}", e);
        }
        let mut bad = good.clone();
        let i = 10 + flip.index(good.len() - 10);
        bad[i] = byte;
        let (a, b) = (codec.decode_event(&bad), codec.decode_event_generic(&bad));
        if let Ok(fast) = &a {
            prop_assert_eq!(Some(fast), b.as_ref().ok(), "generic {:?}", b);
        }
        if b.is_err() {
            prop_assert!(a.is_err(), "generic refused {:?}, direct accepted {:?}", b, a);
        }
    }
}

/// The direct output writers implement exactly the current schemas: if an
/// output's .avsc changes, this fails until codec/outputs.rs follows.
#[test]
fn direct_output_writers_are_written_for_the_current_schemas() {
    let codec = Codec::new();
    let changed: Vec<String> = Codec::direct_output_fingerprints()
        .into_iter()
        .filter(|(kind, fingerprint)| codec.schemas().current(*kind).fingerprint != *fingerprint)
        .map(|(kind, _)| format!("{} is now {:#018x}", kind.full_name(), codec.schemas().current(kind).fingerprint))
        .collect();
    assert!(
        changed.is_empty(),
        "output schemas changed, update src/codec/outputs.rs and its fingerprints: {changed:?}"
    );
}

fn pick<T: Copy + std::fmt::Debug + 'static>(all: &'static [T]) -> impl Strategy<Value = T> {
    proptest::sample::select(all)
}

fn arb_strings() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(arb_string(), 0..4)
}

fn arb_evidence() -> impl Strategy<Value = Evidence> {
    let manual = proptest::option::of((arb_string(), pick(&Decision::ALL), arb_string(), arb_strings()).prop_map(
        |(actor, decision, note, evidence_checked)| ManualDecisionRecord { actor, decision, note, evidence_checked },
    ));
    let superseded = proptest::option::of(
        (arb_string(), any::<Option<i64>>())
            .prop_map(|(operation_id, expected_version)| Supersession { operation_id, expected_version }),
    );
    (
        (
            any::<Option<i64>>(),
            proptest::option::of(arb_string()),
            any::<Option<i64>>(),
            proptest::option::of(arb_string()),
            arb_strings(),
            proptest::option::of(arb_string()),
            any::<i32>(),
            any::<Option<i64>>(),
        ),
        (any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>(), any::<i32>(), any::<i64>()),
        (manual, any::<i32>(), any::<Option<i64>>(), any::<Option<i64>>(), superseded),
        proptest::option::of(pick(&Escalation::ALL)),
    )
        .prop_map(
            |(
                (ev, ef, ov, of, ids, key, attempts, req),
                (last, applied, dups, ooo, tp, to),
                (m, rq, fu, na, sup),
                esc,
            )| {
                Evidence {
                    expected_version: ev,
                    expected_fingerprint: ef,
                    observed_version: ov,
                    observed_fingerprint: of,
                    remote_ids: ids,
                    idempotency_key: key,
                    attempts,
                    requested_at: req,
                    last_event_at: last,
                    events_applied: applied,
                    duplicates_seen: dups,
                    out_of_order_seen: ooo,
                    trigger_partition: tp,
                    trigger_offset: to,
                    manual_decision: m,
                    requeues: rq,
                    follow_up_at: fu,
                    next_attempt_at: na,
                    superseded_by: sup,
                    escalation: esc,
                }
            },
        )
}

fn arb_verdict() -> impl Strategy<Value = Verdict> {
    (
        (arb_string(), arb_string(), arb_string(), arb_string()),
        (pick(&Outcome::ALL), pick(&Action::ALL), pick(&Status::ALL)),
        (arb_string(), any::<i64>(), arb_string()),
        arb_evidence(),
    )
        .prop_map(|((id, op, ent, ty), (outcome, action, state), (reason, at, trigger), evidence)| Verdict {
            verdict_id: id,
            operation_id: op,
            entity_id: ent,
            operation_type: ty,
            outcome,
            action,
            state,
            reason: reason.into(),
            decided_at: at,
            trigger_event_id: trigger,
            evidence,
        })
}

fn arb_anomaly() -> impl Strategy<Value = Anomaly> {
    (
        (arb_string(), pick(&AnomalyKind::ALL), arb_string(), arb_string(), arb_string(), arb_string()),
        (any::<Option<i64>>(), any::<Option<i64>>(), proptest::collection::vec(any::<i64>(), 0..5), any::<i64>()),
        (arb_string(), any::<i32>(), any::<i64>(), proptest::option::of(arb_string())),
    )
        .prop_map(|((id, kind, op, ent, ty, ev), (seq, exp, missing, at), (detail, p, o, producer))| Anomaly {
            anomaly_id: id,
            kind,
            operation_id: op,
            entity_id: ent,
            operation_type: ty,
            event_id: ev,
            seq,
            expected_seq: exp,
            missing_seqs: missing,
            detected_at: at,
            detail,
            source_partition: p,
            source_offset: o,
            producer,
        })
}

fn arb_command() -> impl Strategy<Value = RepairCommand> {
    (
        (arb_string(), arb_string(), arb_string(), arb_string(), arb_string()),
        (pick(&RepairAction::ALL), proptest::option::of(arb_string()), arb_string()),
        (any::<Option<i64>>(), proptest::option::of(arb_string()), any::<i64>()),
    )
        .prop_map(|((id, v, op, ent, ty), (action, key, dest), (ver, fp, at))| RepairCommand {
            command_id: id,
            verdict_id: v,
            operation_id: op,
            entity_id: ent,
            operation_type: ty,
            action,
            idempotency_key: key,
            destination: dest,
            expected_version: ver,
            expected_fingerprint: fp,
            issued_at: at,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The direct output writers and apache-avro's schema-aware serializer
    /// write the same bytes, which read back to the same output.
    #[test]
    fn direct_verdict_writer_agrees_with_the_generic_path(v in arb_verdict()) {
        let codec = Codec::new();
        let fast = codec.encode_verdict(&v).unwrap();
        prop_assert_eq!(&fast, &codec.encode_verdict_generic(&v).unwrap());
        prop_assert_eq!(codec.decode_verdict(&fast).unwrap(), v);
    }

    #[test]
    fn direct_anomaly_writer_agrees_with_the_generic_path(a in arb_anomaly()) {
        let codec = Codec::new();
        let fast = codec.encode_anomaly(&a).unwrap();
        prop_assert_eq!(&fast, &codec.encode_anomaly_generic(&a).unwrap());
        prop_assert_eq!(codec.decode_anomaly(&fast).unwrap(), a);
    }

    #[test]
    fn direct_command_writer_agrees_with_the_generic_path(c in arb_command()) {
        let codec = Codec::new();
        let fast = codec.encode_command(&c).unwrap();
        prop_assert_eq!(&fast, &codec.encode_command_generic(&c).unwrap());
        prop_assert_eq!(codec.decode_command(&fast).unwrap(), c);
    }
}

/// The Confluent framing of `body` (a single-object record's body) under
/// registry id `id`.
fn confluent(id: u32, single: &[u8]) -> Vec<u8> {
    let mut v = reconciler::codec::framing::confluent_header(id).to_vec();
    v.extend_from_slice(&single[reconciler::codec::HEADER_LEN..]);
    v
}

/// `operation_event.avsc` changed by `edit` (its top-level JSON).
fn event_schema_with(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut json: serde_json::Value = serde_json::from_str(SchemaKind::OperationEvent.current_text()).unwrap();
    edit(&mut json);
    json.to_string()
}

#[test]
fn a_confluent_record_of_a_registry_schema_decodes_like_its_single_object_twin() {
    use reconciler::codec::{InputFraming, Learned};
    let e = event(Body::Started { attempt: 2, worker: "w-9".into() }, Some(2));
    let single = Codec::new().encode_event(&e).unwrap();
    let framed = confluent(7, &single);
    let codec = Codec::new().reading(InputFraming::Confluent);
    // Not fetched yet: no guess.
    assert!(matches!(codec.decode_event(&framed), Err(DecodeError::UnknownSchemaId { id: 7, .. })));
    // The registry's copy of the current schema (minified, as registries
    // answer) is the shipped schema itself.
    let minified =
        serde_json::from_str::<serde_json::Value>(SchemaKind::OperationEvent.current_text()).unwrap().to_string();
    assert!(matches!(codec.schemas().learn(7, Ok(&minified)), Learned::Shipped(_)));
    assert_eq!(codec.decode_event(&framed).unwrap(), e);
    // Only what the topic is read in.
    let e1 = codec.decode_event(&single).unwrap_err();
    assert_eq!(e1.class(), "bad_magic");
    assert!(e1.to_string().contains("expected 00 (Confluent schema-registry framing), found C3 01"), "{e1}");
    let e2 = Codec::new().decode_event(&framed).unwrap_err();
    assert!(e2.to_string().contains("expected C3 01 (Avro single-object encoding), found 00 00"), "{e2}");
    let both = Codec::new().reading(InputFraming::Both);
    both.schemas().learn(7, Ok(&minified));
    assert_eq!(both.decode_event(&single).unwrap(), both.decode_event(&framed).unwrap());
    assert!(matches!(codec.decode_event(&framed[..3]), Err(DecodeError::TruncatedHeader { len: 3, needs: 5, .. })));
}

#[test]
fn a_newer_compatible_schema_resolves_and_an_incompatible_or_missing_one_is_a_typed_error() {
    use reconciler::codec::{InputFraming, Learned};
    let e = event(Body::Cancelled { reason: "gone".into() }, Some(3));
    let single = Codec::new().encode_event(&e).unwrap();
    let codec = Codec::new().reading(InputFraming::Confluent);
    // A field added at the end with a default: the body gains its value
    // (union branch 0, null: one zero byte).
    let newer = event_schema_with(|s| {
        s["fields"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"name": "trace_id", "type": ["null", "string"], "default": null}))
    });
    assert!(matches!(codec.schemas().learn(8, Ok(&newer)), Learned::Resolvable(_)));
    let mut framed = confluent(8, &single);
    framed.push(0);
    assert_eq!(codec.decode_event(&framed).unwrap(), e);
    // `producer` as a long cannot be read as the reconciler's string.
    let incompatible = event_schema_with(|s| {
        for f in s["fields"].as_array_mut().unwrap() {
            if f["name"] == "producer" {
                f["type"] = "long".into();
            }
        }
    });
    assert!(matches!(codec.schemas().learn(9, Ok(&incompatible)), Learned::Unusable(_)));
    let err = codec.decode_event(&confluent(9, &single)).unwrap_err();
    assert_eq!(err.class(), "incompatible_schema");
    assert!(err.to_string().contains("schema id 9 cannot be read as reconciler.v1.OperationEvent"), "{err}");
    // A verdict's schema under the input's id: the wrong record type.
    codec.schemas().learn(10, Ok(SchemaKind::Verdict.current_text()));
    assert!(matches!(codec.decode_event(&confluent(10, &single)), Err(DecodeError::WrongSchema { .. })));
    // The registry has no such id.
    codec.schemas().learn(11, Err("the registry has none (40403: Schema 11 not found.)".into()));
    let err = codec.decode_event(&confluent(11, &single)).unwrap_err();
    assert_eq!(err.class(), "unknown_schema_id");
    assert!(err.to_string().contains("Schema 11 not found"), "{err}");
}

#[test]
fn outputs_written_confluent_carry_their_registry_id_and_read_back() {
    let codec = Codec::new().writing_confluent(SchemaKind::Verdict, 0x0102_0304);
    let v = verdict();
    let bytes = codec.encode_verdict(&v).unwrap();
    assert_eq!(&bytes[..5], &[0, 1, 2, 3, 4]);
    let single = Codec::new().encode_verdict(&v).unwrap();
    assert_eq!(&bytes[5..], &single[reconciler::codec::HEADER_LEN..], "the same Avro body");
    assert_eq!(codec.decode_verdict(&bytes).unwrap(), v);
    // Kinds not registered are still single-object encoded.
    let other = Codec::new().writing_confluent(SchemaKind::Anomaly, 5);
    assert_eq!(&other.encode_verdict(&v).unwrap()[..2], &[0xC3, 0x01]);
}
