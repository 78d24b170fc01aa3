//! Interoperability with fastavro: records written by an Avro library we did
//! not write, from `schemas/` alone, decode here; and verdicts we encode
//! decode there. Needs `python3` with `fastavro` (installed by scripts/test.sh).

use std::process::Command;

use reconciler::codec::Codec;
use reconciler::core::event::{Body, Decision};
use reconciler::core::output::{Action, Escalation, Evidence, Outcome, Status, Supersession, Verdict};

fn python(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/fastavro_interop.py");
    let out = Command::new("python3").arg(script).args(args).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "fastavro side failed (is fastavro installed? scripts/test.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn fastavro_event_decodes_in_rust() {
    let dir = std::env::temp_dir().join(format!("reconciler-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("event.avro");
    python(&["encode-event", path.to_str().unwrap()]);
    let bytes = std::fs::read(&path).unwrap();
    let ev = Codec::new().decode_event(&bytes).expect("fastavro's record decodes");
    assert_eq!(ev.event_id, "py-1");
    assert_eq!(ev.occurred_at, 1_700_000_000_123);
    assert_eq!(ev.seq, None);
    match ev.body {
        Body::ManualDecision { actor, decision, evidence_checked, .. } => {
            assert_eq!(actor, "ana");
            assert_eq!(decision, Decision::Requeue);
            assert_eq!(evidence_checked, vec!["crm record", "worker log"]);
        }
        other => panic!("wrong body {other:?}"),
    }
}

#[test]
fn rust_verdict_decodes_in_fastavro() {
    let v = Verdict {
        verdict_id: "v-1".into(),
        operation_id: "op-1".into(),
        entity_id: "cust-1".into(),
        operation_type: "sync_customer".into(),
        outcome: Outcome::Ambiguous,
        action: Action::Probe,
        state: Status::AwaitingConfirmation,
        reason: "probe it".into(),
        decided_at: 1_700_000_000_456,
        trigger_event_id: "deadline:op-1:1".into(),
        evidence: Evidence {
            expected_version: Some(7),
            expected_fingerprint: None,
            observed_version: None,
            observed_fingerprint: Some("abc".into()),
            remote_ids: vec!["r1".into(), "r2".into()],
            idempotency_key: Some("k".into()),
            attempts: 2,
            requested_at: Some(1_700_000_000_000),
            last_event_at: 1_700_000_000_400,
            events_applied: 4,
            duplicates_seen: 1,
            out_of_order_seen: 0,
            trigger_partition: 3,
            trigger_offset: 99,
            manual_decision: None,
            requeues: 1,
            follow_up_at: Some(1_700_000_300_456),
            next_attempt_at: None,
            superseded_by: Some(Supersession { operation_id: "op-2".into(), expected_version: Some(8) }),
            escalation: Some(Escalation::ProbeUnanswered),
        },
    };
    let dir = std::env::temp_dir().join(format!("reconciler-interop-v-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("verdict.avro");
    std::fs::write(&path, Codec::new().encode_verdict(&v).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&python(&["decode-verdict", path.to_str().unwrap()])).unwrap();
    assert_eq!(json["outcome"], "AMBIGUOUS");
    assert_eq!(json["action"], "PROBE");
    assert_eq!(json["state"], "AWAITING_CONFIRMATION");
    assert_eq!(json["decided_at"], 1_700_000_000_456i64);
    assert_eq!(json["evidence"]["expected_version"], 7);
    assert_eq!(json["evidence"]["observed_fingerprint"], "abc");
    assert_eq!(json["evidence"]["remote_ids"], serde_json::json!(["r1", "r2"]));
    assert_eq!(json["evidence"]["manual_decision"], serde_json::Value::Null);
    assert_eq!(json["evidence"]["trigger_offset"], 99);
    // Schema version 2's evidence (SPEC §11).
    assert_eq!(json["evidence"]["requeues"], 1);
    assert_eq!(json["evidence"]["follow_up_at"], 1_700_000_300_456i64);
    assert_eq!(json["evidence"]["next_attempt_at"], serde_json::Value::Null);
    assert_eq!(json["evidence"]["superseded_by"], serde_json::json!({"operation_id": "op-2", "expected_version": 8}));
    assert_eq!(json["evidence"]["escalation"], "PROBE_UNANSWERED");
}

/// Every shipped schema has the same CRC-64-AVRO fingerprint here as in
/// fastavro (the Parsing Canonical Form agrees).
#[test]
fn fingerprints_agree_with_fastavro() {
    let out = python(&["fingerprints", concat!(env!("CARGO_MANIFEST_DIR"), "/schemas")]);
    let codec = Codec::new();
    let mut n = 0;
    for line in out.lines() {
        let (file, hex) = line.split_once(' ').unwrap();
        // fastavro prints the 8 little-endian bytes as hex.
        let bytes: Vec<u8> = (0..16).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let theirs = u64::from_le_bytes(bytes.try_into().unwrap());
        let ours =
            codec.schemas().all().find(|w| w.file == file).unwrap_or_else(|| panic!("{file} not loaded")).fingerprint;
        assert_eq!(ours, theirs, "{file}: fingerprint {ours:016x} here, {theirs:016x} in fastavro");
        n += 1;
    }
    assert_eq!(n, codec.schemas().all().count());
}
