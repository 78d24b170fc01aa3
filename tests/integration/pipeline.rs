//! The pipeline against the real broker: verdicts and anomalies out as the
//! core predicts, dead letters byte-identical with provenance, overdue
//! verdicts on an idle partition, crash and restart without loss or double
//! application, and replay giving byte-identical output streams.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::child::Instance;
use common::{check, config, Running};
use reconciler::clock::system_clock;
use reconciler::codec::Codec;
use reconciler::core::event::{Body, Event, Requested};
use reconciler::core::{Output, Verdict};
use reconciler::demo;
use reconciler::kafka::producer::Publisher;
use reconciler::kafka::reader::TopicReader;
use reconciler::records::InputRecord;
use reconciler::records::ProducerRecord;
use reconciler::records::Record;
use reconciler::store::Store;

fn now() -> i64 {
    (system_clock())()
}

fn verdicts_of(records: &[&Record]) -> BTreeMap<String, Verdict> {
    let codec = Codec::new();
    records
        .iter()
        .filter_map(|r| codec.decode_verdict(r.value.as_deref()?).ok())
        .map(|v| (v.verdict_id.clone(), v))
        .collect()
}

/// The core's verdicts, compared on what does not depend on where the
/// trigger sat in the log.
fn comparable(v: &Verdict) -> (String, &'static str, &'static str, &'static str, String, String) {
    (
        v.operation_id.clone(),
        v.outcome.as_str(),
        v.action.as_str(),
        v.state.as_str(),
        v.reason.to_string(),
        v.trigger_event_id.clone(),
    )
}

#[test]
fn events_in_give_the_predicted_verdicts_and_anomalies() {
    let _serial = common::serial();
    let mut cfg = config("predicted");
    demo::configure(&mut cfg);
    let start = now();
    let records = demo::workload(start, 2);
    let (outputs, _) = demo::predict(&cfg, &records, start + 3_600_000);
    let running = Running::start(&cfg, system_clock());
    demo::publish(&cfg, &records).unwrap();

    let t = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts, &t.anomalies, &t.dlq], 3).unwrap();
    let predicted: Vec<&Verdict> =
        outputs.iter().filter_map(|o| if let Output::Verdict(v) = o { Some(v) } else { None }).collect();
    let predicted_anomalies = outputs.iter().filter(|o| matches!(o, Output::Anomaly(_))).count();
    let garbage = records.iter().filter(|r| !matches!(r, InputRecord::Event(_))).count();
    let ok = reader.read_until(Duration::from_secs(60), |recs| {
        let n = |topic: &str| recs.iter().filter(|r| *r.topic == *topic).count();
        n(&t.verdicts) >= predicted.len() && n(&t.anomalies) >= predicted_anomalies && n(&t.dlq) >= garbage
    });
    let stats = running.stop();
    assert!(ok, "outputs did not all arrive; stats {stats:?}");

    let got = verdicts_of(&reader.of(&t.verdicts).collect::<Vec<_>>());
    let want: BTreeMap<String, &Verdict> = predicted.iter().map(|v| (v.verdict_id.clone(), *v)).collect();
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "verdict ids differ from the core's");
    for (id, v) in &got {
        assert_eq!(comparable(v), comparable(want[id]));
    }
    let codec = Codec::new();
    let mut kinds_got: BTreeMap<&str, usize> = BTreeMap::new();
    for r in reader.of(&t.anomalies) {
        *kinds_got.entry(codec.decode_anomaly(r.value.as_deref().unwrap()).unwrap().kind.as_str()).or_default() += 1;
    }
    let mut kinds_want: BTreeMap<&str, usize> = BTreeMap::new();
    for o in &outputs {
        if let Output::Anomaly(a) = o {
            *kinds_want.entry(a.kind.as_str()).or_default() += 1;
        }
    }
    assert_eq!(kinds_got, kinds_want);
    assert_eq!(reader.of(&t.dlq).count(), garbage);
    for kind in
        ["DUPLICATE_DELIVERY", "DUPLICATE_EMISSION", "CONFLICTING_TRANSITION", "OUT_OF_ORDER", "INVALID_TRANSITION"]
    {
        assert!(kinds_got.contains_key(kind), "the demo workload shows {kind}");
    }
}

