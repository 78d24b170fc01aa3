//! The outbox relay's throughput against a real broker and a throw-away
//! PostgreSQL cluster: RELAY_ROWS outbox rows (100,000 by
//! default; RELAY_ENTITIES entities, 10,000) are committed first, then
//! the release binary's `reconciler relay` publishes them, once with one
//! relay and once with three at once (each run on a topic of its own, the
//! same rows made pending again in between).
//!
//! Reported per run: wall time from the relays' start until no row is
//! pending, rows/s, the relays' CPU seconds together (user + system, from
//! /proc) and CPU per 1,000 rows, and the records on the topic (at least
//! the rows: more only if a relay published some twice). PostgreSQL runs
//! with fsync off (it is the relay that is measured, not the disk).
//!
//!   KAFKA_BROKERS=127.0.0.1:9092 cargo bench --bench relay
//!
//! Other knobs: RELAY_BATCH (rows per claim, the default of
//! `[relay] batch_size`), RELAY_BIN (default: the release binary cargo
//! built for the bench).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reconciler::codec::Codec;
use reconciler::config::{Config, Topics};
use reconciler::core::event::{Body, Event};
use reconciler::kafka::admin;

#[path = "../tests/integration/common/postgres.rs"]
mod postgres;
#[path = "support/proc_stats.rs"]
mod proc_stats;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn binary() -> PathBuf {
    std::env::var("RELAY_BIN").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_reconciler")))
}

const DB_VAR: &str = "RELAY_BENCH_DB";

/// Runs `sql` and returns the first column of its one row.
fn number(rt: &tokio::runtime::Runtime, conn: &str, sql: &str) -> i64 {
    rt.block_on(async {
        let (client, c) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await.unwrap();
        let task = tokio::spawn(c);
        let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        drop(client);
        let _ = task.await;
        n
    })
}

/// Commits `rows` events over `entities` entities, 1,000 rows per
/// transaction (the trigger's per-entity lock and id per row included).
fn preload(rt: &tokio::runtime::Runtime, conn: &str, rows: usize, entities: usize) {
    let codec = Codec::new();
    rt.block_on(async {
        let (mut client, c) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(c);
        let mut i = 0;
        while i < rows {
            let end = (i + 1000).min(rows);
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for r in i..end {
                let (e, seq) = (r % entities, (r / entities) as i64 + 1);
                let ev = Event {
                    event_id: format!("ev-{e}-{seq}"),
                    operation_id: format!("op-{e}"),
                    entity_id: format!("ent-{e}"),
                    operation_type: "sync_customer".into(),
                    seq: Some(seq),
                    occurred_at: 1_700_000_000_000 + r as i64,
                    producer: "relay-bench".into(),
                    body: Body::Started { attempt: seq as i32, worker: "w".into() },
                };
                keys.push(ev.entity_id.clone());
                values.push(codec.encode_event(&ev).unwrap());
            }
            let tx = client.transaction().await.unwrap();
            tx.execute(
                "INSERT INTO reconciler_outbox (entity_id, event) SELECT * FROM unnest($1::text[], $2::bytea[])",
                &[&keys, &values],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            i = end;
        }
    });
}

fn spawn(file: &PathBuf, conn: &str) -> Child {
    Command::new(binary())
        .arg("--config")
        .arg(file)
        .arg("relay")
        .env(DB_VAR, conn)
        .env("RECONCILER_LOG", std::env::var("RELAY_LOG").unwrap_or_else(|_| "error".into()))
        .stdout(Stdio::null())
        .spawn()
        .expect("the release binary runs")
}

/// One run with `relays` relays on topic `cfg.topics.events`; prints and
/// returns rows/s.
fn measure(rt: &tokio::runtime::Runtime, cfg: &Config, conn: &str, relays: usize, rows: usize) -> f64 {
    let dir = std::env::temp_dir().join(format!("relay-bench-{relays}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reconciler.toml");
    std::fs::write(&file, toml::to_string(cfg).unwrap()).unwrap();
    let ticks = proc_stats::clock_ticks();
    let start = Instant::now();
    let children: Vec<Child> = (0..relays).map(|_| spawn(&file, conn)).collect();
    let mut cpu = vec![0.0; relays];
    let until = start + Duration::from_secs(900);
    let pending = "SELECT count(*) FROM reconciler_outbox WHERE status = 'pending'";
    loop {
        for (i, c) in children.iter().enumerate() {
            if let Some(s) = proc_stats::sample(c.id(), ticks) {
                cpu[i] = s.cpu_s;
            }
        }
        if number(rt, conn, pending) == 0 {
            break;
        }
        assert!(Instant::now() < until, "{relays} relay(s): rows still pending after 900 s");
        std::thread::sleep(Duration::from_millis(50)); // the sampling period
    }
    let wall = start.elapsed().as_secs_f64();
    for (i, c) in children.iter().enumerate() {
        if let Some(s) = proc_stats::sample(c.id(), ticks) {
            cpu[i] = s.cpu_s;
        }
    }
    for mut c in children {
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let _ = c.wait();
    }
    let on_topic: i64 = reconciler::kafka::reader::watermarks(&cfg.kafka, &cfg.topics.events)
        .unwrap()
        .values()
        .map(|(low, high)| high - low)
        .sum();
    let _ = std::fs::remove_dir_all(&dir);
    let total_cpu: f64 = cpu.iter().sum();
    let rate = rows as f64 / wall;
    println!(
        "{relays} relay(s): {rows} rows in {wall:.2} s = {rate:.0} rows/s; relay CPU {total_cpu:.2} s = {:.1} ms per 1,000 rows; {on_topic} records on the topic",
        total_cpu * 1000.0 / (rows as f64 / 1000.0)
    );
    assert!(on_topic as usize >= rows, "the topic holds fewer records than rows");
    rate
}

fn main() {
    let brokers = env_or("KAFKA_BROKERS", "127.0.0.1:9092".to_owned());
    let rows: usize = env_or("RELAY_ROWS", 100_000);
    let entities: usize = env_or("RELAY_ENTITIES", 10_000);
    let batch: usize = env_or("RELAY_BATCH", reconciler::config::RelayConfig::default().batch_size);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let pg = postgres::PgCluster::start();
    pg.execute(reconciler::outbox::SCHEMA);
    let conn = pg.connection();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let t = Instant::now();
    preload(&rt, &conn, rows, entities);
    println!(
        "relay bench: {rows} outbox rows over {entities} entities committed in {:.1} s; batch_size {batch}",
        t.elapsed().as_secs_f64()
    );
    let mut rates = Vec::new();
    for relays in [1, 3] {
        let mut cfg = Config::default();
        cfg.kafka.insert("bootstrap.servers".into(), brokers.clone());
        cfg.topics = Topics::named(&format!("relay-bench-{relays}-{nanos}"), 6);
        cfg.relay.connection_env = DB_VAR.into();
        cfg.relay.batch_size = batch;
        cfg.relay.bind = "off".into();
        admin::ensure_topics(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions, 1).unwrap();
        pg.execute("UPDATE reconciler_outbox SET status = 'pending', published_at = NULL, attempts = 0");
        rates.push(measure(&rt, &cfg, &conn, relays, rows));
    }
    println!("three relays / one relay: {:.2}x the rows/s (one run, same machine)", rates[1] / rates[0]);
}
