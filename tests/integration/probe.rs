//! The probe worker against the real broker, a real HTTP destination (the
//! loadgen's destination service) and a real PostgreSQL: every
//! AMBIGUOUS/PROBE case ends in the verdict the destination's truth
//! implies, an unreachable destination ends in MANUAL_REVIEW with its
//! failures in `explain`, and a worker killed mid-flight loses no probe
//! and never publishes two different answers to one command.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::child::{spawn_probe, write_full_config};
use common::postgres::PgCluster;
use common::{check, config, Running};
use reconciler::clock::system_clock;
use reconciler::codec::Codec;
use reconciler::config::{Config, DestinationConfig};
use reconciler::core::event::{Body, Event, Requested};
use reconciler::core::{Action, Escalation, Outcome, RepairAction, RepairCommand, Verdict};
use reconciler::kafka::producer::Publisher;
use reconciler::kafka::reader::TopicReader;
use reconciler::loadgen::destination::{probe_commands, DestinationServer, Held};
use reconciler::operator::commands::explain_cmd;
use reconciler::probe::answer::{answer_id, PRODUCER};
use reconciler::probe::ProbeWorker;
use reconciler::records::InputRecord;

/// The confirmation window of the test's operations, and the follow-up
/// window after a PROBE: an answer must come within the latter, or the
/// case escalates.
const CONFIRM_MS: i64 = 1500;
const FOLLOW_UP_MS: i64 = 10_000;

fn http_destination(server: &DestinationServer) -> DestinationConfig {
    // Three attempts of 700 ms fail the silent key well before its
    // follow-up; the breaker stays out of the way of the failing keys.
    DestinationConfig {
        timeout_ms: 700,
        concurrency: 4,
        failure_threshold: 100,
        open_for_ms: 1000,
        ..server.destination()
    }
}

/// An operation whose outcome is unknown after its first attempt: its
/// deadline gives AMBIGUOUS/PROBE.
fn unknown_outcome(op: &str, destination: &str, idempotent: bool, version: i64, at: i64) -> Vec<InputRecord> {
    let ev = |seq: i64, body: Body| {
        InputRecord::Event(Event {
            event_id: format!("{op}-{seq}"),
            operation_id: op.into(),
            entity_id: format!("ent-{op}"),
            operation_type: "sync_customer".into(),
            seq: Some(seq),
            occurred_at: at + seq,
            producer: "test".into(),
            body,
        })
    };
    vec![
        ev(
            1,
            Body::Requested(Requested {
                expected_version: Some(version),
                expected_fingerprint: None,
                idempotency_key: Some(format!("key-{op}")),
                idempotent,
                destination: destination.into(),
                confirm_within_ms: Some(CONFIRM_MS),
                max_attempts: None,
            }),
        ),
        ev(2, Body::Started { attempt: 1, worker: "w-1".into() }),
        ev(3, Body::OutcomeUnknown { attempt: 1, detail: "timeout after send".into() }),
    ]
}

/// The verdicts so far, by operation, in order.
fn verdicts_by_op(reader: &TopicReader, topic: &str) -> BTreeMap<String, Vec<Verdict>> {
    let codec = Codec::new();
    let mut out: BTreeMap<String, Vec<Verdict>> = BTreeMap::new();
    for r in reader.of(topic) {
        if let Some(v) = r.value.as_deref().and_then(|b| codec.decode_verdict(b).ok()) {
            out.entry(v.operation_id.clone()).or_default().push(v);
        }
    }
    out
}

/// The verdict that follows the PROBE verdict of an operation.
fn after_probe(verdicts: &[Verdict]) -> Option<&Verdict> {
    let i = verdicts.iter().position(|v| v.action == Action::Probe)?;
    verdicts.get(i + 1)
}

fn run_worker(cfg: &Config) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut worker = ProbeWorker::new(cfg.clone(), &prometheus::Registry::new()).expect("worker starts");
    let flag = stop.clone();
    let handle = std::thread::spawn(move || worker.run(&flag).expect("worker runs"));
    (stop, handle)
}

