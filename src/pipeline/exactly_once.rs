//! The run loop's batch under `guarantee = "exactly_once"`.
//!
//! Order of a batch: apply in memory → one Kafka transaction with the
//! batch's outputs and the consumed offsets (committed for the group) →
//! the store write (state, timers, offsets; no outbox). The transaction
//! comes first because it is the one step that can be undone: until it
//! commits, nothing of the batch exists anywhere (an abort or a crash
//! leaves the store and the group where they were, and the batch is
//! consumed again). After it commits, the store may lag behind it by that
//! one batch (a crash between the commit and the store write): the next
//! start finds the group's committed offset ahead of the stored one and
//! applies the gap without publishing, the restore path every moved
//! partition takes ([`super::restore`]). The core being deterministic, the
//! state it rebuilds is the one the committed outputs came from.
//!
//! So the committed offset is the truth and the store follows it: a
//! `read_committed` reader sees every output once, and the state never
//! holds what an aborted transaction did.
//!
//! Offsets are committed only for partitions past their restore target:
//! below it the group's offset is already ahead, and committing the batch's
//! would move it back (and the outputs between would be published twice).
//!
//! Transaction markers take offsets too: a partition whose last record is
//! followed by a commit marker would keep its committed offset one short
//! of the end (a lag of 1 that never drains). When the loop is idle, the
//! offsets of partitions whose consumer position has passed such markers
//! move to that position, in a transaction and a store write of their own
//! ([`Pipeline::skip_markers`]), as Kafka Streams commits positions.
//!
//! Fencing: the zombie fence's stall rule is checked once more right
//! before the commit; the broker fences the rest (see
//! [`crate::kafka::transaction`]).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{Pipeline, PipelineError};
use crate::crash::{self, CrashPoint};
use crate::kafka::transaction::{Transactions, TxnError, TxnOffsets};
use crate::records::ProducerRecord;
use crate::store::{Batch as StoreBatch, Encoded};

/// A batch applied in memory, on its way to its transaction.
pub(super) struct PendingTransaction {
    /// Input records taken in.
    pub records: usize,
    /// When its processing began.
    pub started: Instant,
    pub encoded: Encoded,
    /// Each partition the batch advanced, with its next offset.
    pub touched: BTreeMap<i32, i64>,
    pub deadlines: Vec<(String, i64)>,
}

impl Pipeline {
    /// Commits `b`'s outputs and offsets in one transaction, then writes
    /// its state. An aborted transaction rewinds its partitions to `stored`
    /// (the owned offsets before the batch): nothing of it was kept.
    pub(super) fn process_in_transaction(
        &mut self,
        b: PendingTransaction,
        stored: BTreeMap<i32, i64>,
        alive_at: Instant,
    ) -> Result<(), PipelineError> {
        let PendingTransaction { records, started, mut encoded, touched, deadlines } = b;
        let applied = started.elapsed();
        let outbox = encoded.take_outbox();
        let commit: BTreeMap<i32, i64> = touched
            .iter()
            .filter(|(p, n)| self.restore_until.get(p).is_none_or(|until| *n >= until))
            .map(|(p, n)| (*p, *n))
            .collect();
        if !outbox.is_empty() || !commit.is_empty() {
            let txn = self.txn.as_ref().expect("exactly_once has transactions");
            let Some(group) = self.consumer.group_metadata() else {
                // Records but no membership: the next poll sorts it out.
                warn!("Batch dropped: the consumer has no group metadata for its transaction");
                self.rewind(&stored, &touched);
                return Ok(());
            };
            let offsets = TxnOffsets { topic: &self.cfg.topics.events, next: &commit, group: &group };
            let (fence, consumer) = (&self.fence, &self.consumer);
            let result = txn.run(outbox.iter().map(|r| (r, self.route(r))), Some(offsets), || {
                crash::point(CrashPoint::BeforeCommit);
                // A stall since the last poll may have cost the partitions.
                fence.check(alive_at, consumer.assignment_lost())
            });
            match result {
                Ok(_) => self.metrics.transaction(true),
                Err(TxnError::Aborted(why)) => {
                    self.metrics.transaction(false);
                    self.stats.aborted += 1;
                    warn!(reason = %why, partitions = ?touched.keys().collect::<Vec<_>>(), "Batch dropped: its transaction was aborted; consuming it again");
                    self.rewind(&stored, &touched);
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
            crash::point(CrashPoint::AfterCommit);
        }
        let committed = started.elapsed();
        self.store.write_encoded(&encoded)?;
        crash::point(CrashPoint::AfterStore);
        self.stored(&touched, deadlines);
        if records > 0 {
            self.stats.batches += 1;
            self.metrics.batch(records, started.elapsed());
        }
        debug!(
            records,
            outputs = outbox.len(),
            apply_us = applied.as_micros() as u64,
            transaction_us = (committed - applied).as_micros() as u64,
            store_us = (started.elapsed() - committed).as_micros() as u64,
            next_offsets = ?touched,
            "Batch committed"
        );
        Ok(())
    }

    /// Idle: moves owned partitions whose consumer position is past their
    /// next offset (only transaction markers or aborted records between)
    /// to that position, committed and stored like a batch without records.
    pub(super) fn skip_markers(&mut self, alive_at: Instant) -> Result<(), PipelineError> {
        let owned = self.consumer.assignment.lock().expect("not poisoned").owned.clone();
        let positions = self.consumer.positions();
        let ahead: BTreeMap<i32, i64> = owned
            .iter()
            .filter_map(|(p, next)| positions.get(p).filter(|pos| *pos > next).map(|pos| (*p, *pos)))
            .collect();
        if ahead.is_empty() {
            return Ok(());
        }
        let mut offsets = StoreBatch::default();
        for (p, n) in &ahead {
            offsets.set_offset(*p, *n);
        }
        let b = PendingTransaction {
            records: 0,
            started: Instant::now(),
            encoded: offsets.encode(crate::store::changelog::Target::of(&self.cfg.topics)),
            touched: ahead,
            deadlines: Vec::new(),
        };
        self.process_in_transaction(b, owned, alive_at)
    }

    /// Publishes `records` in a transaction of their own (no offsets),
    /// again after an abort, until committed.
    pub(super) fn transact_with_retry(
        &self,
        txn: &Transactions,
        records: &[&ProducerRecord],
        shutdown: &AtomicBool,
    ) -> Result<(), PipelineError> {
        let mut waits = crate::retry::Doubling::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut backoff = waits.next_wait();
        loop {
            match txn.run(records.iter().map(|r| (*r, self.route(r))), None, || true) {
                Ok(_) => {
                    self.metrics.transaction(true);
                    return Ok(());
                }
                Err(TxnError::Aborted(why)) if !shutdown.load(std::sync::atomic::Ordering::SeqCst) => {
                    self.metrics.transaction(false);
                    warn!(reason = %why, retry_in_ms = backoff.as_millis() as u64, "Transaction aborted; retrying");
                }
                Err(e) => return Err(e.into()),
            }
            std::thread::sleep(backoff);
            backoff = waits.next_wait();
        }
    }
}
