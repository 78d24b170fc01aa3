//! The state changelog against RocksDB, without a broker: the changelog
//! records a fault-injected workload's batches make (timers fired until
//! retention has removed operations, so tombstones are in it too) restore
//! into an empty store, or over a stale one, exactly the state the batches
//! wrote (the timer index too, which the changelog does not carry); and so
//! do what compaction leaves of them and a standby's batch-by-batch writes.

use std::collections::BTreeMap;

use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::event::{Body, Requested};
use reconciler::core::Event;
use reconciler::loadgen::{Generator, MemoryTopic, Options};
use reconciler::metrics::Metrics;
use reconciler::pipeline::{Applier, Stats};
use reconciler::records::{event_record, signed, ProducerRecord, Record};
use reconciler::signature::ControlKeys;
use reconciler::store::{changelog, Batch, Restored, Store};

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
    (Store::open(&dir, &Config::default().topics.events, false).unwrap(), Dir(dir))
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
fn workload(store: &Store, cfg: &Config) -> Vec<ProducerRecord> {
    workload_until(store, cfg, usize::MAX)
}

/// [`workload`], with the timers fired `rounds` times at most (0: none, so
/// that the state ends with its timers pending).
fn workload_until(store: &Store, cfg: &Config, rounds: usize) -> Vec<ProducerRecord> {
    workload_losing(store, cfg, rounds, |_| false)
}

/// The default fault-injected workload's records: 1,500 units.
fn preload(topic: &mut MemoryTopic, codec: &Codec, keys: &ControlKeys, cfg: &Config) -> Vec<Record> {
    Generator::new(Options::preload(1_500, 5, 1_700_000_000_000))
        .map(|p| topic.append(p.record.to_outbox(codec, keys, &cfg.topics.events).unwrap()))
        .collect()
}

/// [`workload_until`], losing batches as [`apply_losing`] says.
fn workload_losing(store: &Store, cfg: &Config, rounds: usize, lost: impl Fn(usize) -> bool) -> Vec<ProducerRecord> {
    apply_losing(store, cfg, preload, 700, rounds, lost)
}

/// Applies the records `input` appends to the topic in batches of `size`,
/// then fires the timers `rounds` times at most (see [`workload_until`]);
/// the store write of each batch that `lost` picks (by its number, counted
/// through the timer rounds) is lost after its changelog records went out:
/// a crash between an `exactly_once` transaction's commit and the store
/// write, or an unsynced WAL lost with the machine. The next batch takes
/// the lost batch's records again with its own, from the store's offsets:
/// in other batch boundaries, as the first poll after a restart would. A
/// round's last batch is never lost. Returns the changelog records in
/// order.
fn apply_losing(
    store: &Store,
    cfg: &Config,
    input: impl FnOnce(&mut MemoryTopic, &Codec, &ControlKeys, &Config) -> Vec<Record>,
    size: usize,
    rounds: usize,
    lost: impl Fn(usize) -> bool,
) -> Vec<ProducerRecord> {
    let (policy, codec) = (cfg.policy(), Codec::new());
    // Timers and decisions signed as the reconciler signs them.
    let keys = ControlKeys::new([b"offline-changelog-test-key".to_vec()]);
    let metrics = Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types);
    let applier = Applier::new(cfg, store, &policy, &codec, &keys, &metrics);
    let mut topic = MemoryTopic::new(PARTITIONS);
    let mut records = input(&mut topic, &codec, &keys, cfg);
    let mut next: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let mut stats = Stats::default();
    let mut log = Vec::new();
    let mut batches = 0;
    for round in 0.. {
        assert!(round < 50, "timers keep coming");
        let chunks: Vec<&[Record]> = records.chunks(size).collect();
        // The records of a lost batch, taken again by the next.
        let mut again: Vec<Record> = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let before = next.clone();
            again.extend_from_slice(chunk);
            let applied = applier.apply(&again, &mut next, &BTreeMap::new(), &mut stats).unwrap();
            let is_lost = i + 1 < chunks.len() && lost(batches);
            batches += 1;
            if is_lost {
                next = before;
            } else {
                store.write_encoded(&applied.batch).unwrap();
                again.clear();
            }
            log.extend(
                applied.batch.into_outbox().into_iter().filter(|r| cfg.topics.changelog() == Some(r.topic.as_str())),
            );
        }
        if round == rounds {
            break;
        }
        // The timer wheel, with a clock past every deadline: each due timer
        // becomes an event in its operation's partition.
        records = Vec::new();
        for p in 0..PARTITIONS {
            for t in store.due_timers(p, i64::MAX / 4, usize::MAX).unwrap() {
                let ev = Event::deadline_reached(&t.operation_id, &t.entity_id, &t.operation_type, t.at);
                let rec = signed(event_record(&codec, &cfg.topics.events, &ev).unwrap(), &keys);
                records.push(topic.append_to(p, rec));
            }
        }
        if records.is_empty() {
            break;
        }
    }
    log
}

