//! The store's own contract: what a batch writes is what reads return, the
//! outbox keeps whole batches in order, and a store of another format is
//! refused with a clear error rather than misread.

use super::*;
use crate::core::Event;

/// A fresh directory for a test's store, removed when dropped (the other
/// unit tests that open a store use it too).
pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `reconciler-<name>-<pid>` in the temp directory, emptied.
pub(crate) fn temp(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("reconciler-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TempDir(dir)
}

/// How many times `needle` occurs in stored bytes `hay`.
fn occurrences(hay: &[u8], needle: impl AsRef<[u8]>) -> usize {
    let needle = needle.as_ref();
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// `events` of one operation applied in turn (from offset 0 of partition
/// 0) and recorded in its timeline, as the pipeline's batch step does: its
/// state, its timeline's head, and a batch with the entries moved out of
/// the head.
fn applied_and_recorded(
    events: impl IntoIterator<Item = Event>,
    policy: &crate::core::Policy,
) -> (Option<OperationState>, TimelineHead, Batch) {
    use crate::core::{Authenticity, EntityState, SourcePos};
    let (mut slot, mut head, mut entity) = (None, TimelineHead::default(), EntityState::default());
    let mut batch = Batch::default();
    for (offset, ev) in events.into_iter().enumerate() {
        let pos = SourcePos { partition: 0, offset: offset as i64 };
        let a = timeline::Arrival::of(&ev, pos, policy);
        let mut out = Vec::new();
        let d =
            crate::core::apply(policy, &mut slot, &mut entity, ev, Authenticity::Unsigned, pos, &mut out).disposition;
        timeline::record(&mut batch, &mut head, a, d, &out, slot.as_ref());
    }
    (slot, head, batch)
}

/// Event `id` of operation `op-1` (entity `ent-1`, producer `svc`) at
/// revision `seq`, at event time `at`.
fn op1_event(id: &str, seq: i64, at: i64, body: crate::core::event::Body) -> Event {
    Event {
        event_id: id.into(),
        seq: Some(seq),
        occurred_at: at,
        producer: "svc".into(),
        body,
        ..Event::deadline_reached("op-1", "ent-1", "sync", 0)
    }
}

/// Writes `op-1`'s stored state back after `change` (its timeline head
/// kept): to read its entries against a state they were not written with.
fn rewrite_op1_state(store: &Store, change: impl FnOnce(&mut OperationState)) {
    let (state, head) = store.load_op(0, "op-1").unwrap();
    let mut state = state.expect("op-1 is stored");
    change(&mut state);
    let mut batch = Batch::default();
    batch.put_op(0, "op-1".into(), Some(state), head);
    store.commit(batch).unwrap();
}

fn record(n: u8) -> ProducerRecord {
    ProducerRecord {
        topic: "out".into(),
        key: Some(vec![n]),
        value: Some(vec![n; 3]),
        headers: vec![("h".into(), Some(vec![n]))],
    }
}

/// The outbox keeps a batch's outputs whole, and of its changelog records
/// only what a restart uses: which partitions had some unpublished.
#[test]
fn the_outbox_keeps_the_outputs_and_one_changelog_record_per_partition() {
    let dir = temp("store-outbox-changelog");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut b = Batch::default();
    b.publish(record(1));
    for p in [1, 2] {
        b.put_entity(p, format!("e-{p}"), Some(Default::default()));
        b.put_entity(p, format!("f-{p}"), Some(Default::default()));
        b.set_offset(p, 10 * i64::from(p));
    }
    let encoded = b.encode(Some(changelog::Target { topic: "t.state", input: "t.events" }));
    assert_eq!(encoded.parts[0].outbox.len(), 1 + 6, "the output, then 3 changelog records per partition");
    store.write_encoded(&encoded).unwrap();
    let pending: Vec<ProducerRecord> = store.pending_outbox().unwrap().into_iter().map(|(_, r)| r).collect();
    assert_eq!(pending[0], record(1));
    let partitions: Vec<Option<i32>> =
        pending[1..].iter().map(|r| changelog::partition_of(r.key.as_deref().unwrap())).collect();
    assert_eq!(partitions, vec![Some(1), Some(2)]);
    assert!(pending[1..].iter().all(|r| r.topic == "t.state"));
    assert_eq!(encoded.into_outbox().len(), 7, "the batch in memory still publishes every record");
}

#[test]
fn the_outbox_keeps_each_batch_whole_and_in_order_until_acknowledged() {
    let dir = temp("store-outbox");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut first = Batch::default();
    first.publish(record(1));
    first.publish(record(2));
    let mut second = Batch::default();
    second.publish(record(3));
    let a = store.commit(first).unwrap();
    let b = store.commit(second).unwrap();
    assert_eq!(store.commit(Batch::default()).unwrap(), 0..0, "a batch without outputs takes no sequence number");
    assert_eq!(store.outbox_len().unwrap(), 3, "counts records, not batches");
    let pending = store.pending_outbox().unwrap();
    let records: Vec<_> = pending.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(records, vec![record(1), record(2), record(3)]);
    assert_eq!(pending.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![a.start, a.start, b.start]);
    store.ack_outbox(a).unwrap();
    assert_eq!(store.pending_outbox().unwrap(), vec![(b.start, record(3))]);
    drop(store);
    // Sequence numbers continue after a restart.
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut third = Batch::default();
    third.publish(record(4));
    assert_eq!(store.commit(third).unwrap().start, b.start + 1);
}

#[test]
fn an_operation_is_read_back_with_its_timeline_total() {
    let dir = temp("store-op");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let ev = Event::deadline_reached("op-1", "ent-1", "sync", 5);
    let state = OperationState::new(&ev);
    let mut batch = Batch::default();
    batch.put_op(0, "op-1".into(), Some(state.clone()), TimelineHead::of_total(7));
    store.commit(batch).unwrap();
    // Its id is its key's and its type is stored once, in the summary;
    // every read names the state with both.
    let value = store.get_raw(encoded::Family::Ops, &keys::scoped(0, "op-1")).unwrap().unwrap();
    assert_eq!((occurrences(&value, "op-1"), occurrences(&value, "sync")), (0, 1));
    assert_eq!(store.load_op(0, "op-1").unwrap(), (Some(state.clone()), TimelineHead::of_total(7)));
    assert_eq!(store.load_ops(&[(0, "op-1")]).unwrap(), vec![(Some(state.clone()), TimelineHead::of_total(7))]);
    assert_eq!(store.get_op(0, "op-1").unwrap(), Some(state.clone()));
    assert_eq!(store.ops_of(0).unwrap(), vec![state.clone()]);
    assert_eq!(store.timeline_total(0, "op-1").unwrap(), 7);
    assert_eq!(store.load_op(1, "op-1").unwrap(), (None, TimelineHead::default()), "scoped by partition");
    let mut seen = Vec::new();
    store
        .scan_summaries(0, |s| {
            seen.push(s.owned());
            true
        })
        .unwrap();
    let summary = OpSummary {
        operation_type: "sync".into(),
        status: state.status,
        requested_at: None,
        review_since: state.last_event_at,
        follow_up: None,
    };
    assert_eq!(seen, vec![summary]);
    let mut batch = Batch::default();
    batch.put_op(0, "op-1".into(), None, TimelineHead::of_total(7));
    store.commit(batch).unwrap();
    assert_eq!(store.timeline_total(0, "op-1").unwrap(), 0);
}

#[test]
fn a_store_of_an_older_format_is_refused_with_the_directory_named() {
    let dir = temp("store-format");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut batch = Batch::default();
    batch.set_offset(0, 10);
    store.commit(batch).unwrap();
    // What a store written before the format marker looks like.
    store.db.delete_cf(store.cf("meta"), b"format").unwrap();
    let scratch = temp("store-format-secondary");
    let err = Store::open_secondary(&dir.0, &scratch.0, "t.events").err().expect("a reader refuses it too");
    assert!(matches!(err, StoreError::Format { found: 1, .. }), "{err}");
    drop(store);
    let err = Store::open(&dir.0, "t.events", false).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Format { found: 1, .. }), "{msg}");
    assert!(msg.contains(&dir.0.display().to_string()) && msg.contains("replay"), "{msg}");
}

