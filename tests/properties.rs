//! Property tests over generated valid lifecycles (issue: the core):
//! (a) delivering each event 1–3 times gives the same final state and the
//!     same verdicts as once (anomalies and their counters aside);
//! (b) any arrival order within the reorder window gives the same final
//!     state and verdicts;
//! (c) the same input applied twice from empty state gives byte-identical
//!     encoded outputs.

use proptest::prelude::*;
use reconciler::codec::Codec;
use reconciler::core::event::{Body, EffectObserved, ErrorClass, Event, EvidenceSource, Requested};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{OperationState, Output, Policy, Verdict};

const BASE: i64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Path {
    WorkerConfirms { matches: bool },
    UnknownThenQueryFinds { matches: bool },
    UnknownThenQueryAbsent,
    RetryThenConfirms,
    PermanentFailure,
    Cancelled,
    UnknownThenSilence,
    NeverStarted,
}

fn path() -> impl Strategy<Value = Path> {
    prop_oneof![
        any::<bool>().prop_map(|matches| Path::WorkerConfirms { matches }),
        any::<bool>().prop_map(|matches| Path::UnknownThenQueryFinds { matches }),
        Just(Path::UnknownThenQueryAbsent),
        Just(Path::RetryThenConfirms),
        Just(Path::PermanentFailure),
        Just(Path::Cancelled),
        Just(Path::UnknownThenSilence),
        Just(Path::NeverStarted),
    ]
}

/// One operation's events, all with a seq, spaced 100 ms apart (well inside
/// the 30 s reorder window).
fn lifecycle(op: usize, path: Path, idempotent: bool, with_key: bool) -> Vec<Event> {
    let op_id = format!("op-{op}");
    let entity = format!("cust-{}", op % 3);
    let mut bodies = vec![Body::Requested(Requested {
        expected_version: Some(7),
        expected_fingerprint: None,
        idempotency_key: with_key.then(|| format!("key-{op}")),
        idempotent,
        destination: "crm".into(),
        confirm_within_ms: Some(60_000),
        max_attempts: None,
    })];
    let started = |attempt| Body::Started { attempt, worker: "w-1".into() };
    let observed = |v, source| {
        Body::EffectObserved(EffectObserved {
            remote_id: Some(format!("r-{op}")),
            observed_version: Some(v),
            observed_fingerprint: None,
            source,
            evidence_ref: None,
        })
    };
    let unknown = Body::OutcomeUnknown { attempt: 1, detail: "timeout".into() };
    match path {
        Path::WorkerConfirms { matches } => {
            bodies.push(started(1));
            bodies.push(observed(if matches { 7 } else { 6 }, EvidenceSource::WorkerResponse));
        }
        Path::UnknownThenQueryFinds { matches } => {
            bodies.extend([started(1), unknown]);
            bodies.push(observed(if matches { 7 } else { 8 }, EvidenceSource::DestinationQuery));
        }
        Path::UnknownThenQueryAbsent => {
            bodies.extend([started(1), unknown]);
            bodies.push(Body::EffectAbsent { source: EvidenceSource::DestinationQuery, evidence_ref: None });
        }
        Path::RetryThenConfirms => {
            bodies.push(started(1));
            bodies.push(Body::AttemptFailed {
                attempt: 1,
                error_class: ErrorClass::Transient,
                error_code: "503".into(),
                detail: "busy".into(),
                next_attempt_at: None,
            });
            bodies.push(started(2));
            bodies.push(observed(7, EvidenceSource::WorkerResponse));
        }
        Path::PermanentFailure => {
            bodies.push(started(1));
            bodies.push(Body::AttemptFailed {
                attempt: 1,
                error_class: ErrorClass::Permanent,
                error_code: "422".into(),
                detail: "rejected".into(),
                next_attempt_at: None,
            });
        }
        Path::Cancelled => bodies.push(Body::Cancelled { reason: "deleted".into() }),
        Path::UnknownThenSilence => bodies.extend([started(1), unknown]),
        Path::NeverStarted => {}
    }
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event {
            event_id: format!("{op_id}-e{i}"),
            operation_id: op_id.clone(),
            entity_id: entity.clone(),
            operation_type: "sync_customer".into(),
            seq: Some(i as i64 + 1),
            occurred_at: BASE + op as i64 * 10 + i as i64 * 100,
            producer: "prop".into(),
            body,
        })
        .collect()
}

fn workload() -> impl Strategy<Value = Vec<Vec<Event>>> {
    proptest::collection::vec((path(), any::<bool>(), any::<bool>()), 1..6)
        .prop_map(|ops| ops.into_iter().enumerate().map(|(i, (p, idem, key))| lifecycle(i, p, idem, key)).collect())
}