#[test]
fn probes_settle_every_ambiguous_case_as_the_destination_says() {
    let _serial = common::serial();
    // The HTTP destination: what it holds under each idempotency key.
    let held = HashMap::from([
        ("key-h-same".to_owned(), Held::Present { remote_id: "crm-1".into(), version: 7 }),
        ("key-h-other".to_owned(), Held::Present { remote_id: "crm-2".into(), version: 6 }),
        ("key-h-absent".to_owned(), Held::Absent),
        (
            "key-h-flaky".to_owned(),
            Held::Unavailable { failures: 2, then: Box::new(Held::Present { remote_id: "crm-4".into(), version: 7 }) },
        ),
        ("key-h-silent".to_owned(), Held::Silent),
    ]);
    let server = DestinationServer::start(held).unwrap();
    // The PostgreSQL destination: a table of the destination's own.
    let pg = PgCluster::start();
    pg.execute(
        "CREATE TABLE effects (key text PRIMARY KEY, remote_id bigint, version bigint);
         INSERT INTO effects VALUES ('key-p-same', 501, 7), ('key-p-other', 502, 9);",
    );
    let env = common::unique("PG").replace('-', "_").to_uppercase();
    std::env::set_var(&env, pg.connection());

    let mut cfg = config("probe");
    cfg.time.follow_up_ms = Some(FOLLOW_UP_MS);
    cfg.time.timer_interval_ms = 100;
    cfg.probe.group_id = common::unique("probe-group");
    cfg.probe.state_dir = common::temp_dir("probe-ledger");
    cfg.probe.max_attempts = 3;
    cfg.probe.backoff_initial_ms = 50;
    cfg.probe.backoff_max_ms = 300;
    let http = http_destination(&server);
    cfg.destinations.insert("crm".into(), http.clone());
    let ledger = DestinationConfig::postgres(
        &env,
        "SELECT remote_id, version FROM effects WHERE key = $1",
        &["idempotency_key"],
    );
    let ledger = DestinationConfig {
        timeout_ms: http.timeout_ms,
        concurrency: http.concurrency,
        failure_threshold: http.failure_threshold,
        open_for_ms: http.open_for_ms,
        ..ledger
    };
    cfg.destinations.insert("ledger".into(), ledger);

    // (operation, destination, idempotent, the verdict after the probe).
    let cases: [(&str, &str, bool, Outcome, Action); 9] = [
        ("h-same", "crm", true, Outcome::Correct, Action::None),
        ("h-other", "crm", true, Outcome::Divergent, Action::ManualReview),
        ("h-absent", "crm", true, Outcome::Missing, Action::Requeue),
        ("h-flaky", "crm", true, Outcome::Correct, Action::None),
        ("h-silent", "crm", true, Outcome::Ambiguous, Action::ManualReview),
        ("p-same", "ledger", false, Outcome::Correct, Action::None),
        ("p-other", "ledger", false, Outcome::Divergent, Action::ManualReview),
        ("p-absent", "ledger", false, Outcome::Missing, Action::ManualReview),
        ("nowhere", "billing", true, Outcome::Ambiguous, Action::ManualReview),
    ];
    let running = Running::start(&cfg, system_clock());
    let (stop, worker) = run_worker(&cfg);
    let at = (system_clock())();
    let records: Vec<InputRecord> =
        cases.iter().flat_map(|(op, dest, idem, _, _)| unknown_outcome(op, dest, *idem, 7, at)).collect();
    reconciler::demo::publish(&cfg, &records).unwrap();

    let t = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts], t.partitions).unwrap();
    let bound = Duration::from_millis((CONFIRM_MS + FOLLOW_UP_MS) as u64 + 30_000);
    let until = Instant::now() + bound;
    let settled = loop {
        reader.read_until(Duration::from_millis(200), |_| false);
        let by_op = verdicts_by_op(&reader, &t.verdicts);
        if cases.iter().all(|(op, ..)| by_op.get(*op).and_then(|v| after_probe(v)).is_some()) {
            break true;
        }
        if Instant::now() >= until {
            break false;
        }
    };
    stop.store(true, Ordering::SeqCst);
    worker.join().unwrap();
    let stats = running.stop();
    let by_op = verdicts_by_op(&reader, &t.verdicts);
    assert!(settled, "not every case was settled within {bound:?}: {by_op:#?}; stats {stats:?}");

    for (op, _, _, outcome, action) in &cases {
        let v = after_probe(&by_op[*op]).unwrap();
        assert_eq!((v.outcome, v.action), (*outcome, *action), "{op}: {v:#?}");
        let probe = by_op[*op].iter().find(|v| v.action == Action::Probe).unwrap();
        let waited = v.decided_at - probe.decided_at;
        println!("{op}: {} / {} {waited} ms after the PROBE verdict", v.outcome.as_str(), v.action.as_str());
        if *action == Action::ManualReview && *outcome == Outcome::Ambiguous {
            assert_eq!(v.evidence.escalation, Some(Escalation::ProbeUnanswered), "{op}");
        } else {
            // Settled by the answer, not by the follow-up.
            assert!(waited < FOLLOW_UP_MS, "{op} answered after the follow-up window: {waited} ms");
        }
    }
    // The flaky key was asked until it answered; the silent one the whole budget.
    assert_eq!(server.queries("key-h-flaky"), 3);
    assert_eq!(server.queries("key-h-silent"), 3);

    // One answer per command on the input topic, with the command's id.
    let all = check::read_all(&cfg, &[&t.events, &t.commands]);
    let codec = Codec::new();
    let commands: Vec<RepairCommand> = all
        .iter()
        .filter(|r| *r.topic == *t.commands)
        .filter_map(|r| codec.decode_command(r.value.as_deref()?).ok())
        .collect();
    assert_eq!(commands.len(), cases.len(), "one PROBE command per case, in observe mode");
    assert!(commands.iter().all(|c| c.action == RepairAction::Probe));
    let answers: Vec<Event> = all
        .iter()
        .filter(|r| *r.topic == *t.events)
        .filter_map(|r| codec.decode_event(r.value.as_deref()?).ok())
        .filter(|e| e.producer == PRODUCER)
        .collect();
    assert_eq!(answers.len(), cases.len(), "{answers:#?}");
    for c in &commands {
        assert!(answers.iter().any(|a| a.event_id == answer_id(&c.command_id)), "no answer to {c:?}");
    }

    // The unreachable cases show their failed probes in explain.
    let silent = explain_cmd(&cfg, "h-silent", false).unwrap();
    assert!(silent.contains("probe failed after 3 attempt(s): TIMEOUT"), "{silent}");
    let nowhere = explain_cmd(&cfg, "nowhere", false).unwrap();
    assert!(nowhere.contains("UNKNOWN_DESTINATION") && nowhere.contains("billing"), "{nowhere}");
}

