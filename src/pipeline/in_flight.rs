//! Batches between their store write and their group offset commit.
//!
//! A stored batch goes through three waits for the broker, in this order:
//! its outputs are sent and acknowledged; then its changelog records are
//! sent and acknowledged (RELIABILITY 4a: a state restored from the
//! changelog never holds a batch whose outputs could be lost with the
//! machine that held its outbox); then its outbox entries are forgotten
//! and its group offsets committed.
//!
//! The run loop overlaps those waits with the next batches: while batch N
//! is applied and stored, batch N-1's outputs and batch N-2's changelog are
//! on their way, and N's outputs go out as soon as N-1's are acknowledged.
//! Waiting for a batch's changelog before sending the next outputs (as
//! before) put one more linger and broker round trip between every two
//! batches. Each topic's records still go out in batch order: a batch's
//! outputs are sent only after the previous batch's are acknowledged, and
//! its changelog only after the previous changelog is. So at most two
//! batches are in flight.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use tracing::warn;

use super::{changelog_partition, faults, Pipeline, PipelineError};
use crate::kafka::producer::{Publisher, Ticket};
use crate::metrics::Metrics;
use crate::records::OutboxRecord;
use crate::store::{changelog, Store};

/// The batches in flight: at most one in each stage.
#[derive(Default)]
pub(super) struct InFlight {
    /// Outputs acknowledged, changelog sent (the older batch).
    logging: Option<Batch>,
    /// Outputs sent (the newer batch).
    publishing: Option<Batch>,
}

impl InFlight {
    /// Changelog records of the batches in flight (not yet acknowledged).
    fn changelog_records(&self) -> usize {
        [&self.logging, &self.publishing].into_iter().flatten().map(|b| b.changelog.len()).sum()
    }
}

/// A stored batch on its way out.
pub(super) struct Batch {
    /// What was sent of it last: its outputs while publishing, its
    /// changelog records while logging.
    pub(super) sent: Sent,
    pub(super) outbox: Vec<OutboxRecord>,
    pub(super) changelog: Vec<OutboxRecord>,
    /// Its outbox entries in the store.
    pub(super) seqs: std::ops::Range<u64>,
    /// Its partitions and their next offsets.
    pub(super) touched: BTreeMap<i32, i64>,
}

impl Batch {
    /// Whether what was sent of the batch last is acknowledged (waiting
    /// for it if need be). `sent` is left [`Sent::Failed`]: the caller
    /// sets what follows once it knows (an error on the way leaves the
    /// records to be published again).
    fn sent_acknowledged(&mut self, publisher: &Publisher) -> bool {
        std::mem::replace(&mut self.sent, Sent::Failed).acknowledged(publisher)
    }
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
        records: &[OutboxRecord],
        route: impl Fn(&OutboxRecord) -> Option<i32>,
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
    /// Hands a stored batch whose outputs were sent (`batch.sent`) to the
    /// batches in flight. [`Pipeline::advance_in_flight`] must have run
    /// first: its stage is free then.
    pub(super) fn put_in_flight(&self, batch: Batch) {
        let mut f = self.in_flight.lock().expect("not poisoned");
        debug_assert!(f.publishing.is_none(), "advance_in_flight ran first");
        f.publishing = Some(batch);
        self.metrics.restore.set_changelog_pending(f.changelog_records());
    }

    /// Moves each batch in flight one stage on: the older batch's
    /// changelog is waited for (then its outbox forgotten, its offsets
    /// committed), the newer batch's outputs are waited for and its
    /// changelog sent. Afterwards the next batch's outputs may be sent.
    /// On an error the batches stay in flight, to be finished later.
    pub(super) fn advance_in_flight(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let result = self.settle_logging(shutdown).and_then(|()| {
            let Some(mut b) = self.in_flight.lock().expect("not poisoned").publishing.take() else { return Ok(()) };
            let sent = self.send_changelog(&mut b, shutdown);
            let mut f = self.in_flight.lock().expect("not poisoned");
            match sent {
                Ok(()) => f.logging = Some(b),
                Err(_) => f.publishing = Some(b),
            }
            sent
        });
        self.note_pending();
        result
    }

