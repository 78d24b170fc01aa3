//! Replay rebuild without Kafka, into RocksDB, and the memory it takes.
//!
//! Streams a loadgen workload of REBUILD_OPERATIONS operations (default
//! 1,000,000) as encoded records, spread over REBUILD_PARTITIONS partitions
//! by key (default 6, the default topic's), through the pipeline's own
//! batch step ([`Applier`]: decode, `core::apply` against the store's
//! state, timeline, metrics, on REBUILD_THREADS lanes, default one per core
//! as `[consumer] apply_threads = 0`) and its one atomic RocksDB write per
//! batch of `[consumer] batch_size` records (state, timers, offsets and
//! timeline; REBUILD_BATCH overrides it) into a store opened
//! as `reconciler replay` opens it, and reports the rate
//! (generation excluded) and the process's peak and final RSS. Run with
//! 1M and 10M operations to see that RSS is set by `[store]` (block cache,
//! memtables), not by how many operations the store holds.
//!
//!   REBUILD_OPERATIONS=10000000 cargo bench --bench rebuild
//!   REBUILD_THREADS=1 cargo bench --bench rebuild
//!   REBUILD_OUTPUTS=1 cargo bench --bench rebuild   # as `replay --output-prefix`,
//!                                                  # and counts the changelog records
//!   REBUILD_SIZES=1 cargo bench --bench rebuild     # bytes stored per family and key
//!   REBUILD_BLOCK_CACHE_MB=128 REBUILD_OPERATIONS=1000000 cargo bench --bench rebuild
//!   REBUILD_ENTITIES=5000 REBUILD_OPERATIONS=20000 cargo bench --bench rebuild
//!       # over fewer entities (default 100,000): four operations each, as
//!       # the end-to-end bench has, so that most requests supersede one

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::config::StoreTuning;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::Record;
use reconciler::store::Store;

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
    // As the binary does first (src/main.rs), so the figures are the binary's.
    reconciler::process::disable_transparent_huge_pages().expect("prctl(PR_SET_THP_DISABLE)");
    let env = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let operations = env("REBUILD_OPERATIONS", 1_000_000) as u64;
    let partitions = env("REBUILD_PARTITIONS", 6).max(1) as i32;
    // Records per batch: the pipeline's default `[consumer] batch_size`.
    let batch = env("REBUILD_BATCH", Config::default().consumer.batch_size).max(1);
    let mut cfg = Config::default();
    cfg.consumer.apply_threads = env("REBUILD_THREADS", 0);
    // The workload's decisions signed, as in production: their check is
    // part of the measured work.
    cfg.security.control_keys = vec!["rebuild-bench-control-key".into()];
    let keys = cfg.security.loaded();
    let policy = cfg.policy();
    let codec = Codec::new();
    // REBUILD_BLOCK_CACHE_MB / REBUILD_WRITE_BUFFER_MB: the `[store]`
    // budget, to show that RSS follows it rather than the operations held.
    let defaults = StoreTuning::default();
    let tuning = StoreTuning {
        block_cache_mb: env("REBUILD_BLOCK_CACHE_MB", defaults.block_cache_mb),
        write_buffer_mb: env("REBUILD_WRITE_BUFFER_MB", defaults.write_buffer_mb),
    };
    let dir = std::env::temp_dir().join(format!("reconciler-rebuild-{}", std::process::id()));
    // As `reconciler replay` opens it: no write-ahead log.
    let store = Store::open_for_rebuild(&dir, "rebuild.events", &tuning).unwrap();
    // REBUILD_OUTPUTS=1: outputs encoded and stored, as `replay
    // --output-prefix` does (else counted only, as a plain replay does).
    let discard_outputs = env("REBUILD_OUTPUTS", 0) == 0;
    let mut opts = Options::preload(operations, 5, reconciler::clock::now_ms());
    // A fixed entity count (REBUILD_ENTITIES) and no per-operation truth:
    // nothing in this process but the store should grow with the
    // operations.
    opts.entities = env("REBUILD_ENTITIES", 100_000) as u64;
    opts.keep_verdicts = false;
    let mut gen = Generator::new(opts);
    let mut busy = Duration::ZERO;
    // Apply (the lanes free their batch's states), then the store write.
    let mut phases = [Duration::ZERO; 2];
    let mut total = 0u64;
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let applier = Applier { discard_outputs, ..Applier::new(&cfg, &store, &policy, &codec, &keys, &metrics) };
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    // By key, as a producer's partitioner does: an entity's events stay in
    // one partition, in order.
    let mut topic = MemoryTopic::new(partitions);
    let no_restore = BTreeMap::new();
    let mut stats = Stats::default();
    // With outputs: the state changelog records the batches would publish.
    let (mut changelog_records, mut changelog_bytes) = (0u64, 0u64);
    let started = Instant::now();
    loop {
        let records: Vec<Record> = gen
            .by_ref()
            .take(batch)
            .map(|p| topic.append(p.record.to_outbox(&codec, &keys, &cfg.topics.events).unwrap()))
            .collect();
        if records.is_empty() {
            break;
        }
        let t = Instant::now();
        // Exactly the pipeline's per-batch work (decode, core, timeline,
        // metrics, outputs counted or encoded, on the lanes), then its store
        // write; an outbox is acknowledged at once (no broker).
        let applied = applier.apply(&records, &mut next, &no_restore, &mut stats).unwrap();
        let a = t.elapsed();
        let seqs = store.write_encoded(&applied.batch).unwrap();
        store.ack_outbox(seqs).unwrap();
        // Freed here, timed, as the pipeline frees a written batch.
        let outbox = applied.batch.into_outbox();
        for r in outbox.iter().filter(|r| cfg.topics.changelog() == Some(r.topic.as_str())) {
            changelog_records += 1;
            changelog_bytes += (r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)) as u64;
        }
        drop(outbox);
        busy += t.elapsed();
        phases[0] += a;
        phases[1] += t.elapsed() - a;
        total += records.len() as u64;
    }
    // A replay ends with a flush (the store has no write-ahead log).
    let t = Instant::now();
    store.flush().unwrap();
    busy += t.elapsed();
    phases[1] += t.elapsed();
    let outputs_n = stats.verdicts + stats.anomalies + stats.commands + stats.dead_letters.values().sum::<u64>();
    let truth = gen.into_truth();
    println!(
        "rebuild: {operations} operations, {total} records ({} events) over {partitions} partitions on {} lanes in {:.1} s of decode+apply+commit = {:.0} records/s ({:.1} s wall with generation); {outputs_n} outputs ({})",
        truth.events,
        applier.lanes,
        busy.as_secs_f64(),
        total as f64 / busy.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        if discard_outputs { "counted, as a replay without --output-prefix" } else { "encoded and stored" }
    );
    println!("phases: apply {:.2} s, store write and flush {:.2} s", phases[0].as_secs_f64(), phases[1].as_secs_f64());
    if !discard_outputs {
        println!(
            "changelog: {changelog_records} records ({:.2} per input record, {:.2} per operation), {:.1} MB of keys and values ({:.0} bytes per input record)",
            changelog_records as f64 / total as f64,
            changelog_records as f64 / operations as f64,
            changelog_bytes as f64 / 1e6,
            changelog_bytes as f64 / total as f64
        );
    }
    println!(
        "memory: peak RSS {} MB, RSS at end {} MB (block cache {} MiB, memtables {} MiB); store on disk {} MB",
        status_kb("VmHWM:") / 1024,
        status_kb("VmRSS:") / 1024,
        tuning.block_cache_mb,
        tuning.write_buffer_mb,
        dir_bytes(&dir) / (1 << 20)
    );
    // REBUILD_SIZES=1: what the store holds per family, and how an
    // operation's value divides between its state and its inline timeline
    // entries (the bytes every write of it costs: write-ahead log, flush,
    // changelog record).
    if env("REBUILD_SIZES", 0) != 0 {
        let mut families: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        store
            .scan_partitions_state(|family, k, v| {
                let e = families.entry(family.to_owned()).or_default();
                e.0 += 1;
                e.1 += (k.len() + v.len()) as u64;
            })
            .unwrap();
        let mut state_bytes = 0u64;
        store.scan_state(|family, _, v, _| state_bytes += if family == "ops" { v.len() as u64 } else { 0 }).unwrap();
        for (family, (n, bytes)) in &families {
            println!(
                "stored {family}: {n} keys, {:.1} MB, {:.0} bytes per key",
                *bytes as f64 / 1e6,
                *bytes as f64 / (*n).max(1) as f64
            );
        }
        if let Some((n, _)) = families.get("ops") {
            println!(
                "operation values: state {:.0} bytes per operation on average",
                state_bytes as f64 / (*n).max(1) as f64
            );
        }
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
