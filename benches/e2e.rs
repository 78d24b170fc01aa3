//! A first end-to-end throughput probe against a running broker (not the
//! full harness): preloads the demo workload into a fresh topic, then times
//! the pipeline from start until every verdict the core predicts is on the
//! verdict topic.
//!
//!   KAFKA_BROKERS=127.0.0.1:9092 E2E_COPIES=2000 cargo bench --bench e2e
//!
//! (start the broker with scripts/broker.sh start sqlite|memory).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reconciler::config::Config;
use reconciler::core::Output;
use reconciler::demo::{self, DemoRecord};
use reconciler::kafka::admin;
use reconciler::kafka::reader::TopicReader;
use reconciler::pipeline::{system_clock, Pipeline};

fn main() {
    tracing_subscriber::fmt().with_env_filter(std::env::var("RECONCILER_LOG").unwrap_or_else(|_| "warn".into())).init();
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let copies: usize = std::env::var("E2E_COPIES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let id = format!("e2e-{}", std::process::id());
    let mut cfg = Config::default();
    cfg.kafka.insert("bootstrap.servers".into(), brokers);
    cfg.topics = reconciler::config::Topics::named(&id, 3);
    cfg.consumer.group_id = format!("{id}.group");
    cfg.state_dir = std::env::temp_dir().join(&id);

    let start = (system_clock())();
    let records = demo::workload(start, copies);
    // Default 5-minute windows: no deadline passes during the run.
    let (outputs, _) = demo::predict(&cfg, &records, start);
    let want = outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count();
    let t = cfg.topics.clone();
    admin::ensure_topics(&cfg.kafka, &t.all(), 3, 1).unwrap();
    let load = Instant::now();
    demo::publish(&cfg, &records).unwrap();
    let load = load.elapsed();
    let events = records.iter().filter(|r| matches!(r, DemoRecord::Event(_))).count();
    println!("preloaded {} records ({events} events) in {load:?}", records.len());

    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts], 3).unwrap();
    let shutdown = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let mut p = Pipeline::new(cfg.clone(), system_clock()).unwrap();
    let flag = shutdown.clone();
    let worker = std::thread::spawn(move || {
        p.run(&flag).unwrap();
        p.stats
    });
    let ok = reader.read_until(Duration::from_secs(600), |recs| recs.len() >= want);
    let elapsed = began.elapsed();
    shutdown.store(true, Ordering::SeqCst);
    let stats = worker.join().unwrap();
    let _ = std::fs::remove_dir_all(&cfg.state_dir);
    assert!(ok, "only {} of {want} verdicts arrived", reader.records.len());
    println!(
        "pipeline: {} records -> {want} verdicts in {:.2} s = {:.0} records/s ({} batches)",
        records.len(),
        elapsed.as_secs_f64(),
        records.len() as f64 / elapsed.as_secs_f64(),
        stats.batches
    );
}