#[test]
fn a_new_or_current_store_opens() {
    let dir = temp("store-fresh");
    drop(Store::open(&dir.0, "t.events", false).unwrap());
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut batch = Batch::default();
    batch.set_offset(0, 1);
    store.commit(batch).unwrap();
    drop(store);
    assert!(Store::open(&dir.0, "t.events", false).is_ok());
}

#[test]
fn of_two_timeline_entries_for_one_ring_slot_in_a_batch_the_later_is_kept() {
    use crate::core::Disposition;
    let dir = temp("store-ring");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let ev = Event::deadline_reached("op-1", "ent-1", "sync", 5);
    let policy = crate::core::Policy::default();
    let entry = |ordinal: u64| {
        let a = timeline::Arrival::of(&ev, crate::core::SourcePos { partition: 0, offset: ordinal as i64 }, &policy);
        timeline::entry_value(ordinal, &a, Disposition::Applied, &[], &OperationState::new(&ev))
    };
    let mut batch = Batch::default();
    // Another operation's entries around it, so the batch really is sorted.
    batch.add_timeline_value(0, "op-2", 0, entry(0));
    batch.add_timeline_value(0, "op-1", 3, entry(3));
    batch.add_timeline_value(0, "op-1", 3 + timeline::TIMELINE_CAP, entry(3 + timeline::TIMELINE_CAP));
    batch.add_timeline_value(0, "op-0", 0, entry(0));
    batch.put_op(0, "op-1".into(), Some(OperationState::new(&ev)), TimelineHead::of_total(4 + timeline::TIMELINE_CAP));
    store.commit(batch).unwrap();
    let t = store.timeline(0, "op-1").unwrap();
    assert_eq!(t.entries.iter().map(|e| e.ordinal).collect::<Vec<_>>(), vec![3 + timeline::TIMELINE_CAP]);
}