/// A worker killed at its crash points and with `kill -9` mid-flight, then
/// restarted on the same store, reading every command twice (the pipeline
/// re-sends them after its own crash): every command gets an answer, and
/// every answer id has one body only, although the destination answers
/// each key differently on every second query.
#[test]
fn a_killed_probe_worker_loses_no_probe_and_contradicts_no_answer() {
    let _serial = common::serial();
    const COMMANDS: usize = 120;
    let held: HashMap<String, Held> = (0..COMMANDS)
        .map(|i| (format!("key-{i}"), Held::Flipping { remote_id: format!("r-{i}"), version: 7 }))
        .collect();
    let server = DestinationServer::start_slow(held, Duration::from_millis(50)).unwrap();
    let mut cfg = config("probe-kill");
    cfg.probe.group_id = common::unique("probe-kill-group");
    cfg.probe.state_dir = common::temp_dir("probe-kill-ledger");
    cfg.probe.bind = "off".into();
    cfg.http.bind = "off".into();
    // A killed member leaves the group after 6 s, not librdkafka's 45.
    cfg.kafka.insert("session.timeout.ms".into(), "6000".into());
    let mut crm = http_destination(&server);
    crm.concurrency = 4;
    cfg.destinations.insert("crm".into(), crm);
    let dir = common::temp_dir("probe-kill");
    let file = write_full_config(&cfg, &dir);

    let codec = Codec::new();
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &cfg.topics.all(), cfg.topics.partitions, 1).unwrap();
    let commands = probe_commands(&cfg.topics.commands, "crm", "", COMMANDS);
    // Each command twice, as the pipeline re-publishes its outputs after
    // its own crash: the copy must get the same answer, not a new query.
    Publisher::new(&cfg.kafka, 1 << 20)
        .unwrap()
        .publish_all(commands.iter().chain(commands.iter()).map(|r| (r, None)))
        .unwrap();

    let answers = |reader: &mut TopicReader| {
        reader.read_until(Duration::from_millis(200), |_| false);
        let mut by_id: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
        for r in reader.of(&cfg.topics.events) {
            let ev = codec.decode_event(r.value.as_deref().unwrap()).unwrap();
            by_id.entry(ev.event_id).or_default().push(r.value.clone().unwrap());
        }
        by_id
    };
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions).unwrap();
    let log = dir.join("probe.log");
    // A restarted worker takes the crashed one's partitions once that
    // member's session expires.
    let wait_for = |reader: &mut TopicReader, n: usize, what: &str| {
        let until = Instant::now() + Duration::from_secs(90);
        loop {
            let got = answers(reader).len();
            if got >= n {
                return got;
            }
            assert!(Instant::now() < until, "{what}: {got} of {n} answers; log:\n{}", common::child::tail(&log));
        }
    };

    // 1. Crash right after a publish is acknowledged, before the offsets
    //    move: the restarted worker finds those commands again.
    let mut first = spawn_probe(&file, Some("probe::after_publish=2*off->return"), &log);
    let until = Instant::now() + Duration::from_secs(90);
    while !first.crashed() {
        assert!(Instant::now() < until, "no crash at probe::after_publish; log:\n{}", first.log_tail());
        std::thread::sleep(Duration::from_millis(50)); // poll interval of the child's state
    }
    let after_crash = answers(&mut reader).len();
    // 2. Restart, kill -9 while queries are in flight.
    let second = spawn_probe(&file, None, &log);
    wait_for(&mut reader, (after_crash + 20).min(COMMANDS - 20), "after the first restart");
    second.kill9();
    // 3. Restart and let it finish.
    let third = spawn_probe(&file, None, &log);
    let got = wait_for(&mut reader, COMMANDS, "after the second restart");
    // Redelivered answers come from the ledger: give them a moment to
    // arrive before the check (the count is already complete).
    let by_id = answers(&mut reader);
    third.stop();
    assert_eq!(got, COMMANDS);
    let republished = by_id.values().filter(|v| v.len() > 1).count();
    for (id, bodies) in &by_id {
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "answer {id} was published with {} different bodies",
            bodies.len()
        );
    }
    println!(
        "{COMMANDS} commands, {} answers, {republished} published more than once (identical), {} destination queries",
        by_id.len(),
        server.total_queries()
    );
    assert!(republished > 0, "the crash after a publish must make the worker re-publish some answers");
}