    /// Finishes every batch in flight: outputs and changelog acknowledged,
    /// outbox forgotten, group offsets committed (idle, partitions moving,
    /// shutting down).
    pub(super) fn finish_in_flight(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        self.advance_in_flight(shutdown)?;
        let result = self.settle_logging(shutdown);
        self.note_pending();
        result
    }

    /// Sets the pending changelog gauge from the batches in flight.
    fn note_pending(&self) {
        let pending = self.in_flight.lock().expect("not poisoned").changelog_records();
        self.metrics.restore.set_changelog_pending(pending);
    }

    /// Settles the logging batch (see [`Pipeline::settle`]), if any; on an
    /// error it stays there.
    fn settle_logging(&self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let Some(mut b) = self.in_flight.lock().expect("not poisoned").logging.take() else { return Ok(()) };
        let settled = self.settle(&mut b, shutdown);
        if settled.is_err() {
            self.in_flight.lock().expect("not poisoned").logging = Some(b);
        }
        settled
    }

    /// Makes sure a batch's outputs are acknowledged (publishing them again
    /// until they are), then sends its changelog records, each to its
    /// partition, without waiting for them.
    fn send_changelog(&self, b: &mut Batch, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        if !b.sent_acknowledged(&self.publisher) {
            self.metrics.publish_retry();
            self.publish_with_retry(b.outbox.iter().collect(), shutdown)?;
        }
        b.sent = Sent::Nothing;
        faults::point("pipeline::after_publish");
        self.keep_owned(&mut b.changelog)?;
        if faults::fires(faults::CHANGELOG_CRASH_POINTS[0]) {
            // All but the offsets records (the last of each partition).
            let cut = b.changelog.iter().filter(|r| !changelog::is_offsets(r)).collect();
            self.publish_with_retry(cut, shutdown)?;
            faults::crash(faults::CHANGELOG_CRASH_POINTS[0]);
        }
        b.sent = Sent::send(&self.publisher, &b.changelog, changelog_partition, "changelog");
        Ok(())
    }

    /// Waits until a batch's changelog records are acknowledged (publishing
    /// them again until they are), then forgets its outbox entries and
    /// commits its group offsets (so a new owner of its partitions restores
    /// it silently rather than publishing again).
    fn settle(&self, b: &mut Batch, shutdown: &AtomicBool) -> Result<(), PipelineError> {
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
    pub(super) fn send_outputs(&self, outbox: &[OutboxRecord]) -> Sent {
        Sent::send(&self.publisher, outbox, |_| None, "outputs")
    }

    /// Keeps the changelog records of partitions still owned. The local
    /// state of the others' partitions is forgotten: their changelog will
    /// not hold this batch, so they are restored from it when assigned
    /// again (see [`super::restore`]).
    fn keep_owned(&self, records: &mut Vec<OutboxRecord>) -> Result<(), PipelineError> {
        let owned = self.consumer.assignment.lock().expect("not poisoned").owned.clone();
        let kept = |r: &OutboxRecord| changelog_partition(r).is_some_and(|p| owned.contains_key(&p));
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
    pub(super) fn forget_partitions(&self, records: &[OutboxRecord]) -> Result<(), PipelineError> {
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

/// What the revoke hook does: settles the logging batch, then waits for
/// the publishing batch's outputs, publishes its changelog and settles it,
/// each with one attempt. Returns the offsets of the batches settled; a
/// batch not settled stays in `f`.
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
    if let Some(mut b) = f.publishing.take() {
        if !b.sent_acknowledged(publisher) {
            f.publishing = Some(b);
            return finished;
        }
        // Every partition is still owned here: the changelog goes out
        // whole before the release, or the run loop sorts it out.
        b.sent = Sent::send(publisher, &b.changelog, changelog_partition, "changelog");
        match settle_once(publisher, store, metrics, b) {
            // A later batch's offsets are past an earlier one's.
            Ok(touched) => finished.extend(touched),
            Err(b) => f.logging = Some(b),
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
    mut b: Batch,
) -> Result<BTreeMap<i32, i64>, Batch> {
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