/// An operation is found by its key alone: a damaged value still names
/// its partition (the HTTP API tells "not owned" before it reads one),
/// where reading the value fails.
#[test]
fn an_operation_is_located_without_reading_its_value() {
    let dir = temp("store-locate");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    for p in [1, 3] {
        let mut batch = Batch::default();
        batch.set_offset(p, 10);
        store.commit(batch).unwrap();
    }
    store.db.put_cf(store.cf("ops"), keys::scoped(3, "op-1"), b"\xff\xff damaged").unwrap();
    assert_eq!(store.op_partition("op-1").unwrap(), Some(3));
    assert!(matches!(store.get_op(3, "op-1").unwrap_err(), StoreError::Corrupt { what: "operation", .. }));
    assert_eq!(store.op_partition("op-2").unwrap(), None);
}

/// A value of the wrong size (a damaged store, or one written by something
/// else) is a typed error naming what was read, never a panic.
#[test]
fn values_of_the_wrong_size_are_corrupt_not_a_panic() {
    let dir = temp("store-corrupt");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    store.db.put_cf(store.cf("offsets"), keys::partition_prefix(2), b"abc").unwrap();
    let err = store.next_offset(2).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { what: "offset", .. }), "{err}");
    assert!(err.to_string().contains("3 bytes is too short"), "{err}");
    store.db.put_cf(store.cf("offsets"), b"ab", keys::offset(1)).unwrap();
    assert!(matches!(store.partitions().unwrap_err(), StoreError::Corrupt { what: "offset key", .. }));
    store.db.put_cf(store.cf("ops"), keys::scoped(2, "op-1"), b"\xff\xff").unwrap();
    assert!(matches!(store.load_op(2, "op-1").unwrap_err(), StoreError::Corrupt { what: "operation", .. }));
    // A head with more inline entries than entries: refused, not read as
    // a timeline of a few billion ordinals.
    let state = OperationState::new(&Event::deadline_reached("op-1", "ent-1", "sync", 5));
    let latest = std::collections::VecDeque::from(vec![vec![0u8]; 2]);
    let stored = encoded::StoredOpRef {
        timeline_total: 1,
        summary: encoded::OpSummary::of(&state),
        state: &state,
        last_verdict: None,
        latest: encoded::LatestRef(&latest),
    };
    store.db.put_cf(store.cf("ops"), keys::scoped(2, "op-1"), postcard::to_allocvec(&stored).unwrap()).unwrap();
    for err in [store.load_op(2, "op-1").unwrap_err(), store.timeline(2, "op-1").unwrap_err()] {
        assert!(err.to_string().contains("more entries in the value"), "{err}");
    }
}