#[test]
fn eleven_kinds_of_poison_are_dead_lettered_once_byte_identical_the_stream_flows_on_and_a_replay_agrees() {
    let _serial = common::serial();
    let cfg = config("dlq");
    let codec = Codec::new();
    let running = Running::start(&cfg, system_clock());
    let t = now();
    let valid = |id: &str, seq, body| Event {
        event_id: id.into(),
        operation_id: "op-after".into(),
        entity_id: "cust-1".into(),
        operation_type: "sync_customer".into(),
        seq: Some(seq),
        occurred_at: t,
        producer: "test".into(),
        body,
    };
    let requested = valid(
        "a1",
        1,
        Body::Requested(Requested { idempotent: true, destination: "crm".into(), ..Default::default() }),
    );
    let cancelled = valid("a2", 2, Body::Cancelled { reason: "gone".into() });
    let mut unknown_fp = codec.encode_event(&requested).unwrap();
    unknown_fp[3] ^= 0x55;
    let rec = |key: &[u8], value: Option<Vec<u8>>, headers: Vec<(String, Option<Vec<u8>>)>| ProducerRecord {
        topic: cfg.topics.events.clone(),
        key: Some(key.to_vec()),
        value,
        headers,
    };
    let mut oversize = codec.encode_event(&requested).unwrap();
    oversize.resize(cfg.consumer.max_record_bytes + 1, b'x');
    let valid_bytes = codec.encode_event(&requested).unwrap();
    let mut wrong_magic = valid_bytes.clone();
    wrong_magic[1] = 0x02;
    let mut empty_id = requested.clone();
    empty_id.event_id = String::new();
    let mut trailing = valid_bytes.clone();
    trailing.extend_from_slice(b"extra");
    let verdict_bytes = {
        // A record of another topic's schema (a Verdict) on the input topic.
        let (outputs, _) = {
            let mut engine = reconciler::core::memory::MemoryEngine::new();
            let mut out = Vec::new();
            engine.replay(&reconciler::core::Policy::default(), [requested.clone(), cancelled.clone()], 0, &mut out);
            (out, engine)
        };
        match &outputs[0] {
            Output::Verdict(v) => codec.encode_verdict(v).unwrap(),
            other => panic!("expected a verdict, got {other:?}"),
        }
    };
    // Ten kinds of poison, each with the class its dead letter must carry.
    let poison: Vec<(ProducerRecord, &str)> = vec![
        (
            rec(
                b"cust-1",
                Some(vec![0xde, 0xad, 0xbe, 0xef, 0, 1, 2]),
                vec![("trace-id".into(), Some(b"t-1".to_vec())), ("empty".into(), None)],
            ),
            "bad_magic",
        ),
        (rec(b"cust-1", None, vec![]), "null_value"),
        (rec(b"cust-1", Some(unknown_fp), vec![]), "unknown_fingerprint"),
        (rec(b"cust-2", Some(valid_bytes.clone()), vec![]), "key_mismatch"),
        (rec(b"cust-1", Some(oversize.clone()), vec![]), "oversize"),
        (rec(b"cust-1", Some(valid_bytes[..valid_bytes.len() - 4].to_vec()), vec![]), "truncated"),
        (rec(b"cust-1", Some(wrong_magic), vec![]), "bad_magic"),
        (rec(b"cust-1", Some(codec.encode_event(&empty_id).unwrap()), vec![]), "invalid_field"),
        (rec(b"cust-1", Some(verdict_bytes), vec![]), "wrong_schema"),
        (
            rec(
                b"cust-1",
                Some(trailing),
                vec![("bin".into(), Some(vec![0, 0xff, 0xfe, 7])), ("x".into(), Some(vec![]))],
            ),
            "malformed",
        ),
        // Headers with garbage: binary values, an empty name, a repeated
        // name, a null and a large value; all kept byte-identical, in order.
        (rec(b"cust-1", Some(vec![0x00, 0x13, 0x37]), garbage_headers()), "bad_magic"),
    ];
    // Headers are not part of the contract: a valid event with garbage
    // headers is applied like any other.
    let good = [
        rec(b"cust-1", Some(codec.encode_event(&requested).unwrap()), garbage_headers()),
        rec(b"cust-1", Some(codec.encode_event(&cancelled).unwrap()), vec![]),
    ];
    let publisher = Publisher::new(&cfg.kafka, 2 * cfg.consumer.max_record_bytes).unwrap();
    publisher.publish_all(poison.iter().map(|(r, _)| r).chain(&good).map(|r| (r, Some(0)))).unwrap();

    let topics = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&topics.dlq, &topics.verdicts], 3).unwrap();
    let ok = reader.read_until(Duration::from_secs(30), |recs| {
        recs.iter().filter(|r| *r.topic == *topics.dlq).count() >= poison.len()
            && recs.iter().any(|r| *r.topic == *topics.verdicts)
    });
    running.stop();
    assert!(ok, "dead letters and the later verdict did not arrive");
    let dlq: Vec<&Record> = reader.of(&topics.dlq).collect();
    assert_eq!(dlq.len(), poison.len(), "exactly one dead letter per poison record");
    for (i, ((sent, class), got)) in poison.iter().zip(&dlq).enumerate() {
        assert_eq!(got.key, sent.key, "key of dead letter {i}");
        if *class == "oversize" {
            // Too large for any producer: the first 64 KiB and the length.
            assert_eq!(got.value.as_deref(), Some(&oversize[..reconciler::records::OVERSIZE_KEPT_BYTES]));
            let len = got.headers.iter().find(|(k, _)| k == "reconciler.value.truncated").and_then(|(_, v)| v.clone());
            assert_eq!(len, Some(oversize.len().to_string().into_bytes()));
        } else {
            assert_eq!(got.value, sent.value, "value of dead letter {i}");
        }
        let header = |k: &str| {
            got.headers.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone()).map(|v| String::from_utf8(v).unwrap())
        };
        for (k, v) in &sent.headers {
            assert!(got.headers.contains(&(k.clone(), v.clone())), "original header {k} kept");
        }
        assert_eq!(header("reconciler.error.class").unwrap(), *class, "dead letter {i}");
        assert!(!header("reconciler.error.message").unwrap().is_empty());
        assert_eq!(header("reconciler.source.topic").unwrap(), topics.events);
        assert_eq!(header("reconciler.source.partition").unwrap(), "0");
        assert_eq!(header("reconciler.source.offset").unwrap(), i.to_string());
        assert!(header("reconciler.source.timestamp").unwrap().parse::<i64>().is_ok());
    }
    let v = verdicts_of(&reader.of(&topics.verdicts).collect::<Vec<_>>());
    assert_eq!(v.len(), 1);
    assert_eq!(v.values().next().unwrap().outcome.as_str(), "NOT_APPLICABLE");

    // I1-I3 of the live run against the reference over the input log.
    let input = check::read_all(&cfg, &[&topics.events]);
    let live = check::check(&cfg, &input, &check::read_all(&cfg, &check::output_topics(&cfg)), &[&cfg.state_dir]);

    // A replay into empty state (new group, new output topics) gives the
    // same dead letters, byte for byte, provenance included.
    let replay = replay_config(&cfg);
    let running = Running::start(&replay, system_clock());
    let mut again = TopicReader::new(&replay.kafka, &[&replay.topics.dlq, &replay.topics.verdicts], 3).unwrap();
    let rt = replay.topics.clone();
    let ok = again.read_until(Duration::from_secs(30), |recs| {
        recs.iter().filter(|r| *r.topic == *rt.dlq).count() >= poison.len()
            && recs.iter().any(|r| *r.topic == *rt.verdicts)
    });
    running.stop();
    assert!(ok, "the replay did not dead-letter everything");
    let dead = |recs: Vec<&Record>| -> Vec<_> {
        recs.into_iter().map(|r| (r.key.clone(), r.value.clone(), r.headers.clone())).collect()
    };
    assert_eq!(dead(again.of(&rt.dlq).collect()), dead(dlq), "the replay's dead letters differ");
    let replayed =
        check::check(&replay, &input, &check::read_all(&replay, &check::output_topics(&replay)), &[&replay.state_dir]);
    println!(
        "poison suite: kinds {}, inputs {}, dead letters {} (replayed identical), losses {}, non-identical duplicates {}",
        poison.len(),
        live.inputs,
        poison.len(),
        live.losses + replayed.losses,
        live.divergent + replayed.divergent
    );
}

