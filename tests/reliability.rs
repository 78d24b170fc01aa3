//! Reliability suites (issue 6): crashes at every crash point and at random,
//! broker bounces, rebalances with a zombie, poison input, and clocks. Each
//! checks the invariants I1–I4 of tests/common/check.rs against a reference
//! run over the same input log and prints its figures.
//!
//! The default run is short (a handful of iterations); `RELIABILITY_FULL=1`
//! runs the long variants (≥ 50 crash iterations). See RELIABILITY.md.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::check::{self, Figures};
use common::child::Instance;
use reconciler::config::Config;
use reconciler::core::Output;
use reconciler::demo;
use reconciler::faults::CRASH_POINTS;
use reconciler::pipeline::system_clock;

#[test]
#[ignore = "the child process of the suites (tests/common/child.rs)"]
fn child_instance() {
    common::child::child_main();
}

// The tests link the library with its crash points (the dev-dependency on
// the crate itself turns on `failpoints`).
const _: () = assert!(reconciler::faults::ARMED, "the crash points are compiled in");

fn full() -> bool {
    std::env::var("RELIABILITY_FULL").is_ok_and(|v| v == "1")
}

/// SplitMix64: the seeded choices of an iteration, reproducible from the
/// seed printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A workload run: its config (own topics, group, state), the config file
/// for child instances, and how many verdicts settle it.
struct Run {
    cfg: Config,
    dir: PathBuf,
    config_file: PathBuf,
    records: usize,
    verdicts: usize,
}

impl Run {
    /// Creates the topics and publishes `copies` copies of the demo workload.
    fn new(name: &str, copies: usize, batch_size: usize) -> Run {
        let mut cfg = common::config(name);
        demo::configure(&mut cfg);
        cfg.consumer.batch_size = batch_size;
        // Short windows, so that every timer of the workload fires within
        // seconds, and a short session, so that a killed member's partitions
        // move on quickly.
        cfg.time.reorder_window_ms = 2_000;
        cfg.kafka.insert("session.timeout.ms".into(), "6000".into());
        cfg.kafka.insert("heartbeat.interval.ms".into(), "1000".into());
        let start = (system_clock())();
        let records = demo::workload(start, copies);
        let (outputs, _) = demo::predict(&cfg, &records, start + 3_600_000);
        let verdicts = outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count();
        let t = &cfg.topics;
        reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
        demo::publish(&cfg, &records).unwrap();
        let dir = common::temp_dir(&format!("{name}-run"));
        let config_file = common::child::write_config(&cfg, &dir);
        Run { cfg, dir, config_file, records: records.len(), verdicts }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("reconciler.log")
    }

    fn spawn(&self, failpoints: Option<&str>) -> Instance {
        Instance::spawn(&self.config_file, None, failpoints, &self.log())
    }

    /// Distinct verdicts published so far.
    fn verdicts_so_far(&self) -> usize {
        let recs = check::read_all(&self.cfg, &[&self.cfg.topics.verdicts]);
        recs.iter().filter_map(|r| r.value.as_deref()).collect::<std::collections::HashSet<_>>().len()
    }

    /// Waits until at least `n` distinct verdicts were published.
    fn wait_verdicts(&self, n: usize, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.verdicts_so_far() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200)); // polling interval, not a wait for a condition
        }
        false
    }

    /// I4 with the instance running, then stops it and checks I1–I3.
    fn settle_and_check(&self, running: Vec<Instance>, state_dirs: &[&Path]) -> Figures {
        let settled = check::wait_settled(&self.cfg, self.verdicts, Duration::from_secs(120));
        let tails: Vec<String> = running.iter().map(Instance::log_tail).collect();
        for i in running {
            i.stop();
        }
        assert!(
            settled,
            "I4: lag did not return to zero with all {} verdicts; log:\n{}",
            self.verdicts,
            tails.join("\n--\n")
        );
        let input = check::read_all(&self.cfg, &[&self.cfg.topics.events]);
        let outputs = check::read_all(&self.cfg, &check::output_topics(&self.cfg));
        check::check(&self.cfg, &input, &outputs, state_dirs)
    }
}