/// The batched reads the apply step starts a lane with return what the
/// reads one key at a time return, in the order asked (sorted, which
/// RocksDB is told, or not), absent keys included; a corrupt value is an
/// error, as one by one.
#[test]
fn batched_reads_agree_with_reads_one_key_at_a_time() {
    let dir = temp("store-multi-get");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let mut batch = Batch::default();
    for (p, id) in [(0, "op-1"), (1, "op-2"), (0, "op-3")] {
        let state = OperationState::new(&Event::deadline_reached(id, "ent-1", "sync", 5));
        batch.put_op(p, id.into(), Some(state), TimelineHead::of_total(p as u64 + 2));
    }
    let entity = EntityState { confirmed_version: Some(4), operations: 2, ..EntityState::default() };
    batch.put_entity(0, "ent-1".into(), Some(entity.clone()));
    store.commit(batch).unwrap();
    let ids = [(0, "op-3"), (1, "op-1"), (1, "op-2"), (0, "op-1"), (5, "none")];
    let one_by_one: Vec<_> = ids.iter().map(|(p, id)| store.load_op(*p, id).unwrap()).collect();
    assert_eq!(store.load_ops(&ids).unwrap(), one_by_one);
    assert_eq!(one_by_one.iter().filter(|(s, _)| s.is_some()).count(), 3, "present and absent keys");
    let mut sorted = ids;
    sorted.sort_unstable();
    let one_by_one: Vec<_> = sorted.iter().map(|(p, id)| store.load_op(*p, id).unwrap()).collect();
    assert_eq!(store.load_ops(&sorted).unwrap(), one_by_one, "in key order");
    let entities = store.get_entities(&[(1, "ent-1"), (0, "ent-1")]).unwrap();
    assert_eq!(entities, vec![EntityState::default(), entity]);
    store.db.put_cf(store.cf("ops"), keys::scoped(2, "op-1"), b"\xff\xff").unwrap();
    let err = store.load_ops(&[(0, "op-1"), (2, "op-1")]).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { what: "operation", .. }), "{err}");
}

/// An operation's latest entries live in its value; only those before them
/// take keys of the timeline family, and its removal takes both.
#[test]
fn the_latest_timeline_entries_live_in_the_operation_and_older_ones_move_out() {
    use crate::core::{Disposition, Policy, SourcePos};
    let dir = temp("store-inline");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let policy = Policy::default();
    let timeline_keys =
        |store: &Store| store.db.iterator_cf(store.cf("timeline"), rocksdb::IteratorMode::Start).count();
    let n = timeline::INLINE_ENTRIES as u64 + 4;
    // Written over two batches, the head carried from one to the next as
    // the pipeline carries it (read back with the state).
    for range in [0..3, 3..n] {
        let (state, mut head) = store.load_op(0, "op-1").unwrap();
        let ev = Event::deadline_reached("op-1", "ent-1", "sync", 5);
        let state = state.unwrap_or_else(|| OperationState::new(&ev));
        let mut batch = Batch::default();
        for offset in range {
            let a = timeline::Arrival::of(&ev, SourcePos { partition: 0, offset: offset as i64 }, &policy);
            timeline::record(&mut batch, &mut head, a, Disposition::Applied, &[], Some(&state));
        }
        batch.put_op(0, "op-1".into(), Some(state), head);
        store.commit(batch).unwrap();
        if store.timeline_total(0, "op-1").unwrap() == 3 {
            assert_eq!(timeline_keys(&store), 0, "a short timeline is all in the operation's value");
        }
    }
    let t = store.timeline(0, "op-1").unwrap();
    assert_eq!(t.total, n);
    assert_eq!(t.entries.iter().map(|e| e.offset).collect::<Vec<_>>(), (0..n as i64).collect::<Vec<_>>());
    assert_eq!(timeline_keys(&store), 4, "the four oldest moved out of the value");
    let (_, head) = store.load_op(0, "op-1").unwrap();
    assert_eq!((head.latest.len(), head.spilled_slots()), (timeline::INLINE_ENTRIES, 4));
    // Out of retention: the state, the entries in it and those out of it.
    let mut batch = Batch::default();
    batch.put_op(0, "op-1".into(), None, head);
    store.commit(batch).unwrap();
    assert_eq!((store.timeline(0, "op-1").unwrap(), timeline_keys(&store)), (Timeline::default(), 0));
    // An entry larger than the value may hold moves out at once, and the
    // value keeps the smaller ones after it.
    let mut big = Event::deadline_reached("op-2", "ent-1", "sync", 5);
    big.producer = "p".repeat(timeline::INLINE_BYTES + 1);
    let small = Event::deadline_reached("op-2", "ent-1", "sync", 6);
    let (mut head, mut batch, state) = (TimelineHead::default(), Batch::default(), OperationState::new(&small));
    for (offset, ev) in [&big, &small].into_iter().enumerate() {
        let a = timeline::Arrival::of(ev, SourcePos { partition: 0, offset: offset as i64 }, &policy);
        timeline::record(&mut batch, &mut head, a, Disposition::Applied, &[], Some(&state));
    }
    assert_eq!((head.total, head.latest.len(), batch.timeline.len()), (2, 1, 1));
}

