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

use std::collections::VecDeque;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::Batch;
use crate::core::event::{Body, Event, SourcePos};
use crate::core::output::ManualDecisionRecord;
use crate::core::{Action, AnomalyKind, Disposition, Outcome, Output, Policy, Status, Supersede};

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
}

impl Head {
    /// A head of `total` entries whose latest are all out of the value
    /// (tests, and operations written without their entries).
    pub fn of_total(total: u64) -> Head {
        Head { total, latest: VecDeque::new() }
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
        (latest.len() as u64 <= total && latest.len() <= INLINE_ENTRIES).then_some(Head { total, latest })
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
    /// outside it (SPEC §4).
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
    /// The operation id, then the entry's fields from `partition` to
    /// `producer` as [`crate::store::TimelineEntry`] serializes them, then
    /// the summary.
    buf: Vec<u8>,
    id_end: usize,
    fields_end: usize,
    manual: Option<ManualDecisionRecord>,
}

/// The fields of an entry known on arrival, in the entry's order (postcard
/// writes a struct as its fields back to back, so these bytes are the
/// entry's own).
#[derive(Serialize)]
struct ArrivalFields<'a> {
    partition: i32,
    offset: i64,
    event_id: &'a str,
    seq: Option<i64>,
    body: &'a str,
    occurred_at: i64,
    producer: &'a str,
}

/// The fields decided by the core, in the entry's order.
#[derive(Serialize)]
struct Decided<'a> {
    disposition: Disposition,
    summary: &'a str,
    anomalies: Vec<AnomalyRef<'a>>,
    verdicts: Vec<VerdictRef<'a>>,
    manual: &'a Option<ManualDecisionRecord>,
}

/// [`crate::store::timeline::AnomalyNote`], borrowed.
#[derive(Serialize)]
struct AnomalyRef<'a> {
    kind: AnomalyKind,
    event_id: &'a str,
    detail: &'a str,
}

/// [`crate::store::timeline::VerdictNote`], borrowed.
#[derive(Serialize)]
struct VerdictRef<'a> {
    verdict_id: &'a str,
    outcome: Outcome,
    action: Action,
    state: Status,
    reason: &'a str,
    trigger_event_id: &'a str,
}

fn serialize_into<T: Serialize>(buf: &mut Vec<u8>, value: &T) {
    *buf = postcard::to_extend(value, std::mem::take(buf)).expect("timeline fields serialize");
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
        let mut buf = Vec::with_capacity(ev.operation_id.len() + ev.event_id.len() + ev.producer.len() + 128);
        buf.extend_from_slice(ev.operation_id.as_bytes());
        let id_end = buf.len();
        let fields = ArrivalFields {
            partition: pos.partition,
            offset: pos.offset,
            event_id: &ev.event_id,
            seq: ev.seq,
            body: ev.body.name(),
            occurred_at: ev.occurred_at,
            producer: &ev.producer,
        };
        serialize_into(&mut buf, &fields);
        let fields_end = buf.len();
        write_summary(&mut buf, &ev.body);
        Arrival { partition: pos.partition, buf, id_end, fields_end, manual }
    }
}

impl Arrival {
    /// The entry a superseded operation gets: the newer operation's request
    /// (its record, in the older one's timeline) and what it replaced.
    pub fn superseded(s: &Supersede) -> Arrival {
        let mut buf = Vec::with_capacity(s.operation_id.len() + s.trigger_event_id.len() + 128);
        buf.extend_from_slice(s.operation_id.as_bytes());
        let id_end = buf.len();
        let fields = ArrivalFields {
            partition: s.pos.partition,
            offset: s.pos.offset,
            event_id: &s.trigger_event_id,
            seq: None,
            body: "Requested",
            occurred_at: s.at,
            producer: "reconciler",
        };
        serialize_into(&mut buf, &fields);
        let fields_end = buf.len();
        let by = &s.by;
        let version = by.expected_version.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let _ = write!(Text(&mut buf), "superseded by operation {} (version {version})", by.operation_id);
        Arrival { partition: s.pos.partition, buf, id_end, fields_end, manual: None }
    }
}

