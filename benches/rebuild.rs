//! Replay rebuild without Kafka, into RocksDB, and the memory it takes.
//!
//! Streams a loadgen workload of REBUILD_OPERATIONS operations (default
//! 1,000,000) as encoded records through the pipeline's own batch step
//! ([`Applier`]: decode, `core::apply` against the store's state, timeline,
//! metrics, outputs encoded) and its one atomic RocksDB write per batch of
//! 5,000 (state, timers, offsets, timeline and the outbox, acknowledged at
//! once: no broker), and reports the rate
//! (generation excluded) and the process's peak and final RSS. Run with
//! 1M and 10M operations to see that RSS is set by `[store]` (block cache,
//! memtables), not by how many operations the store holds.
//!
//!   REBUILD_OPERATIONS=10000000 cargo bench --bench rebuild
//!   REBUILD_BLOCK_CACHE_MB=128 REBUILD_OPERATIONS=1000000 cargo bench --bench rebuild

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::kafka::Record;
use reconciler::loadgen::{self, Generator, LoadRecord, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::store::{Store, Tuning};

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
}

fn main() {
    let operations: u64 = std::env::var("REBUILD_OPERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let cfg = Config::default();
    let policy = cfg.policy();
    let codec = Codec::new();
    // REBUILD_BLOCK_CACHE_MB / REBUILD_WRITE_BUFFER_MB: the `[store]`
    // budget, to show that RSS follows it rather than the operations held.
    let defaults = Tuning::default();
    let env = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let tuning = Tuning {
        block_cache_mb: env("REBUILD_BLOCK_CACHE_MB", defaults.block_cache_mb),
        write_buffer_mb: env("REBUILD_WRITE_BUFFER_MB", defaults.write_buffer_mb),
    };
    let dir = std::env::temp_dir().join(format!("reconciler-rebuild-{}", std::process::id()));
    let store = Store::open_with(&dir, "rebuild.events", false, &tuning).unwrap();
    let mut opts = Options::preload(operations, 5, loadgen::now_ms());
    // A fixed entity count and no per-operation truth: nothing in this
    // process but the store should grow with the operations.
    opts.entities = 100_000;
    opts.keep_verdicts = false;
    let mut gen = Generator::new(opts);
    let mut busy = Duration::ZERO;
    let (mut total, mut offset, mut outputs_n) = (0u64, -1i64, 0u64);
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let applier = Applier {
        store: &store,
        policy: &policy,
        codec: &codec,
        topics: &cfg.topics,
        max_record_bytes: cfg.consumer.max_record_bytes,
        metrics: &metrics,
    };
    let mut next = BTreeMap::from([(0, 0)]);
    let no_restore = BTreeMap::new();
    let mut stats = Stats::default();
    let started = Instant::now();
    loop {
        let chunk: Vec<(Vec<u8>, Option<Vec<u8>>)> = gen
            .by_ref()
            .take(5000)
            .map(|p| match p.record {
                LoadRecord::Event(e) => (e.entity_id.clone().into_bytes(), Some(codec.encode_event(&e).unwrap())),
                LoadRecord::Raw { key, value, .. } => (key, value),
            })
            .collect();
        if chunk.is_empty() {
            break;
        }
        let records: Vec<Record> = chunk
            .into_iter()
            .map(|(key, value)| {
                offset += 1;
                Record {
                    topic: cfg.topics.events.clone(),
                    partition: 0,
                    offset,
                    timestamp: None,
                    key: Some(key),
                    value,
                    headers: Vec::new(),
                }
            })
            .collect();
        let t = Instant::now();
        // Exactly the pipeline's per-batch work (decode, core, timeline,
        // metrics, outputs encoded), then its store write; the outbox is
        // acknowledged at once (no broker).
        let applied = applier.apply(&records, &mut next, &no_restore, &mut stats).unwrap();
        outputs_n += applied.batch.outbox().len() as u64;
        let seqs = store.commit(&applied.batch).unwrap();
        store.ack_outbox(seqs).unwrap();
        busy += t.elapsed();
        total += records.len() as u64;
    }
    let truth = gen.into_truth();
    println!(
        "rebuild: {operations} operations, {total} records ({} events) in {:.1} s of decode+apply+commit = {:.0} records/s ({:.1} s wall with generation); {outputs_n} outputs",
        truth.events,
        busy.as_secs_f64(),
        total as f64 / busy.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "memory: peak RSS {} MB, RSS at end {} MB (block cache {} MiB, memtables {} MiB); store on disk {} MB",
        status_kb("VmHWM:") / 1024,
        status_kb("VmRSS:") / 1024,
        tuning.block_cache_mb,
        tuning.write_buffer_mb,
        dir_bytes(&dir) / (1 << 20)
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