/// The changelog has no timers: a restore moves each operation's timer as
/// it applies the operation's records, also when the operation's writes
/// fall on both sides of a chunk written in between (its earlier timer is
/// then read back from the store, not from the chunk).
#[test]
fn a_restore_rebuilds_the_timer_index_across_its_chunks() {
    let dir = temp("store-restore-timers");
    let source = Store::open(&dir.0, "t.events", false).unwrap();
    let target = changelog::Target { topic: "s", input: "t.events" };
    let ev = |op: &str| Event::deadline_reached(op, "ent-1", "sync", 5);
    let with_timer = |op: &str, at: Option<i64>| {
        let mut s = OperationState::new(&ev(op));
        s.timer_at = at;
        s
    };
    // op-1: a timer at 10, moved to 20, then gone with the operation; op-2:
    // a timer at 30 that stays; op-3: no timer.
    // (operation, timer before, timer after, exists after)
    type Step<'a> = &'a [(&'a str, Option<i64>, Option<i64>, bool)];
    let steps: [Step; 3] = [
        &[("op-1", None, Some(10), true), ("op-3", None, None, true)],
        &[("op-1", Some(10), Some(20), true), ("op-2", None, Some(30), true)],
        &[("op-1", Some(20), None, false)],
    ];
    let mut log = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let mut batch = Batch::default();
        for (op, from, to, exists) in *step {
            let state = exists.then(|| with_timer(op, *to));
            batch.move_timer(0, op, *from, state.as_ref());
            batch.put_op(0, (*op).into(), state, TimelineHead::default());
        }
        batch.set_offset(0, n as i64 + 1);
        let encoded = batch.encode(Some(target));
        source.write_encoded(&encoded).unwrap();
        log.extend(encoded.into_outbox().into_iter().filter(|r| r.topic == "s"));
    }
    assert!(log.iter().all(|r| r.key.as_ref().unwrap()[1] != b't'), "no timer in the changelog");
    let timers = |store: &Store| {
        let mut out = Vec::new();
        store
            .scan_partitions_state(|f, k, v| {
                if f == "timers" {
                    out.push((k.to_vec(), v.to_vec()));
                }
            })
            .unwrap();
        out
    };
    let want = timers(&source);
    assert_eq!(want.len(), 1, "op-2's timer only");
    for chunk in [1, usize::MAX] {
        let dir = temp(&format!("store-restore-timers-{chunk}"));
        let store = Store::open(&dir.0, "t.events", false).unwrap();
        let mut into = store.restoring(0).in_chunks_of(chunk);
        for (at, r) in log.iter().enumerate() {
            into.apply(at as i64, r.key.as_deref().unwrap(), r.value.as_deref()).unwrap();
        }
        assert_eq!(into.finish().unwrap().next, Some(3));
        assert_eq!(timers(&store), want, "chunks of {chunk} bytes");
        // Its timers are not listed: the partition's scans start over.
        assert_eq!(store.take_timer_puts(), std::collections::BTreeMap::from([(0, i64::MIN)]));
    }
}

/// A timer of operation `op` due at `at`.
fn timer_entry(at: i64, op: &str) -> TimerEntry {
    TimerEntry { at, operation_id: op.into(), entity_id: "e".into(), operation_type: "t".into() }
}

/// What `f` returns, and how many deleted keys RocksDB stepped over in it.
fn counting_deletes_skipped<R>(f: impl FnOnce() -> R) -> (R, u64) {
    rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::EnableCount);
    let mut perf = rocksdb::perf::PerfContext::default();
    perf.reset();
    let r = f();
    let skipped = perf.metric(rocksdb::perf::PerfMetric::InternalDeleteSkippedCount);
    rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
    (r, skipped)
}

/// Looking for due timers does not step over deleted timers that are not
/// due yet: timers are put and deleted all the time, and without an upper
/// bound the iterator walked every deleted future timer of the partition
/// on each tick (200,000 of them took 15 ms per look).
#[test]
fn due_timers_do_not_walk_deleted_future_timers() {
    let dir = temp("store-timers-tombstones");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let future = 10_000;
    let mut b = Batch::default();
    b.timers_added.push((0, timer_entry(100, "due")));
    for i in 0..future {
        b.timers_added.push((0, timer_entry(1_000 + i, &format!("op-{i}"))));
    }
    b.timers_added.push((0, timer_entry(1_000_000, "live-later")));
    store.commit(b).unwrap();
    let mut b = Batch::default();
    for i in 0..future {
        b.timers_removed.push((0, 1_000 + i, format!("op-{i}")));
    }
    store.commit(b).unwrap();

    let (due, skipped) = counting_deletes_skipped(|| store.due_timers(0, 500, 100).unwrap());

    assert_eq!(due.iter().map(|t| t.operation_id.as_str()).collect::<Vec<_>>(), ["due"]);
    assert!(skipped < 10, "stepped over {skipped} deleted timers that were not due");
    // Later, the live timer past the deleted ones is still found.
    let due = store.due_timers(0, 2_000_000, 100).unwrap();
    assert_eq!(due.iter().map(|t| t.operation_id.as_str()).collect::<Vec<_>>(), ["due", "live-later"]);
}

