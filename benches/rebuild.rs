//! Replay rebuild without Kafka, into RocksDB, and the memory it takes.
//!
//! Streams a loadgen workload of REBUILD_OPERATIONS operations (default
//! 1,000,000) as encoded records through what the pipeline does to each
//! batch of 5,000 — decode, `core::apply` against the store's state, one
//! atomic RocksDB batch with state, timers, offsets and the encoded outputs
//! in the outbox (acknowledged at once: no broker) — and reports the rate
//! (generation excluded) and the process's peak and final RSS. Run with
//! 1M and 10M operations to see that RSS is set by `[store]` (block cache,
//! memtables), not by how many operations the store holds.
//!
//!   REBUILD_OPERATIONS=10000000 cargo bench --bench rebuild

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reconciler::codec::{validate_key, Codec};
use reconciler::config::Config;
use reconciler::core::{self, EntityState, OperationState, Output, SourcePos};
use reconciler::loadgen::{self, Generator, LoadRecord, Options};
use reconciler::store::{Batch, OutboxRecord, Store, Tuning};

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
    let tuning = Tuning::default();
    let dir = std::env::temp_dir().join(format!("reconciler-rebuild-{}", std::process::id()));
    let store = Store::open_with(&dir, "rebuild.events", false, &tuning).unwrap();
    let mut opts = Options::preload(operations, 5, loadgen::now_ms());
    // A fixed entity count and no per-operation truth: nothing in this
    // process but the store should grow with the operations.
    opts.entities = 100_000;
    opts.keep_verdicts = false;
    let mut gen = Generator::new(opts);
    let mut busy = Duration::ZERO;
    let (mut records, mut offset, mut outputs_n) = (0u64, 0i64, 0u64);
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
        let t = Instant::now();
        let mut ops: HashMap<String, (Option<i64>, Option<OperationState>)> = HashMap::new();
        let mut entities: HashMap<String, EntityState> = HashMap::new();
        let mut batch = Batch::default();
        let mut out = Vec::new();
        for (key, value) in &chunk {
            offset += 1;
            let Ok(ev) = value.as_deref().ok_or(()).and_then(|v| codec.decode_event(v).map_err(|_| ())) else {
                continue;
            };
            if validate_key(Some(key), &ev).is_err() {
                continue;
            }
            let slot = &mut ops
                .entry(ev.operation_id.clone())
                .or_insert_with(|| {
                    let s = store.get_op(0, &ev.operation_id).unwrap();
                    (s.as_ref().and_then(|s| s.timer_at), s)
                })
                .1;
            let entity =
                entities.entry(ev.entity_id.clone()).or_insert_with(|| store.get_entity(0, &ev.entity_id).unwrap());
            core::apply(&policy, slot, entity, ev, SourcePos { partition: 0, offset }, &mut out);
        }
        for o in out.drain(..) {
            let value = match &o {
                Output::Verdict(v) => codec.encode_verdict(v),
                Output::Anomaly(a) => codec.encode_anomaly(a),
                Output::Command(c) => codec.encode_command(c),
            };
            let key = Some(o.entity_id().as_bytes().to_vec());
            batch.publish(OutboxRecord { topic: "out".into(), key, value: Some(value.unwrap()), headers: vec![] });
            outputs_n += 1;
        }
        for (id, (before, state)) in ops {
            batch.move_timer(0, &id, before, state.as_ref());
            batch.put_op(0, id, state);
        }
        for (id, e) in entities {
            batch.put_entity(0, id, e);
        }
        batch.set_offset(0, offset + 1);
        let seqs = store.commit(batch).unwrap();
        store.ack_outbox(seqs).unwrap();
        busy += t.elapsed();
        records += chunk.len() as u64;
    }
    let truth = gen.into_truth();
    println!(
        "rebuild: {operations} operations, {records} records ({} events) in {:.1} s of decode+apply+commit = {:.0} records/s ({:.1} s wall with generation); {outputs_n} outputs",
        truth.events,
        busy.as_secs_f64(),
        records as f64 / busy.as_secs_f64(),
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