/// Interleaves per-operation sequences in order, choosing the next
/// operation from `choices` (per-operation order is kept).
fn interleave(ops: &[Vec<Event>], choices: &[usize]) -> Vec<Event> {
    let mut cursors = vec![0; ops.len()];
    let mut out = Vec::new();
    let mut c = choices.iter().cycle();
    while out.len() < ops.iter().map(Vec::len).sum::<usize>() {
        let mut k = c.next().copied().unwrap_or(0) % ops.len();
        while cursors[k] == ops[k].len() {
            k = (k + 1) % ops.len();
        }
        out.push(ops[k][cursors[k]].clone());
        cursors[k] += 1;
    }
    out
}

/// Feeds events, then fires every timer up to one hour later.
fn run(events: &[Event]) -> (Vec<Output>, MemoryEngine) {
    let policy = Policy::default();
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    engine.replay(&policy, events.iter().cloned(), BASE + 3_600_000, &mut out);
    (out, engine)
}

/// Verdicts without the fields that legitimately depend on arrival (where
/// the trigger sat in the log, how many duplicates or early arrivals so far).
fn verdicts(out: &[Output]) -> Vec<Verdict> {
    out.iter()
        .filter_map(|o| match o {
            Output::Verdict(v) => {
                let mut v = v.clone();
                v.evidence.trigger_offset = 0;
                v.evidence.duplicates_seen = 0;
                v.evidence.out_of_order_seen = 0;
                Some(v)
            }
            _ => None,
        })
        .collect()
}

fn states(engine: &MemoryEngine) -> Vec<OperationState> {
    let mut ops: Vec<&OperationState> = engine.ops.values().collect();
    ops.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    ops.into_iter()
        .map(|op| {
            let mut op = op.clone();
            op.duplicates_seen = 0;
            op.out_of_order_seen = 0;
            op
        })
        .collect()
}

/// Verdicts per operation (the relative order of different operations'
/// verdicts follows the interleaving).
fn by_op(mut v: Vec<Verdict>) -> Vec<Verdict> {
    v.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn redelivery_changes_nothing_but_anomalies(
        ops in workload(),
        choices in proptest::collection::vec(0usize..8, 1..40),
        copies in proptest::collection::vec(1usize..=3, 40),
        lag in proptest::collection::vec(0usize..5, 40),
    ) {
        let once = interleave(&ops, &choices);
        // Each event delivered 1–3 times; redeliveries land up to a few
        // records later (as after a consumer restart).
        let mut delivered: Vec<Event> = Vec::new();
        let mut pending: Vec<(usize, Event)> = Vec::new();
        for (i, ev) in once.iter().enumerate() {
            delivered.push(ev.clone());
            for _ in 1..copies[i % copies.len()] {
                pending.push((i + lag[i % lag.len()], ev.clone()));
            }
            let (now, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(at, _)| *at <= i);
            delivered.extend(now.into_iter().map(|(_, e)| e));
            pending = later;
        }
        delivered.extend(pending.into_iter().map(|(_, e)| e));

        let (out1, e1) = run(&once);
        let (out2, e2) = run(&delivered);
        prop_assert_eq!(by_op(verdicts(&out1)), by_op(verdicts(&out2)));
        prop_assert_eq!(states(&e1), states(&e2));
    }

    #[test]
    fn arrival_order_within_the_window_changes_nothing(
        ops in workload(),
        choices in proptest::collection::vec(0usize..8, 1..40),
        shuffle_seed in any::<u64>(),
    ) {
        let in_order = interleave(&ops, &choices);
        // Any permutation: the whole workload spans less than the window.
        let mut shuffled = in_order.clone();
        let mut x = shuffle_seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (out1, e1) = run(&in_order);
        let (out2, e2) = run(&shuffled);
        prop_assert_eq!(by_op(verdicts(&out1)), by_op(verdicts(&out2)));
        prop_assert_eq!(states(&e1), states(&e2));
    }

    #[test]
    fn same_input_gives_byte_identical_outputs(
        ops in workload(),
        choices in proptest::collection::vec(0usize..8, 1..40),
    ) {
        let input = interleave(&ops, &choices);
        let codec = Codec::new();
        let encode = |out: &[Output]| -> Vec<Vec<u8>> {
            out.iter().map(|o| match o {
                Output::Verdict(v) => codec.encode_verdict(v).unwrap(),
                Output::Anomaly(a) => codec.encode_anomaly(a).unwrap(),
                Output::Command(c) => codec.encode_command(c).unwrap(),
            }).collect()
        };
        let (a, _) = run(&input);
        let (b, _) = run(&input);
        prop_assert!(!a.is_empty() || input.is_empty());
        prop_assert_eq!(encode(&a), encode(&b));
    }
}
