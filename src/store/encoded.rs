//! A [`Batch`] encoded into the keys and values the store writes, before
//! any RocksDB call.
//!
//! Encoding is most of a store write's CPU (serializing states and timeline
//! entries, building keys, sorting them). Done apart from the write, it runs
//! on the apply threads, one lane's batch each, and the lane frees its
//! states itself. Each lane's part is then written as one RocksDB write
//! batch, the parts in parallel (RocksDB inserts concurrent writes into the
//! memtable in parallel).

use std::collections::VecDeque;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::keys;
use super::{timeline, Batch, ProducerRecord};
use crate::core::operation::LastVerdict;
use crate::core::{Action, OperationState, Outcome, RepairAction, Status};

/// The column families a batch writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    Timeline,
    Ops,
    Entities,
    Timers,
    Offsets,
}

impl Family {
    /// Its column family's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Timeline => super::rocks::TIMELINE,
            Family::Ops => super::rocks::OPS,
            Family::Entities => super::rocks::ENTITIES,
            Family::Timers => super::rocks::TIMERS,
            Family::Offsets => super::rocks::OFFSETS,
        }
    }
}

/// One write of an encoded batch; keys and values are ranges of the
/// batch's byte buffer.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Put {
        family: Family,
        key: Range<usize>,
        value: Range<usize>,
    },
    Delete {
        family: Family,
        key: Range<usize>,
    },
    /// Deletes `[from, to)`: an operation's timeline (`from` its head),
    /// which used its first `slots` ring slots (the changelog's tombstones).
    DeleteRange {
        family: Family,
        from: Range<usize>,
        to: Range<usize>,
        slots: u32,
    },
}

/// An operation as stored: how many timeline entries it has received in
/// all (read with the state, so recording the timeline needs no read of its
/// own), the few fields the metrics scan reads (decoded without the rest),
/// the state, its latest verdict, then its latest timeline entries (see
/// [`super::timeline::Head`]; last, so that reading the state alone never
/// decodes them).
#[derive(Serialize)]
pub(super) struct StoredOpRef<'a> {
    pub timeline_total: u64,
    pub summary: OpSummary<&'a str>,
    pub state: &'a OperationState,
    pub last_verdict: Option<LastVerdictRef<'a>>,
    pub latest: LatestRef<'a>,
}

impl<'a> StoredOpRef<'a> {
    /// `state` with its timeline's head, as written.
    pub(super) fn of(state: &'a OperationState, head: &'a timeline::Head) -> StoredOpRef<'a> {
        StoredOpRef {
            timeline_total: head.total,
            summary: OpSummary::of(state),
            state,
            last_verdict: state.last_verdict.as_ref().map(|v| match head.inline_verdict(state) {
                Some((entry, verdict)) => LastVerdictRef::InEntry {
                    entry,
                    verdict,
                    outcome: v.outcome,
                    action: v.action,
                    decided_at: v.decided_at,
                },
                None => LastVerdictRef::Whole(v),
            }),
            latest: LatestRef(&head.latest),
        }
    }
}

/// An operation's latest verdict as written. Its timeline entry (of the
/// record that led to it) holds its id and reason too, and is nearly always
/// still one of the entries in the operation's value: then only where they
/// are is written (known from the recording, see
/// [`timeline::Head::inline_verdict`]: nothing is searched). That is about
/// a hundred bytes, a seventh of a typical operation's value, which every
/// store write of the operation (write-ahead log, memtable, flush,
/// compactions) and its changelog record carried twice. Whole when the
/// entry has moved out of the value (a long timeline).
#[derive(Serialize)]
pub(super) enum LastVerdictRef<'a> {
    Whole(&'a LastVerdict),
    InEntry {
        /// Its entry's position among the value's entries.
        entry: u32,
        /// Its position among that entry's verdicts.
        verdict: u32,
        outcome: Outcome,
        action: Action,
        decided_at: i64,
    },
}

/// [`LastVerdictRef`] read back.
#[derive(Deserialize)]
pub(super) enum StoredLastVerdict {
    Whole(LastVerdict),
    InEntry { entry: u32, verdict: u32, outcome: Outcome, action: Action, decided_at: i64 },
}

impl StoredLastVerdict {
    /// Where its id and reason are when an inline entry holds them: that
    /// entry's position among the value's entries, and the verdict's among
    /// the entry's verdicts.
    fn in_entry(&self) -> Option<(u32, u32)> {
        match *self {
            StoredLastVerdict::InEntry { entry, verdict, .. } => Some((entry, verdict)),
            StoredLastVerdict::Whole(_) => None,
        }
    }