/// Two workers of one group, each with its own ledger (two machines): the
/// first is answering a backlog of commands, queries in flight, when the
/// second joins and the group moves partitions. The first settles what it
/// has in flight and commits its finished offsets before it lets them go,
/// so the destination is asked about each command exactly once.
#[test]
fn a_partition_moving_to_another_probe_worker_asks_the_destination_once_per_command() {
    let _serial = common::serial();
    const COMMANDS: usize = 60;
    let held: HashMap<String, Held> = (0..COMMANDS)
        .map(|i| (format!("key-{i}"), Held::Present { remote_id: format!("r-{i}"), version: 7 }))
        .collect();
    // Two queries at a time, 250 ms each: the backlog takes the first
    // worker about 7.5 s, so the partitions move with queries in flight.
    let server = DestinationServer::start_slow(held, Duration::from_millis(250)).unwrap();
    let mut cfg = config("probe-move");
    cfg.probe.group_id = common::unique("probe-move-group");
    cfg.probe.bind = "off".into();
    cfg.http.bind = "off".into();
    // The first worker hears of the second's join within half a second.
    cfg.kafka.insert("heartbeat.interval.ms".into(), "500".into());
    let mut crm = http_destination(&server);
    crm.concurrency = 2;
    cfg.destinations.insert("crm".into(), crm);
    let codec = Codec::new();
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &cfg.topics.all(), cfg.topics.partitions, 1).unwrap();
    let commands = probe_commands(&cfg.topics.commands, "crm", "", COMMANDS);
    Publisher::new(&cfg.kafka, 1 << 20).unwrap().publish_all(commands.iter().map(|r| (r, None))).unwrap();

    let first_cfg = Config {
        probe: {
            let mut p = cfg.probe.clone();
            p.state_dir = common::temp_dir("probe-move-a");
            p
        },
        ..cfg.clone()
    };
    let second_cfg = Config {
        probe: {
            let mut p = cfg.probe.clone();
            p.state_dir = common::temp_dir("probe-move-b");
            p
        },
        ..cfg.clone()
    };
    let (stop_first, first) = run_worker(&first_cfg);
    assert!(
        common::wait_for(Duration::from_secs(60), || server.total_queries() >= 6),
        "the first worker never started answering"
    );
    let (stop_second, second) = run_worker(&second_cfg);
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions).unwrap();
    let mut answered = std::collections::BTreeSet::new();
    assert!(
        common::wait_for(Duration::from_secs(90), || {
            reader.read_until(Duration::from_millis(200), |_| false);
            for r in reader.of(&cfg.topics.events) {
                answered.insert(codec.decode_event(r.value.as_deref().unwrap()).unwrap().operation_id);
            }
            answered.len() == COMMANDS
        }),
        "{} of {COMMANDS} commands answered",
        answered.len()
    );
    for stop in [&stop_first, &stop_second] {
        stop.store(true, Ordering::Relaxed);
    }
    first.join().unwrap();
    second.join().unwrap();
    let twice: Vec<String> = (0..COMMANDS).map(|i| format!("key-{i}")).filter(|k| server.queries(k) > 1).collect();
    assert!(twice.is_empty(), "asked more than once after the partitions moved: {twice:?}");
    assert_eq!(server.total_queries(), COMMANDS as u64);
}
