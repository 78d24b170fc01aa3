//! Helpers for the integration tests against the real broker
//! (`KAFKA_BROKERS`, started by scripts/test.sh). Every test uses topics,
//! groups and state directories of its own.

#![allow(dead_code)]

pub mod binary;
pub mod check;
pub mod child;
pub mod http;
pub mod logs;
pub mod postgres;
pub mod proxy;
pub mod run;
pub mod tls;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use reconciler::clock::Clock;
use reconciler::config::Config;
use reconciler::pipeline::{Pipeline, Stats};

/// Broker tests run one at a time: they measure wall-clock deadlines and
/// kill processes, and the machine has two cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Polls `cond` every 50 ms until it holds or `limit` passes; whether it
/// held.
pub fn wait_for(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50)); // polling interval
    }
    cond()
}

/// A TCP port of 127.0.0.1 free when asked (the system's choice).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A name no other test (or earlier run) uses.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The control key of every test config (issue 18): the instances, the
/// operator tools and loadgen all sign and verify with it.
pub const CONTROL_KEY: &str = "integration-tests-control-key";

/// A config with its own topics, group and state directory.
pub fn config(name: &str) -> Config {
    let id = unique(name);
    let mut cfg = Config::default();
    cfg.kafka.insert("bootstrap.servers".into(), brokers());
    cfg.topics = reconciler::config::Topics::named(&id, 3);
    cfg.consumer.group_id = format!("{id}.group");
    cfg.consumer.batch_wait_ms = 20;
    cfg.state_dir = temp_dir(&format!("{name}-state"));
    cfg.security.control_keys = vec![CONTROL_KEY.into()];
    cfg
}

/// A pipeline running in a thread until `stop`.
pub struct Running {
    shutdown: Arc<AtomicBool>,
    handle: Option<JoinHandle<Stats>>,
}

impl Running {
    pub fn start(cfg: &Config, clock: Clock) -> Running {
        logs::capture();
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut p = Pipeline::new(cfg.clone(), clock).expect("pipeline starts");
        let flag = shutdown.clone();
        let handle = std::thread::spawn(move || {
            p.run(&flag).expect("pipeline runs");
            p.stats
        });
        Running { shutdown, handle: Some(handle) }
    }

    pub fn stop(mut self) -> Stats {
        self.shutdown.store(true, Ordering::SeqCst);
        self.handle.take().unwrap().join().expect("pipeline thread")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Distinct verdicts published so far, read as they come (one reader for
/// the whole test: reading the topic from the start at every poll would
/// load the broker).
pub struct VerdictCount {
    reader: reconciler::kafka::reader::TopicReader,
    distinct: std::collections::HashSet<Vec<u8>>,
}

impl VerdictCount {
    pub fn new(cfg: &Config) -> VerdictCount {
        let reader =
            reconciler::kafka::reader::TopicReader::new(&cfg.kafka, &[&cfg.topics.verdicts], cfg.topics.partitions)
                .unwrap();
        VerdictCount { reader, distinct: Default::default() }
    }

    /// Reads what arrived (for up to 300 ms) and returns the count.
    pub fn now(&mut self) -> usize {
        let before = self.reader.records.len();
        self.reader.read_until(std::time::Duration::from_millis(300), |r| r.len() >= before + 5_000);
        for r in self.reader.records.drain(..) {
            self.distinct.extend(r.value);
        }
        self.distinct.len()
    }
}

/// A loadgen workload with every fault but the probed story (it needs the
/// probe worker), published in event time now at `rate` records/s on a
/// thread of its own while the test injects its fault.
pub struct Paced {
    handle: Option<JoinHandle<(reconciler::loadgen::Published, reconciler::loadgen::truth::GroundTruth)>>,
    /// The ground truth, from a dry pass of the same (deterministic) generator.
    pub expected: reconciler::loadgen::truth::GroundTruth,
}

impl Paced {
    pub fn start(cfg: &Config, operations: u64, seed: u64, rate: u64) -> Paced {
        use reconciler::loadgen::{self, EventTime, Faults, Generator, Workload};
        let workload = Workload {
            operations,
            entities: None,
            seed,
            rate,
            event_time: EventTime::Now,
            confirm_within_ms: 3_000,
            truth: None,
            quiet: true,
            faults: Faults { probed: 0.0, ..Faults::uniform(0.045) },
        };
        let o = workload.options(cfg, (reconciler::clock::system_clock())()).unwrap();
        let mut dry = Generator::new(o.clone());
        dry.by_ref().for_each(drop);
        let expected = dry.into_truth();
        let cfg = cfg.clone();
        let handle = std::thread::spawn(move || loadgen::publish(&cfg, Generator::new(o), true, false).unwrap());
        Paced { handle: Some(handle), expected }
    }

    /// Whether every record was published.
    pub fn finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the last record; what was published and its ground truth.
    pub fn join(mut self) -> (reconciler::loadgen::Published, reconciler::loadgen::truth::GroundTruth) {
        let (published, truth) = self.handle.take().unwrap().join().expect("the publisher");
        assert_eq!(truth, self.expected, "the dry pass and the published workload are the same");
        (published, truth)
    }
}
