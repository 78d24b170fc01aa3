//! The per-operation timeline: every input record taken in for an
//! operation, in arrival order, with what became of it and what it caused.
//!
//! Written in the same atomic batch as the state (so a crash never leaves a
//! timeline that disagrees with the state), read by `explain` and the HTTP
//! API. Bounded: each operation keeps its last [`TIMELINE_CAP`] entries in
//! a ring (slot = ordinal mod cap), and the head records how many arrived in
//! all, so `explain` can say how many early entries were overwritten. An
//! operation that leaves retention takes its timeline with it.
//!
//! Recording it is on the hot path: the pipeline takes an [`Arrival`] of
//! each event before the core consumes it and hands it back with the
//! disposition and outputs ([`record`]).
//!
//! # Where the entries are kept
//!
//! An operation's latest [`INLINE_ENTRIES`] entries live in its own value,
//! beside its state ([`Head`]): the operation is written once per batch
//! anyway, so an operation of a handful of events costs no key, no store
//! write and no changelog record of its own for its timeline. When more
//! arrive (or more than [`INLINE_BYTES`] of them), the oldest inline entry
//! moves out to the timeline column family, to ring slot
//! `ordinal mod TIMELINE_CAP`: a producer looping on one operation then
//! writes one small entry per event there, and its operation's value stays
//! bounded. Reading merges the two, oldest first.
//!
//! # What an entry stores
//!
//! Less than it shows: its body's fields rather than their one-line
//! summary (see [`super::summary`]), a verdict's reason as its template's
//! number and arguments (see [`super::reason`]), ids of the UUID form as
//! their 16 bytes (see [`super::stored_id`]), its own event's id not at
//! all when that event claimed the entry's revision (the operation's state
//! names it in that revision's record, `OperationState::applied_seqs`;
//! nearly every entry of the default workload), a request's fields not at
//! all when they are the operation's request (which the state holds), and
//! the event its anomalies and verdicts name only when that is not its own,
//! and its event time as its distance from the operation's request (see
//! [`super::event_time`]).
//! Reading renders the summary and fills in what the entry left out, from
//! the operation's state where it is there ([`TimelineEntry`] is what
//! readers see).
//! The entry of the record that led to an operation's latest verdict is
//! also where that verdict's id and reason are stored while the entry is in
//! the operation's value ([`Head::verdict`], `encoded::LastVerdictRef`).

use std::collections::VecDeque;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::append::append;
use super::event_time::{StoredTime, TimeRef};
use super::reason::{ReasonRef, Rendered};
use super::stored_id::{Claimer, IdRef, StoredId, StoredOwnId};
use super::summary::Fields;
use super::Batch;
use crate::core::event::{Body, Event, SourcePos};
use crate::core::output::ManualDecisionRecord;
use crate::core::{Action, AnomalyKind, Disposition, OperationState, Outcome, Output, Policy, Status, Supersede};

/// Most entries kept per operation. Real operations have a handful of
/// events; the cap only bites for a producer looping on one operation, and
/// then the latest entries are the ones an investigation needs.
pub const TIMELINE_CAP: u64 = 256;

/// Entries kept in the operation's value: every entry of a typical
/// operation (the default loadgen workload's have at most 8). Changing it
/// changes what a stored value may hold: a store format change.
pub const INLINE_ENTRIES: usize = 8;

/// Bytes of entries kept in the operation's value, at most: an entry
/// carries strings of the input of unchecked length (ids, names, a redacted
/// note), and the operation's value is one changelog record, which must stay
/// far below a producer's message size limit. Larger entries move out at
/// once, as an entry of a long timeline does.
pub const INLINE_BYTES: usize = 16 << 10;