/// Headers no decoder should choke on.
fn garbage_headers() -> Vec<(String, Option<Vec<u8>>)> {
    vec![
        ("bin".into(), Some(vec![0xff, 0x00, 0xfe, 0x80])),
        ("".into(), Some(b"empty name".to_vec())),
        ("dup".into(), Some(b"first".to_vec())),
        ("dup".into(), Some(b"second".to_vec())),
        ("null".into(), None),
        ("big".into(), Some(vec![0xa5; 10_000])),
    ]
}

/// The same input topic, read by a fresh instance: new state, new group,
/// new output topics.
fn replay_config(cfg: &reconciler::config::Config) -> reconciler::config::Config {
    let mut replay = cfg.clone();
    let id = common::unique("replayed");
    replay.topics =
        reconciler::config::Topics { events: cfg.topics.events.clone(), ..reconciler::config::Topics::named(&id, 3) };
    replay.consumer.group_id = format!("{id}.group");
    replay.state_dir = common::temp_dir("replay-state");
    replay
}

#[test]
fn overdue_operation_on_an_idle_partition_is_judged_within_three_seconds() {
    let _serial = common::serial();
    overdue_within_three_seconds(false);
}

/// Regression (review): "caught up" once meant "nothing new since the last
/// batch", so a partition with steady traffic never fired its timers (this
/// test then fails with no verdict at all). The bound is wider than on an
/// idle partition: the timer queues behind the traffic.
#[test]
fn overdue_operation_on_a_busy_partition_is_judged_while_traffic_continues() {
    let _serial = common::serial();
    overdue_within_three_seconds(true);
}