/// A scan from a later point does not step over the deleted timers in
/// front of it (the fired and moved ones, until a compaction drops them),
/// and every write tells the earliest timer it put in each partition, once.
#[test]
fn due_timers_from_a_point_skip_the_deleted_ones_before_it() {
    let dir = temp("store-timers-floor");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let fired = 10_000;
    let mut b = Batch::default();
    for i in 0..fired {
        b.timers_added.push((0, timer_entry(i, &format!("op-{i}"))));
    }
    b.timers_added.push((0, timer_entry(fired + 5, "due")));
    b.timers_added.push((1, timer_entry(42, "other")));
    store.commit(b).unwrap();
    assert_eq!(store.take_timer_puts(), std::collections::BTreeMap::from([(0, 0), (1, 42)]));
    assert!(store.take_timer_puts().is_empty(), "taken once");
    let mut b = Batch::default();
    for i in 0..fired {
        b.timers_removed.push((0, i, format!("op-{i}")));
    }
    store.commit(b).unwrap();
    assert!(store.take_timer_puts().is_empty(), "deletes put no timer");

    let skipped_by = |from: i64| {
        let (due, skipped) = counting_deletes_skipped(|| store.due_timers_from(0, from, fired + 10, 100).unwrap());
        assert_eq!(due.iter().map(|t| t.operation_id.as_str()).collect::<Vec<_>>(), ["due"]);
        skipped
    };
    assert!(skipped_by(i64::MIN) >= fired as u64, "from the start, every deletion is stepped over");
    assert!(skipped_by(fired) < 10, "from past them, none is");
    // From the due time itself: the timer is included.
    assert_eq!(store.due_timers_from(0, fired + 5, fired + 5, 10).unwrap().len(), 1);
    assert!(store.due_timers_from(0, fired + 6, fired + 10, 10).unwrap().is_empty());
}