/// An operation's timeline as its value holds it: how many entries it has
/// received in all, and its latest ones (at most [`INLINE_ENTRIES`] and
/// [`INLINE_BYTES`]), serialized as [`TimelineEntry`] values, oldest
/// first. The entries before them, up to [`TIMELINE_CAP`] in all, are in
/// the timeline family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// Entries received in all, retained or overwritten.
    pub total: u64,
    /// The latest entries, oldest first.
    pub latest: VecDeque<Vec<u8>>,
    /// Which of them holds the operation's latest verdict, if one does:
    /// its value then stores the verdict's id and reason only there (see
    /// `encoded::LastVerdictRef`).
    pub(crate) verdict: Option<VerdictAt>,
}

/// Where an operation's latest verdict is in its timeline: the entry of
/// the record that led to it and its position among that entry's verdicts,
/// with the operation's verdict count then (it is that verdict as long as
/// the count has not moved on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VerdictAt {
    pub ordinal: u64,
    pub index: u32,
    pub count: u32,
}

impl Head {
    /// A head of `total` entries whose latest are all out of the value
    /// (tests, and operations written without their entries).
    pub fn of_total(total: u64) -> Head {
        Head { total, ..Head::default() }
    }

    /// Where `op`'s latest verdict is among the inline entries: its
    /// entry's position there and its own among the entry's verdicts.
    /// `None` when it is not in one (none yet, the entry moved out of the
    /// value, or a verdict recorded nowhere since).
    pub(crate) fn inline_verdict(&self, op: &OperationState) -> Option<(u32, u32)> {
        let at = self.verdict.filter(|at| at.count == op.verdict_count && op.last_verdict.is_some())?;
        let entry = at.ordinal.checked_sub(self.first_inline()).filter(|e| *e < self.latest.len() as u64)?;
        Some((u32::try_from(entry).ok()?, at.index))
    }

    /// The ordinal of the oldest inline entry: entries before it are in
    /// the timeline family.
    pub(crate) fn first_inline(&self) -> u64 {
        self.total - self.latest.len() as u64
    }

    /// The ring slots of the timeline family this operation has used (its
    /// changelog tombstones when it goes).
    pub(crate) fn spilled_slots(&self) -> u32 {
        self.first_inline().min(TIMELINE_CAP) as u32
    }

    /// A head as read back, unless it could not have been written (a
    /// damaged store): more inline entries than entries, or than the value
    /// may hold.
    pub(crate) fn checked(total: u64, latest: VecDeque<Vec<u8>>) -> Option<Head> {
        (latest.len() as u64 <= total && latest.len() <= INLINE_ENTRIES).then(|| Head {
            total,
            latest,
            ..Head::default()
        })
    }

    /// Appends an entry (of ordinal `total`); then the oldest inline
    /// entries, with their ordinals, that the value can no longer hold.
    fn push(&mut self, value: Vec<u8>) -> Vec<(u64, Vec<u8>)> {
        self.latest.push_back(value);
        self.total += 1;
        let mut out = Vec::new();
        let mut bytes: usize = self.latest.iter().map(Vec::len).sum();
        while self.latest.len() > INLINE_ENTRIES || bytes > INLINE_BYTES {
            let ordinal = self.first_inline();
            let Some(v) = self.latest.pop_front() else { break };
            bytes -= v.len();
            out.push((ordinal, v));
        }
        if self.verdict.is_some_and(|at| at.ordinal < self.first_inline()) {
            self.verdict = None;
        }
        out
    }
}

/// An anomaly raised while a record was processed (it may name another
/// event, e.g. a held one given up by SEQ_GAP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnomalyNote {
    /// What was detected.
    pub kind: AnomalyKind,
    /// The event flagged.
    pub event_id: String,
    /// One human sentence.
    pub detail: String,
}

/// A verdict issued while a record was processed. `trigger_event_id` may be
/// an event released from the reorder buffer by this record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictNote {
    /// The verdict's deterministic id.
    pub verdict_id: String,
    /// Its outcome.
    pub outcome: Outcome,
    /// The action it recommends.
    pub action: Action,
    /// The operation's state, as the verdict reports it.
    pub state: Status,
    /// One human sentence.
    pub reason: String,
    /// The event that decided it.
    pub trigger_event_id: String,
}

