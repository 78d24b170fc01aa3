//! Durable state: operations, entities, the timer index, consumed offsets
//! and the outbox, in RocksDB column families.
//!
//! One [`Batch`] holds everything a consumed batch of records changed in
//! some partitions (a lane of the batch): state, timers, the next offset of
//! each partition and the outputs still to publish. It is encoded
//! ([`Encoded`]) and written atomically, so a crash at any point either
//! loses the whole lane (it is consumed again and gives the same result) or
//! keeps all of it (its outputs are re-published from the outbox).

mod append;
pub mod changelog;
mod claims;
mod encoded;
mod event_time;
mod keys;
mod reason;
mod restoring;
mod rocks;
mod stored_id;
mod summary;
pub mod timeline;

pub use claims::Claims;
pub use encoded::{Encoded, OpSummary};
pub use restoring::{Restored, Restoring, Tail};
pub use rocks::{Store, StoreError, StoreSize};
pub use timeline::{Head as TimelineHead, Timeline, TimelineEntry};

use serde::{Deserialize, Serialize};

use crate::core::{EntityState, OperationState};
use crate::records::ProducerRecord;

/// A due timer of the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerEntry {
    /// When it is due (event time, ms).
    pub at: i64,
    /// The operation it wakes.
    pub operation_id: String,
    /// The operation's entity: the key of the `DeadlineReached` event written
    /// when the timer fires.
    pub entity_id: String,
    /// The operation's type, carried into that event.
    pub operation_type: String,
}

/// Everything one consumed batch changed, written atomically.
#[derive(Debug, Default)]
pub struct Batch {
    /// (partition, operation, state or `None` to delete, its timeline's
    /// head: stored in its value).
    pub(crate) ops: Vec<(i32, String, Option<OperationState>, timeline::Head)>,
    /// (partition, entity, facts or `None` to delete).
    pub(crate) entities: Vec<(i32, String, Option<EntityState>)>,
    pub(crate) timers_removed: Vec<(i32, i64, String)>,
    pub(crate) timers_added: Vec<(i32, TimerEntry)>,
    pub(crate) offsets: Vec<(i32, i64)>,
    pub(crate) outbox: Vec<ProducerRecord>,
    /// Timeline entries out of their operations' values, keyed and
    /// serialized (written before `ops`: an operation deleted in the same
    /// batch takes them with it).
    pub(crate) timeline: Vec<(Vec<u8>, Vec<u8>)>,
    /// (partition, operation, ring slots it used): the timelines of
    /// operations removed while the batch was applied, deleted before
    /// `timeline` is written, so that a new operation of the same id later
    /// in the batch starts a timeline of its own (see
    /// [`Batch::drop_timeline`]).
    pub(crate) timelines_dropped: Vec<(i32, String, u32)>,
}

impl Batch {
    /// A batch with room for the outputs of `records` input records.
    pub fn with_capacity(records: usize) -> Batch {
        Batch {
            // About one output per three input records in the default
            // workload; the rest grows as needed.
            outbox: Vec::with_capacity(records / 2),
            ..Batch::default()
        }
    }

    /// Room for `ops` operations and `entities` entities more: their
    /// vectors hold large elements (an operation's state is hundreds of
    /// bytes), and growing them by doubling copied every one each time.
    /// Called once their number is known (after the records are applied:
    /// new operations, and those a request supersedes, only show up then).
    pub fn reserve(&mut self, ops: usize, entities: usize) {
        self.ops.reserve(ops);
        self.entities.reserve(entities);
    }

    /// Sets (or, with `None`, deletes) an operation's state, with its
    /// timeline's head.
    pub fn put_op(
        &mut self,
        partition: i32,
        operation_id: String,
        state: Option<OperationState>,
        head: timeline::Head,
    ) {
        self.ops.push((partition, operation_id, state, head));
    }

    /// Deletes the timeline `head` of an operation just removed (out of
    /// retention) while the batch is applied: the entries out of its value,
    /// stored or added earlier in the batch. A new operation of the same id
    /// later in the batch then starts from an empty head, and its entries
    /// are never read against the old one's state (an entry may name what
    /// its operation's state holds, see [`timeline`]).
    pub fn drop_timeline(&mut self, partition: i32, operation_id: &str, head: timeline::Head) {
        let prefix = keys::timeline_head(partition, operation_id);
        let end = keys::timeline_end(partition, operation_id);
        self.timeline.retain(|(k, _)| k.as_slice() < prefix.as_slice() || k.as_slice() >= end.as_slice());
        self.timelines_dropped.push((partition, operation_id.to_owned(), head.spilled_slots()));
    }

    /// Sets (or, with `None`, deletes) an entity's facts.
    pub fn put_entity(&mut self, partition: i32, entity_id: String, state: Option<EntityState>) {
        self.entities.push((partition, entity_id, state));
    }

    /// Moves an operation's timer in the index: from `from` (the timer
    /// indexed before the batch) to the timer of `to` (its state after the
    /// batch; `None` when the operation was removed).
    pub fn move_timer(&mut self, partition: i32, operation_id: &str, from: Option<i64>, to: Option<&OperationState>) {
        let to_at = to.and_then(|s| s.timer_at);
        if from == to_at {
            return;
        }
        if let Some(at) = from {
            self.timers_removed.push((partition, at, operation_id.to_owned()));
        }
        if let (Some(at), Some(op)) = (to_at, to) {
            self.timers_added.push((
                partition,
                TimerEntry {
                    at,
                    operation_id: op.operation_id.clone(),
                    entity_id: op.entity_id.clone(),
                    operation_type: op.operation_type.clone(),
                },
            ));
        }
    }

    /// Records that everything before `next_offset` of `partition` is applied.
    pub fn set_offset(&mut self, partition: i32, next_offset: i64) {
        self.offsets.push((partition, next_offset));
    }

    /// Adds an output to the outbox: stored with the batch, published once the
    /// batch is written.
    pub fn publish(&mut self, record: ProducerRecord) {
        self.outbox.push(record);
    }

    /// Records a timeline entry out of its operation's value, already
    /// serialized (see [`timeline::entry_value`]), in ring slot `ordinal`
    /// modulo [`timeline::TIMELINE_CAP`].
    pub fn add_timeline_value(&mut self, partition: i32, operation_id: &str, ordinal: u64, value: Vec<u8>) {
        let key = keys::timeline_entry(partition, operation_id, (ordinal % timeline::TIMELINE_CAP) as u32);
        self.timeline.push((key, value));
    }
}

#[cfg(test)]
pub(crate) mod tests;