/// The records of `log` in changelog partition `p`, in order.
fn of_partition(log: &[ProducerRecord], p: i32) -> Vec<ProducerRecord> {
    log.iter().filter(|r| changelog::partition_of(r.key.as_deref().unwrap()) == Some(p)).cloned().collect()
}

/// Restores partition `p` from `records` (its changelog, from position 0).
fn restore_partition(store: &Store, p: i32, records: &[ProducerRecord]) -> Restored {
    let mut into = store.restoring(p);
    for (at, r) in records.iter().enumerate() {
        into.apply(at as i64, r.key.as_deref().unwrap(), r.value.as_deref()).unwrap();
    }
    into.finish().unwrap()
}

/// Restores every partition of `log` into `store`; the offsets restored to.
fn restore(store: &Store, log: &[ProducerRecord]) -> BTreeMap<i32, Option<i64>> {
    let mut restored = BTreeMap::new();
    for p in 0..PARTITIONS {
        let r = restore_partition(store, p, &of_partition(log, p));
        assert_eq!(r.tail, None, "a changelog of whole batches has no tail");
        restored.insert(p, r.next);
    }
    restored
}

/// Applies every partition of `log` to `store` as a standby replica does:
/// a batch at a time, each up to and including its offsets record.
fn apply_as_standby(store: &Store, log: &[ProducerRecord]) {
    for p in 0..PARTITIONS {
        let mut held = Vec::new();
        for r in of_partition(log, p) {
            held.push((r.key.clone().unwrap(), r.value.clone()));
            if is_offsets(&r) {
                store.apply_changelog(p, &held).unwrap();
                held.clear();
            }
        }
        assert!(held.is_empty(), "every batch ends with its offsets record");
    }
}

/// Whether `r` is an offsets record.
fn is_offsets(r: &ProducerRecord) -> bool {
    r.key.as_deref().unwrap()[1] == b'n'
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

    // As a standby replica applies it: a batch at a time, each write
    // moving its operation's timer from the one already in the store (the
    // changelog has no timers).
    let (s, _ds) = open("standby");
    apply_as_standby(&s, &log);
    assert!(state(&s) == want, "the state a standby applied differs from the state the batches wrote");

    // What compaction leaves (the latest record per key, tombstones gone
    // after delete.retention.ms), over a store holding stale state of
    // partition 0 and a later offset: the stale state does not survive.
    // (In log order, as compaction keeps it.)
    let mut latest: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for (at, r) in log.iter().enumerate() {
        latest.insert(r.key.clone().unwrap(), at);
    }
    let mut kept: Vec<usize> = latest.into_values().filter(|at| log[*at].value.is_some()).collect();
    kept.sort_unstable();
    let compacted: Vec<ProducerRecord> = kept.into_iter().map(|at| log[at].clone()).collect();
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
    assert_eq!(d.restoring(1).finish().unwrap(), Restored { next: None, tail: None });
    assert_eq!(d.next_offset(1).unwrap(), Some(7));
}

/// A store that lost batches after their changelog records went out (see
/// [`workload_losing`]) and took their records again in other batch
/// boundaries ends with the state of a store that lost none, and its
/// changelog restores exactly that state: applying records again writes
/// every key they touch, so no record of a lost batch outlives it in the
/// changelog. (A batch that skipped writing an entity whose value equals
/// the stored one broke this: an entity changed by a lost batch and back
/// by the batch that took its records again kept the lost batch's value
/// in the changelog. BENCHMARKS.md, issue 20, "an entity skip reverted".)
#[test]
fn batches_lost_after_their_changelog_went_out_and_applied_again_leave_it_agreeing() {
    let mut cfg = Config::default();
    cfg.time.retention_ms = 60_000;
    let (a, _da) = open("none-lost");
    workload(&a, &cfg);
    let want = state(&a);
    for every in [2, 3, 5] {
        lose_then_restore(&format!("lost-{every}"), &format!("every {every}th batch lost"), &want, |b| {
            workload_losing(b, &cfg, usize::MAX, |i| i % every == every - 1)
        });
    }
}

