//! The operator's tools against a real broker and a real run: explain shows
//! duplicates and out-of-order arrivals with their offsets, resolve moves a
//! case out of review through the log (and refuses what the core would
//! refuse), replay reproduces the live state digest and verdicts, and a
//! dead letter re-driven after a fix is processed.

use crate::common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, Running};
use reconciler::clock::{system_clock, Clock};
use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::event::{Body, Event, Requested};
use reconciler::core::{Disposition, Output, Status};
use reconciler::demo;
use reconciler::kafka::producer::Publisher;
use reconciler::kafka::reader::{read_to_end, watermarks, TopicReader};
use reconciler::operator::commands::open_view;
use reconciler::operator::dlq::{self, DlqFilter};
use reconciler::operator::replay::{self, ReplayOptions};
use reconciler::operator::{explain, review, state_digest, ReviewFilter};
use reconciler::records::ProducerRecord;
use reconciler::store::Store;

fn now() -> i64 {
    (system_clock())()
}

/// The binary with `cfg`'s topics, state directory and broker.
fn cli(cfg: &Config, args: &[&str]) -> (bool, String, String) {
    cli_env(cfg, &[], args)
}

/// [`cli`] with more environment variables (`FAILPOINTS` to crash it).
fn cli_env(cfg: &Config, vars: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let t = &cfg.topics;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reconciler"));
    cmd.envs(vars.iter().copied());
    // The same policy as the run: a replay under another one decides otherwise.
    for (ty, tc) in &cfg.types {
        if let Some(ms) = tc.confirm_within_ms {
            cmd.env(format!("RECONCILER_TYPES__{}__CONFIRM_WITHIN_MS", ty.to_uppercase()), ms.to_string());
        }
    }
    let out = cmd
        .args(["--brokers", &common::brokers()])
        .args(args)
        .env("RECONCILER_STATE_DIR", &cfg.state_dir)
        .env("RECONCILER_TOPICS__EVENTS", &t.events)
        .env("RECONCILER_TOPICS__VERDICTS", &t.verdicts)
        .env("RECONCILER_TOPICS__ANOMALIES", &t.anomalies)
        .env("RECONCILER_TOPICS__DLQ", &t.dlq)
        .env("RECONCILER_TOPICS__COMMANDS", &t.commands)
        .env("RECONCILER_CONSUMER__MAX_RECORD_BYTES", cfg.consumer.max_record_bytes.to_string())
        .env("RECONCILER_SECURITY__CONTROL_KEYS", format!("[{:?}]", common::CONTROL_KEY))
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A wall clock that can be stopped: once frozen no new deadline comes
/// due, so a run can be brought to a point where its log is complete.
fn freezable() -> (Clock, Arc<AtomicI64>) {
    let frozen = Arc::new(AtomicI64::new(0));
    let f = frozen.clone();
    let clock: Clock = Arc::new(move || match f.load(Ordering::SeqCst) {
        0 => now(),
        at => at,
    });
    (clock, frozen)
}

/// Waits until the running instance's store has applied everything in the
/// input topic (read through a secondary view while it runs).
fn wait_applied_to_end(cfg: &Config, within: Duration) -> bool {
    let until = Instant::now() + within;
    let view = open_view(cfg).unwrap();
    while Instant::now() < until {
        view.store.catch_up().unwrap();
        let marks = watermarks(&cfg.kafka, &cfg.topics.events).unwrap();
        if marks.iter().all(|(p, (_, high))| view.store.next_offset(*p).unwrap().unwrap_or(0) >= *high) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Runs the demo workload (one copy) live until every predicted verdict is
/// out, then freezes the clock and waits until the store applied the whole
/// log. Returns the running instance, the clock freezer and the outputs.
fn settled_demo_run(cfg: &Config) -> (Running, Vec<Output>) {
    let start = now();
    let records = demo::workload(start, 1);
    let (outputs, _) = demo::predict(cfg, &records, start + 3_600_000);
    let n_verdicts = outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count();
    let (clock, frozen) = freezable();
    let running = Running::start(cfg, clock);
    demo::publish(cfg, &records).unwrap();
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.verdicts], 3).unwrap();
    let ok = reader.read_until(Duration::from_secs(60), |recs| recs.len() >= n_verdicts);
    assert!(ok, "the live run did not settle");
    frozen.store(now(), Ordering::SeqCst);
    assert!(wait_applied_to_end(cfg, Duration::from_secs(30)), "the store did not apply the whole log");
    (running, outputs)
}

#[test]
fn explain_review_and_resolve_on_a_live_run() {
    let _serial = common::serial();
    let mut cfg = config("explain");
    demo::configure(&mut cfg);
    let (running, _) = settled_demo_run(&cfg);
    let codec = Codec::new();
    let anomalies: Vec<_> = read_to_end(&cfg.kafka, &cfg.topics.anomalies, Duration::from_secs(30))
        .unwrap()
        .into_iter()
        .map(|r| codec.decode_anomaly(r.value.as_deref().unwrap()).unwrap())
        .collect();
    let anomaly = |op: &str, kind: &str| {
        anomalies
            .iter()
            .find(|a| a.operation_id == op && a.kind.as_str() == kind)
            .unwrap_or_else(|| panic!("{kind} for {op}"))
    };
    // Read beside the running pipeline (RocksDB secondary instance).
    let view = open_view(&cfg).unwrap();

    // A redelivered event: two arrivals, the second flagged, at the offset
    // the anomaly names.
    let x = explain(&view.store, "redelivered-0").unwrap().expect("known");
    let dup = anomaly("redelivered-0", "DUPLICATE_DELIVERY");
    let arrivals: Vec<_> = x.timeline.iter().filter(|r| r.entry.event_id == "redelivered-0-e0").collect();
    assert_eq!(arrivals.len(), 2, "{:#?}", x.timeline);
    assert_eq!(
        (arrivals[0].delivery, arrivals[0].deliveries, arrivals[0].entry.disposition),
        (1, 2, Disposition::Applied)
    );
    assert_eq!((arrivals[1].delivery, arrivals[1].entry.disposition), (2, Disposition::Duplicate));
    assert_eq!((arrivals[1].entry.partition, arrivals[1].entry.offset), (dup.source_partition, dup.source_offset));
    assert!(arrivals[0].entry.offset < arrivals[1].entry.offset);
    assert!(x.timeline.windows(2).all(|w| w[0].entry.offset < w[1].entry.offset), "arrival order");

    // An out-of-order revision: held at its offset, applied once the gap filled.
    let x = explain(&view.store, "reordered-0").unwrap().expect("known");
    let ooo = anomaly("reordered-0", "OUT_OF_ORDER");
    let held = x.timeline.iter().find(|r| r.entry.event_id == "reordered-0-e2").unwrap();
    assert_eq!(held.entry.disposition, Disposition::Held);
    assert!(!held.still_held);
    assert_eq!((held.entry.partition, held.entry.offset), (ooo.source_partition, ooo.source_offset));
    let filler = x.timeline.iter().find(|r| r.entry.event_id == "reordered-0-e1").unwrap();
    assert!(filler.entry.offset > held.entry.offset);
    assert_eq!(filler.entry.verdicts.first().map(|v| v.outcome.as_str()), Some("CORRECT"));
    assert_eq!(x.state, Status::Confirmed);
    let (ok, text, err) = cli(&cfg, &["explain", "reordered-0"]);
    assert!(ok, "{err}");
    assert!(text.contains("held, applied later") && text.contains("OUT_OF_ORDER"), "{text}");
    let (ok, text, _) = cli(&cfg, &["explain", "redelivered-0", "--json"]);
    assert!(ok);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["timeline"][1]["deliveries"], 2, "{json:#}");

    // The review queue holds the divergent case; the CLI lists it too.
    let queue = review(&view.store, &ReviewFilter::default(), now()).unwrap();
    assert!(queue.windows(2).all(|w| w[0].since <= w[1].since), "oldest first");
    let case = queue.iter().find(|i| i.operation_id == "divergent-0").expect("divergent case in review");
    assert_eq!(case.outcome.map(|o| o.as_str()), Some("DIVERGENT"));
    let (ok, text, _) = cli(&cfg, &["review", "--type", "sync_customer"]);
    assert!(ok && text.contains("divergent-0") && !text.contains("invoice-silent-0"), "{text}");
    let (ok, text, _) = cli(&cfg, &["review", "--older-than", "3d"]);
    assert!(ok && text.contains("No case matches these filters"), "{text}");

    // Refused as the core would refuse it: nothing published.
    let before = watermarks(&cfg.kafka, &cfg.topics.events).unwrap();
    let (ok, _, err) =
        cli(&cfg, &["resolve", "divergent-0", "--decision", "compensate", "--actor", "ana", "--note", "undo it"]);
    assert!(!ok && err.contains("refused") && err.contains("DUPLICATE_EFFECT"), "{err}");
    let (ok, _, err) = cli(&cfg, &["resolve", "ok-0", "--decision", "confirm", "--actor", "ana", "--note", "fine"]);
    assert!(!ok && err.contains("in state CONFIRMED"), "{err}");
    assert_eq!(watermarks(&cfg.kafka, &cfg.topics.events).unwrap(), before, "a refused decision publishes nothing");

    // Accepted: published to the log, applied by the pipeline.
    let (ok, text, err) = cli(
        &cfg,
        &[
            "resolve",
            "divergent-0",
            "--decision",
            "confirm",
            "--actor",
            "ana",
            "--note",
            "CRM shows v8 on purpose",
            "--evidence-checked",
            "crm record",
        ],
    );
    assert!(ok, "{err}");
    assert!(text.contains("Published CONFIRM"), "{text}");
    let until = Instant::now() + Duration::from_secs(30);
    let x = loop {
        view.store.catch_up().unwrap();
        let x = explain(&view.store, "divergent-0").unwrap().unwrap();
        if x.state != Status::ManualReview || Instant::now() > until {
            break x;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    running.stop();
    assert_eq!(x.state, Status::Confirmed);
    let last = x.timeline.last().unwrap();
    let m = last.entry.manual.as_ref().expect("the decision is in the timeline");
    assert_eq!((m.actor.as_str(), m.note.as_str()), ("ana", "CRM shows v8 on purpose"));
    assert_eq!(m.evidence_checked, vec!["crm record".to_owned()]);
    assert_eq!(last.entry.verdicts[0].outcome.as_str(), "CORRECT");
    assert!(review(&view.store, &ReviewFilter::default(), now())
        .unwrap()
        .iter()
        .all(|i| i.operation_id != "divergent-0"));
}

#[test]
fn replay_reproduces_the_live_state_digest_and_verdicts() {
    let _serial = common::serial();
    let mut cfg = config("replay-digest");
    demo::configure(&mut cfg);
    let (running, _) = settled_demo_run(&cfg);
    running.stop();
    let live = {
        let store = Store::open(&cfg.state_dir, &cfg.topics.events, false).unwrap();
        state_digest(&store).unwrap()
    };
    let opts = ReplayOptions {
        state_dir: common::temp_dir("replayed").join("state"),
        output_prefix: Some(common::unique("scratch")),
        diff: true,
    };
    let mut reports = 0;
    let summary = replay::replay(&cfg, &opts, &AtomicBool::new(false), |_| reports += 1).unwrap();
    assert!(reports > 0);
    assert_eq!(summary.digest, live, "replayed state differs from the live state");
    let diff = summary.diff.unwrap();
    assert!(diff.live > 0);
    assert_eq!((diff.equal, diff.differing, diff.missing, diff.extra), (diff.live, 0, 0, 0), "{diff:?}");
    assert_eq!(summary.verdicts as usize, diff.live);
    assert!(summary.dead_letters > 0 && summary.anomalies > 0);

    // Without scratch topics the outputs are dropped, and --diff is refused.
    let bad = ReplayOptions { state_dir: common::temp_dir("replayed2").join("s"), output_prefix: None, diff: true };
    let err = replay::replay(&cfg, &bad, &AtomicBool::new(false), |_| {}).unwrap_err();
    assert!(err.to_string().contains("--diff needs --output-prefix"), "{err}");
    let (ok, text, err) =
        cli(&cfg, &["replay", "--state-dir", common::temp_dir("replayed3").join("s").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(text.contains(&live.digest) && text.contains("discarded"), "{text}");
    // A used directory is refused.
    let (ok, _, err) = cli(&cfg, &["replay", "--state-dir", cfg.state_dir.to_str().unwrap()]);
    assert!(!ok && err.contains("not empty"), "{err}");
}

#[test]
fn an_oversize_dead_letter_redriven_after_a_larger_limit_is_processed() {
    let _serial = common::serial();
    let mut cfg = config("redrive");
    cfg.consumer.max_record_bytes = 2_000;
    let running = Running::start(&cfg, system_clock());
    let codec = Codec::new();
    let t = now();
    let ev = |id: &str, seq, body| Event {
        event_id: id.into(),
        operation_id: "op-big".into(),
        entity_id: "cust-big".into(),
        operation_type: "sync_customer".into(),
        seq: Some(seq),
        occurred_at: t,
        producer: "test".into(),
        body,
    };
    let requested =
        ev("b1", 1, Body::Requested(Requested { idempotent: true, destination: "crm".into(), ..Default::default() }));
    let cancelled = ev("b2", 2, Body::Cancelled { reason: "customer deleted".into() });
    let rec = |e: &Event, headers| ProducerRecord {
        topic: cfg.topics.events.clone(),
        key: Some(b"cust-big".to_vec()),
        value: Some(codec.encode_event(e).unwrap()),
        headers,
    };
    // The cancellation carries a 3 kB trace header: over the 2 kB limit.
    let trace = ("trace".to_owned(), Some(vec![b't'; 3_000]));
    let publisher = Publisher::new(&cfg.kafka, 100_000).unwrap();
    publisher.publish_all([(&rec(&requested, vec![]), None), (&rec(&cancelled, vec![trace.clone()]), None)]).unwrap();
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.dlq], 3).unwrap();
    assert!(reader.read_until(Duration::from_secs(30), |r| !r.is_empty()), "no dead letter");
    running.stop();

    let letters = dlq::inspect(&cfg.kafka, &cfg.topics, &DlqFilter::default()).unwrap();
    assert_eq!(letters.len(), 1);
    let d = &letters[0];
    assert_eq!(d.class, "oversize");
    assert_eq!(d.source.topic, cfg.topics.events);
    let input = read_to_end(&cfg.kafka, &cfg.topics.events, Duration::from_secs(30)).unwrap();
    let original = input.iter().find(|r| r.headers.contains(&trace)).unwrap();
    assert_eq!((d.source.partition, d.source.offset), (Some(original.partition), Some(original.offset)));
    assert_eq!(d.headers, vec![("trace".to_owned(), Some("t".repeat(3_000)))]);
    assert!(d.message.contains("exceeds the limit of 2000 bytes"), "{}", d.message);
    let (ok, text, _) = cli(&cfg, &["dlq", "inspect", "--class", "oversize"]);
    assert!(
        ok && text.contains("oversize") && text.contains(&format!("{}/{}", cfg.topics.events, original.partition)),
        "{text}"
    );

    // The fix: a larger limit, then a restart.
    cfg.consumer.max_record_bytes = 10_000;
    let running = Running::start(&cfg, system_clock());
    let (ok, text, err) = cli(&cfg, &["dlq", "redrive", "--class", "oversize", "--dry-run"]);
    assert!(ok && text.contains("would re-drive") && text.contains("dry run"), "{text}{err}");
    assert_eq!(read_to_end(&cfg.kafka, &cfg.topics.events, Duration::from_secs(30)).unwrap().len(), input.len());
    let (ok, _, err) = cli(&cfg, &["dlq", "redrive"]);
    assert!(!ok && err.contains("choose what to re-drive"), "{err}");
    let position = format!("{}:{}", d.partition, d.offset);
    // A position that is not there (a typo) sends nothing, not even the good one.
    let (ok, _, err) = cli(&cfg, &["dlq", "redrive", "--offset", &position, "--offset", "0:999", "--actor", "ana"]);
    assert!(!ok && err.contains("no dead letter at 0:999"), "{err}");
    let (ok, _, err) = cli(&cfg, &["dlq", "inspect", "--class", "oversized"]);
    assert!(!ok && err.contains("unknown error class"), "{err}");
    assert_eq!(read_to_end(&cfg.kafka, &cfg.topics.events, Duration::from_secs(30)).unwrap().len(), input.len());
    // A re-drive killed after the record was published and before the
    // audit says so: the dead letter is not offered again as new, and
    // only a re-drive by position sends it again.
    let (ok, _, err) = cli_env(
        &cfg,
        &[("FAILPOINTS", "dlq::redriven=return")],
        &["dlq", "redrive", "--class", "oversize", "--actor", "ana", "--note", "limit raised"],
    );
    assert!(!ok && err.contains("crash point dlq::redriven reached"), "{err}");
    let (ok, text, _) = cli(&cfg, &["dlq", "inspect", "--class", "oversize"]);
    assert!(ok && text.contains("No dead letters match"), "{text}");
    let (ok, text, _) = cli(&cfg, &["dlq", "inspect", "--all"]);
    assert!(ok && text.contains("cut short") && text.contains(&format!("--offset {position}")), "{text}");
    let (ok, text, err) = cli(&cfg, &["dlq", "redrive", "--class", "oversize", "--actor", "ana"]);
    assert!(ok && text.contains("0 re-driven"), "{text}{err}");
    let (ok, text, err) =
        cli(&cfg, &["dlq", "redrive", "--offset", &position, "--actor", "ana", "--note", "limit raised"]);
    assert!(ok && text.contains("1 re-driven"), "{text}{err}");
    // Audited, and not offered again: inspect hides it, a second re-drive
    // of the class finds nothing, and naming it says who re-drove it.
    let (ok, text, _) = cli(&cfg, &["dlq", "inspect", "--class", "oversize"]);
    assert!(ok && text.contains("No dead letters match"), "{text}");
    let (ok, text, _) = cli(&cfg, &["dlq", "inspect", "--all"]);
    assert!(ok && text.contains("re-driven by ana") && text.contains("limit raised"), "{text}");
    let (ok, text, err) = cli(&cfg, &["dlq", "redrive", "--class", "oversize", "--actor", "ana"]);
    assert!(ok && text.contains("0 re-driven"), "{text}{err}");
    let (ok, text, err) = cli(&cfg, &["dlq", "redrive", "--offset", &position, "--actor", "bo"]);
    assert!(ok && text.contains("already re-driven by ana") && text.contains("0 re-driven"), "{text}{err}");
    let audit = dlq::audits(&cfg.kafka, &cfg.topics.dlq_audit().unwrap()).unwrap();
    let a = &audit[&dlq::position(&cfg.topics.dlq, d.partition, d.offset)];
    assert_eq!((a.actor.as_str(), a.note.as_str(), a.class.as_str()), ("ana", "limit raised", "oversize"));
    assert_eq!((a.to_topic.as_str(), a.to_partition), (cfg.topics.events.as_str(), Some(original.partition)));

    // Both copies reached the input: the first is processed, the second
    // is recognised as the same event delivered again.
    let mut anomalies = TopicReader::new(&cfg.kafka, &[&cfg.topics.anomalies], 3).unwrap();
    let duplicate = |r: &[reconciler::records::Record]| {
        r.iter().any(|r| codec.decode_anomaly(r.value.as_deref().unwrap()).unwrap().event_id == "b2")
    };
    let got = anomalies.read_until(Duration::from_secs(30), |r| duplicate(r));
    assert!(got, "the second copy was not recognised");
    assert!(wait_applied_to_end(&cfg, Duration::from_secs(30)), "the pipeline did not reach the end of the input");
    running.stop();
    let a = anomalies
        .records
        .iter()
        .map(|r| codec.decode_anomaly(r.value.as_deref().unwrap()).unwrap())
        .find(|a| a.event_id == "b2")
        .unwrap();
    assert_eq!((a.kind.as_str(), a.operation_id.as_str()), ("DUPLICATE_DELIVERY", "op-big"));
    let verdicts = read_to_end(&cfg.kafka, &cfg.topics.verdicts, Duration::from_secs(30)).unwrap();
    assert_eq!(verdicts.len(), 1, "one verdict, whatever the number of copies");
    let v = codec.decode_verdict(verdicts[0].value.as_deref().unwrap()).unwrap();
    assert_eq!((v.operation_id.as_str(), v.outcome.as_str()), ("op-big", "NOT_APPLICABLE"));
    // In the log: unchanged key, value and headers, plus where it came from.
    let input = read_to_end(&cfg.kafka, &cfg.topics.events, Duration::from_secs(30)).unwrap();
    let copies: Vec<_> = input.iter().filter(|r| r.headers.iter().any(|(k, _)| k == dlq::REDRIVEN_FROM)).collect();
    assert_eq!(copies.len(), 2, "the cut-short re-drive and its repeat");
    let from = format!("{}/{}/{}", cfg.topics.dlq, d.partition, d.offset).into_bytes();
    for c in &copies {
        assert_eq!((&c.key, &c.value), (&original.key, &original.value));
        assert_eq!(c.headers, vec![trace.clone(), (dlq::REDRIVEN_FROM.to_owned(), Some(from.clone()))]);
    }
    // The story: the request, the first copy taken in, the second seen as
    // a duplicate.
    let store = Store::open(&cfg.state_dir, &cfg.topics.events, false).unwrap();
    let x = explain(&store, "op-big").unwrap().unwrap();
    let story: Vec<(i64, &str, Disposition)> =
        x.timeline.iter().map(|r| (r.entry.offset, r.entry.body.as_str(), r.entry.disposition)).collect();
    assert_eq!(
        story[1..],
        [
            (copies[0].offset, "Cancelled", Disposition::Applied),
            (copies[1].offset, "Cancelled", Disposition::Duplicate)
        ],
        "{story:?}"
    );
    assert_eq!(story[0].1, "Requested");
}
