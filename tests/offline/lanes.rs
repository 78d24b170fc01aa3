//! The pipeline's batch step against RocksDB, without a broker: a batch
//! applied on several lanes (threads taking whole partitions) gives the
//! stored state and the per-key outputs of one thread.

use std::collections::BTreeMap;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::{OutboxRecord, Record};
use reconciler::signature::ControlKeys;
use reconciler::store::Store;

/// Outputs by key, in order; the stored state (family, key, value, and the
/// latest verdict's id and reason when a timeline entry holds them); the
/// counts.
type Run = (BTreeMap<Vec<u8>, Vec<OutboxRecord>>, Vec<StateItem>, String);

/// One stored item as the state digest sees it.
type StateItem = (String, Vec<u8>, Vec<u8>, Option<(String, String)>);

/// A fault-injected loadgen stream over six partitions by key, in batches
/// of 2,000 records, applied on `lanes` lanes into a new store: the outputs
/// of each key in order, the state as stored, and the counts.
fn run(lanes: usize) -> Run {
    let dir = std::env::temp_dir().join(format!("reconciler-apply-lanes-{lanes}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::open(&dir, "t.events", false).unwrap();
    let cfg = Config::default();
    let (policy, codec) = (cfg.policy(), Codec::new());
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let keys = ControlKeys::new([b"offline-lanes-test-key".to_vec()]);
    let applier = Applier { lanes, ..Applier::new(&cfg, &store, &policy, &codec, &keys, &metrics) };
    let mut topic = MemoryTopic::new(6);
    let records: Vec<Record> = Generator::new(Options::preload(3_000, 11, 1_700_000_000_000))
        .map(|p| topic.append(p.record.to_outbox(&codec, &keys, &cfg.topics.events).unwrap()))
        .collect();
    let (mut next, mut stats) = ((0..6).map(|p| (p, 0)).collect(), Stats::default());
    let mut by_key: BTreeMap<Vec<u8>, Vec<OutboxRecord>> = BTreeMap::new();
    for chunk in records.chunks(2_000) {
        let applied = applier.apply(chunk, &mut next, &BTreeMap::new(), &mut stats).unwrap();
        store.write_encoded(&applied.batch).unwrap();
        for o in applied.batch.into_outbox() {
            by_key.entry(o.key.clone().unwrap_or_default()).or_default().push(o);
        }
    }
    let mut state = Vec::new();
    store
        .scan_state(|family, k, v, verdict| {
            let verdict = verdict.map(|(id, reason)| (id.to_owned(), reason.to_owned()));
            state.push((family.to_owned(), k.to_vec(), v.to_vec(), verdict))
        })
        .unwrap();
    let counts = format!(
        "{} {:?} {:?} {} {}",
        stats.records, stats.by_disposition, stats.dead_letters, stats.verdicts, stats.anomalies
    );
    assert_eq!(next.values().sum::<i64>(), records.len() as i64, "every record applied once");
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    (by_key, state, counts)
}

#[test]
fn lanes_give_the_state_and_the_outputs_of_one_thread() {
    let (outputs, state, counts) = run(1);
    let (outputs2, state2, counts2) = run(2);
    assert!(outputs.values().map(Vec::len).sum::<usize>() > 1_000, "the workload produces outputs");
    assert_eq!(counts, counts2);
    assert!(state == state2, "the stored state differs");
    assert!(outputs == outputs2, "the outputs of some key differ in content or order");
}
