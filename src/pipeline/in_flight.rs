//! Batches between their store write and their group offset commit.
//!
//! A stored batch goes through three waits for the broker, in this order:
//! its outputs are sent and acknowledged; then its changelog records are
//! sent and acknowledged (RELIABILITY 4a: a state restored from the
//! changelog never holds a batch whose outputs could be lost with the
//! machine that held its outbox); then its outbox entries are forgotten
//! and its group offsets committed.
//!
//! A batch's outputs are sent right after its store write, whether or not
//! the batches before it are acknowledged: the idempotent producer keeps
//! each partition's records in the order they were sent, so outputs keep
//! the input order without the run loop waiting for it. (Until this step
//! a batch's outputs waited for the previous batch's acknowledgements,
//! one broker round trip per batch on the loop's critical path.)
//!
//! The changelog is serial: one group of batches' changelog is in flight
//! at a time, and the next group's goes out once it is acknowledged and
//! the group settled. A group is every batch whose outputs are
//! acknowledged by then, so a changelog that falls behind catches up in
//! one round trip rather than one per batch. Its records are merged: the
//! last record of each key, in the order of those last records, so each
//! partition's offsets record still comes after its state records (see
//! [`merge_changelogs`]). A group cut short by a crash is then left out
//! by the next restore like a single batch, and a group published again
//! after a failure never puts an earlier batch's offsets after a later
//! batch's state.
//!
//! After each batch the run loop moves the batches in flight on as far as
//! their acknowledgements allow, without waiting; it waits only when more
//! than [`MAX_PUBLISHING`] batches are in flight behind the changelog, and
//! when it finishes them all (idle, partitions moving, timers firing,
//! shutting down).
//!
//! A failed acknowledgement purges the producer (see
//! [`Publisher::wait`]), so the later batches' records still queued fail
//! too. That batch and every later one in flight are then published again,
//! oldest first, before their changelog goes out. Under a failure a reader
//! may therefore see a later batch's outputs before an earlier batch's
//! copies (before this step the earlier batch went out again first), and
//! then the later batch's copies after them: each key's last output is
//! still its newest. Each copy is byte-identical with the same id, as
//! after a crash.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::AtomicBool;

use rustc_hash::FxHashSet;
use tracing::warn;

use super::{changelog_partition, Pipeline, PipelineError};
use crate::crash::{self, CrashPoint};
use crate::kafka::producer::{Publisher, Ticket};
use crate::metrics::Metrics;
use crate::records::ProducerRecord;
use crate::store::{changelog, Store};

/// Most batches in flight behind the changelog before the run loop waits
/// for the oldest. Each changelog round trip takes a few batches' time
/// when the broker is busy: at 35,000 records/s on a single-node broker
/// sharing two cores with the pipeline, groups of up to five
/// batches formed, and with at most 4 the loop still waited 4.0 of its
/// 11.4 busy seconds; with 8 it waited 1.5–2.1 s, for the same
/// event→verdict latency (BENCHMARKS.md). Bounds the memory the
/// batches in flight hold (their outputs and changelog records) and how
/// much a failure publishes again.
pub(super) const MAX_PUBLISHING: usize = 8;

/// The batches in flight.
#[derive(Default)]
pub(super) struct InFlight {
    /// Outputs acknowledged, changelog sent: the oldest batches, merged
    /// into one (see [`SentBatch::absorb`]).
    logging: Option<SentBatch>,
    /// Outputs sent, oldest first.
    publishing: VecDeque<SentBatch>,
}

impl InFlight {
    /// Changelog records of the batches in flight (not yet acknowledged).
    fn changelog_records(&self) -> usize {
        self.logging.iter().chain(&self.publishing).map(|b| b.changelog.len()).sum()
    }
}

/// A stored batch on its way out, or a group of them once their outputs
/// are acknowledged.
pub(super) struct SentBatch {
    /// What was sent of it last: its outputs while publishing, its
    /// changelog records while logging.
    pub(super) sent: Sent,
    pub(super) outbox: Vec<ProducerRecord>,
    pub(super) changelog: Vec<ProducerRecord>,
    /// Its outbox entries in the store.
    pub(super) seqs: Range<u64>,
    /// Its partitions and their next offsets.
    pub(super) touched: BTreeMap<i32, i64>,
}