/// Appends formatted text to a byte buffer through `fmt::Write` (the
/// `io::Write` route to a `Vec<u8>` cost twice as much per record).
struct Text<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Appends the structured fields of a body in one line to `out`. Free text
/// that may carry personal data (`detail`, `evidence_ref`) is left out.
fn write_summary(out: &mut Vec<u8>, body: &Body) {
    let out = &mut Text(out);
    struct Opt<T>(Option<T>);
    impl<T: std::fmt::Display> std::fmt::Display for Opt<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match &self.0 {
                Some(v) => v.fmt(f),
                None => f.write_str("-"),
            }
        }
    }
    let written = match body {
        Body::Requested(r) => write!(
            out,
            "expects version {} fingerprint {}; {}idempotent; key {}; to {}",
            Opt(r.expected_version),
            Opt(r.expected_fingerprint.as_deref()),
            if r.idempotent { "" } else { "not " },
            Opt(r.idempotency_key.as_deref()),
            r.destination
        ),
        Body::Started { attempt, worker } => write!(out, "attempt {attempt} by {worker}"),
        Body::AttemptFailed { attempt, error_class, error_code, next_attempt_at, .. } => {
            write!(out, "attempt {attempt} failed {error_class:?} ({error_code})").and_then(
                |()| match next_attempt_at {
                    Some(t) => write!(out, "; next attempt at {}", crate::clock::format_time(*t)),
                    None => Ok(()),
                },
            )
        }
        Body::OutcomeUnknown { attempt, .. } => write!(out, "attempt {attempt}: outcome unknown"),
        Body::EffectObserved(o) => write!(
            out,
            "{:?} saw remote id {} version {} fingerprint {}",
            o.source,
            Opt(o.remote_id.as_deref()),
            Opt(o.observed_version),
            Opt(o.observed_fingerprint.as_deref())
        ),
        Body::EffectAbsent { source, .. } => write!(out, "{source:?} found no effect"),
        Body::Compensated { actor, reason } => write!(out, "compensated by {actor}: {reason}"),
        Body::Cancelled { reason } => write!(out, "cancelled: {reason}"),
        Body::ManualDecision { actor, decision, .. } => write!(out, "{} by {actor}", decision.as_str()),
        Body::DeadlineReached { deadline } => write!(out, "deadline {deadline} reached"),
        Body::ProbeFailed { attempt, error_class, detail } => {
            write!(out, "probe failed after {attempt} attempt(s): {} ({detail})", error_class.as_str())
        }
    };
    written.expect("writing to a vector");
}

/// Records what became of arrival `a` (its disposition and the outputs its
/// processing produced) in the operation's timeline `head`, which is
/// stored with its state; an entry the head no longer holds goes to
/// `batch`. `exists` is whether the operation still exists afterwards (a
/// timer for a removed operation leaves no trace that nothing would
/// delete).
pub fn record(
    batch: &mut Batch,
    head: &mut Head,
    a: Arrival,
    disposition: Disposition,
    outputs: &[Output],
    exists: bool,
) {
    if !exists {
        return;
    }
    let mut anomalies = Vec::new();
    let mut verdicts = Vec::new();
    for o in outputs {
        match o {
            Output::Anomaly(x) => anomalies.push(AnomalyRef { kind: x.kind, event_id: &x.event_id, detail: &x.detail }),
            Output::Verdict(v) => verdicts.push(VerdictRef {
                verdict_id: &v.verdict_id,
                outcome: v.outcome,
                action: v.action,
                state: v.state,
                reason: &v.reason,
                trigger_event_id: &v.trigger_event_id,
            }),
            Output::Command(_) => {}
        }
    }
    let summary = std::str::from_utf8(&a.buf[a.fields_end..]).expect("formatted text");
    let decided = Decided { disposition, summary, anomalies, verdicts, manual: &a.manual };
    // The entry: its ordinal, then the fields taken on arrival, then these.
    let mut value = Vec::with_capacity(a.buf.len() + 64);
    serialize_into(&mut value, &head.total);
    value.extend_from_slice(&a.buf[a.id_end..a.fields_end]);
    serialize_into(&mut value, &decided);
    for (ordinal, out) in head.push(value) {
        batch.add_timeline_value(a.partition, a.operation_id(), ordinal, out);
    }
}
