//! Bounded state: at a steady input rate, with event time
//! advancing, the store stops growing.
//!
//! Streams a loadgen workload (RETENTION_OPERATIONS, default 2,000,000, at
//! 1,000 operations per second of event time, with every fault at its
//! default rate) through the pipeline's own batch step ([`Applier`]) into
//! RocksDB, as `reconciler run` would with its timer wheel and an operator
//! working the review queue, both driven by the input's event time:
//! - after each batch, every timer due by the latest event time read is
//!   appended to the input as the wheel would publish it (a
//!   `DeadlineReached`), so overdue verdicts, follow-ups, reorder windows
//!   and retention all run;
//! - every RETENTION_REVIEW_EVERY batches (default 20) a person closes each
//!   case in MANUAL_REVIEW (a `ManualDecision` CLOSE): review cases are kept
//!   until decided, so without a person they would be the one thing that
//!   grows, by design.
//!
//! Confirmation windows are RETENTION_WINDOW_MS (default 10 s) and
//! retention RETENTION_MS (default 60 s), so that the steady state comes
//! after a few hundred thousand operations. Every RETENTION_REPORT
//! operations (default 200,000) it prints what the store holds, counted
//! key by key: operations (of which in review), entities, timers, timeline
//! entries; and RocksDB's estimate of its live data, its memtables, and the
//! bytes of its files on disk. The figures flatten once event time has passed the
//! longest life of an operation (its windows, follow-ups and retention).
//!
//!   cargo bench --bench retention
//!   RETENTION_OPERATIONS=5000000 cargo bench --bench retention

use std::collections::BTreeMap;
use std::time::Instant;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::event::{Body, Decision, Event};
use reconciler::core::Status;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::InputRecord;
use reconciler::records::Record;
use reconciler::records::{event_record, signed};
use reconciler::store::Store;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What the store holds, counted by reading it.
#[derive(Debug, Default)]
struct Held {
    operations: u64,
    in_review: u64,
    entities: u64,
    timers: u64,
    timeline: u64,
    /// Bytes of the store's files on disk.
    disk: u64,
}

fn held(store: &Store, dir: &std::path::Path, partitions: i32) -> Held {
    let mut h = Held::default();
    for p in 0..partitions {
        store
            .scan_ops(p, |op| {
                h.in_review += u64::from(op.status == Status::ManualReview);
                true
            })
            .unwrap();
    }
    let count = store.key_counts().unwrap();
    let keys = |family: &str| count.iter().find(|(f, _)| *f == family).map_or(0, |(_, n)| *n);
    h.operations = keys("ops");
    h.entities = keys("entities");
    h.timers = keys("timers");
    h.timeline = keys("timeline");
    h.disk = std::fs::read_dir(dir).map_or(0, |d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum());
    h
}