/// Has `losing` apply into a fresh store `name` (losing batches, see
/// [`apply_losing`]) and restores the changelog it returns into another:
/// both must end with `want` (`what` names the case in the messages).
/// Returns the two stores, the one that lost batches first.
fn lose_then_restore(
    name: &str,
    what: &str,
    want: &[(String, Vec<u8>, Vec<u8>)],
    losing: impl FnOnce(&Store) -> Vec<ProducerRecord>,
) -> [(Store, Dir); 2] {
    let (b, db) = open(name);
    let log = losing(&b);
    assert!(state(&b) == want, "{what}: the store that lost batches ends with another state");
    let (c, dc) = open(&format!("{name}-restored"));
    restore(&c, &log);
    assert!(state(&c) == want, "{what}: its changelog restores another state");
    [(b, db), (c, dc)]
}

/// The case that broke the entity skip, by hand, in batches of one record:
/// an operation's `Started` arrives before its request (the operation is
/// created, its entity counts it, nothing is open); the batch of its
/// `Requested` (the entity now lists it as open) is lost after its
/// changelog went out; the next batch takes the request again with the
/// `Cancelled` that closes it, which leaves the entity as the store holds
/// it. The entity is written all the same, so its changelog record from
/// the lost batch does not outlive it.
#[test]
fn an_entity_a_lost_batch_changed_and_the_next_changed_back_is_written_again() {
    let cfg = Config::default();
    let events = |topic: &mut MemoryTopic, codec: &Codec, _: &ControlKeys, cfg: &Config| -> Vec<Record> {
        let bodies = [
            (2, Body::Started { attempt: 1, worker: "w-1".into() }),
            (
                1,
                Body::Requested(Requested {
                    expected_version: Some(7),
                    expected_fingerprint: None,
                    idempotency_key: None,
                    idempotent: false,
                    destination: "crm".into(),
                    confirm_within_ms: Some(60_000),
                    max_attempts: None,
                }),
            ),
            (3, Body::Cancelled { reason: "deleted".into() }),
        ];
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, (seq, body))| {
                let ev = Event {
                    event_id: format!("op-1.e{seq}"),
                    operation_id: "op-1".into(),
                    entity_id: "cust-1".into(),
                    operation_type: "sync_customer".into(),
                    seq: Some(seq),
                    occurred_at: 1_700_000_000_000 + i as i64 * 100,
                    producer: "test".into(),
                    body,
                };
                topic.append_to(0, event_record(codec, &cfg.topics.events, &ev).unwrap())
            })
            .collect()
    };
    let (a, _da) = open("by-hand-none-lost");
    apply_losing(&a, &cfg, events, 1, 0, |_| false);
    let [(b, _db), (c, _dc)] = lose_then_restore("by-hand-lost", "the request's batch lost", &state(&a), |b| {
        apply_losing(b, &cfg, events, 1, 0, |i| i == 1)
    });
    let (restored, held) = (c.get_entity(0, "cust-1").unwrap(), b.get_entity(0, "cust-1").unwrap());
    assert!(held.open.is_empty() && held.operations == 1, "{held:?}");
    assert_eq!(restored, held, "the changelog restores the entity the store holds");
}

/// The changelog carries no timers: whoever applies it rebuilds the timer
/// index from the operations, each write moving its operation's timer. A
/// state with its timers pending (none fired) and one after a round of
/// them (timers moved, some operations closed) restore with the index the
/// batches wrote, by a restore and by a standby's writes.
#[test]
fn the_timer_index_is_rebuilt_from_the_operations_of_the_changelog() {
    for (rounds, pending) in [(0, 500), (1, 20)] {
        let cfg = Config::default();
        let (a, _da) = open(&format!("timers-source-{rounds}"));
        let log = workload_until(&a, &cfg, rounds);
        assert!(log.iter().all(|r| r.key.as_deref().unwrap()[1] != b't'), "no timer record in the changelog");
        let want = state(&a);
        let timers = want.iter().filter(|(f, _, _)| f == "timers").count();
        assert!(timers > pending, "the state holds pending timers: {timers}");
        let (b, _db) = open(&format!("timers-restored-{rounds}"));
        restore(&b, &log);
        assert!(state(&b) == want, "the restored timer index differs (after {rounds} rounds)");
        let (s, _ds) = open(&format!("timers-standby-{rounds}"));
        apply_as_standby(&s, &log);
        assert!(state(&s) == want, "the standby's timer index differs (after {rounds} rounds)");
    }
}