/// Waits for a child to hit its crash point (it aborts).
fn wait_crash(i: &mut Instance, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if i.crashed() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50)); // polling interval
    }
    false
}

/// One seeded crash iteration. Scenario `seed % 7`: the six crash points
/// of src/faults.rs, then a random `kill -9`.
fn crash_iteration(seed: u64) -> Figures {
    let mut rng = Rng(seed);
    let copies = 4 + rng.below(if full() { 20 } else { 6 }) as usize;
    let batch_size = 10 + rng.below(90) as usize;
    let run = Run::new(&format!("crash{seed}"), copies, batch_size);
    let scenario = (seed % 7) as usize;
    let mut crashes = 0;
    let crash_with = |spec: String, crashes: &mut usize| {
        let mut i = run.spawn(Some(&spec));
        assert!(
            wait_crash(&mut i, Duration::from_secs(90)),
            "seed {seed}: {spec} never crashed; log:\n{}",
            i.log_tail()
        );
        *crashes += 1;
    };
    match scenario {
        0 => crash_with(format!("{}={}*off->return", CRASH_POINTS[0], rng.below(run.records as u64 / 2)), &mut crashes),
        1 | 2 => crash_with(format!("{}={}*off->return", CRASH_POINTS[scenario], rng.below(4)), &mut crashes),
        3 => crash_with(format!("{}={}*off->return", CRASH_POINTS[3], rng.below(2)), &mut crashes),
        4 => {
            // Leave an outbox behind, then crash while re-publishing it.
            crash_with(format!("{}={}*off->return", CRASH_POINTS[1], rng.below(3)), &mut crashes);
            crash_with(format!("{}=return", CRASH_POINTS[4]), &mut crashes);
        }
        5 => {
            // The state directory is lost after a crash: the instance
            // restores from the log up to the group's committed offset
            // without publishing, and crashes half-way through that.
            let mut i = run.spawn(None);
            assert!(run.wait_verdicts(run.verdicts / 2, Duration::from_secs(90)), "seed {seed}: no progress");
            assert!(i.exited().is_none());
            i.kill9();
            crashes += 1;
            std::fs::remove_dir_all(&run.cfg.state_dir).unwrap();
            crash_with(format!("{}={}*off->return", CRASH_POINTS[5], rng.below(20)), &mut crashes);
        }
        _ => {
            // kill -9 at a random moment, twice.
            for round in 0..2 {
                let i = run.spawn(None);
                let target = (run.verdicts as u64 * (round + 1) / 3).max(1);
                let target = rng.below(target) as usize + 1;
                assert!(run.wait_verdicts(target, Duration::from_secs(90)), "seed {seed}: no progress");
                std::thread::sleep(Duration::from_millis(rng.below(300))); // a random moment
                i.kill9();
                crashes += 1;
            }
        }
    }
    let survivor = run.spawn(None);
    let mut f = run.settle_and_check(vec![survivor], &[&run.cfg.state_dir]);
    f.iterations = 1;
    f.crashes = crashes;
    println!("  seed {seed}: scenario {scenario}, {} records, batch {batch_size}, {crashes} crashes, {} outputs ({} byte-identical repeats)", run.records, f.outputs, f.duplicates);
    f
}

#[test]
fn crash_suite_loses_nothing_and_repeats_only_byte_identical_outputs() {
    let _serial = common::serial();
    let iterations = if full() { 56 } else { 7 };
    let base: u64 = std::env::var("RELIABILITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut total = Figures::default();
    for seed in base..base + iterations {
        total.add(&crash_iteration(seed));
    }
    total.print("crash suite");
    assert_eq!((total.losses, total.divergent), (0, 0));
    assert_eq!(total.iterations as u64, iterations);
}
