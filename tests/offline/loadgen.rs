//! The load generator's ground truth, built by construction of each story,
//! against the in-memory core (the two are written independently: a
//! disagreement is a bug in one of them). The run through the real pipeline
//! and broker checked by `loadgen verify` is in the integration tests.

use std::collections::{BTreeMap, HashMap};

use reconciler::codec::{validate_key, Codec};
use reconciler::config::Config;
use reconciler::core::Output;
use reconciler::loadgen::destination::replay_with_answers;
use reconciler::loadgen::scenario::PROBED_DESTINATION;
use reconciler::loadgen::truth::Expected;
use reconciler::loadgen::{Faults, Generator, Options};
use reconciler::records::InputRecord;

/// Every fault at a high rate, so that a small workload holds many of each.
pub(crate) fn heavy_faults() -> Faults {
    Faults::uniform(0.045)
}

fn options(operations: u64, seed: u64, now: i64) -> Options {
    let mut o = Options::preload(operations, seed, now);
    o.faults = heavy_faults();
    o
}

#[test]
fn ground_truth_matches_the_memory_engine() {
    let now = 1_800_000_000_000;
    let mut gen = Generator::new(options(20_000, 42, now));
    let records: Vec<InputRecord> = gen.by_ref().map(|p| p.record).collect();
    let truth = gen.into_truth();
    assert_eq!(truth.stories.len(), 27, "every story occurs: {:?}", truth.stories);
    assert!(!truth.destination.is_empty(), "the probed story's destination holds effects");

    // Dead letters: what the pipeline's decode step rejects, by class.
    let codec = Codec::new();
    let mut dead: BTreeMap<String, u64> = BTreeMap::new();
    let mut events = Vec::new();
    for r in &records {
        let (key, value) = match r {
            InputRecord::Event(e) => (e.entity_id.as_bytes().to_vec(), Some(codec.encode_event(e).unwrap())),
            InputRecord::Raw { key, value, .. } => (key.clone(), value.clone()),
        };
        let decoded = value
            .as_deref()
            .ok_or(reconciler::codec::DecodeError::NullValue)
            .and_then(|v| codec.decode_event(v))
            .and_then(|e| validate_key(Some(&key), &e).map(|_| e));
        match decoded {
            Ok(e) => events.push(e),
            Err(err) => *dead.entry(err.class().to_owned()).or_default() += 1,
        }
    }
    assert_eq!(dead, truth.dead_letters_by_class);
    assert_eq!(events.len() as u64, truth.events);

    // Verdicts and anomalies: the core, with every timer due by `now` fired.
    // The probed story's PROBE commands are answered from the truth's
    // destination, as the probe worker does right after they are issued.
    let policy = Config::default().policy();
    assert!(truth.latest_due_ms < now);
    let held = HashMap::from([(PROBED_DESTINATION.to_owned(), truth.held())]);
    let (out, _) = replay_with_answers(&policy, events, now, &held);
    let mut verdicts: HashMap<String, Vec<String>> = HashMap::new();
    let mut anomalies: BTreeMap<String, u64> = truth.anomalies.keys().map(|k| (k.clone(), 0)).collect();
    for o in &out {
        match o {
            Output::Verdict(v) => {
                let timer = v.trigger_event_id.starts_with("deadline:");
                let label =
                    Expected { outcome: v.outcome, action: v.action, timer_at: timer.then_some(v.decided_at) }.label();
                verdicts.entry(v.operation_id.clone()).or_default().push(label);
            }
            Output::Anomaly(a) => *anomalies.entry(a.kind.as_str().to_owned()).or_default() += 1,
            Output::Command(_) => {}
        }
    }
    let mut wrong = Vec::new();
    for (op, expected) in &truth.verdicts {
        let got = verdicts.remove(op).unwrap_or_default();
        if &got != expected {
            wrong.push(format!("{op}: expected {expected:?}, core {got:?}"));
        }
    }
    for (op, got) in verdicts {
        wrong.push(format!("{op}: expected nothing, core {got:?}"));
    }
    assert!(wrong.is_empty(), "{} operations differ, e.g.\n{}", wrong.len(), wrong[..wrong.len().min(10)].join("\n"));
    assert_eq!(anomalies, truth.anomalies);
    assert_eq!(out.iter().filter(|o| matches!(o, Output::Verdict(_))).count() as u64, truth.verdict_count);
}

#[test]
fn same_seed_same_workload_other_seed_another() {
    let now = 1_800_000_000_000;
    let run = |seed| {
        let mut g = Generator::new(options(2_000, seed, now));
        let records: Vec<_> = g.by_ref().collect();
        (records, g.into_truth())
    };
    let (a, ta) = run(7);
    let (b, tb) = run(7);
    let (c, _) = run(8);
    assert_eq!(a, b);
    assert_eq!(ta, tb);
    assert_ne!(a, c);
}

#[test]
fn clean_workload_has_no_anomalies_and_operations_as_asked() {
    let mut o = Options::preload(5_000, 3, 1_800_000_000_000);
    o.faults = Faults::none();
    let mut g = Generator::new(o);
    let n = g.by_ref().count() as u64;
    let t = g.into_truth();
    assert_eq!(t.operations, 5_000);
    assert_eq!(t.verdicts.len(), 5_000);
    assert_eq!(t.anomaly_count(), 0);
    assert_eq!(t.dead_letters, 0);
    assert_eq!(n, t.records);
}

#[test]
fn fault_rates_are_validated() {
    let f = Faults { garbage: 1.5, ..Faults::none() };
    assert!(f.validate().unwrap_err().contains("--garbage"));
    let f = Faults { garbage: 0.6, orphan: 0.6, ..Faults::none() };
    assert!(f.validate().is_err());
}

/// SPEC §11 against the generator: a version bump supersedes the older
/// operation, a late retry moves the deadline, and unanswered requeues and
/// probes end in review at the times the truth states.
#[test]
fn follow_up_stories_carry_their_timer_times() {
    let mut o = Options::preload(4_000, 9, 1_800_000_000_000);
    o.faults = Faults { version_bump: 0.2, retry_scheduled_late: 0.2, requeue_not_picked_up: 0.2, ..Faults::none() };
    let mut g = Generator::new(o.clone());
    g.by_ref().for_each(drop);
    let t = g.into_truth();
    let w = o.confirm_within_ms;
    let labels: Vec<&Vec<String>> = t.verdicts.values().collect();
    // Never picked up: requeued now, again one window later, then review.
    assert!(labels.iter().any(|l| l.len() == 3
        && l[0] == "MISSING/REQUEUE"
        && l[1].starts_with("MISSING/REQUEUE+timer@")
        && l[2].starts_with("MISSING/MANUAL_REVIEW+timer@")));
    // Superseded: closed once, nothing after.
    assert!(labels.iter().any(|l| l.as_slice() == ["NOT_APPLICABLE/CLOSE"]));
    // A late retry: the first timer verdict comes three windows after the
    // request (the retry two windows ahead, plus its own window).
    for (op, l) in &t.verdicts {
        if let Some(first) = l.first().and_then(|s| Expected::parse(s)).and_then(|e| e.timer_at) {
            assert!(first > o.start_ms, "{op}: {l:?}");
        }
    }
    assert!(t.timer_verdicts > 0 && t.latest_due_ms >= o.start_ms + 3 * w);
}