/// An owner that stopped while publishing a batch's changelog left its
/// first records without the batch's offsets record. The restore reports
/// that tail; restored again up to the batch before, the state is the one
/// of the complete batches; its undo, published after the tail, makes the
/// changelog restore that state on its own, and the batch applied again
/// after the undo restores exactly the state of the uncut changelog.
#[test]
fn a_batch_cut_short_at_the_end_of_the_changelog_is_left_out_and_set_back() {
    let cfg = Config::default();
    let (a, _da) = open("cut-source");
    let log = workload(&a, &cfg);
    let p0 = of_partition(&log, 0);
    let ends: Vec<usize> = p0.iter().enumerate().filter(|(_, r)| is_offsets(r)).map(|(at, _)| at + 1).collect();
    assert!(ends.len() > 3, "the workload has batches: {ends:?}");
    // The cut batch: the one after the second complete batch, cut in its
    // middle.
    let (complete, next_end) = (ends[1], ends[2]);
    assert!(next_end - complete > 2, "the batch has writes to cut");
    let cut = complete + (next_end - complete) / 2;

    let (reference, _dr) = open("cut-reference");
    let before = restore_partition(&reference, 0, &p0[..complete]);
    assert_eq!(before.tail, None);
    let want_before = state(&reference);

    // The tail is reported, and where the complete batches end.
    let (b, _db) = open("cut");
    let cut_short = restore_partition(&b, 0, &p0[..cut]);
    let tail = cut_short.tail.expect("the cut batch is reported");
    assert_eq!(tail.complete_to, Some(complete as i64));
    assert_eq!(tail.len(), cut - complete);
    // Restored again up to there: the state of the complete batches.
    let again = restore_partition(&b, 0, &p0[..complete]);
    assert_eq!(again.next, before.next);
    assert!(state(&b) == want_before, "restored up to the batch before the cut, the state differs");

    // The undo after the tail: a changelog that restores on its own to the
    // state before the cut batch, with no tail left.
    let undo = b.undo(0, &tail, again.next, cfg.topics.changelog().expect("on")).unwrap();
    assert_eq!(
        undo.len(),
        1 + p0[complete..cut].iter().map(|r| r.key.clone()).collect::<std::collections::BTreeSet<_>>().len()
    );
    let mut set_back: Vec<ProducerRecord> = p0[..cut].to_vec();
    set_back.extend(undo.iter().cloned());
    let (c, _dc) = open("cut-undone");
    let undone = restore_partition(&c, 0, &set_back);
    assert_eq!(undone, Restored { next: before.next, tail: None });
    assert!(state(&c) == want_before, "the tail followed by its undo restores another state");

    // The batch published again, whole, after the undo: the state of the
    // changelog that was never cut.
    set_back.extend(p0[complete..next_end].iter().cloned());
    let (d, _dd) = open("cut-redone");
    let redone = restore_partition(&d, 0, &set_back);
    let (e, _de) = open("uncut");
    let uncut = restore_partition(&e, 0, &p0[..next_end]);
    assert_eq!(redone, uncut);
    assert!(
        state(&d) == state(&e),
        "the re-published batch after the undo restores another state than the uncut changelog"
    );

    // Without any complete batch, the tail is all there is: nothing of the
    // partition stays, and the undo deletes every key the tail wrote.
    let (f, _df) = open("cut-only");
    let only = restore_partition(&f, 0, &p0[..ends[0] - 1]);
    let tail = only.tail.expect("a tail with no batch before it");
    assert_eq!((only.next, tail.complete_to), (None, None));
    f.forget_partition(0).unwrap();
    assert!(f.undo(0, &tail, None, "t.state").unwrap().iter().all(|r| r.value.is_none()));
}

/// Two pipelines of different inputs pointed at one changelog topic: the
/// offsets records name their input, and a restore into the state of
/// another input stops there (the partition then replays its own input).
#[test]
fn a_changelog_of_another_input_is_not_restored() {
    let cfg = Config::default();
    let (a, _da) = open("input-source");
    let log = workload(&a, &cfg);
    let dir = std::env::temp_dir().join(format!("reconciler-changelog-other-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let other = Store::open(&dir, "another.events", false).unwrap();
    let _d = Dir(dir);
    let p0 = of_partition(&log, 0);
    let mut into = other.restoring(0);
    let err = p0
        .iter()
        .enumerate()
        .find_map(|(at, r)| into.apply(at as i64, r.key.as_deref().unwrap(), r.value.as_deref()).err())
        .expect("refused at the first offsets record");
    assert!(err.to_string().contains(&format!("input topic {:?}, not \"another.events\"", cfg.topics.events)), "{err}");
    into.abandon().unwrap();
    assert_eq!(other.next_offset(0).unwrap(), None, "nothing restored");
}