/// The input record of an idempotent operation's `Requested` (first of
/// its sequence), keyed by its entity: (event, operation, entity, type).
fn requested_record(codec: &Codec, topic: &str, ids: (&str, &str, &str, &str), occurred_at: i64) -> ProducerRecord {
    let (event_id, operation_id, entity_id, operation_type) = ids;
    let ev = Event {
        event_id: event_id.into(),
        operation_id: operation_id.into(),
        entity_id: entity_id.into(),
        operation_type: operation_type.into(),
        seq: Some(1),
        occurred_at,
        producer: "test".into(),
        body: Body::Requested(Requested { idempotent: true, destination: "crm".into(), ..Default::default() }),
    };
    reconciler::records::event_record(codec, topic, &ev).unwrap()
}

fn overdue_within_three_seconds(busy: bool) {
    let mut cfg = config("overdue");
    cfg.types.insert(
        "quick".into(),
        reconciler::config::TypeConfig { confirm_within_ms: Some(2_000), ..Default::default() },
    );
    let log = common::logs::mark();
    let running = Running::start(&cfg, system_clock());
    let t = now();
    let rec = requested_record(&Codec::new(), &cfg.topics.events, ("q1", "op-quick", "cust-q", "quick"), t);
    Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes).unwrap().publish_all([(&rec, None)]).unwrap();
    let deadline = t + 2_000;
    // With `busy`, steady traffic on the same partition while the deadline
    // passes: the partition is never idle, and the timer must still fire.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (stop, kafka, topic, max) =
            (stop.clone(), cfg.kafka.clone(), cfg.topics.events.clone(), cfg.consumer.max_record_bytes);
        std::thread::spawn(move || {
            let publisher = Publisher::new(&kafka, max).unwrap();
            let codec = Codec::new();
            let mut i = 0;
            while busy && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let batch: Vec<ProducerRecord> = (0..20)
                    .map(|_| {
                        i += 1;
                        let ids = (format!("busy-{i}"), format!("op-busy-{i}"));
                        requested_record(&codec, &topic, (&ids.0, &ids.1, "cust-q", "slow"), now())
                    })
                    .collect();
                publisher.publish_all(batch.iter().map(|r| (r, None))).unwrap();
            }
            i
        })
    };
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.verdicts, &cfg.topics.events], 3).unwrap();
    let verdicts = cfg.topics.verdicts.clone();
    let ok = reader.read_until(Duration::from_secs(20), |recs| {
        recs.iter().any(|r| *r.topic == *verdicts && r.key.as_deref() == Some(b"cust-q"))
    });
    let arrived = now();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = traffic.join().unwrap();
    let stats = running.stop();
    assert!(!busy || sent > 100, "the partition was kept busy ({sent} records)");
    if !ok {
        // What each side saw, so that a failure names the step that stalled.
        let codec = Codec::new();
        let seen: Vec<String> = reader
            .of(&cfg.topics.events)
            .filter_map(|r| {
                let e = codec.decode_event(r.value.as_deref()?).ok()?;
                (e.operation_id == "op-quick").then(|| format!("{} at {}@{}", e.body.name(), r.partition, r.offset))
            })
            .take(20)
            .collect();
        panic!(
            "no overdue verdict within 20 s: the pipeline took in {} records in {} batches, fired {} timers, issued {} verdicts; \
             the reader saw {} verdicts and the input records {seen:?}; the pipeline logged:\n{}",
            stats.records,
            stats.batches,
            stats.timers_fired,
            stats.verdicts,
            reader.of(&cfg.topics.verdicts).count(),
            common::logs::since(log)
        );
    }
    let bound = if busy { 10_000 } else { 3_000 };
    assert!(arrived <= deadline + bound, "verdict {} ms after the deadline (bound {bound} ms)", arrived - deadline);
    let v = verdicts_of(&reader.of(&cfg.topics.verdicts).collect::<Vec<_>>());
    let v = v.values().next().unwrap();
    assert_eq!((v.outcome.as_str(), v.action.as_str()), ("MISSING", "REQUEUE"));
    assert_eq!(v.trigger_event_id, format!("deadline:op-quick:{deadline}"));
    // The reader may have seen the verdict before fetching the input
    // partition that holds the timer: read on until it shows (or time out).
    let codec = Codec::new();
    let events = cfg.topics.events.clone();
    let timer_in_log = reader.read_until(Duration::from_secs(10), |recs| {
        recs.iter()
            .filter(|r| *r.topic == *events)
            .filter_map(|r| codec.decode_event(r.value.as_deref()?).ok())
            .any(|e| matches!(e.body, Body::DeadlineReached { deadline: d } if d == deadline))
    });
    assert!(timer_in_log, "the DeadlineReached event is in the input topic");
}