    /// The verdict whole, its id and reason read from the entry `entry`
    /// returns by position (the value's inline entries); `None` when that
    /// entry does not hold them (a damaged store).
    fn complete<'e>(self, entry: impl FnOnce(u32) -> Option<&'e [u8]>) -> Option<LastVerdict> {
        match self {
            StoredLastVerdict::Whole(v) => Some(v),
            StoredLastVerdict::InEntry { entry: at, verdict, outcome, action, decided_at } => {
                let (verdict_id, reason) = timeline::verdict_at(entry(at)?, verdict)?;
                Some(LastVerdict { verdict_id, outcome, action, reason, decided_at })
            }
        }
    }
}

/// The latest timeline entries as written: each as one byte string.
pub(super) struct LatestRef<'a>(pub &'a VecDeque<Vec<u8>>);

impl Serialize for LatestRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|v| serde_bytes::Bytes::new(v)))
    }
}

/// [`StoredOpRef`] as read back, but for the timeline entries (decode it
/// as a prefix; [`StoredOp::into_state`] names the state and completes its
/// latest verdict).
#[derive(Deserialize)]
pub(super) struct StoredOp {
    pub timeline_total: u64,
    summary: OpSummary,
    state: OperationState,
    last_verdict: Option<StoredLastVerdict>,
}

/// Why a stored operation whose latest verdict is not where its value
/// says cannot be read (a damaged store).
const NO_VERDICT: &str = "its latest verdict is not in the timeline entry its value names";

impl StoredOp {
    /// The state of operation `id` (its key's), with its type (the
    /// summary's): neither is stored a second time in the state. Its
    /// latest verdict is not read (see [`StoredOp::into_state`]).
    pub(super) fn into_named(self, id: &str) -> (OperationState, Option<StoredLastVerdict>) {
        let mut state = self.state;
        state.operation_id = id.to_owned();
        state.operation_type = self.summary.operation_type;
        (state, self.last_verdict)
    }

    /// The state of operation `id` with its latest verdict; `rest` is what
    /// follows this prefix in the value (its inline entries), read only
    /// when the verdict is in one of them. `Err`: it is not there (a
    /// damaged store).
    pub(super) fn into_state(self, id: &str, rest: &[u8]) -> Result<OperationState, &'static str> {
        let (mut state, last_verdict) = self.into_named(id);
        if let Some(v) = last_verdict {
            // The entries are read only when the verdict is in one.
            state.last_verdict = Some(v.complete(|i| inline_entry(rest, i)).ok_or(NO_VERDICT)?);
        }
        Ok(state)
    }

    /// The id and reason of its latest verdict when an inline entry (in
    /// `rest`, as for [`StoredOp::into_state`]) holds them instead of this
    /// prefix: for the state digest, which leaves the entries out but must
    /// cover the verdict. `Err`: the entry does not hold them.
    pub(super) fn verdict_in_entry(&self, rest: &[u8]) -> Result<Option<(String, String)>, &'static str> {
        let Some((entry, verdict)) = self.last_verdict.as_ref().and_then(StoredLastVerdict::in_entry) else {
            return Ok(None);
        };
        let entry = inline_entry(rest, entry).ok_or(NO_VERDICT)?;
        timeline::verdict_at(entry, verdict).map(Some).ok_or(NO_VERDICT)
    }
}

/// Inline entry `i` of the entries `rest` holds (what follows a
/// [`StoredOp`] prefix in the value).
fn inline_entry(rest: &[u8], i: u32) -> Option<&[u8]> {
    let latest: Vec<&[u8]> = postcard::from_bytes(rest).ok()?;
    latest.get(usize::try_from(i).ok()?).copied()
}

/// [`StoredOpRef`] as read back whole: postcard writes a struct as its
/// fields back to back, so the prefix is a [`StoredOp`].
#[derive(Deserialize)]
pub(super) struct StoredOpWithTimeline {
    pub op: StoredOp,
    pub latest: Vec<serde_bytes::ByteBuf>,
}

impl StoredOpWithTimeline {
    /// The state and the timeline's head, or what makes the value one that
    /// could not have been written: a head of more inline entries than it
    /// may hold (see [`super::timeline::Head::checked`]), or a latest
    /// verdict not where the value says.
    pub(super) fn split(self, id: &str) -> Result<(OperationState, timeline::Head), &'static str> {
        let timeline_total = self.op.timeline_total;
        let (mut state, last_verdict) = self.op.into_named(id);
        // Where the verdict is, noted in the head: a write of the operation
        // that issues no new verdict leaves it there.
        let at = last_verdict.as_ref().and_then(StoredLastVerdict::in_entry);
        if let Some(v) = last_verdict {
            let entry = |i: u32| self.latest.get(usize::try_from(i).ok()?).map(|b| &b[..]);
            state.last_verdict = Some(v.complete(entry).ok_or(NO_VERDICT)?);
        }
        let latest = self.latest.into_iter().map(serde_bytes::ByteBuf::into_vec).collect();
        let mut head = timeline::Head::checked(timeline_total, latest)
            .ok_or("its timeline holds more entries in the value than it may")?;
        head.verdict = at.map(|(entry, index)| timeline::VerdictAt {
            ordinal: head.first_inline() + u64::from(entry),
            index,
            count: state.verdict_count,
        });
        Ok((state, head))
    }
}

