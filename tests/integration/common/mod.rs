//! Helpers for the integration tests against the real broker
//! (`KAFKA_BROKERS`, started by scripts/test.sh). Every test uses topics,
//! groups and state directories of its own.

#![allow(dead_code)]

pub mod check;
pub mod child;
pub mod http;
pub mod logs;
pub mod postgres;
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