impl SentBatch {
    /// Whether what was sent of the batch last is acknowledged (waiting
    /// for it if need be). `sent` is left [`Sent::Failed`]: the caller
    /// sets what follows once it knows (an error on the way leaves the
    /// records to be published again).
    fn sent_acknowledged(&mut self, publisher: &Publisher) -> bool {
        std::mem::replace(&mut self.sent, Sent::Failed).acknowledged(publisher)
    }

    /// Takes the next batch (whose outputs are acknowledged too) into
    /// this group: its changelog after this one's, its outbox entries
    /// (which follow this group's in the store: each batch's are the next
    /// sequence numbers) and its offsets. Only the changelog is kept of the
    /// outputs' records: they are acknowledged.
    fn absorb(&mut self, next: SentBatch) {
        self.outbox.clear();
        self.changelog.extend(next.changelog);
        // A batch without outputs has none (an empty range at 0).
        if self.seqs.is_empty() {
            self.seqs = next.seqs;
        } else if !next.seqs.is_empty() {
            debug_assert_eq!(self.seqs.end, next.seqs.start, "a batch's outbox entries follow the previous batch's");
            self.seqs.end = next.seqs.end;
        }
        self.touched.extend(next.touched);
    }
}

/// Keeps the last record of each key of `records`, in the order of those
/// last records. Applied in that order, they leave the same state as all
/// of them (a restore keeps a key's last value; compaction does too), and
/// each partition's offsets record, the last of the partition in each
/// batch's changelog, stays after the partition's state records.
fn merge_changelogs(records: &mut Vec<ProducerRecord>) {
    let keep: Vec<bool> = {
        let mut seen = FxHashSet::default();
        let mut keep: Vec<bool> = records.iter().rev().map(|r| seen.insert(r.key.as_deref())).collect();
        keep.reverse();
        keep
    };
    let mut keep = keep.into_iter();
    records.retain(|_| keep.next().expect("one flag per record"));
}

/// How a batch's records went out.
pub(super) enum Sent {
    /// Nothing to send, or outputs discarded (replay).
    Nothing,
    Ticket(Ticket),
    /// Sending failed: publish again before anything else.
    Failed,
}

impl Sent {
    /// Sends `records` (each to `route`'s partition, else by key); a
    /// failure to send is logged and kept as [`Sent::Failed`], for the
    /// wait that follows to publish them again.
    fn send(
        publisher: &Publisher,
        records: &[ProducerRecord],
        route: impl Fn(&ProducerRecord) -> Option<i32>,
        what: &str,
    ) -> Sent {
        if records.is_empty() {
            return Sent::Nothing;
        }
        match publisher.send_all(records.iter().map(|r| (r, route(r)))) {
            Ok((ticket, _)) => Sent::Ticket(ticket),
            Err(e) => {
                warn!(error = %e, what, "Sending failed; publishing again before the next step");
                Sent::Failed
            }
        }
    }

    /// Whether [`Sent::acknowledged`] would answer without waiting: every
    /// record reported on, or nothing to wait for (a failed send is
    /// published again at once).
    fn reported(&self, publisher: &Publisher) -> bool {
        match self {
            Sent::Ticket(t) => publisher.reported(t),
            Sent::Nothing | Sent::Failed => true,
        }
    }

    /// Whether everything sent is acknowledged (waiting for it if need be).
    fn acknowledged(self, publisher: &Publisher) -> bool {
        match self {
            Sent::Nothing => true,
            Sent::Ticket(t) => match publisher.wait(t) {
                Ok(()) => true,
                Err(e) => {
                    warn!(error = %e, "Records not acknowledged; publishing them again");
                    false
                }
            },
            Sent::Failed => false,
        }
    }
}

impl Pipeline {
    /// Adds a stored batch whose outputs were sent (`batch.sent`) to the
    /// batches in flight, after those sent before it.
    /// [`Pipeline::advance_in_flight`] follows at once and sets the pending
    /// changelog gauge.
    pub(super) fn put_in_flight(&self, batch: SentBatch) {
        self.in_flight.lock().expect("not poisoned").publishing.push_back(batch);
    }

    /// Moves the batches in flight on as far as their acknowledgements
    /// allow without waiting, and waits for the oldest while more than
    /// [`MAX_PUBLISHING`] batches are behind the changelog. On an error the
    /// batches stay in flight, to be finished later.
    pub(super) fn advance_in_flight(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let result = self.advance(shutdown, |publishing| publishing > MAX_PUBLISHING);
        self.note_pending();
        result
    }

