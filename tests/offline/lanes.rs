//! The pipeline's batch step against RocksDB, without a broker: a batch
//! applied on several lanes (threads taking whole partitions) gives the
//! stored state and the per-key outputs of one thread, and smaller batches
//! give those of larger ones.

use std::collections::BTreeMap;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::{ProducerRecord, Record};
use reconciler::signature::ControlKeys;
use reconciler::store::Store;

/// Records by key, in order.
type ByKey = BTreeMap<Vec<u8>, Vec<ProducerRecord>>;

/// What one run published and stored.
struct Run {
    /// The outputs (verdicts, anomalies, commands, dead letters).
    outputs: ByKey,
    /// The state changelog's records: one per operation and batch, so
    /// they depend on where batches end.
    changelog: ByKey,
    /// The stored state (family, key, value, and the latest verdict's id
    /// and reason when a timeline entry holds them).
    state: Vec<StateItem>,
    /// The counts.
    counts: String,
}

/// One stored item as the state digest sees it.
type StateItem = (String, Vec<u8>, Vec<u8>, Option<(String, String)>);

/// A fault-injected loadgen stream over six partitions by key, in batches
/// of `batch` records, applied on `lanes` lanes into a new store.
fn run(lanes: usize, batch: usize) -> Run {
    // One directory per run: the tests run at once, two of them run(1, 2_000).
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("reconciler-apply-lanes-{}-{n}", std::process::id()));
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
    let (mut outputs, mut changelog) = (ByKey::new(), ByKey::new());
    for chunk in records.chunks(batch) {
        let applied = applier.apply(chunk, &mut next, &BTreeMap::new(), &mut stats).unwrap();
        store.write_encoded(&applied.batch).unwrap();
        for o in applied.batch.into_outbox() {
            let into = if cfg.topics.changelog() == Some(o.topic.as_str()) { &mut changelog } else { &mut outputs };
            into.entry(o.key.clone().unwrap_or_default()).or_default().push(o);
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
    Run { outputs, changelog, state, counts }
}

/// Asserts that two runs stored the same state and published the same
/// outputs per key, in the same order.
fn assert_same(a: &Run, b: &Run) {
    assert!(a.outputs.values().map(Vec::len).sum::<usize>() > 1_000, "the workload produces outputs");
    assert_eq!(a.counts, b.counts);
    assert!(a.state == b.state, "the stored state differs");
    assert!(a.outputs == b.outputs, "the outputs of some key differ in content or order");
}

#[test]
fn lanes_give_the_state_and_the_outputs_of_one_thread() {
    let (one, two) = (run(1, 2_000), run(2, 2_000));
    assert_same(&one, &two);
    assert!(!one.changelog.is_empty(), "the workload writes a changelog");
    assert!(one.changelog == two.changelog, "the changelog of some key differs in content or order");
}

/// Where batches end changes nothing: small batches give the state and the
/// outputs of large ones. In small batches most operations a request
/// supersedes were stored by an earlier batch, so this also covers how the
/// batch step reads those (one by one, see `Applier::slot`): returning an
/// empty state there fails it.
#[test]
fn batch_boundaries_change_neither_the_state_nor_the_outputs() {
    assert_same(&run(1, 2_000), &run(1, 97));
}