/// What the state gauges need of an operation; stored in front of its
/// state so that a scan decodes only this (no event ids, no held events).
/// `S` is `&str` when written (borrowed from the state) and when the
/// metrics scan reads it (borrowed from the stored value: no allocation per
/// operation), `String` when the whole state is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSummary<S = String> {
    /// Its type (the gauges' label).
    pub operation_type: S,
    /// Where it stands in the state machine.
    pub status: Status,
    /// Event time of its `Requested`, once that arrived (age of the oldest
    /// unconfirmed operation).
    pub requested_at: Option<i64>,
    /// When it entered manual review (else its last event time).
    pub review_since: i64,
    /// The machine action it waits for (PROBE or REQUEUE), if any.
    pub follow_up: Option<RepairAction>,
}

impl<'a> OpSummary<&'a str> {
    /// The summary of `op`, as written.
    pub(super) fn of(op: &'a OperationState) -> OpSummary<&'a str> {
        OpSummary {
            operation_type: &op.operation_type,
            status: op.status,
            requested_at: op.request.as_ref().map(|r| r.requested_at),
            review_since: op.review_since.unwrap_or(op.last_event_at),
            follow_up: op.follow_up.filter(|_| op.awaits_evidence()).map(|f| f.action),
        }
    }

    /// The same summary, owning its type.
    pub fn owned(&self) -> OpSummary {
        OpSummary {
            operation_type: self.operation_type.to_owned(),
            status: self.status,
            requested_at: self.requested_at,
            review_since: self.review_since,
            follow_up: self.follow_up,
        }
    }
}

/// The writes of one batch in parts of disjoint partitions, each part in
/// the order it goes to the store, with the outputs still to publish.
#[derive(Debug, Default)]
pub struct Encoded {
    pub(crate) parts: Vec<Part>,
}

/// The writes of some partitions: one atomic store write, which holds
/// their state, their offsets and their outputs together.
#[derive(Debug, Default)]
pub(crate) struct Part {
    /// Every key and value, back to back.
    pub bytes: Vec<u8>,
    pub writes: Vec<Write>,
    /// The outputs, then the changelog records (from `changelog_from` on),
    /// stored as one outbox value (see [`Part::stored_outbox`]).
    pub outbox: Vec<ProducerRecord>,
    pub changelog_from: usize,
}

impl Encoded {
    /// Adds the parts of `other` (of other partitions) after these; its
    /// outputs go after these.
    pub fn absorb(&mut self, other: Encoded) {
        self.parts.extend(other.parts);
    }

    /// Takes the outputs out of a batch not yet written, in order: it is
    /// then written without an outbox (under `exactly_once` a batch's
    /// outputs go out in its Kafka transaction, before the store write).
    pub fn take_outbox(&mut self) -> Vec<ProducerRecord> {
        self.parts.iter_mut().flat_map(|p| std::mem::take(&mut p.outbox)).collect()
    }

    /// Takes the outputs out of a written batch, in order.
    pub fn into_outbox(self) -> Vec<ProducerRecord> {
        self.parts.into_iter().flat_map(|p| p.outbox).collect()
    }
}

impl Part {
    /// What the outbox value keeps of this part's records: every output,
    /// and of the changelog records one per partition. A restart publishes
    /// none of the changelog records it finds there: it forgets their
    /// partitions' local state instead (`Pipeline::republish_outbox`), so
    /// only their partitions matter. Storing them all wrote the batch's
    /// state a second time (the changelog has a record per store write).
    pub(crate) fn stored_outbox(&self) -> Vec<&ProducerRecord> {
        let (outputs, changelog) = self.outbox.split_at(self.changelog_from.min(self.outbox.len()));
        let mut kept: Vec<&ProducerRecord> = outputs.iter().collect();
        let mut partitions: Vec<Option<i32>> = Vec::new();
        for r in changelog {
            let p = r.key.as_deref().and_then(super::changelog::partition_of);
            if !partitions.contains(&p) {
                partitions.push(p);
                kept.push(r);
            }
        }
        kept
    }

    fn push(&mut self, bytes: &[u8]) -> Range<usize> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        start..self.bytes.len()
    }