    /// Finishes every batch in flight: outputs and changelog acknowledged,
    /// outbox forgotten, group offsets committed (idle, partitions moving,
    /// timers firing, shutting down).
    pub(super) fn finish_in_flight(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let result = self.advance(shutdown, |_| true);
        self.note_pending();
        result
    }

    /// Moves the batches in flight on, oldest first: the logging group is
    /// settled once its changelog is acknowledged; then the publishing
    /// batches whose outputs are acknowledged become the next group and its
    /// changelog is sent. A step whose acknowledgements are not all in yet
    /// ends the walk, unless `wait(batches publishing)` says to wait for
    /// them (then the oldest publishing batch is waited for, and the group
    /// takes those acknowledged meanwhile).
    fn advance(&self, shutdown: &AtomicBool, wait: impl Fn(usize) -> bool) -> Result<(), PipelineError> {
        loop {
            let mut f = self.in_flight.lock().expect("not poisoned");
            let wait = wait(f.publishing.len());
            if let Some(b) = &f.logging {
                if !wait && !b.sent.reported(&self.publisher) {
                    return Ok(());
                }
                drop(f);
                self.settle_logging(shutdown)?;
                continue;
            }
            // The group: the oldest batches whose outputs are reported
            // on (at least the oldest when waiting).
            let reported = f.publishing.iter().take_while(|b| b.sent.reported(&self.publisher)).count();
            let take = if wait { reported.max(1) } else { reported };
            let take = take.min(f.publishing.len());
            if take == 0 {
                return Ok(());
            }
            let mut group: Vec<SentBatch> = f.publishing.drain(..take).collect();
            drop(f);
            let logged = self.send_changelog(&mut group, shutdown);
            let mut f = self.in_flight.lock().expect("not poisoned");
            match logged {
                Ok(b) => f.logging = Some(b),
                Err(e) => {
                    for b in group.into_iter().rev() {
                        f.publishing.push_front(b);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Sets the pending changelog gauge from the batches in flight.
    fn note_pending(&self) {
        let pending = self.in_flight.lock().expect("not poisoned").changelog_records();
        self.metrics.restore.set_changelog_pending(pending);
    }

    /// Settles the logging group (see [`Pipeline::settle`]), if any; on an
    /// error it stays there.
    fn settle_logging(&self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let Some(mut b) = self.in_flight.lock().expect("not poisoned").logging.take() else { return Ok(()) };
        let settled = self.settle(&mut b, shutdown);
        if settled.is_err() {
            self.in_flight.lock().expect("not poisoned").logging = Some(b);
        }
        settled
    }

    /// Makes sure the outputs of a group of batches are acknowledged, then
    /// merges them into one and sends its changelog records, each to its
    /// partition, without waiting for them. When a batch's outputs were
    /// not acknowledged, that batch and every later one in flight (taken
    /// into the group) are published again, oldest first, until they are.
    /// On an error `group` holds what is left to do, in order, for the run
    /// loop to try again.
    fn send_changelog(&self, group: &mut Vec<SentBatch>, shutdown: &AtomicBool) -> Result<SentBatch, PipelineError> {
        let mut failed_at = None;
        for (i, b) in group.iter_mut().enumerate() {
            if !b.sent_acknowledged(&self.publisher) {
                failed_at = Some(i);
                break;
            }
            b.sent = Sent::Nothing;
        }
        if let Some(i) = failed_at {
            // The failure purged the producer: of every later batch in
            // flight, some records may be on the broker and some not.
            // They all go out again after this one, in order, so each
            // key's last output is still its newest, and no later batch
            // is left to be purged by this one's retry (each purge would
            // hit the batch sent after it, one batch after another).
            group.extend(self.in_flight.lock().expect("not poisoned").publishing.drain(..));
            for b in &mut group[i + 1..] {
                // Its reports are waited for (whatever they say): a
                // ticket is finished only by its wait.
                let _ = b.sent_acknowledged(&self.publisher);
            }
            for b in &mut group[i..] {
                self.metrics.publish_retry();
                self.publish_with_retry(b.outbox.iter().collect(), shutdown)?;
                b.sent = Sent::Nothing;
            }
        }
        let batches = group.len();
        let mut drained = group.drain(..);
        let mut b = drained.next().expect("a group holds at least one batch");
        drained.for_each(|next| b.absorb(next));
        crash::point(CrashPoint::AfterPublish);
        let ready = self.keep_owned(&mut b.changelog).and_then(|()| {
            if batches > 1 {
                merge_changelogs(&mut b.changelog);
            }
            if crash::fires(CrashPoint::ChangelogCut) {
                // All but the offsets records (the last of each partition).
                let cut = b.changelog.iter().filter(|r| !changelog::is_offsets(r)).collect();
                self.publish_with_retry(cut, shutdown)?;
                crash::crash(CrashPoint::ChangelogCut);
            }
            Ok(())
        });
        if let Err(e) = ready {
            group.push(b);
            return Err(e);
        }
        b.sent = Sent::send(&self.publisher, &b.changelog, changelog_partition, "changelog");
        Ok(b)
    }

    /// Waits until a batch's changelog records are acknowledged (publishing
    /// them again until they are), then forgets its outbox entries and
    /// commits its group offsets (so a new owner of its partitions restores
    /// it silently rather than publishing again).
    fn settle(&self, b: &mut SentBatch, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        if !b.changelog.is_empty() {
            if !b.sent_acknowledged(&self.publisher) {
                // Partitions may have moved since the records were sent:
                // only those still owned are published again.
                self.keep_owned(&mut b.changelog)?;
                self.publish_with_retry(b.changelog.iter().collect(), shutdown)?;
            }
            self.metrics.restore.changelog_published(b.changelog.len());
            b.changelog.clear();
            b.sent = Sent::Nothing;
        }
        self.store.ack_outbox(b.seqs.clone())?;
        self.consumer.commit_for_visibility(&b.touched);
        Ok(())
    }

    /// Sends a batch's outputs; see [`Pipeline::put_in_flight`].
    pub(super) fn send_outputs(&self, outbox: &[ProducerRecord]) -> Sent {
        Sent::send(&self.publisher, outbox, |_| None, "outputs")
    }

    /// Keeps the changelog records of partitions still owned. The local
    /// state of the others' partitions is forgotten: their changelog will
    /// not hold this batch, so they are restored from it when assigned
    /// again (see [`super::restore`]).
    fn keep_owned(&self, records: &mut Vec<ProducerRecord>) -> Result<(), PipelineError> {
        let owned = self.consumer.assignment.lock().expect("not poisoned").owned.clone();
        let kept = |r: &ProducerRecord| changelog_partition(r).is_some_and(|p| owned.contains_key(&p));
        // Usually every partition is still owned: then nothing is moved
        // (splitting copied every record into a new, growing Vec).
        if records.iter().all(kept) {
            return Ok(());
        }
        let (mine, moved): (Vec<_>, Vec<_>) = std::mem::take(records).into_iter().partition(kept);
        *records = mine;
        self.forget_partitions(&moved)
    }

    /// Forgets the local state of the partitions of changelog records that
    /// will not be published.
    pub(super) fn forget_partitions(&self, records: &[ProducerRecord]) -> Result<(), PipelineError> {
        let partitions: std::collections::BTreeSet<i32> = records.iter().filter_map(changelog_partition).collect();
        for p in partitions {
            warn!(partition = p, "Changelog records of the partition were not published; forgetting its local state (restored from the changelog when assigned again)");
            self.store.forget_partition(p)?;
        }
        Ok(())
    }

    /// Lets the consumer finish the batches in flight when partitions are
    /// revoked, before they are released (see
    /// [`crate::kafka::consumer::RevokeHook`]): it gets the offsets to
    /// commit of those it finished. What it cannot finish stays for the run
    /// loop, which publishes it again (a changelog only to partitions still
    /// owned then).
    pub(super) fn install_revoke_hook(&self) {
        let (in_flight, publisher, store) = (self.in_flight.clone(), self.publisher.clone(), self.store.clone());
        let metrics = self.metrics.clone();
        self.consumer.on_revoke(Box::new(move || {
            let mut f = in_flight.lock().expect("not poisoned");
            let finished = finish_before_release(&mut f, &publisher, &store, &metrics);
            metrics.restore.set_changelog_pending(f.changelog_records());
            Some(finished).filter(|m| !m.is_empty())
        }));
    }
}

/// What the revoke hook does: settles the logging group, then, oldest
/// first, waits for each publishing batch's outputs, publishes its
/// changelog and settles it, each with one attempt. Returns the offsets of
/// the batches settled; the batches not settled stay in `f`.
fn finish_before_release(
    f: &mut InFlight,
    publisher: &Publisher,
    store: &Store,
    metrics: &Metrics,
) -> BTreeMap<i32, i64> {
    let mut finished = BTreeMap::new();
    if let Some(b) = f.logging.take() {
        match settle_once(publisher, store, metrics, b) {
            Ok(touched) => finished.extend(touched),
            Err(b) => {
                f.logging = Some(b);
                return finished;
            }
        }
    }
    while let Some(mut b) = f.publishing.pop_front() {
        if !b.sent_acknowledged(publisher) {
            f.publishing.push_front(b);
            return finished;
        }
        // Every partition is still owned here: the changelog goes out
        // whole before the release, or the run loop sorts it out.
        b.sent = Sent::send(publisher, &b.changelog, changelog_partition, "changelog");
        match settle_once(publisher, store, metrics, b) {
            // A later batch's offsets are past an earlier one's.
            Ok(touched) => finished.extend(touched),
            Err(b) => {
                f.logging = Some(b);
                return finished;
            }
        }
    }
    finished
}

/// [`Pipeline::settle`] with one attempt, for the revoke hook: the
/// batch's offsets when it is settled, else the batch, for the run loop to
/// settle (its changelog records cleared if they were acknowledged).
fn settle_once(
    publisher: &Publisher,
    store: &Store,
    metrics: &Metrics,
    mut b: SentBatch,
) -> Result<BTreeMap<i32, i64>, SentBatch> {
    if !b.changelog.is_empty() {
        let mut acked = b.sent_acknowledged(publisher);
        if !acked {
            let routed = b.changelog.iter().map(|r| (r, changelog_partition(r)));
            acked = match publisher.publish_all(routed) {
                Ok(_) => true,
                Err(e) => {
                    warn!(error = %e, "Publishing the changelog before releasing partitions failed; the run loop retries");
                    false
                }
            };
        }
        if !acked {
            return Err(b);
        }
        b.sent = Sent::Nothing;
        metrics.restore.changelog_published(b.changelog.len());
        b.changelog.clear();
    }
    if let Err(e) = store.ack_outbox(b.seqs.clone()) {
        warn!(error = %e, "Forgetting acknowledged outputs failed; the run loop retries");
        return Err(b);
    }
    Ok(b.touched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, value: &str) -> ProducerRecord {
        ProducerRecord {
            topic: "ops.state".into(),
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            headers: Vec::new(),
        }
    }

    fn batch(seqs: Range<u64>, changelog: Vec<ProducerRecord>, touched: &[(i32, i64)]) -> SentBatch {
        SentBatch {
            sent: Sent::Nothing,
            outbox: vec![record("entity", "verdict")],
            changelog,
            seqs,
            touched: touched.iter().copied().collect(),
        }
    }

    /// Two batches' changelogs merged keep each key's last record, in the
    /// order of those last records: the state a restore or compaction
    /// keeps is the same, and the offsets record stays last.
    #[test]
    fn merged_changelogs_keep_each_keys_last_record_in_order() {
        let mut records = vec![
            record("a", "a1"),
            record("b", "b1"),
            record("offsets", "10"),
            record("a", "a2"),
            record("c", "c2"),
            record("offsets", "20"),
        ];
        merge_changelogs(&mut records);
        let kept: Vec<&[u8]> = records.iter().map(|r| r.value.as_deref().unwrap()).collect();
        assert_eq!(kept, [&b"b1"[..], b"a2", b"c2", b"20"]);
    }

    /// A group takes the next batch's changelog after its own, its outbox
    /// entries (a batch without outputs has the empty range at 0) and its
    /// offsets; the acknowledged outputs are let go.
    #[test]
    fn a_group_absorbs_the_next_batch() {
        let mut g = batch(0..0, vec![record("a", "a1")], &[(0, 10)]);
        g.absorb(batch(5..7, vec![record("b", "b1")], &[(0, 20), (1, 5)]));
        assert_eq!(g.seqs, 5..7);
        g.absorb(batch(0..0, Vec::new(), &[(1, 8)]));
        assert_eq!(g.seqs, 5..7);
        g.absorb(batch(7..9, vec![record("a", "a2")], &[(2, 3)]));
        assert_eq!(g.seqs, 5..9);
        assert!(g.outbox.is_empty());
        assert_eq!(g.changelog.len(), 3);
        assert_eq!(g.touched, [(0, 20), (1, 8), (2, 3)].into_iter().collect());
    }
}