/// A group offset set back behind what the pipeline stored (an
/// asynchronous commit lost in a rebalance; an operator's reset of the
/// group while it was stopped) is committed again once the pipeline is
/// idle, rather than leaving lag above zero until the next record arrives.
/// The store, not the group, says where the pipeline is: it resumes from
/// its own offsets and mends the group's (its log says so; without the
/// mending the offset stays behind, as nothing new arrives).
#[test]
fn a_group_offset_set_back_is_committed_again_when_idle() {
    let _serial = common::serial();
    let cfg = config("mend-offsets");
    let running = Running::start(&cfg, system_clock());
    let codec = Codec::new();
    let records: Vec<ProducerRecord> = (0..30)
        .map(|i| {
            let ids = (format!("m{i}"), format!("op-m{i}"), format!("cust-m{i}"));
            requested_record(&codec, &cfg.topics.events, (&ids.0, &ids.1, &ids.2, "sync"), now())
        })
        .collect();
    Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes)
        .unwrap()
        .publish_all(records.iter().map(|r| (r, None)))
        .unwrap();
    let end = check::end_offsets(&cfg, &cfg.topics.events);
    let at_end = |c: &BTreeMap<i32, i64>| end.iter().all(|(p, e)| *e == 0 || c.get(p) == Some(e));
    assert!(
        common::wait_for(Duration::from_secs(30), || at_end(&check::committed(&cfg))),
        "never committed to the end {end:?}"
    );
    // Kafka accepts a commit from outside the group only while the group
    // has no member: the pipeline stops, the offset is set back, the
    // pipeline starts again on its store.
    running.stop();
    let (&p, &e) = end.iter().find(|(_, e)| **e > 0).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(30), || check::try_commit_as_group(&cfg, p, 0).is_ok()),
        "the broker refused the outside commit to the empty group"
    );
    assert_eq!(check::committed(&cfg).get(&p), Some(&0), "the offset was not set back: nothing to mend");
    let log = common::logs::mark();
    let running = Running::start(&cfg, system_clock());
    let mended = common::wait_for(Duration::from_secs(30), || check::committed(&cfg).get(&p).is_some_and(|c| *c >= e));
    let stats = running.stop();
    assert!(
        mended,
        "partition {p}'s group offset stayed behind {e}: {:?} ({} records taken in)",
        check::committed(&cfg),
        stats.records
    );
    assert!(
        common::logs::since(log).contains("Group offsets behind the stored ones"),
        "the offset moved, but not by the mending"
    );
}

/// Per-partition sequences of output values.
fn streams(reader: &TopicReader, topic: &str) -> BTreeMap<i32, Vec<Vec<u8>>> {
    let mut out: BTreeMap<i32, Vec<Vec<u8>>> = BTreeMap::new();
    let mut recs: Vec<&Record> = reader.of(topic).collect();
    recs.sort_by_key(|r| (r.partition, r.offset));
    for r in recs {
        out.entry(r.partition).or_default().push(r.value.clone().unwrap());
    }
    out
}