/// An operation's latest verdict is stored once: its id and reason (as its
/// template and arguments) stay in the timeline entry of the record that led to it, the value names that
/// entry, and every read returns the verdict whole. Once the entry has
/// moved out of the value, the verdict is stored whole again; a value
/// naming an entry it does not hold is corrupt, not misread.
#[test]
fn a_latest_verdict_is_stored_once_and_read_back_whole() {
    use crate::core::event::{Body, Requested};
    use crate::core::{Disposition, Policy, SourcePos};
    let dir = temp("store-last-verdict");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let policy = Policy::default();
    let requested = Event {
        seq: Some(1),
        occurred_at: 1_000,
        producer: "svc".into(),
        body: Body::Requested(Requested {
            destination: "crm".into(),
            confirm_within_ms: Some(10),
            ..Default::default()
        }),
        ..Event::deadline_reached("op-1", "ent-1", "sync", 0)
    };
    let stored = |store: &Store| store.get_raw(encoded::Family::Ops, &keys::scoped(0, "op-1")).unwrap().unwrap();
    // The request, then its deadline: a verdict, recorded in the timeline
    // as the pipeline records it.
    let events = [requested, Event::deadline_reached("op-1", "ent-1", "sync", 1_010)];
    let (slot, mut head, mut batch) = applied_and_recorded(events, &policy);
    let state = slot.clone().unwrap();
    let v = state.last_verdict.clone().expect("the deadline decided a verdict");
    assert!(!v.reason.is_empty());
    batch.put_op(0, "op-1".into(), slot.clone(), head.clone());
    store.commit(batch).unwrap();
    let value = stored(&store);
    // The id once, as its 16 bytes; the reason as its template's number and
    // arguments: neither's text is in the value, yet every read renders it.
    let id_bytes = uuid::Uuid::parse_str(&v.verdict_id).unwrap();
    assert_eq!(
        (occurrences(&value, id_bytes.as_bytes()), occurrences(&value, &v.verdict_id), occurrences(&value, &v.reason)),
        (1, 0, 0),
        "id once as bytes, reason as a form"
    );
    assert_eq!(store.load_op(0, "op-1").unwrap(), (Some(state.clone()), head.clone()));
    assert_eq!(store.get_op(0, "op-1").unwrap(), Some(state.clone()));
    assert_eq!(store.ops_of(0).unwrap(), vec![state.clone()]);
    // What the state digest covers: the value without its entries, and the
    // id and reason of the verdict that an entry holds.
    let digested = |store: &Store| {
        let mut ops = Vec::new();
        store
            .scan_state(|family, _, value, verdict| {
                if family == "ops" {
                    ops.push((value.to_vec(), verdict.map(|(id, reason)| (id.to_owned(), reason.to_owned()))));
                }
            })
            .unwrap();
        assert_eq!(ops.len(), 1);
        ops.pop().unwrap()
    };
    let (_, verdict) = digested(&store);
    assert_eq!(verdict, Some((v.verdict_id.clone(), v.reason.clone())), "the digest covers the verdict in its entry");
    // Enough entries after it that the verdict's entry moves out of the
    // value: the verdict is then stored whole.
    let mut batch = Batch::default();
    for offset in 2..2 + timeline::INLINE_ENTRIES as i64 {
        let ev = Event::deadline_reached("op-1", "ent-1", "sync", 1_010);
        let a = timeline::Arrival::of(&ev, SourcePos { partition: 0, offset }, &policy);
        timeline::record(&mut batch, &mut head, a, Disposition::Duplicate, &[], slot.as_ref());
    }
    batch.put_op(0, "op-1".into(), slot, head.clone());
    store.commit(batch).unwrap();
    let value = stored(&store);
    assert_eq!((occurrences(&value, &v.verdict_id), occurrences(&value, &v.reason)), (1, 1), "whole, in the value");
    let (value, verdict) = digested(&store);
    assert_eq!(
        (occurrences(&value, &v.verdict_id), occurrences(&value, &v.reason), verdict),
        (1, 1, None),
        "the digest covers the whole verdict in the value"
    );
    assert_eq!(store.load_op(0, "op-1").unwrap(), (Some(state.clone()), head));
    assert_eq!(store.get_op(0, "op-1").unwrap(), Some(state.clone()));
    let t = store.timeline(0, "op-1").unwrap();
    let noted = t.entries.iter().flat_map(|e| &e.verdicts).map(|n| (&n.verdict_id, &n.reason));
    assert_eq!(noted.collect::<Vec<_>>(), vec![(&v.verdict_id, &v.reason)], "the timeline still shows it");
    // A value naming an entry it does not hold.
    let latest = std::collections::VecDeque::new();
    let damaged = encoded::StoredOpRef {
        timeline_total: 0,
        summary: encoded::OpSummary::of(&state),
        state: &state,
        last_verdict: Some(encoded::LastVerdictRef::InEntry {
            entry: 0,
            verdict: 0,
            outcome: v.outcome,
            action: v.action,
            decided_at: v.decided_at,
        }),
        latest: encoded::LatestRef(&latest),
    };
    store.db.put_cf(store.cf("ops"), keys::scoped(0, "op-1"), postcard::to_allocvec(&damaged).unwrap()).unwrap();
    let digest = store.scan_state(|_, _, _, _| {}).unwrap_err();
    for err in [store.load_op(0, "op-1").unwrap_err(), store.get_op(0, "op-1").unwrap_err(), digest] {
        assert!(matches!(err, StoreError::Corrupt { what: "operation", .. }), "{err}");
        assert!(err.to_string().contains("latest verdict is not in the timeline entry"), "{err}");
    }
}