/// One input record of an operation and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    /// Arrival order within the operation, from 0.
    pub ordinal: u64,
    /// Input partition of the record.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// The event's id.
    pub event_id: String,
    /// Its revision of the operation record; `None` for an observation from
    /// outside it (the event's seq is null).
    pub seq: Option<i64>,
    /// The body's union branch (`Requested`, `Started`, ...).
    pub body: String,
    /// Event time.
    pub occurred_at: i64,
    /// The service that emitted it.
    pub producer: String,
    /// How the core accounted for it (applied, duplicate, held, ...).
    pub disposition: Disposition,
    /// The body's structured fields in one line; free text (details,
    /// evidence references) is left out, as it may carry personal data.
    pub summary: String,
    /// Anomalies raised while it was processed.
    pub anomalies: Vec<AnomalyNote>,
    /// Verdicts issued while it was processed.
    pub verdicts: Vec<VerdictNote>,
    /// For a `ManualDecision`: who decided what, with the (redacted) note.
    pub manual: Option<ManualDecisionRecord>,
}

/// The timeline as stored: the retained entries in arrival order, and the
/// number of entries that ever arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Entries that ever arrived, retained or overwritten.
    pub total: u64,
    /// The retained entries, in arrival order.
    pub entries: Vec<TimelineEntry>,
}

impl Timeline {
    /// Entries that arrived but were overwritten by the cap.
    pub fn dropped(&self) -> u64 {
        self.total - self.entries.len() as u64
    }
}

/// What the timeline keeps of an event, taken before `core::apply`
/// consumes it: already serialized, in one buffer (one allocation per
/// record rather than a string per field).
#[derive(Debug, Clone)]
pub struct Arrival {
    partition: i32,
    /// The event's revision of the operation record.
    seq: Option<i64>,
    /// Whether it is a `Requested` (its entry may name its fields as the
    /// operation's request, [`Fields::OfTheRequest`]).
    request: bool,
    /// The operation id, the event id, then the entry's fields from
    /// `partition` to `fields` as [`StoredEntry`] reads them.
    buf: Vec<u8>,
    id_end: usize,
    event_end: usize,
    /// Where the entry's field `event_id` is in `buf` (written instead as
    /// [`Claimer`] when the event claimed its revision).
    own: Range<usize>,
    /// The event time, written in the entry between the revision and the
    /// producer (at `time_at` in `buf`) as its distance from the
    /// operation's request ([`TimeRef`]).
    occurred_at: i64,
    time_at: usize,
    /// Where the entry's field `fields` starts in `buf` (it ends `buf`).
    fields_at: usize,
    manual: Option<ManualDecisionRecord>,
}

/// The fields of an entry known on arrival, in the entry's order.
/// Postcard writes a struct as its fields back to back, so these, appended
/// in turn, are the entry's own bytes; all but the event time, which is
/// written once the operation's state is known ([`TimeRef`]).
struct ArrivalFields<'a> {
    partition: i32,
    offset: i64,
    event_id: IdRef<'a>,
    seq: Option<i64>,
    occurred_at: i64,
    producer: &'a str,
    fields: Fields<&'a str>,
}

/// The fields decided by the core, in the entry's order.
#[derive(Serialize)]
struct Decided<'a> {
    disposition: Disposition,
    anomalies: Vec<AnomalyRef<'a>>,
    verdicts: Vec<VerdictRef<'a>>,
    manual: &'a Option<ManualDecisionRecord>,
}

/// [`AnomalyNote`] as written: the event it flags only when that is not
/// the entry's own (it nearly always is).
#[derive(Serialize)]
struct AnomalyRef<'a> {
    kind: AnomalyKind,
    other_event_id: Option<IdRef<'a>>,
    detail: &'a str,
}

