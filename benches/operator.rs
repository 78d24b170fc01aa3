//! Cost of the operation timeline on the hot path: one RocksDB batch of
//! 5,000 records written with and without their timeline entries (the
//! recording included). `cargo bench --bench operator`.

use std::collections::HashMap;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use reconciler::config::Config;
use reconciler::core::{apply, Authenticity, Disposition, EntityState, Event, OperationState, Output, SourcePos};
use reconciler::demo;
use reconciler::records::InputRecord;
use reconciler::store::timeline::{self, Arrival};
use reconciler::store::{Batch, Store, TimelineHead};

struct Applied {
    arrival: Arrival,
    disposition: Disposition,
    outputs: Vec<Output>,
    /// The operation after the record (`None`: removed).
    state: Option<OperationState>,
}

fn bench(c: &mut Criterion) {
    let mut cfg = Config::default();
    demo::configure(&mut cfg);
    let policy = cfg.policy();
    let evs: Vec<Event> = demo::workload(1_700_000_000_000, 200)
        .into_iter()
        .filter_map(|r| if let InputRecord::Event(e) = r { Some(e) } else { None })
        .take(5000)
        .collect();
    let mut ops: HashMap<String, Option<OperationState>> = HashMap::new();
    let mut entities: HashMap<String, EntityState> = HashMap::new();
    let mut applied = Vec::new();
    for (i, e) in evs.iter().enumerate() {
        let pos = SourcePos { partition: 0, offset: i as i64 };
        let slot = ops.entry(e.operation_id.clone()).or_default();
        let entity = entities.entry(e.entity_id.clone()).or_default();
        let arrival = Arrival::of(e, pos, &policy);
        let mut outputs = Vec::new();
        // The demo's own events, taken as signed (the check is not what this measures).
        let disposition = apply(&policy, slot, entity, e.clone(), Authenticity::Signed, pos, &mut outputs).disposition;
        applied.push(Applied { arrival, disposition, outputs, state: slot.clone() });
    }
    // The state after the records, each operation with its timeline's
    // head (empty: written without its timeline).
    let add_state = |batch: &mut Batch, heads: &mut HashMap<String, TimelineHead>| {
        for (id, op) in &ops {
            batch.move_timer(0, id, None, op.as_ref());
            batch.put_op(0, id.clone(), op.clone(), heads.remove(id).unwrap_or_default());
        }
        for (id, e) in &entities {
            batch.put_entity(0, id.clone(), Some(e.clone()));
        }
        batch.set_offset(0, evs.len() as i64);
    };
    let state_batch = || {
        let mut batch = Batch::default();
        add_state(&mut batch, &mut HashMap::new());
        batch
    };
    // The records' timeline entries (in their operations' heads, or out of
    // them into the batch), then the state.
    let record_all = |batch: &mut Batch, arrivals: Vec<Arrival>| {
        let mut heads: HashMap<String, TimelineHead> = HashMap::new();
        for (arrival, a) in arrivals.into_iter().zip(&applied) {
            let head = heads.entry(arrival.operation_id().to_owned()).or_default();
            timeline::record(batch, head, arrival, a.disposition, &a.outputs, a.state.as_ref());
        }
        heads
    };
    let base = std::env::temp_dir().join(format!("reconciler-bench-timeline-{}", std::process::id()));
    let n = std::cell::Cell::new(0);
    // A fresh store per iteration: the figure is the write itself, without
    // the flushes and compactions of a store the bench keeps filling.
    let fresh = || {
        n.set(n.get() + 1);
        let dir = base.join(n.get().to_string());
        (Store::open(&dir, "bench.events", false).unwrap(), dir)
    };
    // TIMELINE_BREAKDOWN=1: where the time goes, timed directly (one batch
    // each, three times), beside criterion's figures.
    if std::env::var_os("TIMELINE_BREAKDOWN").is_some() {
        let state: usize = ops.values().map(|o| postcard::to_allocvec(o).unwrap().len()).sum();
        eprintln!("state: {} operations, {state} bytes encoded", ops.len());
        for _ in 0..3 {
            let (store, _) = fresh();
            let mut batch = Batch::default();
            let arrivals = applied.iter().map(|a| a.arrival.clone()).collect();
            let t0 = std::time::Instant::now();
            let mut heads = record_all(&mut batch, arrivals);
            add_state(&mut batch, &mut heads);
            let t1 = t0.elapsed();
            store.commit(batch).unwrap();
            let t2 = t0.elapsed();
            let (store2, _) = fresh();
            let t4 = std::time::Instant::now();
            store2.commit(state_batch()).unwrap();
            eprintln!("record {t1:?} commit {:?}; state only incl. build {:?}", t2 - t1, t4.elapsed());
        }
    }
    let mut g = c.benchmark_group("timeline");
    g.throughput(Throughput::Elements(evs.len() as u64));
    g.sample_size(20);
    g.bench_function("commit_5000_records_state_only", |b| {
        b.iter_batched(
            || (fresh(), state_batch()),
            |((store, dir), batch)| {
                store.commit(batch).unwrap();
                (store, dir)
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("commit_5000_records_with_timeline", |b| {
        b.iter_batched(
            || (fresh(), applied.iter().map(|a| a.arrival.clone()).collect::<Vec<_>>()),
            |((store, dir), arrivals)| {
                let mut batch = Batch::default();
                let mut heads = record_all(&mut batch, arrivals);
                add_state(&mut batch, &mut heads);
                store.commit(batch).unwrap();
                (store, dir)
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("record_5000_without_commit", |b| {
        b.iter_batched(
            || applied.iter().map(|a| a.arrival.clone()).collect::<Vec<_>>(),
            |arrivals| {
                let mut batch = Batch::default();
                let heads = record_all(&mut batch, arrivals);
                (batch, heads)
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("take_arrivals_of_5000_events", |b| {
        b.iter(|| {
            let arrivals: Vec<Arrival> = evs
                .iter()
                .enumerate()
                .map(|(i, e)| Arrival::of(e, SourcePos { partition: 0, offset: i as i64 }, &policy))
                .collect();
            std::hint::black_box(arrivals)
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&base);
}

criterion_group!(benches, bench);
criterion_main!(benches);
