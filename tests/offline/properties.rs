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

// ---- SPEC §11: the reconciliation never stops before a case is settled ----

/// One step of a random stream: an event of operation `op` (0..4) or the
/// wall clock moving on by `dt` ms (timers fire).
#[derive(Debug, Clone)]
enum Move {
    Event { op: usize, seq: Option<i64>, dt: i64, body: Body },
    Clock { dt: i64 },
}

fn any_body() -> impl Strategy<Value = Body> {
    use reconciler::core::event::Decision;
    let requested = (1i64..5, any::<bool>(), any::<bool>(), 0usize..2, proptest::option::of(Just(60_000i64))).prop_map(
        |(v, idempotent, key, dest, within)| {
            Body::Requested(Requested {
                expected_version: Some(v),
                expected_fingerprint: None,
                idempotency_key: key.then(|| format!("key-{v}")),
                idempotent,
                destination: ["crm", "billing"][dest].into(),
                confirm_within_ms: within,
                max_attempts: Some(3),
            })
        },
    );
    let failed =
        (1i32..4, any::<bool>(), proptest::option::of(0i64..400_000)).prop_map(|(attempt, transient, next)| {
            Body::AttemptFailed {
                attempt,
                error_class: if transient { ErrorClass::Transient } else { ErrorClass::Permanent },
                error_code: "E".into(),
                detail: "d".into(),
                next_attempt_at: next.map(|n| BASE + n),
            }
        });
    let observed = (1i64..5, 0usize..2).prop_map(|(v, r)| {
        Body::EffectObserved(EffectObserved {
            remote_id: Some(format!("r-{r}")),
            observed_version: Some(v),
            observed_fingerprint: None,
            source: EvidenceSource::DestinationQuery,
            evidence_ref: None,
        })
    });
    let decision = prop_oneof![
        Just(Decision::Confirm),
        Just(Decision::Requeue),
        Just(Decision::Compensate),
        Just(Decision::Close)
    ]
    .prop_map(|decision| Body::ManualDecision {
        actor: "ana".into(),
        decision,
        note: "n".into(),
        evidence_checked: vec![],
    });
    prop_oneof![
        3 => requested,
        3 => (1i32..4).prop_map(|attempt| Body::Started { attempt, worker: "w".into() }),
        2 => failed,
        2 => (1i32..4).prop_map(|attempt| Body::OutcomeUnknown { attempt, detail: "t".into() }),
        2 => observed,
        2 => Just(Body::EffectAbsent { source: EvidenceSource::DestinationQuery, evidence_ref: None }),
        1 => Just(Body::Compensated { actor: "a".into(), reason: "r".into() }),
        1 => Just(Body::Cancelled { reason: "r".into() }),
        2 => decision,
    ]
}

fn any_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        4 => (0usize..4, proptest::option::of(1i64..6), 0i64..40_000, any_body())
            .prop_map(|(op, seq, dt, body)| Move::Event { op, seq, dt, body }),
        1 => (0i64..400_000).prop_map(|dt| Move::Clock { dt }),
    ]
}

/// The invariant of SPEC §11, and the entity bookkeeping it relies on
/// (every operation counted with its entity; the open list is exactly the
/// requested, not terminal operations).
fn check_invariant(engine: &MemoryEngine, after: &str) -> Result<(), TestCaseError> {
    use reconciler::core::Status;
    for op in engine.ops.values() {
        prop_assert!(
            op.status == Status::ManualReview || op.timer_at.is_some(),
            "after {}: {} is {:?} without a timer: {:?}",
            after,
            op.operation_id,
            op.status,
            op
        );
    }
    for (id, entity) in &engine.entities {
        let ops: Vec<&OperationState> = engine.ops.values().filter(|o| &o.entity_id == id).collect();
        prop_assert_eq!(entity.operations as usize, ops.len(), "after {}: operations of {}", after, id);
        let mut open: Vec<&str> = entity.open.iter().map(|o| o.operation_id.as_str()).collect();
        let mut want: Vec<&str> = ops
            .iter()
            .filter(|o| o.request.is_some() && !o.status.is_terminal())
            .map(|o| o.operation_id.as_str())
            .collect();
        open.sort();
        want.sort();
        prop_assert_eq!(open, want, "after {}: open operations of {}", after, id);
    }
    for op in engine.ops.values() {
        prop_assert!(engine.entities.contains_key(&op.entity_id), "after {}: {} has no entity", after, op.operation_id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// After every applied event (timers included) each operation is
    /// terminal, in MANUAL_REVIEW, or has a pending timer; firing every
    /// timer until none is due leaves only terminal, removed or review
    /// cases behind.
    #[test]
    fn every_open_operation_has_a_timer(moves in proptest::collection::vec(any_move(), 1..60)) {
        use reconciler::core::event::SourcePos;
        let policy = Policy { retention_ms: 3_600_000, ..Policy::default() };
        let mut engine = MemoryEngine::new();
        let mut out = Vec::new();
        let (mut now, mut offset, mut n) = (BASE, 0i64, 0usize);
        let mut next_pos = || { offset += 1; SourcePos { partition: 0, offset } };
        let fire = |engine: &mut MemoryEngine, until: i64, out: &mut Vec<Output>, pos: &mut dyn FnMut() -> SourcePos| -> Result<(), TestCaseError> {
            loop {
                let due = engine.due_timers(until);
                if due.is_empty() { return Ok(()); }
                for ev in due {
                    let what = format!("timer {} of {}", ev.event_id, ev.operation_id);
                    engine.process(&policy, ev, pos(), out);
                    check_invariant(engine, &what)?;
                }
            }
        };
        for m in moves {
            match m {
                Move::Event { op, seq, dt, body } => {
                    now += dt;
                    n += 1;
                    let ev = Event {
                        event_id: format!("e{n}"),
                        operation_id: format!("op-{op}"),
                        entity_id: format!("cust-{}", op % 2),
                        operation_type: "sync_customer".into(),
                        seq,
                        occurred_at: now,
                        producer: "prop".into(),
                        body,
                    };
                    let what = format!("{} {:?} of op-{op}", ev.event_id, ev.body.name());
                    engine.process(&policy, ev, next_pos(), &mut out);
                    check_invariant(&engine, &what)?;
                }
                Move::Clock { dt } => {
                    now += dt;
                    fire(&mut engine, now, &mut out, &mut next_pos)?;
                }
            }
        }
        // Nothing is left waiting forever: once every timer has fired,
        // what remains is with a person.
        fire(&mut engine, i64::MAX / 2, &mut out, &mut next_pos)?;
        for op in engine.ops.values() {
            prop_assert_eq!(op.status, reconciler::core::Status::ManualReview, "{:?}", op);
        }
    }
}
