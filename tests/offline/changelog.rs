//! The state changelog against RocksDB, without a broker: the changelog
//! records a fault-injected workload's batches make (timers fired until
//! retention has removed operations, so tombstones are in it too) restore
//! into an empty store, or over a stale one, exactly the state the batches
//! wrote; and so does what compaction leaves of them.

use std::collections::BTreeMap;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::Event;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::{event_record, OutboxRecord, Record};
use reconciler::store::{changelog, Batch, Store};

const PARTITIONS: i32 = 3;

struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(name: &str) -> (Store, Dir) {
    let dir = std::env::temp_dir().join(format!("reconciler-changelog-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    (Store::open(&dir, "t.events", false).unwrap(), Dir(dir))
}

/// Everything the store holds of the partitions.
fn state(store: &Store) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    store.scan_partitions_state(|f, k, v| out.push((f.to_owned(), k.to_vec(), v.to_vec()))).unwrap();
    out
}

/// Applies a loadgen workload in batches, then fires every due timer (as
/// `DeadlineReached` events through the same batch step) until none is
/// left, retention's included. Returns the changelog records in order.
fn workload(store: &Store, cfg: &Config) -> Vec<OutboxRecord> {
    let (policy, codec) = (cfg.policy(), Codec::new());
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let applier = Applier::new(cfg, store, &policy, &codec, &metrics);
    let mut topic = MemoryTopic::new(PARTITIONS);
    let mut records: Vec<Record> = Generator::new(Options::preload(1_500, 5, 1_700_000_000_000))
        .map(|p| topic.append(p.record.to_outbox(&codec, &cfg.topics.events).unwrap()))
        .collect();
    let (mut next, mut stats) = ((0..PARTITIONS).map(|p| (p, 0)).collect(), Stats::default());
    let mut log = Vec::new();
    for round in 0.. {
        assert!(round < 50, "timers keep coming");
        for chunk in records.chunks(700) {
            let applied = applier.apply(chunk, &mut next, &BTreeMap::new(), &mut stats).unwrap();
            store.write_encoded(&applied.batch).unwrap();
            log.extend(applied.batch.into_outbox().into_iter().filter(|r| r.topic == cfg.topics.changelog));
        }
        // The timer wheel, with a clock past every deadline: each due timer
        // becomes an event in its operation's partition.
        records = Vec::new();
        for p in 0..PARTITIONS {
            for t in store.due_timers(p, i64::MAX / 4, usize::MAX).unwrap() {
                let ev = Event::deadline_reached(&t.operation_id, &t.entity_id, &t.operation_type, t.at);
                let rec = event_record(&codec, &cfg.topics.events, &ev).unwrap();
                records.push(topic.append_to(p, rec));
            }
        }
        if records.is_empty() {
            break;
        }
    }
    log
}

/// Restores every partition of `log` into `store`; the offsets restored to.
fn restore(store: &Store, log: &[OutboxRecord]) -> BTreeMap<i32, Option<i64>> {
    let mut restored = BTreeMap::new();
    for p in 0..PARTITIONS {
        let mut into = store.restoring(p);
        for r in log.iter().filter(|r| changelog::partition_of(r.key.as_deref().unwrap()) == Some(p)) {
            into.apply(r.key.as_deref().unwrap(), r.value.as_deref()).unwrap();
        }
        restored.insert(p, into.finish().unwrap());
    }
    restored
}

#[test]
fn a_changelog_restores_the_state_its_batches_wrote_also_compacted_and_over_stale_state() {
    let mut cfg = Config::default();
    // Short retention: operations leave during the run, with their timelines.
    cfg.time.retention_ms = 60_000;
    let (a, _da) = open("source");
    let log = workload(&a, &cfg);
    let want = state(&a);
    let tombstones = log.iter().filter(|r| r.value.is_none()).count();
    assert!(tombstones > 1_000, "retention removed operations: {tombstones} tombstones");
    let offsets: BTreeMap<i32, Option<i64>> = (0..PARTITIONS).map(|p| (p, a.next_offset(p).unwrap())).collect();

    // Into an empty store: the same keys and values, the same offsets.
    let (b, _db) = open("empty");
    assert_eq!(restore(&b, &log), offsets);
    assert!(state(&b) == want, "the restored state differs from the state the batches wrote");

    // What compaction leaves (the latest record per key, tombstones gone
    // after delete.retention.ms), over a store holding stale state of
    // partition 0 and a later offset: the stale state does not survive.
    let mut latest: BTreeMap<Vec<u8>, &OutboxRecord> = BTreeMap::new();
    for r in &log {
        latest.insert(r.key.clone().unwrap(), r);
    }
    let compacted: Vec<OutboxRecord> = latest.into_values().filter(|r| r.value.is_some()).cloned().collect();
    assert!(compacted.len() < log.len() / 2, "compaction keeps {} of {}", compacted.len(), log.len());
    let (c, _dc) = open("stale");
    let mut stale = Batch::default();
    stale.put_entity(0, "left-over".into(), Some(Default::default()));
    stale.set_offset(0, 1 << 40);
    c.commit(stale).unwrap();
    assert_eq!(restore(&c, &compacted), offsets);
    assert!(state(&c) == want, "the state restored from the compacted changelog differs");

    // A changelog with nothing of a partition leaves the store as it was.
    let (d, _dd) = open("nothing");
    let mut own = Batch::default();
    own.set_offset(1, 7);
    d.commit(own).unwrap();
    assert_eq!(d.restoring(1).finish().unwrap(), None);
    assert_eq!(d.next_offset(1).unwrap(), Some(7));
}
