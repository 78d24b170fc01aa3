//! Throughput of the hot path without Kafka: decode, encode and core apply.
//! `cargo bench --bench core`; figures are per core (single-threaded).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{Output, Policy, SourcePos};
use reconciler::demo;
use reconciler::records::InputRecord;

/// The binary's allocator (src/main.rs), so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn events() -> Vec<reconciler::core::Event> {
    demo::workload(1_700_000_000_000, 200)
        .into_iter()
        .filter_map(|r| match r {
            InputRecord::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let codec = Codec::new();
    let evs = events();
    let encoded: Vec<Vec<u8>> = evs.iter().map(|e| codec.encode_event(e).unwrap()).collect();
    let mut cfg = Config::default();
    demo::configure(&mut cfg);
    let policy: Policy = cfg.policy();

    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(encoded.len() as u64));
    g.bench_function("decode_event", |b| {
        b.iter(|| {
            for bytes in &encoded {
                std::hint::black_box(codec.decode_event(bytes).unwrap());
            }
        })
    });
    g.bench_function("decode_event_generic", |b| {
        b.iter(|| {
            for bytes in &encoded {
                std::hint::black_box(codec.decode_event_generic(bytes).unwrap());
            }
        })
    });
    g.bench_function("encode_event_generic", |b| {
        b.iter(|| {
            for e in &evs {
                std::hint::black_box(codec.encode_event_generic(e).unwrap());
            }
        })
    });
    g.bench_function("encode_event", |b| {
        b.iter(|| {
            for e in &evs {
                std::hint::black_box(codec.encode_event(e).unwrap());
            }
        })
    });
    g.finish();

    // Verdicts and anomalies the workload produces, to time their encoding.
    let mut engine = MemoryEngine::new();
    let mut outputs = Vec::new();
    for (i, e) in evs.iter().enumerate() {
        engine.process(&policy, e.clone(), SourcePos { partition: 0, offset: i as i64 }, &mut outputs);
    }
    let mut g = c.benchmark_group("outputs");
    g.throughput(Throughput::Elements(outputs.len() as u64));
    g.bench_function("encode_outputs", |b| {
        b.iter(|| {
            for o in &outputs {
                let bytes = match o {
                    Output::Verdict(v) => codec.encode_verdict(v),
                    Output::Anomaly(a) => codec.encode_anomaly(a),
                    Output::Command(c) => codec.encode_command(c),
                };
                std::hint::black_box(bytes.unwrap());
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("core");
    g.throughput(Throughput::Elements(evs.len() as u64));
    g.bench_function("apply", |b| {
        b.iter_batched(
            || (MemoryEngine::new(), evs.clone()),
            |(mut engine, evs)| {
                let mut out = Vec::with_capacity(64);
                for (i, e) in evs.into_iter().enumerate() {
                    engine.process(&policy, e, SourcePos { partition: 0, offset: i as i64 }, &mut out);
                    out.clear();
                }
                engine
            },
            BatchSize::LargeInput,
        )
    });
    // A verdict's id, and the same id through uuid's own version 5 (what
    // derived it before src/core/ids.rs), for the ratio in one run.
    let parts = ["verdict", "order-452:v7", "2b6f0d3e-6f7c-4d0e-9a51-0f3c2d1e4b5a", "3"];
    g.bench_function("verdict_id", |b| {
        b.iter(|| reconciler::core::ids::v5(&uuid::Uuid::NAMESPACE_OID, std::hint::black_box(&parts)))
    });
    g.bench_function("verdict_id_uuid_v5", |b| {
        b.iter(|| {
            let name = std::hint::black_box(&parts).join("\u{1f}");
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
        })
    });
    g.finish();
}

/// One RocksDB write of what a 5,000-record batch changes: the states of
/// the operations it touched, their timers, offsets and the outbox.
fn store_commit(c: &mut Criterion) {
    use reconciler::records::ProducerRecord;
    use reconciler::store::{Batch, Store};
    let codec = Codec::new();
    let mut cfg = Config::default();
    demo::configure(&mut cfg);
    let policy = cfg.policy();
    let evs: Vec<_> = events().into_iter().take(5000).collect();
    let mut engine = MemoryEngine::new();
    let mut outputs = Vec::new();
    engine.replay(&policy, evs.iter().cloned(), 0, &mut outputs);
    let outbox: Vec<ProducerRecord> = outputs
        .iter()
        .map(|o| ProducerRecord {
            topic: "ops.verdicts".into(),
            key: Some(o.entity_id().as_bytes().to_vec()),
            value: Some(match o {
                Output::Verdict(v) => codec.encode_verdict(v).unwrap(),
                Output::Anomaly(a) => codec.encode_anomaly(a).unwrap(),
                Output::Command(c) => codec.encode_command(c).unwrap(),
            }),
            headers: vec![],
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("reconciler-bench-store-{}", std::process::id()));
    let store = Store::open(&dir, "bench.events", false).unwrap();
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(evs.len() as u64));
    g.sample_size(20);
    g.bench_function("commit_batch_of_5000_records", |b| {
        b.iter_batched(
            || {
                let mut batch = Batch::default();
                for op in engine.ops.values() {
                    batch.move_timer(0, &op.operation_id, None, Some(op));
                    batch.put_op(0, op.operation_id.clone(), Some(op.clone()), Default::default());
                }
                for (id, e) in &engine.entities {
                    batch.put_entity(0, id.clone(), Some(e.clone()));
                }
                batch.set_offset(0, evs.len() as i64);
                for r in &outbox {
                    batch.publish(r.clone());
                }
                batch
            },
            |batch| {
                let seqs = store.commit(batch).unwrap();
                store.ack_outbox(seqs).unwrap();
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The metrics sampler's pass (`pipeline/sampler.rs`): each operation's
/// summary read from the store, on 60,000 operations flushed to a table
/// file, as a pass over a large store reads them. The sampler reads up to
/// `[metrics] scan_ops_per_sec` of them a second beside the pipeline.
fn sampler_scan(c: &mut Criterion) {
    use reconciler::store::{Batch, Store};
    let mut cfg = Config::default();
    demo::configure(&mut cfg);
    let policy = cfg.policy();
    let mut engine = MemoryEngine::new();
    let mut outputs = Vec::new();
    engine.replay(&policy, events(), 0, &mut outputs);
    let ops: Vec<_> = engine.ops.values().cloned().collect();
    let dir = std::env::temp_dir().join(format!("reconciler-bench-scan-{}", std::process::id()));
    let store = Store::open(&dir, "bench.events", false).unwrap();
    let mut stored = 0u64;
    while stored < 60_000 {
        let mut batch = Batch::default();
        for op in &ops {
            let mut op = op.clone();
            op.operation_id = format!("{}-{stored}", op.operation_id);
            batch.put_op(0, op.operation_id.clone(), Some(op), Default::default());
            stored += 1;
        }
        store.commit(batch).unwrap();
    }
    store.flush().unwrap();
    let mut g = c.benchmark_group("sampler");
    g.throughput(Throughput::Elements(stored));
    g.sample_size(20);
    g.bench_function("scan_summaries", |b| {
        b.iter(|| {
            let mut seen = 0u64;
            store
                .scan_summaries(0, |s| {
                    seen += s.requested_at.is_some() as u64;
                    true
                })
                .unwrap();
            seen
        })
    });
    g.finish();
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rebuilding state from a recorded stream without Kafka: decode and apply.
fn replay(c: &mut Criterion) {
    let codec = Codec::new();
    let mut cfg = Config::default();
    demo::configure(&mut cfg);
    let policy = cfg.policy();
    let recorded: Vec<Vec<u8>> = events().iter().map(|e| codec.encode_event(e).unwrap()).collect();
    let mut g = c.benchmark_group("replay");
    g.throughput(Throughput::Elements(recorded.len() as u64));
    g.bench_function("decode_and_apply_recorded_stream", |b| {
        b.iter(|| {
            let mut engine = MemoryEngine::new();
            let mut out = Vec::new();
            engine.replay(&policy, recorded.iter().map(|bytes| codec.decode_event(bytes).unwrap()), 0, &mut out);
            engine
        })
    });
    g.finish();
}

/// What checking a control event's signature costs, per event,
/// against decoding it. Only control events (timers, decisions, probe
/// failures) are checked; every lifecycle event is decoded.
fn signature(c: &mut Criterion) {
    use reconciler::signature::ControlKeys;
    let codec = Codec::new();
    let keys = ControlKeys::new([b"bench-control-key-0123456789".to_vec(), b"an-older-key-0123456789".to_vec()]);
    let ev = reconciler::core::Event::deadline_reached("op-000123", "cust-000123", "sync_customer", 1_700_000_000_000);
    let value = codec.encode_event(&ev).unwrap();
    let key = ev.entity_id.as_bytes();
    let sig = keys.sign("ops.events", Some(key), &value).unwrap();
    let old = ControlKeys::new([b"an-older-key-0123456789".to_vec()]).sign("ops.events", Some(key), &value).unwrap();
    let mut g = c.benchmark_group("signature");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_control_event", |b| b.iter(|| std::hint::black_box(codec.decode_event(&value).unwrap())));
    g.bench_function("check_first_key", |b| {
        b.iter(|| std::hint::black_box(keys.check("ops.events", Some(key), &value, Some(&sig))))
    });
    g.bench_function("check_second_key", |b| {
        b.iter(|| std::hint::black_box(keys.check("ops.events", Some(key), &value, Some(&old))))
    });
    g.bench_function("sign", |b| b.iter(|| std::hint::black_box(keys.sign("ops.events", Some(key), &value))));
    g.finish();
}

criterion_group!(benches, bench, store_commit, sampler_scan, replay, signature);
criterion_main!(benches);
