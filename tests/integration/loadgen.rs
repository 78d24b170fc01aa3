//! A fault-injected loadgen workload through the real pipeline and broker,
//! checked by the same code as `reconciler loadgen verify`.

use std::time::Duration;

use reconciler::clock::system_clock;
use reconciler::config::DestinationConfig;
use reconciler::loadgen::destination::DestinationServer;
use reconciler::loadgen::scenario::PROBED_DESTINATION;
use reconciler::loadgen::{self, EventTime, Faults, Generator, Options, Workload};
use reconciler::probe::ProbeWorker;

use crate::common;

/// A fault-injected workload through the real pipeline and broker, checked
/// by the same code as `reconciler loadgen verify`: 100% agreement.
#[test]
fn loadgen_run_verify_agrees_on_the_broker() {
    let _serial = common::serial();
    let cfg = common::config("loadgen");
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let ops = std::env::var("LOADGEN_TEST_OPERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000);
    let mut o = Options::preload(ops, 11, (system_clock())());
    o.faults = Faults::uniform(0.045);
    // The probed story needs the probe worker and event time now (below).
    o.faults.probed = 0.0;
    let (published, truth) = loadgen::publish(&cfg, Generator::new(o), false, false).unwrap();
    assert_eq!(published.records, truth.records);
    let running = common::Running::start(&cfg, system_clock());
    let report = loadgen::verify::verify(&cfg, &truth, Duration::from_secs(120), Duration::from_millis(1500)).unwrap();
    // Read while the pipeline still holds the store (a secondary instance).
    let untimed = loadgen::verify::untimed_in(&cfg, &cfg.state_dir).unwrap();
    running.stop();
    let _ = std::fs::remove_dir_all(&cfg.state_dir);
    assert!(report.complete && report.agrees(), "{}", report.render());
    assert!(truth.timer_verdicts > 0 && truth.dead_letters > 0);
    assert!(untimed.is_empty(), "open without a timer: {untimed:?}");
}

/// The probed story through the real pipeline, the probe worker and the
/// loadgen destination (HTTP), in event time now: every probe is answered
/// before its follow-up, and the outputs agree with the ground truth.
#[test]
fn loadgen_with_probes_verify_agrees_on_the_broker() {
    let _serial = common::serial();
    let ops = std::env::var("LOADGEN_PROBED_TEST_OPERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    probed_workload_agrees(common::config("loadgen-probed"), ops, Faults { probed: 0.2, ..Faults::default() });
}

/// A workload of `ops` operations with `faults` (some probed) through
/// `cfg`'s pipeline, probe worker and the loadgen destination: `loadgen
/// verify` agrees. Returns the ground truth.
pub fn probed_workload_agrees(
    mut cfg: reconciler::config::Config,
    ops: u64,
    faults: Faults,
) -> reconciler::loadgen::GroundTruth {
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let workload = Workload {
        operations: ops,
        entities: None,
        seed: 23,
        rate: 4_000,
        event_time: EventTime::Now,
        confirm_within_ms: 3_000,
        truth: None,
        quiet: true,
        faults,
    };
    let o = workload.options(&cfg, (system_clock())()).unwrap();
    // The destination serves what the truth says it holds: a dry pass of
    // the same (deterministic) generator gives it before publishing.
    let mut dry = Generator::new(o.clone());
    dry.by_ref().for_each(drop);
    let expected = dry.into_truth();
    let server = DestinationServer::start(expected.held()).unwrap();
    cfg.probe.group_id = common::unique("loadgen-probe");
    cfg.probe.state_dir = common::temp_dir("loadgen-probe-ledger");
    cfg.destinations
        .insert(PROBED_DESTINATION.into(), DestinationConfig { open_for_ms: 5_000, ..server.destination() });
    let running = common::Running::start(&cfg, system_clock());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut worker = ProbeWorker::new(cfg.clone(), &prometheus::Registry::new()).unwrap();
    let flag = stop.clone();
    let probe = std::thread::spawn(move || worker.run(&flag).unwrap());
    let (published, truth) = loadgen::publish(&cfg, Generator::new(o), true, false).unwrap();
    assert_eq!(truth, expected, "the dry pass and the published workload are the same");
    assert_eq!(published.records, truth.records);
    let report = loadgen::verify::verify(&cfg, &truth, Duration::from_secs(120), Duration::from_millis(1500)).unwrap();
    let untimed = loadgen::verify::untimed_in(&cfg, &cfg.state_dir).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    probe.join().unwrap();
    running.stop();
    let _ = std::fs::remove_dir_all(&cfg.state_dir);
    let probed = truth.stories.get("probed").copied().unwrap_or(0);
    println!("{ops} operations, {probed} probed, {} destination queries", server.total_queries());
    assert!(report.complete && report.agrees(), "{}", report.render());
    assert!(probed > 0 && server.total_queries() >= probed);
    assert!(untimed.is_empty(), "open without a timer: {untimed:?}");
    truth
}