/// An entry names its own event by its revision when that event claimed
/// it, and a request's fields as the operation's request when they are
/// those the state holds: so an applied event's id and the request's
/// fields are stored once in the operation's value (in its state) and in
/// no entry, in the value or moved out of it. The timeline still shows
/// each entry's own id and fields, a redelivery's and a conflicting
/// event's (whose entries hold them in full) too.
#[test]
fn an_entry_leaves_out_what_its_operations_state_holds() {
    use crate::core::event::{Body, ErrorClass, Requested};
    use crate::core::Policy;
    let dir = temp("store-claimer");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let policy = Policy::default();
    let ev = |id: &str, seq: i64, body: Body| op1_event(id, seq, 1_000 + seq, body);
    // The request and attempts that fail, enough for the first entries to
    // move out of the value; then the request again, and another event for
    // its revision (both flagged, naming the request's event in their
    // anomalies' details).
    let request = Body::Requested(Requested { destination: "the-destination".into(), ..Default::default() });
    // Ids that share no beginning with the previous revision's, so that
    // the state holds each in full (it would shorten them otherwise, see
    // `core::applied`) and each can be counted.
    let mut events = vec![ev("1-applied-event", 1, request)];
    for attempt in 1..=5 {
        let seq = 2 * i64::from(attempt);
        let failed = Body::AttemptFailed {
            attempt,
            error_class: ErrorClass::Transient,
            error_code: "503".into(),
            detail: String::new(),
            next_attempt_at: None,
        };
        events.push(ev(&format!("{seq}-applied-event"), seq, Body::Started { attempt, worker: "w".into() }));
        events.push(ev(&format!("{}-applied-event", seq + 1), seq + 1, failed));
    }
    let applied: Vec<String> = events.iter().map(|e| e.event_id.clone()).collect();
    events.push(events[0].clone());
    let other = Body::Requested(Requested { destination: "another-destination".into(), ..Default::default() });
    events.push(ev("a-conflicting-event", 1, other));
    let (slot, head, mut batch) = applied_and_recorded(events.iter().cloned(), &policy);
    batch.put_op(0, "op-1".into(), slot, head);
    store.commit(batch).unwrap();
    let t = store.timeline(0, "op-1").unwrap();
    let shown: Vec<&str> = t.entries.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(shown, events.iter().map(|e| e.event_id.as_str()).collect::<Vec<_>>());
    let summaries: Vec<String> = events.iter().map(|e| summary::Fields::of(&e.body).render()).collect();
    assert_eq!(t.entries.iter().map(|e| &e.summary).collect::<Vec<_>>(), summaries.iter().collect::<Vec<_>>());
    assert!(summaries[0].ends_with("to the-destination"), "{}", summaries[0]);
    let value = store.get_raw(encoded::Family::Ops, &keys::scoped(0, "op-1")).unwrap().unwrap();
    let moved_out: Vec<Vec<u8>> = (store.db.iterator_cf(store.cf("timeline"), rocksdb::IteratorMode::Start))
        .map(|kv| kv.unwrap().1.to_vec())
        .collect();
    assert_eq!(moved_out.len(), events.len() - timeline::INLINE_ENTRIES);
    // The request's event aside, which the anomalies name.
    for id in applied[1..].iter().map(String::as_str).chain(["the-destination"]) {
        let elsewhere: usize = moved_out.iter().map(|v| occurrences(v, id)).sum();
        assert_eq!((occurrences(&value, id), elsewhere), (1, 0), "{id} is stored once, in the state");
    }
    // A state without the records its entries name (a damaged store): the
    // timeline is refused, not shown with wrong ids.
    rewrite_op1_state(&store, |state| state.applied_seqs.clear());
    let err = store.timeline(0, "op-1").unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { what: "timeline entry", .. }), "{err}");
}

/// An entry keeps its event time as its distance from the operation's
/// request once the operation has one, and whole before: every entry reads
/// back its own event's time, one written before the request came too.
#[test]
fn an_entry_keeps_its_event_time_from_the_request() {
    use crate::core::event::{Body, Requested};
    use crate::core::Policy;
    let dir = temp("store-event-time");
    let store = Store::open(&dir.0, "t.events", false).unwrap();
    let policy = Policy::default();
    let t = 1_796_560_000_000;
    let request = Body::Requested(Requested { destination: "d".into(), ..Default::default() });
    let events = [
        // Before its request (held until the request comes).
        op1_event("started", 2, t + 40, Body::Started { attempt: 1, worker: "w".into() }),
        op1_event("requested", 1, t, request),
        // Late, and much later.
        op1_event("started-again", 2, t - 3_000, Body::Started { attempt: 1, worker: "w2".into() }),
        op1_event("later", 3, t + 86_400_000, Body::Started { attempt: 2, worker: "w".into() }),
    ];
    let (slot, head, mut batch) = applied_and_recorded(events.iter().cloned(), &policy);
    batch.put_op(0, "op-1".into(), slot, head);
    store.commit(batch).unwrap();
    let t_shown: Vec<(String, i64)> =
        store.timeline(0, "op-1").unwrap().entries.iter().map(|e| (e.event_id.clone(), e.occurred_at)).collect();
    let t_sent: Vec<(String, i64)> = events.iter().map(|e| (e.event_id.clone(), e.occurred_at)).collect();
    assert_eq!(t_shown, t_sent);
    // The same entries read against another request time: those written
    // after the request count from it, the one written before stays whole.
    rewrite_op1_state(&store, |state| state.request.as_mut().unwrap().requested_at += 1_000);
    let moved: Vec<i64> = store.timeline(0, "op-1").unwrap().entries.iter().map(|e| e.occurred_at).collect();
    assert_eq!(moved, [t + 40, t + 1_000, t - 2_000, t + 86_401_000]);
}