/// [`VerdictNote`] as written: its trigger only when that is not the
/// entry's own event (an event released from the reorder buffer).
#[derive(Serialize)]
struct VerdictRef<'a> {
    verdict_id: IdRef<'a>,
    outcome: Outcome,
    action: Action,
    state: Status,
    reason: ReasonRef<'a>,
    other_trigger_event_id: Option<IdRef<'a>>,
}

/// An entry as stored: [`ArrivalFields`] and [`Decided`] after its ordinal,
/// read back. [`StoredEntry::into_entry`] makes it the [`TimelineEntry`]
/// readers see. `S` is `String`, or `&str` to read a stored operation's
/// latest verdict out of its entry without copying the rest
/// ([`verdict_at`]).
#[derive(Deserialize)]
struct StoredEntry<S = String> {
    ordinal: u64,
    partition: i32,
    offset: i64,
    event_id: StoredOwnId<S>,
    seq: Option<i64>,
    occurred_at: StoredTime,
    producer: S,
    fields: Fields<S>,
    disposition: Disposition,
    anomalies: Vec<StoredAnomaly<S>>,
    verdicts: Vec<StoredVerdict<S>>,
    manual: Option<ManualDecisionRecord>,
}

/// [`AnomalyRef`] read back.
#[derive(Deserialize)]
struct StoredAnomaly<S> {
    kind: AnomalyKind,
    other_event_id: Option<StoredId<S>>,
    detail: S,
}

/// [`VerdictRef`] read back.
#[derive(Deserialize)]
struct StoredVerdict<S> {
    verdict_id: StoredId<S>,
    outcome: Outcome,
    action: Action,
    state: Status,
    reason: Rendered,
    other_trigger_event_id: Option<StoredId<S>>,
}

impl StoredEntry {
    /// The entry as `explain` and the API show it: the body named and its
    /// fields rendered, what it leaves implicit filled in (from `op`, its
    /// operation's state, its own event id when that claimed its revision
    /// and its fields when they are the request's); `None` when `op` does
    /// not hold what the entry names (a damaged store).
    fn into_entry(self, op: &OperationState) -> Option<TimelineEntry> {
        let seq = self.seq;
        let own = self.event_id.into_string(|| Some(op.applied_seqs.get(&seq?)?.event_id.clone()))?;
        let fields = self.fields.resolved(op.request.as_ref())?;
        let occurred_at = self.occurred_at.resolved(op)?;
        Some(TimelineEntry {
            ordinal: self.ordinal,
            partition: self.partition,
            offset: self.offset,
            seq: self.seq,
            body: fields.body().to_owned(),
            occurred_at,
            producer: self.producer,
            disposition: self.disposition,
            summary: fields.render(),
            anomalies: (self.anomalies.into_iter())
                .map(|a| AnomalyNote {
                    kind: a.kind,
                    event_id: a.other_event_id.map_or_else(|| own.clone(), StoredId::into_string),
                    detail: a.detail,
                })
                .collect(),
            verdicts: (self.verdicts.into_iter())
                .map(|v| VerdictNote {
                    verdict_id: v.verdict_id.into_string(),
                    outcome: v.outcome,
                    action: v.action,
                    state: v.state,
                    reason: v.reason.0,
                    trigger_event_id: v.other_trigger_event_id.map_or_else(|| own.clone(), StoredId::into_string),
                })
                .collect(),
            manual: self.manual,
            event_id: own,
        })
    }
}

/// Reads a stored timeline entry (from an operation's value or the
/// timeline family) of the operation whose state is `op`; the error says
/// why it cannot be read.
pub(super) fn decode_entry(bytes: &[u8], op: &OperationState) -> Result<TimelineEntry, String> {
    let entry = postcard::from_bytes::<StoredEntry>(bytes).map_err(|e| e.to_string())?;
    entry.into_entry(op).ok_or_else(|| "it names a revision's record or a request its operation does not hold".into())
}

