//! The probe worker's throughput and cost per probe, per destination kind,
//! against a real broker: PROBE_COMMANDS (20,000 by default) PROBE commands
//! are published to a fresh commands topic, then the release binary's
//! `reconciler probe` answers them, querying
//!
//! 1. the loadgen destination service over HTTP (every key present), and
//! 2. a throw-away PostgreSQL cluster (a table with one row per key).
//!
//! Reported per destination: wall time from the worker's start to the last
//! answer on the input topic, probes/s, the worker's CPU seconds (user +
//! system, from /proc) and CPU per probe, and its peak RSS. The
//! destinations run in this process (HTTP) or their own (PostgreSQL), so
//! their CPU is not counted.
//!
//!   KAFKA_BROKERS=127.0.0.1:9092 cargo bench --bench probe
//!
//! Other knobs: PROBE_CONCURRENCY (queries in flight per destination, 16),
//! PROBE_BIN (default: the release binary cargo built for the bench).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reconciler::config::{Config, DestinationConfig, DestinationKind, Topics};
use reconciler::kafka::admin;
use reconciler::kafka::producer::Publisher;
use reconciler::kafka::reader::TopicReader;
use reconciler::loadgen::destination::{probe_commands, DestinationServer, Held};

#[path = "../tests/integration/common/postgres.rs"]
mod postgres;
#[path = "support/proc_stats.rs"]
mod proc_stats;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn binary() -> PathBuf {
    if let Ok(b) = std::env::var("PROBE_BIN") {
        return b.into();
    }
    PathBuf::from(env!("CARGO_BIN_EXE_reconciler"))
}

/// Publishes `n` PROBE commands to `name`, keys `key-0` .. `key-{n-1}`.
fn publish_commands(cfg: &Config, name: &str, n: usize) {
    let records = probe_commands(&cfg.topics.commands, name, &format!("{name}-"), n);
    Publisher::new(&cfg.kafka, 1 << 20).unwrap().publish_all(records.iter().map(|r| (r, None))).unwrap();
}

/// Runs `reconciler probe` on `cfg` until `n` answers are on the input
/// topic; prints and returns (probes/s, CPU ms per probe).
fn measure(cfg: &Config, name: &str, n: usize) -> (f64, f64) {
    let dir = std::env::temp_dir().join(format!("probe-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reconciler.toml");
    std::fs::write(&file, toml::to_string(cfg).unwrap()).unwrap();
    let ticks = proc_stats::clock_ticks();
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions).unwrap();
    let start = Instant::now();
    let mut child = Command::new(binary())
        .arg("--config")
        .arg(&file)
        .arg("probe")
        .env("RECONCILER_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("the release binary runs");
    let mut last = proc_stats::ProcSample::default();
    let until = start + Duration::from_secs(600);
    while reader.records.len() < n {
        assert!(Instant::now() < until, "{name}: only {} of {n} answers", reader.records.len());
        reader.read_until(Duration::from_millis(100), |r| r.len() >= n);
        if let Some(s) = proc_stats::sample(child.id(), ticks) {
            last = s;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    if let Some(s) = proc_stats::sample(child.id(), ticks) {
        last = s;
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let rate = n as f64 / wall;
    let cpu_ms = last.cpu_s * 1000.0 / n as f64;
    println!(
        "{name:<10} {n} probes in {wall:.2} s = {rate:.0} probes/s; worker CPU {:.2} s = {cpu_ms:.3} ms per probe; peak RSS {:.0} MB",
        last.cpu_s, last.peak_rss_mb
    );
    (rate, cpu_ms)
}

fn main() {
    let brokers = env_or("KAFKA_BROKERS", "127.0.0.1:9092".to_owned());
    let n: usize = env_or("PROBE_COMMANDS", 20_000);
    let concurrency: usize = env_or("PROBE_CONCURRENCY", 16);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let held: HashMap<String, Held> =
        (0..n).map(|i| (format!("key-{i}"), Held::Present { remote_id: format!("r-{i}"), version: 7 })).collect();
    let http = DestinationServer::start(held).unwrap();
    let pg = postgres::PgCluster::start();
    pg.execute(&format!(
        "CREATE TABLE effects (key text PRIMARY KEY, remote_id bigint, version bigint);
         INSERT INTO effects SELECT 'key-' || i, i, 7 FROM generate_series(0, {}) AS i;",
        n - 1
    ));
    std::env::set_var("PROBE_BENCH_PG", pg.connection());
    println!("probe worker bench: {n} PROBE commands per destination, {concurrency} queries in flight per destination");
    for (name, kind) in [("http", DestinationKind::Http), ("postgres", DestinationKind::Postgres)] {
        let prefix = format!("probe-bench-{name}-{nanos}");
        let mut cfg = Config::default();
        cfg.kafka.insert("bootstrap.servers".into(), brokers.clone());
        cfg.kafka.insert("receive.message.max.bytes".into(), "100000000".into());
        cfg.topics = Topics::named(&prefix, 6);
        cfg.probe.group_id = format!("{prefix}.probe");
        cfg.probe.state_dir = std::env::temp_dir().join(format!("{prefix}-ledger"));
        cfg.probe.bind = "off".into();
        let d = match kind {
            DestinationKind::Http => http.destination(),
            DestinationKind::Postgres => DestinationConfig::postgres(
                "PROBE_BENCH_PG",
                "SELECT remote_id, version FROM effects WHERE key = $1",
                &["idempotency_key"],
            ),
        };
        // A slow answer is not a failure here, and nothing opens a circuit.
        let d = DestinationConfig { timeout_ms: 5_000, concurrency, failure_threshold: 50, open_for_ms: 1_000, ..d };
        cfg.destinations.insert(name.into(), d);
        let t = &cfg.topics;
        admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
        publish_commands(&cfg, name, n);
        measure(&cfg, name, n);
        let _ = std::fs::remove_dir_all(&cfg.probe.state_dir);
    }
}