fn main() {
    // As the binary does first (src/main.rs), so the figures are the binary's.
    reconciler::process::disable_transparent_huge_pages().expect("prctl(PR_SET_THP_DISABLE)");
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let operations = env("RETENTION_OPERATIONS", 2_000_000);
    let window = env("RETENTION_WINDOW_MS", 10_000) as i64;
    let retention = env("RETENTION_MS", 60_000) as i64;
    let review_every = env("RETENTION_REVIEW_EVERY", 20).max(1);
    let report_every = env("RETENTION_REPORT", 200_000).max(1);
    let partitions = 6;
    let mut cfg = Config::default();
    cfg.time.retention_ms = retention;
    // Signed as the reconciler signs its timers and the operators their
    // decisions: the signature check is part of the measured work.
    cfg.security.control_keys = vec!["retention-bench-control-key".into()];
    let keys = cfg.security.loaded();
    let policy = cfg.policy();
    let codec = Codec::new();
    let dir = std::env::temp_dir().join(format!("reconciler-retention-{}", std::process::id()));
    let store = Store::open(&dir, "retention.events", false).unwrap();
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let applier = Applier { discard_outputs: true, ..Applier::new(&cfg, &store, &policy, &codec, &keys, &metrics) };
    let mut opts = Options::preload(operations, 17, 1_800_000_000_000);
    opts.confirm_within_ms = window;
    opts.entities = 100_000;
    opts.keep_verdicts = false;
    opts.policy = policy.clone();
    let start = opts.start_ms;
    let mut gen = Generator::new(opts);
    let mut topic = MemoryTopic::new(partitions);
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let mut stats = Stats::default();
    // Records the "wheel" and the "person" wrote, consumed with the next batch.
    let mut pending: Vec<Record> = Vec::new();
    let (mut event_time, mut batches, mut decisions, mut timers_fired) = (i64::MIN, 0u64, 0u64, 0u64);
    let mut next_report = report_every;
    let started = Instant::now();
    println!(
        "retention: {operations} operations at 1000/s of event time, windows {window} ms, retention {retention} ms"
    );
    println!(
        "{:>10} {:>8} {:>9} {:>7} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8}",
        "operations", "event s", "ops held", "review", "entities", "timers", "timeline", "live MB", "mem MB", "disk MB"
    );
    loop {
        let mut records = std::mem::take(&mut pending);
        for p in gen.by_ref().take(5_000) {
            if let InputRecord::Event(e) = &p.record {
                event_time = event_time.max(e.occurred_at);
            }
            records.push(topic.append(p.record.to_outbox(&codec, &keys, &cfg.topics.events).unwrap()));
        }
        if records.is_empty() {
            break;
        }
        let applied = applier.apply(&records, &mut next, &BTreeMap::new(), &mut stats).unwrap();
        let seqs = store.write_encoded(&applied.batch).unwrap();
        store.ack_outbox(seqs).unwrap();
        batches += 1;
        // The wheel: every timer due by the input's event time.
        for p in 0..partitions {
            for t in store.due_timers(p, event_time, usize::MAX).unwrap() {
                let ev = Event::deadline_reached(&t.operation_id, &t.entity_id, &t.operation_type, t.at);
                pending.push(topic.append(signed(event_record(&codec, &cfg.topics.events, &ev).unwrap(), &keys)));
                timers_fired += 1;
            }
        }
        // A person working the review queue.
        if batches % review_every == 0 {
            for p in 0..partitions {
                for op in store.ops_of(p).unwrap().into_iter().filter(|o| o.status == Status::ManualReview) {
                    decisions += 1;
                    let ev = Event {
                        event_id: format!("close-{decisions}"),
                        operation_id: op.operation_id,
                        entity_id: op.entity_id,
                        operation_type: op.operation_type,
                        seq: None,
                        occurred_at: event_time,
                        producer: "reviewer".into(),
                        body: Body::ManualDecision {
                            actor: "reviewer".into(),
                            decision: Decision::Close,
                            note: "worked the queue".into(),
                            evidence_checked: vec![],
                        },
                    };
                    pending.push(topic.append(signed(event_record(&codec, &cfg.topics.events, &ev).unwrap(), &keys)));
                }
            }
        }
        if gen.operations_made() >= next_report || gen.operations_made() >= operations && pending.is_empty() {
            next_report += report_every;
            let h = held(&store, &dir, partitions);
            let size = store.size().unwrap();
            let span_s = (event_time - start) as f64 / 1000.0;
            println!(
                "{:>10} {:>8.0} {:>9} {:>7} {:>9} {:>8} {:>9} {:>8.1} {:>8.1} {:>8.1}",
                gen.operations_made(),
                span_s,
                h.operations,
                h.in_review,
                h.entities,
                h.timers,
                h.timeline,
                size.live_file_bytes as f64 / 1e6,
                size.memtable_bytes as f64 / 1e6,
                h.disk as f64 / 1e6
            );
        }
    }
    println!(
        "{} records applied ({timers_fired} timer firings, {decisions} review decisions) in {:.1} s; {} verdicts",
        stats.records,
        started.elapsed().as_secs_f64(),
        stats.verdicts
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
