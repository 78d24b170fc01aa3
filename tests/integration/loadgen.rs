//! A fault-injected loadgen workload through the real pipeline and broker,
//! checked by the same code as `reconciler loadgen verify`.

use std::time::Duration;

use reconciler::clock::system_clock;
use reconciler::loadgen::{self, Faults, Generator, Options};

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