/// Runs an instance with `clock` over `cfg`'s input until `want` verdicts
/// and anomalies arrived, then a little longer (nothing more may come).
/// With `records`, publishes them first: the whole input is in the log
/// before any timer can fire.
fn run_with_clock(
    cfg: &reconciler::config::Config,
    records: Option<&[InputRecord]>,
    clock: reconciler::clock::Clock,
    want: (usize, usize),
) -> TopicReader {
    if let Some(r) = records {
        reconciler::kafka::admin::ensure_topics(&cfg.kafka, &cfg.topics.all(), 3, 1).unwrap();
        demo::publish(cfg, r).unwrap();
    }
    let running = Running::start(cfg, clock);
    let t = cfg.topics.clone();
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts, &t.anomalies], 3).unwrap();
    let ok = reader.read_until(Duration::from_secs(60), |recs| {
        recs.iter().filter(|r| *r.topic == *t.verdicts).count() >= want.0
            && recs.iter().filter(|r| *r.topic == *t.anomalies).count() >= want.1
    });
    reader.read_until(Duration::from_secs(2), |_| false);
    running.stop();
    assert!(ok, "the run over {} did not settle", t.events);
    reader
}

/// The clock suite. The same input, processed live under two wall clocks an
/// hour apart, gives the same verdicts (the core's prediction); replaying
/// each run's log into empty state under a clock a day later, or a day
/// earlier, gives byte-identical verdict and anomaly streams, timeouts
/// included: every timer firing is in the log.
#[test]
fn verdicts_do_not_depend_on_the_wall_clock_and_replays_are_byte_identical() {
    let _serial = common::serial();
    let mut cfg = config("clock");
    demo::configure(&mut cfg);
    let start = now();
    let records = demo::workload(start, 1);
    let (outputs, _) = demo::predict(&cfg, &records, start + 3_600_000);
    let want = (
        outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count(),
        outputs.iter().filter(|o| matches!(o, Output::Anomaly(_))).count(),
    );
    let predicted: BTreeSet<_> =
        outputs.iter().filter_map(|o| if let Output::Verdict(v) = o { Some(comparable(v)) } else { None }).collect();
    let mut skewed = config("clock-skewed");
    demo::configure(&mut skewed);
    let runs = [
        (cfg, system_clock(), Arc::new(move || now() + 86_400_000) as reconciler::clock::Clock),
        (skewed, Arc::new(move || now() + 3_600_000) as _, Arc::new(move || now() - 86_400_000) as _),
    ];
    for (cfg, live_clock, replay_clock) in runs {
        let live = run_with_clock(&cfg, Some(&records), live_clock, want);
        let t = &cfg.topics;
        let got: BTreeSet<_> =
            verdicts_of(&live.of(&t.verdicts).collect::<Vec<_>>()).values().map(comparable).collect();
        assert_eq!(got, predicted, "verdicts under another wall clock");
        let replay = replay_config(&cfg);
        let again = run_with_clock(&replay, None, replay_clock, want);
        let rt = &replay.topics;
        assert_eq!(streams(&live, &t.verdicts), streams(&again, &rt.verdicts), "verdict streams differ");
        assert_eq!(streams(&live, &t.anomalies), streams(&again, &rt.anomalies), "anomaly streams differ");
    }
    println!(
        "clock suite: 2 wall clocks 1 h apart, 2 replays (a day later, a day earlier), {} verdicts each, identical",
        want.0
    );
}