    /// Serializes `value` straight into the buffer (postcard appends).
    fn push_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Range<usize> {
        let start = self.bytes.len();
        super::append::append(&mut self.bytes, value);
        start..self.bytes.len()
    }

    fn put<T: Serialize + ?Sized>(&mut self, family: Family, key: &[u8], value: &T) {
        let key = self.push(key);
        let value = self.push_value(value);
        self.writes.push(Write::Put { family, key, value });
    }

    /// A put of a value already in bytes.
    fn put_bytes(&mut self, family: Family, key: &[u8], value: &[u8]) {
        let key = self.push(key);
        let value = self.push(value);
        self.writes.push(Write::Put { family, key, value });
    }

    /// Deletes an operation's timeline entries out of its value, which
    /// used its first `slots` ring slots. Most operations have none: no
    /// range delete then.
    fn delete_timeline(&mut self, partition: i32, operation_id: &str, slots: u32) {
        if slots > 0 {
            let from = self.push(&keys::timeline_head(partition, operation_id));
            let to = self.push(&keys::timeline_end(partition, operation_id));
            self.writes.push(Write::DeleteRange { family: Family::Timeline, from, to, slots });
        }
    }

    fn delete(&mut self, family: Family, key: &[u8]) {
        let key = self.push(key);
        self.writes.push(Write::Delete { family, key });
    }
}

/// Writes in key order; a stable sort, so of two writes to one key the
/// later still wins. The memtable's skip list then finds every insert next
/// to the previous one (unsorted, its searches were a fifth of a rebuild's
/// CPU).
fn by_key<K: Ord, T>(items: impl Iterator<Item = (K, T)>) -> Vec<(K, T)> {
    let mut v: Vec<_> = items.collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

impl Batch {
    /// The keys and values this batch writes, in write order: timeline
    /// entries first (an operation deleted in the same batch takes them
    /// with it), then operations, entities, timers, offsets; each family in
    /// key order. The outputs are kept as they are: the store encodes them
    /// as the batch's one outbox value when it writes. With a `changelog`
    /// topic, the batch's changelog records (see [`super::changelog`]) follow
    /// the outputs in the outbox.
    pub fn encode(self, changelog: Option<super::changelog::Target<'_>>) -> Encoded {
        let mut part = Part {
            // About an entry's size for every entry, in or out of its
            // operation's value, and half a KB per operation's state.
            bytes: Vec::with_capacity(
                256 * self.timeline.len()
                    + self.ops.iter().map(|op| 512 + op.3.latest.iter().map(Vec::len).sum::<usize>()).sum::<usize>()
                    + 4096,
            ),
            writes: Vec::with_capacity(
                self.timeline.len()
                    + self.ops.len()
                    + self.entities.len()
                    + self.timers_removed.len()
                    + self.timers_added.len()
                    + self.offsets.len(),
            ),
            changelog_from: self.outbox.len(),
            outbox: self.outbox,
        };
        // First the timelines of operations removed before a new one of the
        // same id came (this batch's entries of the new one are kept).
        for (p, id, slots) in &self.timelines_dropped {
            part.delete_timeline(*p, id, *slots);
        }
        for (key, value) in by_key(self.timeline.iter().map(|(k, v)| (k, v))) {
            part.put_bytes(Family::Timeline, key, value);
        }
        for (key, (p, id, state, head)) in by_key(self.ops.iter().map(|op| (keys::scoped(op.0, &op.1), op))) {
            match state {
                Some(state) => part.put(Family::Ops, &key, &StoredOpRef::of(state, head)),
                None => {
                    part.delete(Family::Ops, &key);
                    // Out of retention: the entries its value did not hold
                    // go with it (after this batch's, which it removes
                    // too).
                    part.delete_timeline(*p, id, head.spilled_slots());
                }
            }
        }
        for (key, (_, _, state)) in by_key(self.entities.iter().map(|e| (keys::scoped(e.0, &e.1), e))) {
            match state {
                Some(state) => part.put(Family::Entities, &key, state),
                None => part.delete(Family::Entities, &key),
            }
        }
        for (key, _) in by_key(self.timers_removed.iter().map(|(p, at, op)| (keys::timer(*p, *at, op), &()))) {
            part.delete(Family::Timers, &key);
        }
        for (key, (_, t)) in by_key(self.timers_added.iter().map(|e| (keys::timer(e.0, e.1.at, &e.1.operation_id), e)))
        {
            part.put(Family::Timers, &key, t);
        }
        for (p, next) in &self.offsets {
            part.put_bytes(Family::Offsets, &keys::partition_prefix(*p), &keys::offset(*next));
        }
        if let Some(to) = changelog {
            let records = super::changelog::records(&part, to);
            part.outbox.extend(records);
        }
        Encoded { parts: vec![part] }
    }
}
