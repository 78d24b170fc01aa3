//! Golden scenarios: `tests/golden/*.json` hold input events (and timer
//! firings) with the exact verdicts, anomalies, commands and final states
//! they must produce. One file per behaviour; the file's `description` says
//! what it guards. Each scenario also runs twice to check the outputs are
//! byte-identical (determinism).

use std::collections::BTreeMap;
use std::path::Path;

use reconciler::core::event::{Body, Event, SourcePos};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{Output, Policy, TypePolicy};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Scenario {
    #[allow(dead_code)]
    description: String,
    #[serde(default)]
    policy: Value,
    steps: Vec<Step>,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)]
enum Step {
    Event { event: GoldenEvent },
    Timers { timers_until: i64 },
}

#[derive(Deserialize, Clone)]
struct GoldenEvent {
    id: String,
    op: String,
    entity: String,
    #[serde(rename = "type")]
    operation_type: String,
    #[serde(default)]
    seq: Option<i64>,
    at: i64,
    body: Body,
}

#[derive(Deserialize)]
struct Expect {
    verdicts: Vec<BTreeMap<String, Value>>,
    anomalies: Vec<BTreeMap<String, Value>>,
    #[serde(default)]
    commands: Vec<BTreeMap<String, Value>>,
    states: BTreeMap<String, Option<String>>,
}

fn policy(v: &Value) -> Policy {
    let mut p = Policy::default();
    if let Some(act) = v.get("act").and_then(Value::as_bool) {
        p.act = act;
    }
    if let Some(r) = v.get("retention_ms").and_then(Value::as_i64) {
        p.retention_ms = r;
    }
    if let Some(f) = v.get("follow_up_ms").and_then(Value::as_i64) {
        p.follow_up_ms = Some(f);
    }
    if let Some(n) = v.get("max_requeues").and_then(Value::as_u64) {
        p.max_requeues = n as u32;
    }
    if let Some(types) = v.get("types").and_then(Value::as_object) {
        for (name, t) in types {
            p.types.insert(
                name.clone(),
                TypePolicy {
                    confirm_within_ms: t.get("confirm_within_ms").and_then(Value::as_i64),
                    max_attempts: t.get("max_attempts").and_then(Value::as_i64).map(|n| n as i32),
                    follow_up_ms: t.get("follow_up_ms").and_then(Value::as_i64),
                    max_requeues: t.get("max_requeues").and_then(Value::as_u64).map(|n| n as u32),
                },
            );
        }
    }
    p
}

/// Runs a scenario; returns the outputs and the final engine.
fn run(s: &Scenario, policy: &Policy) -> (Vec<Output>, MemoryEngine) {
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    let mut offset = 0;
    let mut next_pos = || {
        offset += 1;
        SourcePos { partition: 0, offset }
    };
    for step in &s.steps {
        match step {
            Step::Event { event: g } => {
                let ev = Event {
                    event_id: g.id.clone(),
                    operation_id: g.op.clone(),
                    entity_id: g.entity.clone(),
                    operation_type: g.operation_type.clone(),
                    seq: g.seq,
                    occurred_at: g.at,
                    producer: "golden".into(),
                    body: g.body.clone(),
                };
                engine.process(policy, ev, next_pos(), &mut out);
            }
            Step::Timers { timers_until } => engine.run_timers(policy, *timers_until, &mut next_pos, &mut out),
        }
    }
    (out, engine)
}

/// Every expected key must equal the output's field of that name (with a
/// few derived keys, and `evidence.NAME` for a field of the evidence), in
/// order, with nothing extra. `reason_contains` / `detail_contains` check
/// part of the text.
fn check(name: &str, what: &str, actual: &[Value], expected: &[BTreeMap<String, Value>]) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{name}: expected {} {what}, got {}:\n{}",
        expected.len(),
        actual.len(),
        serde_json::to_string_pretty(actual).unwrap()
    );
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        for (k, want) in e {
            let got = match k.as_str() {
                "duplicates_seen" | "out_of_order_seen" => a["evidence"][k].clone(),
                "manual_actor" => a["evidence"]["manual_decision"]["actor"].clone(),
                "reason_contains" | "detail_contains" => {
                    let field = k.trim_end_matches("_contains");
                    let text = a[field].as_str().unwrap_or_default();
                    assert!(text.contains(want.as_str().unwrap()), "{name}: {what}[{i}] {field} {text:?} lacks {want}");
                    continue;
                }
                _ => match k.strip_prefix("evidence.") {
                    Some(field) => a["evidence"][field].clone(),
                    None => a[k].clone(),
                },
            };
            assert_eq!(&got, want, "{name}: {what}[{i}].{k}\n{}", serde_json::to_string_pretty(a).unwrap());
        }
    }
}

/// Runs the scenario in `file`; panics with what differs.
fn scenario(file: &Path) {
    let name = file.file_stem().unwrap().to_string_lossy().into_owned();
    let s: Scenario =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let policy = policy(&s.policy);
    let (out, engine) = run(&s, &policy);
    let (again, _) = run(&s, &policy);
    assert_eq!(out, again, "{name}: two runs over the same input differ");

    let pick = |f: fn(&Output) -> Option<Value>| out.iter().filter_map(f).collect::<Vec<_>>();
    let verdicts = pick(|o| match o {
        Output::Verdict(v) => Some(serde_json::to_value(v).unwrap()),
        _ => None,
    });
    let anomalies = pick(|o| match o {
        Output::Anomaly(a) => Some(serde_json::to_value(a).unwrap()),
        _ => None,
    });
    let commands = pick(|o| match o {
        Output::Command(c) => Some(serde_json::to_value(c).unwrap()),
        _ => None,
    });
    check(&name, "verdicts", &verdicts, &s.expect.verdicts);
    check(&name, "anomalies", &anomalies, &s.expect.anomalies);
    check(&name, "commands", &commands, &s.expect.commands);
    for (op, want) in &s.expect.states {
        let got = engine.ops.get(op).map(|o| o.status.as_str().to_owned());
        assert_eq!(&got, want, "{name}: final state of {op}");
    }
}

/// Every scenario, each reported on its own: one failing scenario does not
/// hide the others.
#[test]
fn golden_scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 40, "expected the golden scenarios in {dir:?}");
    let failed: Vec<String> = files
        .iter()
        .filter(|f| std::panic::catch_unwind(|| scenario(f)).is_err())
        .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(failed.is_empty(), "{} of {} golden scenarios fail: {failed:?}", failed.len(), files.len());
}