/// The id and reason of verdict `index` of stored entry `entry`; `None`
/// when the entry cannot be read or has no such verdict.
pub(super) fn verdict_at(entry: &[u8], index: u32) -> Option<(String, String)> {
    let e = postcard::from_bytes::<StoredEntry<&str>>(entry).ok()?;
    let v = e.verdicts.into_iter().nth(usize::try_from(index).ok()?)?;
    Some((v.verdict_id.into_string(), v.reason.0))
}

/// `id`, unless it is `own` (the entry's event, which the entry names
/// already).
fn other_than<'x>(id: &'x str, own: &[u8]) -> Option<IdRef<'x>> {
    (id.as_bytes() != own).then_some(IdRef(id))
}

impl Arrival {
    /// The arrival without its decision record: a forged `ManualDecision`
    /// is noted in the timeline as refused, never as a decision someone
    /// took (explain and the panel show the decision record).
    pub fn without_decision(self) -> Arrival {
        Arrival { manual: None, ..self }
    }

    /// The operation the event belongs to.
    pub fn operation_id(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.id_end]).expect("copied from a str")
    }

    /// The event the entry is of, as the bytes of its id: it is only
    /// compared with other ids (validating it as UTF-8 again for that
    /// showed in profiles, once per record).
    fn event_id(&self) -> &[u8] {
        &self.buf[self.id_end..self.event_end]
    }

    /// Takes what the timeline needs of `ev` (the decision note redacted as
    /// the core redacts it).
    pub fn of(ev: &Event, pos: SourcePos, policy: &Policy) -> Arrival {
        let manual = match &ev.body {
            Body::ManualDecision { actor, decision, note, evidence_checked } => Some(ManualDecisionRecord {
                actor: actor.clone(),
                decision: *decision,
                note: policy.redactor.redact(note).into_owned(),
                evidence_checked: evidence_checked.clone(),
            }),
            _ => None,
        };
        let fields = ArrivalFields {
            partition: pos.partition,
            offset: pos.offset,
            event_id: IdRef(&ev.event_id),
            seq: ev.seq,
            occurred_at: ev.occurred_at,
            producer: &ev.producer,
            fields: Fields::of(&ev.body),
        };
        Arrival::with(&ev.operation_id, &fields, manual)
    }

    /// The entry a superseded operation gets: the newer operation's request
    /// (its record, in the older one's timeline) and what it replaced.
    pub fn superseded(s: &Supersede) -> Arrival {
        let fields = ArrivalFields {
            partition: s.pos.partition,
            offset: s.pos.offset,
            event_id: IdRef(&s.trigger_event_id),
            seq: None,
            occurred_at: s.at,
            producer: "reconciler",
            fields: Fields::superseded(s),
        };
        Arrival::with(&s.operation_id, &fields, None)
    }

    fn with(operation_id: &str, fields: &ArrivalFields<'_>, manual: Option<ManualDecisionRecord>) -> Arrival {
        let event_id = fields.event_id.0;
        let mut buf = Vec::with_capacity(operation_id.len() + 2 * event_id.len() + fields.producer.len() + 64);
        buf.extend_from_slice(operation_id.as_bytes());
        let id_end = buf.len();
        buf.extend_from_slice(event_id.as_bytes());
        let event_end = buf.len();
        append(&mut buf, &(fields.partition, fields.offset));
        let own_start = buf.len();
        append(&mut buf, &fields.event_id);
        let own = own_start..buf.len();
        append(&mut buf, &fields.seq);
        let time_at = buf.len();
        append(&mut buf, &fields.producer);
        let fields_at = buf.len();
        append(&mut buf, &fields.fields);
        let request = matches!(fields.fields, Fields::Requested { .. });
        Arrival {
            partition: fields.partition,
            seq: fields.seq,
            request,
            buf,
            id_end,
            event_end,
            own,
            occurred_at: fields.occurred_at,
            time_at,
            fields_at,
            manual,
        }
    }
}