#[test]
fn kill_9_and_restart_loses_nothing_and_applies_nothing_twice() {
    let _serial = common::serial();
    let mut cfg = config("crash");
    demo::configure(&mut cfg);
    cfg.consumer.batch_size = 97;
    cfg.time.reorder_window_ms = 2_000;
    // The killed member stays in the group until its session times out.
    cfg.kafka.insert("session.timeout.ms".into(), "6000".into());
    cfg.kafka.insert("heartbeat.interval.ms".into(), "1000".into());
    let start = now();
    let records = demo::workload(start, 150);
    let (outputs, engine) = demo::predict(&cfg, &records, start + 3_600_000);
    let predicted = outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count();

    let dir = common::temp_dir("crash-config");
    let config_file = common::child::write_config(&cfg, &dir);
    let log = dir.join("reconciler.log");
    let t = cfg.topics.clone();
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), 3, 1).unwrap();
    demo::publish(&cfg, &records).unwrap();
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts], 3).unwrap();
    let mut kills = 0;
    for round in 0..3 {
        let child = Instance::spawn(&config_file, None, None, &log);
        // Let it get some way in, then kill -9 in the middle of the stream.
        let target = predicted * (round + 1) / 5;
        // The previous instance's partitions come once its session expires.
        let got_there = reader.read_until(Duration::from_secs(60), |recs| recs.len() >= target);
        assert!(got_there, "round {round}: no progress; log (last lines first):\n{}", child.log_tail());
        child.kill9();
        kills += 1;
    }
    let child = Instance::spawn(&config_file, None, None, &log);
    // Settled includes the survivor owning every partition: the last
    // killed member's session expires first.
    let settled = check::wait_settled(&cfg, predicted, Duration::from_secs(90), || child.owned() == 3 && child.ready());
    let tail = child.log_tail();
    child.stop();
    if let Err(why) = settled {
        panic!("I4 after {kills} kills: {why}; log:\n{tail}\nI4 after {kills} kills: {why}");
    }

    // I1-I3 against the reference over the input log.
    let input = check::read_all(&cfg, &[&t.events]);
    let mut f = check::check(&cfg, &input, &check::read_all(&cfg, &check::output_topics(&cfg)), &[&cfg.state_dir]);
    f.iterations = 1;
    f.crashes = kills;
    f.print("crash test (kill -9 x3)");

    // And the state equals the core's own prediction for the workload.
    let store = Store::open(&cfg.state_dir, &cfg.topics.events, false).unwrap();
    let mut ops = BTreeMap::new();
    for p in 0..3 {
        for op in store.ops_of(p).unwrap() {
            ops.insert(op.operation_id.clone(), op);
        }
    }
    assert_eq!(ops.len(), engine.ops.len());
    for (id, want) in &engine.ops {
        assert_eq!(&ops[id], want, "{id}: state differs from the uninterrupted reference");
    }
}

/// Issue 14: an error no retry cures is not retried forever. The producer
/// refuses an output the broker would never take (a dead letter larger
/// than `message.max.bytes`): readiness turns red with the error, and after
/// `give_up_after_ms` the pipeline stops with `PublishRefused` (the binary
/// then exits non-zero) instead of waiting for a fix that cannot come.
#[test]
fn an_output_the_producer_refuses_stops_the_pipeline_after_the_bound() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use reconciler::pipeline::{Pipeline, PipelineError};

    let _serial = common::serial();
    let mut cfg = config("refused");
    cfg.consumer.give_up_after_ms = 2_000;
    // Records are accepted up to 900 kB, but the producer of this instance
    // takes messages of 3 kB at most: a 10 kB input is dead-lettered, and
    // its dead letter can never be sent.
    cfg.kafka.insert("message.max.bytes".into(), "3000".into());
    let mut pipeline = Pipeline::new(cfg.clone(), system_clock()).unwrap();
    let metrics = pipeline.metrics();
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    let run = std::thread::spawn(move || pipeline.run(&flag));
    let big = ProducerRecord {
        topic: cfg.topics.events.clone(),
        key: Some(b"cust-1".to_vec()),
        value: Some(vec![0x42; 10_000]),
        headers: Vec::new(),
    };
    let mut kafka = cfg.kafka.clone();
    kafka.remove("message.max.bytes");
    Publisher::new(&kafka, 1 << 20).unwrap().publish_all([(&big, None)]).unwrap();
    let started = Instant::now();
    let mut refused = None;
    while !run.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(60), "the pipeline kept retrying");
        if let Some(e) = metrics.readiness().publish_refused {
            assert!(!metrics.is_ready(), "ready while publishing is refused");
            refused = Some(e);
        }
        std::thread::sleep(Duration::from_millis(50)); // polling interval
    }
    let result = run.join().unwrap();
    shutdown.store(true, Ordering::SeqCst);
    let refused = refused.expect("readiness showed the refusal before the pipeline stopped");
    assert!(refused.contains("Message size too large") || refused.contains("MessageSizeTooLarge"), "{refused}");
    match result {
        Err(PipelineError::PublishRefused { seconds, source }) => {
            assert!(seconds >= 2 && !source.retriable(), "{seconds} s, {source}");
        }
        other => panic!("expected PublishRefused, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&cfg.state_dir);
}