/// Records what became of arrival `a` (its disposition and the outputs its
/// processing produced) in the operation's timeline `head`, which is
/// stored with its state `op` (as it is afterwards: `None` when it no
/// longer exists, and a timer for a removed operation leaves no trace that
/// nothing would delete); an entry the head no longer holds goes to
/// `batch`.
pub fn record(
    batch: &mut Batch,
    head: &mut Head,
    a: Arrival,
    disposition: Disposition,
    outputs: &[Output],
    op: Option<&OperationState>,
) {
    let Some(op) = op else { return };
    // The operation's latest verdict, if this record led to it.
    if let Some(last) = &op.last_verdict {
        let mut verdicts = outputs.iter().filter_map(|o| match o {
            Output::Verdict(v) => Some(&v.verdict_id),
            _ => None,
        });
        if let Some(Ok(index)) = verdicts.position(|id| *id == last.verdict_id).map(u32::try_from) {
            head.verdict = Some(VerdictAt { ordinal: head.total, index, count: op.verdict_count });
        }
    }
    let value = entry_value(head.total, &a, disposition, outputs, op);
    for (ordinal, out) in head.push(value) {
        batch.add_timeline_value(a.partition, a.operation_id(), ordinal, out);
    }
}

/// The stored entry of ordinal `ordinal`: arrival `a`, its disposition
/// and the outputs its processing produced, of operation `op` (as it is
/// after them).
pub(crate) fn entry_value(
    ordinal: u64,
    a: &Arrival,
    disposition: Disposition,
    outputs: &[Output],
    op: &OperationState,
) -> Vec<u8> {
    let own = a.event_id();
    // A revision's record, once written, is never replaced
    // (`detect::apply_now`), nor is the request once set
    // (`OperationState::request`): the entry can name what they hold.
    let claimed = a.seq.and_then(|s| op.applied_seqs.get(&s)).is_some_and(|r| r.event_id.as_bytes() == own);
    let of_the_request = a.request
        && op.request.as_ref().is_some_and(|r| {
            let mut fields = Vec::with_capacity(a.buf.len() - a.fields_at);
            append(&mut fields, &Fields::of_request(r));
            fields == a.buf[a.fields_at..]
        });
    let mut anomalies = Vec::new();
    let mut verdicts = Vec::new();
    // The value's size, about: the arrival's fields, the ordinal and the
    // disposition, and each output's strings (growing the value copied it).
    let mut size = a.buf.len() - a.event_end + 64;
    for o in outputs {
        match o {
            Output::Anomaly(x) => {
                size += 16 + x.event_id.len() + x.detail.len();
                anomalies.push(AnomalyRef {
                    kind: x.kind,
                    other_event_id: other_than(&x.event_id, own),
                    detail: &x.detail,
                });
            }
            Output::Verdict(v) => {
                size += 16 + v.verdict_id.len() + v.reason.len() + v.trigger_event_id.len();
                verdicts.push(VerdictRef {
                    verdict_id: IdRef(&v.verdict_id),
                    outcome: v.outcome,
                    action: v.action,
                    state: v.state,
                    reason: ReasonRef(&v.reason),
                    other_trigger_event_id: other_than(&v.trigger_event_id, own),
                });
            }
            Output::Command(_) => {}
        }
    }
    let decided = Decided { disposition, anomalies, verdicts, manual: &a.manual };
    // Its ordinal, then the fields taken on arrival, then these.
    let mut value = Vec::with_capacity(size);
    append(&mut value, &ordinal);
    value.extend_from_slice(&a.buf[a.event_end..a.own.start]);
    if claimed {
        append(&mut value, &Claimer);
    } else {
        value.extend_from_slice(&a.buf[a.own.clone()]);
    }
    value.extend_from_slice(&a.buf[a.own.end..a.time_at]);
    append(&mut value, &TimeRef { at: a.occurred_at, op });
    value.extend_from_slice(&a.buf[a.time_at..a.fields_at]);
    if of_the_request {
        append(&mut value, &Fields::<&str>::OfTheRequest);
    } else {
        value.extend_from_slice(&a.buf[a.fields_at..]);
    }
    append(&mut value, &decided);
    value
}
