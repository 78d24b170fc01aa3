//! The workload: units of realistic lifecycles ("stories"), each with at
//! most one fault, interleaved the way concurrent services interleave.
//!
//! Every story states what the reconciler must conclude from it (verdicts,
//! anomalies, dead letters) from the documented rules alone (the
//! lifecycle, the anomalies, the verdicts, the timers and the input
//! validation), while it is built: that is the ground truth. The core is
//! never asked; a test compares the two.
//!
//! One fault per unit keeps each expectation a short argument rather than a
//! simulation. Units on the same entity never overlap in the stream (the
//! entity's confirmed version is shared state): a unit waits until no active
//! unit uses its entity, so entity versions grow in stream order and only
//! the stale-version story observes an older one, on purpose. A unit whose
//! operation is left open (it waits for its timers: the overdue verdict,
//! then the follow-ups) retires its entity: a later request for a higher
//! version would supersede it, at a moment that depends on when
//! the timers fire. The version-bump stories supersede on purpose, inside
//! one unit.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::core::event::{Body, Decision, EffectObserved, ErrorClass, Event, EvidenceSource, Requested};
use crate::core::{Action, AnomalyKind, Outcome};

use super::rng::Rng;
use super::truth::{Assumptions, Expected, GroundTruth, HeldEffect};
use crate::records::InputRecord;

/// A fault of the workload, as the command line offers it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    /// The field of [`Faults`] (and the name of its story).
    pub name: &'static str,
    /// The command-line flag: `--` and this.
    pub flag: &'static str,
    /// The default rate, as written in the source.
    pub default: &'static str,
    /// What the fault is, for `--help`.
    pub help: &'static str,
}

/// Declares [`Faults`] once: its fields, defaults and help, the story each
/// field injects, and the table the command line is built from.
macro_rules! faults {
    ($( $(#[doc = $doc:literal])+ $field:ident ($flag:literal) => $story:ident = $default:literal, )+) => {
        /// Fraction of units that carry each fault (the rest are clean lifecycles).
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct Faults {
            $( $(#[doc = $doc])+ pub $field: f64, )+
        }

        impl Default for Faults {
            fn default() -> Self {
                Faults { $( $field: $default, )+ }
            }
        }

        /// How many faults there are.
        const FAULT_COUNT: usize = [$(stringify!($field)),+].len();

        impl Faults {
            /// Every fault: field, flag, default rate and description.
            pub const ALL: [FaultSpec; FAULT_COUNT] =
                [$( FaultSpec {
                    name: stringify!($field),
                    flag: $flag,
                    default: stringify!($default),
                    help: concat!($($doc),+),
                }, )+];

            /// No faults at all: clean lifecycles only.
            pub fn none() -> Faults {
                Faults::uniform(0.0)
            }

            /// Every fault at `rate` (a small workload with many of each).
            pub fn uniform(rate: f64) -> Faults {
                Faults { $( $field: rate, )+ }
            }

            /// The rate of the fault `name` (a field name), to read or set.
            pub fn rate_mut(&mut self, name: &str) -> Option<&mut f64> {
                match name {
                    $( stringify!($field) => Some(&mut self.$field), )+
                    _ => None,
                }
            }

            fn table(&self) -> [(Story, f64); FAULT_COUNT] {
                [$( (Story::$story, self.$field), )+]
            }
        }
    };
}

faults! {
    /// An event delivered twice (same event_id).
    duplicate_delivery ("duplicate-delivery") => DuplicateDelivery = 0.03,
    /// A revision emitted twice with the same body (new event_id).
    duplicate_emission ("duplicate-emission") => DuplicateEmission = 0.01,
    /// Two revisions swapped, the gap filled within the reorder window.
    reorder ("reorder") => Reorder = 0.02,
    /// A revision arriving after the reorder window closed (gap, then late).
    reorder_beyond_window ("reorder-beyond-window") => ReorderBeyondWindow = 0.005,
    /// Two writers transitioning the same revision.
    conflict ("conflict") => Conflict = 0.005,
    /// Outcome unknown and no confirmation ever comes (judged at the deadline).
    missing_confirmation ("missing-confirmation") => MissingConfirmation = 0.01,
    /// The destination holds another version.
    divergent ("divergent") => Divergent = 0.005,
    /// The effect found twice under two remote ids.
    duplicate_effect ("duplicate-effect") => DuplicateEffect = 0.005,
    /// The operation is cancelled.
    cancellation ("cancellation") => Cancellation = 0.01,
    /// Cancelled, then a stray worker starts it anyway.
    invalid_transition ("invalid-transition") => InvalidTransition = 0.003,
    /// A newer version is confirmed before an older one's effect is seen.
    stale_version ("stale-version") => StaleVersion = 0.005,
    /// Events of an operation whose request never arrives.
    orphan ("orphan") => Orphan = 0.003,
    /// Undecodable or invalid records (dead letters).
    garbage ("garbage") => Garbage = 0.002,
    /// A newer version requested while the older operation is pending,
    /// processing or awaiting confirmation (the older one is superseded).
    version_bump ("version-bump") => VersionBump = 0.01,
    /// A failed attempt whose retry is scheduled past the confirmation
    /// window, and never comes.
    retry_scheduled_late ("retry-scheduled-late") => RetryScheduledLate = 0.005,
    /// A query finds nothing, the operation is requeued, and nobody picks
    /// the requeue up.
    requeue_not_picked_up ("requeue-not-picked-up") => RequeueNotPickedUp = 0.005,
    /// A requeue is picked up (a new attempt starts), but that attempt is
    /// never confirmed either.
    requeue_picked_up_then_lost ("requeue-picked-up-then-lost") => RequeuePickedUpThenLost = 0.005,
    /// The outcome is unknown and the probe worker asks destination
    /// `records` (served by `reconciler loadgen destination`), which holds
    /// the same version, another one, or nothing. Off by default: it needs
    /// the worker, the destination service and `--event-time now`.
    probed ("probed") => Probed = 0.0,
}

impl Faults {
    /// Rates must be in [0, 1] and leave room for clean lifecycles.
    pub fn validate(&self) -> Result<(), String> {
        let mut sum = 0.0;
        for (fault, (_, rate)) in Self::ALL.iter().zip(self.table()) {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("fault rate --{} must be between 0 and 1, got {rate}", fault.flag));
            }
            sum += rate;
        }
        if sum > 1.0 {
            return Err(format!("fault rates add up to {sum:.3}; at most 1"));
        }
        Ok(())
    }
}

/// What a unit of the workload is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Story {
    // Clean lifecycles.
    Happy,
    RetryThenSuccess,
    TimeoutThenFound,
    TimeoutAbsentRetried,
    PermanentFailure,
    RetriesExhausted,
    NeverStarted,
    SilentIdempotent,
    SilentNotIdempotent,
    // Faults.
    DuplicateDelivery,
    DuplicateEmission,
    Reorder,
    ReorderBeyondWindow,
    Conflict,
    MissingConfirmation,
    Divergent,
    DuplicateEffect,
    Cancellation,
    InvalidTransition,
    StaleVersion,
    Orphan,
    Garbage,
    VersionBump,
    RetryScheduledLate,
    RequeueNotPickedUp,
    RequeuePickedUpThenLost,
    Probed,
}

/// Clean lifecycles and their weights (they fill what faults leave).
const CLEAN: [(Story, u32); 9] = [
    (Story::Happy, 600),
    (Story::RetryThenSuccess, 150),
    (Story::TimeoutThenFound, 100),
    (Story::TimeoutAbsentRetried, 50),
    (Story::PermanentFailure, 30),
    (Story::RetriesExhausted, 20),
    (Story::NeverStarted, 20),
    (Story::SilentIdempotent, 15),
    (Story::SilentNotIdempotent, 15),
];

impl Story {
    fn name(self) -> &'static str {
        match self {
            Story::Happy => "happy",
            Story::RetryThenSuccess => "retry_then_success",
            Story::TimeoutThenFound => "timeout_then_found",
            Story::TimeoutAbsentRetried => "timeout_absent_retried",
            Story::PermanentFailure => "permanent_failure",
            Story::RetriesExhausted => "retries_exhausted",
            Story::NeverStarted => "never_started",
            Story::SilentIdempotent => "silent_idempotent",
            Story::SilentNotIdempotent => "silent_not_idempotent",
            Story::DuplicateDelivery => "duplicate_delivery",
            Story::DuplicateEmission => "duplicate_emission",
            Story::Reorder => "reorder",
            Story::ReorderBeyondWindow => "reorder_beyond_window",
            Story::Conflict => "conflict",
            Story::MissingConfirmation => "missing_confirmation",
            Story::Divergent => "divergent",
            Story::DuplicateEffect => "duplicate_effect",
            Story::Cancellation => "cancellation",
            Story::InvalidTransition => "invalid_transition",
            Story::StaleVersion => "stale_version",
            Story::Orphan => "orphan",
            Story::Garbage => "garbage",
            Story::VersionBump => "version_bump",
            Story::RetryScheduledLate => "retry_scheduled_late",
            Story::RequeueNotPickedUp => "requeue_not_picked_up",
            Story::RequeuePickedUpThenLost => "requeue_picked_up_then_lost",
            Story::Probed => "probed",
        }
    }

    /// Whether the unit leaves its operation open, waiting for timers.
    fn ends_open(self) -> bool {
        matches!(
            self,
            Story::NeverStarted
                | Story::SilentIdempotent
                | Story::SilentNotIdempotent
                | Story::MissingConfirmation
                | Story::RetryScheduledLate
                | Story::RequeueNotPickedUp
                | Story::RequeuePickedUpThenLost
                | Story::Probed
        )
    }
}

/// A record and the wall-clock time (ms) at which a paced publisher sends
/// it: its unit's start, so a unit's events go out together.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Wall-clock time (ms) to send it at.
    pub due_ms: i64,
    /// The input record: an event, or bytes the reconciler must dead-letter.
    pub record: InputRecord,
}

/// How to generate.
#[derive(Debug, Clone)]
pub struct Options {
    /// Operations to create (garbage records come on top).
    pub operations: u64,
    /// Entities the operations are spread over (a story that retires one takes
    /// a fresh one in its place).
    pub entities: u64,
    /// Seed of the whole workload: the same seed and options give the same
    /// records.
    pub seed: u64,
    /// Event time (ms) of the first unit.
    pub start_ms: i64,
    /// Event time between the starts of two units, in microseconds.
    pub unit_spacing_us: i64,
    /// Event time between two events of one unit (ms).
    pub step_ms: i64,
    /// `confirm_within_ms` written into every request.
    pub confirm_within_ms: i64,
    /// The reconciler's reorder window the workload is built against.
    pub reorder_window_ms: i64,
    /// How many units are in flight at once (interleaving).
    pub interleave: usize,
    /// The rate of each fault story.
    pub faults: Faults,
    /// Keep each operation's expected verdicts in the truth (off for huge
    /// runs that only need the counts: the map grows with the operations).
    pub keep_verdicts: bool,
    /// The reconciler's policy the truth is built for: follow-up windows
    /// and requeue limits (see [`crate::core::Policy`]).
    pub policy: crate::core::Policy,
    /// The framings the reconciler reads its input in: which dead-letter
    /// class each undecodable record the workload plants gets.
    pub input: crate::codec::InputFraming,
}

impl Options {
    /// Defaults for a preloaded topic: events in the past, so every
    /// deadline is already due when the pipeline reads them.
    pub fn preload(operations: u64, seed: u64, now_ms: i64) -> Options {
        let unit_spacing_us = 1000;
        let span = (operations as i64).saturating_mul(unit_spacing_us) / 1000;
        Options {
            operations,
            entities: (operations / 4).max(64),
            seed,
            start_ms: now_ms - 3 * 3_600_000 - span,
            unit_spacing_us,
            step_ms: 10,
            confirm_within_ms: 300_000,
            reorder_window_ms: crate::core::Policy::default().reorder_window_ms,
            interleave: 8,
            faults: Faults::default(),
            keep_verdicts: true,
            policy: crate::core::Policy::default(),
            input: crate::codec::InputFraming::SingleObject,
        }
    }
}

struct Unit {
    records: VecDeque<InputRecord>,
    entity: Option<u64>,
    due_ms: i64,
}

/// Streams the workload and writes its ground truth as it goes.
pub struct Generator {
    opts: Options,
    rng: Rng,
    codec: crate::codec::Codec,
    next_unit: u64,
    ops_made: u64,
    pending: Option<Unit>,
    active: Vec<Unit>,
    busy_entities: HashSet<u64>,
    /// Entities whose last unit left an operation open (see the module doc).
    retired: HashSet<u64>,
    /// Entities beyond `entities` taken in place of retired ones.
    extra_entities: u64,
    /// Per entity: the last version handed out and the highest confirmed.
    versions: HashMap<u64, (i64, Option<i64>)>,
    truth: GroundTruth,
}

fn ev_of(op: &str, entity: &str, ty: &str, seq: Option<i64>, at: i64, tag: &str, body: Body) -> Event {
    Event {
        event_id: format!("{op}.{tag}"),
        operation_id: op.to_owned(),
        entity_id: entity.to_owned(),
        operation_type: ty.to_owned(),
        seq,
        occurred_at: at,
        producer: "loadgen".into(),
        body,
    }
}

const SYNC: &str = "sync_customer";
const INVOICE: &str = "send_invoice";

/// The destination of the probed story, served by `reconciler loadgen
/// destination` from the truth.
pub const PROBED_DESTINATION: &str = "records";

fn v(outcome: Outcome, action: Action) -> Expected {
    Expected::now(outcome, action)
}

fn vt(outcome: Outcome, action: Action, at: i64) -> Expected {
    Expected::at(outcome, action, at)
}

/// The requeue follow-ups for an operation about to be requeued at event
/// time `at` (by a timer, or by the event of that time) after `n` automatic
/// requeues, when nothing ever picks a requeue up: requeued up to `max`
/// times in all, each one follow-up window after the last, then sent to
/// review.
fn requeues_unanswered(at: i64, by_timer: bool, n: u32, follow_up: i64, max: u32, out: &mut Vec<Expected>) {
    let (mut at, mut by_timer, mut n) = (at, by_timer, n);
    loop {
        let e = |o, a| if by_timer { vt(o, a, at) } else { v(o, a) };
        if n >= max {
            out.push(e(Outcome::Missing, Action::ManualReview));
            return;
        }
        out.push(e(Outcome::Missing, Action::Requeue));
        n += 1;
        at += follow_up;
        by_timer = true;
    }
}

/// Builds one operation's events.
#[derive(Clone)]
struct OpBuilder<'a> {
    id: String,
    entity: &'a str,
    ty: &'static str,
    t0: i64,
    step: i64,
    confirm_within_ms: i64,
}

impl OpBuilder<'_> {
    fn at(&self, k: i64) -> i64 {
        self.t0 + k * self.step
    }

    fn ev(&self, tag: &str, seq: Option<i64>, at: i64, body: Body) -> Event {
        ev_of(&self.id, self.entity, self.ty, seq, at, tag, body)
    }

    fn requested(&self, version: i64) -> Event {
        let idempotent = self.ty == SYNC;
        let body = Body::Requested(Requested {
            expected_version: Some(version),
            expected_fingerprint: None,
            idempotency_key: idempotent.then(|| format!("{}-key", self.id)),
            idempotent,
            destination: if idempotent { "crm".into() } else { "billing".into() },
            confirm_within_ms: Some(self.confirm_within_ms),
            max_attempts: Some(3),
        });
        self.ev("req", Some(1), self.at(0), body)
    }

    /// A request the probe worker can settle: an idempotency key, not
    /// idempotent, to the loadgen destination.
    fn requested_probed(&self, version: i64, key: &str) -> Event {
        let mut ev = self.requested(version);
        if let Body::Requested(r) = &mut ev.body {
            r.idempotency_key = Some(key.to_owned());
            r.idempotent = false;
            r.destination = PROBED_DESTINATION.into();
        }
        ev
    }

    fn started(&self, seq: i64, attempt: i32, worker: &str) -> Event {
        self.ev(&format!("s{seq}"), Some(seq), self.at(seq - 1), Body::Started { attempt, worker: worker.into() })
    }

    fn failed(&self, seq: i64, attempt: i32, class: ErrorClass) -> Event {
        let body = Body::AttemptFailed {
            attempt,
            error_class: class,
            error_code: if class == ErrorClass::Permanent { "HTTP_422".into() } else { "HTTP_503".into() },
            detail: "destination answered with an error".into(),
            next_attempt_at: None,
        };
        self.ev(&format!("s{seq}"), Some(seq), self.at(seq - 1), body)
    }

    /// A transient failure whose retry the worker schedules for `next`.
    fn failed_until(&self, seq: i64, attempt: i32, next: i64) -> Event {
        let mut ev = self.failed(seq, attempt, ErrorClass::Transient);
        if let Body::AttemptFailed { next_attempt_at, .. } = &mut ev.body {
            *next_attempt_at = Some(next);
        }
        ev
    }

    fn unknown(&self, seq: i64) -> Event {
        let body = Body::OutcomeUnknown { attempt: 1, detail: "read timeout after the request was sent".into() };
        self.ev(&format!("s{seq}"), Some(seq), self.at(seq - 1), body)
    }

    /// An effect seen by the worker (`seq` given) or by a query (`seq` None, at step `k`).
    fn observed(&self, seq: Option<i64>, k: i64, version: i64, remote: &str) -> Event {
        let source = if seq.is_some() { EvidenceSource::WorkerResponse } else { EvidenceSource::DestinationQuery };
        let body = Body::EffectObserved(EffectObserved {
            remote_id: Some(remote.into()),
            observed_version: Some(version),
            observed_fingerprint: None,
            source,
            evidence_ref: Some("GET /records?key=... -> 200".into()),
        });
        let tag = seq.map_or_else(|| format!("q{k}"), |s| format!("s{s}"));
        self.ev(&tag, seq, self.at(k), body)
    }

    fn absent(&self, k: i64) -> Event {
        let body = Body::EffectAbsent { source: EvidenceSource::DestinationQuery, evidence_ref: Some("query".into()) };
        self.ev(&format!("q{k}"), None, self.at(k), body)
    }

    /// Request, start, effect seen by the worker.
    fn happy(&self, version: i64) -> Vec<Event> {
        vec![self.requested(version), self.started(2, 1, "w-1"), self.observed(Some(3), 2, version, "r1")]
    }

    /// Request, a transient failure, a second attempt that succeeds.
    fn retried(&self, version: i64) -> Vec<Event> {
        vec![
            self.requested(version),
            self.started(2, 1, "w-1"),
            self.failed(3, 1, ErrorClass::Transient),
            self.started(4, 2, "w-2"),
            self.observed(Some(5), 4, version, "r1"),
        ]
    }

    /// Request, start, then the call timed out after sending: the outcome
    /// is unknown.
    fn timed_out(&self, version: i64) -> Vec<Event> {
        vec![self.requested(version), self.started(2, 1, "w-1"), self.unknown(3)]
    }

    fn decision(&self, k: i64, decision: Decision) -> Event {
        let body = Body::ManualDecision {
            actor: "reviewer".into(),
            decision,
            note: "checked the destination".into(),
            evidence_checked: vec!["destination record".into()],
        };
        self.ev(&format!("d{k}"), None, self.at(k), body)
    }
}

impl Generator {
    /// Encodes the events it plants whole with `codec` (the framing and
    /// schema ids the reconciler reads its input in); the default reads
    /// and writes single-object encoding.
    pub fn set_codec(&mut self, codec: crate::codec::Codec) {
        self.codec = codec;
    }

    /// A generator of the workload `opts` describes; iterate it for the
    /// records.
    pub fn new(opts: Options) -> Generator {
        let truth = GroundTruth::new(
            opts.seed,
            opts.operations,
            opts.entities,
            Assumptions {
                reorder_window_ms: opts.reorder_window_ms,
                min_retention_ms: crate::core::Policy::default().retention_ms,
                follow_up_ms: opts.policy.follow_up_ms,
                max_requeues: opts.policy.max_requeues,
            },
        );
        Generator {
            rng: Rng::new(opts.seed),
            codec: crate::codec::Codec::new().reading(opts.input),
            retired: HashSet::new(),
            extra_entities: 0,
            versions: HashMap::new(),
            next_unit: 0,
            ops_made: 0,
            pending: None,
            active: Vec::new(),
            busy_entities: HashSet::new(),
            opts,
            truth,
        }
    }

    /// Operations created so far.
    pub fn operations_made(&self) -> u64 {
        self.ops_made
    }

    /// The ground truth of everything generated so far (complete once the
    /// iterator is exhausted).
    pub fn truth(&self) -> &GroundTruth {
        &self.truth
    }

    /// The ground truth, consuming the generator (complete once it was iterated
    /// to the end).
    pub fn into_truth(self) -> GroundTruth {
        self.truth
    }

    fn pick_story(&mut self) -> Story {
        let mut u = self.rng.unit();
        for (story, rate) in self.opts.faults.table() {
            if u < rate {
                return story;
            }
            u -= rate;
        }
        let total: u32 = CLEAN.iter().map(|(_, w)| w).sum();
        let mut w = self.rng.below(total as u64) as u32;
        for (story, weight) in CLEAN {
            if w < weight {
                return story;
            }
            w -= weight;
        }
        Story::Happy
    }

    /// The next unit of the workload, or None once enough operations exist.
    fn build_unit(&mut self) -> Option<Unit> {
        if self.ops_made >= self.opts.operations {
            return None;
        }
        let n = self.next_unit;
        self.next_unit += 1;
        let mut story = self.pick_story();
        if matches!(story, Story::StaleVersion | Story::VersionBump) && self.ops_made + 2 > self.opts.operations {
            story = Story::Happy;
        }
        *self.truth.stories.entry(story.name().to_owned()).or_default() += 1;
        let t0 = self.opts.start_ms + (n as i64).saturating_mul(self.opts.unit_spacing_us) / 1000;
        let mut unit = Unit { records: VecDeque::new(), entity: None, due_ms: t0 };
        if story == Story::Garbage {
            self.garbage(n, t0, &mut unit);
            return Some(unit);
        }
        // Spread units over the entities; the same entity comes back every
        // `entities` units, unless an earlier unit retired it.
        let e = self.entity_for(n);
        if story.ends_open() {
            self.retired.insert(e);
        }
        unit.entity = Some(e);
        let entity = format!("ent-{e}");
        let op_id = format!("s{}-op-{n}", self.opts.seed);
        let ty = if matches!(story, Story::SilentNotIdempotent) || (story == Story::MissingConfirmation && n % 2 == 1) {
            INVOICE
        } else {
            SYNC
        };
        let b = OpBuilder {
            id: op_id.clone(),
            entity: &entity,
            ty,
            t0,
            step: self.opts.step_ms,
            confirm_within_ms: self.opts.confirm_within_ms,
        };
        let deadline = t0 + self.opts.confirm_within_ms;
        let (version, confirmed) = {
            let slot = self.versions.entry(e).or_default();
            slot.0 += 1;
            (slot.0, slot.1)
        };
        let follow_up = self.opts.policy.follow_up(ty, self.opts.confirm_within_ms);
        let max_requeues = self.opts.policy.max_requeues(ty);
        // The highest version confirmed for the entity afterwards.
        let mut confirms: Option<i64> = None;
        let mut evs: Vec<Event>;
        let mut expected: Vec<Expected> = Vec::new();
        let mut timer_due = None;
        use Action as A;
        use Outcome as O;
        match story {
            Story::Happy => {
                evs = b.happy(version);
                expected.push(v(O::Correct, A::None));
                confirms = Some(version);
            }
            Story::RetryThenSuccess => {
                evs = b.retried(version);
                expected.push(v(O::Correct, A::None));
                confirms = Some(version);
            }
            Story::TimeoutThenFound => {
                evs = b.timed_out(version);
                evs.push(b.observed(None, 3, version, "r1"));
                expected.push(v(O::Correct, A::None));
                confirms = Some(version);
            }
            Story::TimeoutAbsentRetried => {
                // Nothing found and the operation is idempotent: requeue;
                // the retry then succeeds.
                evs = b.timed_out(version);
                evs.extend([b.absent(3), b.started(4, 2, "w-2"), b.observed(Some(5), 4, version, "r1")]);
                expected.extend([v(O::Missing, A::Requeue), v(O::Correct, A::None)]);
                confirms = Some(version);
            }
            Story::PermanentFailure => {
                evs = vec![b.requested(version), b.started(2, 1, "w-1"), b.failed(3, 1, ErrorClass::Permanent)];
                expected.push(v(O::Missing, A::ManualReview));
            }
            Story::RetriesExhausted => {
                evs = vec![b.requested(version)];
                for attempt in 1..=3 {
                    let s = 2 * attempt as i64;
                    evs.push(b.started(s, attempt, "w-1"));
                    evs.push(b.failed(s + 1, attempt, ErrorClass::Transient));
                }
                expected.push(v(O::Missing, A::ManualReview));
            }
            Story::NeverStarted => {
                evs = vec![b.requested(version)];
                requeues_unanswered(deadline, true, 0, follow_up, max_requeues, &mut expected);
            }
            Story::SilentIdempotent => {
                evs = vec![b.requested(version), b.started(2, 1, "w-1")];
                requeues_unanswered(deadline, true, 0, follow_up, max_requeues, &mut expected);
            }
            Story::SilentNotIdempotent => {
                evs = vec![b.requested(version), b.started(2, 1, "w-1")];
                expected.push(vt(O::Ambiguous, A::ManualReview, deadline));
            }
            Story::MissingConfirmation => {
                evs = b.timed_out(version);
                if ty == SYNC {
                    // With an idempotency key the destination can be
                    // probed; nobody answers, so a person must decide.
                    expected.push(vt(O::Ambiguous, A::Probe, deadline));
                    expected.push(vt(O::Ambiguous, A::ManualReview, deadline + follow_up));
                } else {
                    expected.push(vt(O::Ambiguous, A::ManualReview, deadline));
                }
            }
            Story::RetryScheduledLate => {
                // The retry is scheduled two windows ahead and never comes:
                // not overdue before it has had its own window.
                let next = t0 + 2 * self.opts.confirm_within_ms;
                evs = vec![b.requested(version), b.started(2, 1, "w-1"), b.failed_until(3, 1, next)];
                let due = next + self.opts.confirm_within_ms;
                requeues_unanswered(due, true, 0, follow_up, max_requeues, &mut expected);
            }
            Story::RequeueNotPickedUp => {
                // The query finds nothing: requeue at once; nobody picks it up.
                evs = b.timed_out(version);
                evs.push(b.absent(3));
                requeues_unanswered(b.at(3), false, 0, follow_up, max_requeues, &mut expected);
            }
            Story::RequeuePickedUpThenLost => {
                // The requeue is picked up (a new window from the new
                // attempt), but that attempt is never confirmed either: the
                // requeues are counted in all.
                evs = b.timed_out(version);
                let restart = b.started(4, 2, "w-2");
                let due = restart.occurred_at + self.opts.confirm_within_ms;
                evs.extend([b.absent(3), restart]);
                if max_requeues == 0 {
                    // Never requeued: straight to review, where a start is invalid.
                    expected.push(v(O::Missing, A::ManualReview));
                    self.truth.expect_anomaly(AnomalyKind::InvalidTransition, false);
                } else {
                    expected.push(v(O::Missing, A::Requeue));
                    requeues_unanswered(due, true, 1, follow_up, max_requeues, &mut expected);
                }
            }
            Story::Probed => {
                // A timeout after sending, settled by the probe worker: the
                // same version confirms, another goes to review, nothing
                // found on an operation that is not idempotent goes to
                // review too (a requeue could duplicate it).
                let key = format!("{op_id}-key");
                evs = vec![b.requested_probed(version, &key), b.started(2, 1, "w-1"), b.unknown(3)];
                expected.push(vt(O::Ambiguous, A::Probe, deadline));
                let remote_id = format!("{op_id}-r");
                match self.rng.below(4) {
                    0 | 1 => {
                        self.truth.destination.insert(key, HeldEffect { remote_id, version });
                        expected.push(v(O::Correct, A::None));
                        confirms = Some(version);
                    }
                    2 => {
                        self.truth.destination.insert(key, HeldEffect { remote_id, version: version + 1 });
                        expected.push(v(O::Divergent, A::ManualReview));
                    }
                    _ => expected.push(v(O::Missing, A::ManualReview)),
                }
            }
            Story::DuplicateDelivery => {
                evs = b.happy(version);
                let i = self.rng.below(3) as usize;
                let at = i + 1 + self.rng.below((3 - i) as u64) as usize;
                let copy = evs[i].clone();
                evs.insert(at, copy);
                expected.push(v(O::Correct, A::None));
                self.truth.expect_anomaly(AnomalyKind::DuplicateDelivery, false);
                confirms = Some(version);
            }
            Story::DuplicateEmission => {
                evs = b.happy(version);
                let mut again = evs[1].clone();
                again.event_id.push_str("-again");
                let at = 2 + self.rng.below(2) as usize;
                evs.insert(at, again);
                expected.push(v(O::Correct, A::None));
                self.truth.expect_anomaly(AnomalyKind::DuplicateEmission, false);
                confirms = Some(version);
            }
            Story::Reorder => {
                evs = b.retried(version);
                // Swap revisions k and k+1 (k >= 2): k+1 is held, then k fills the gap.
                let k = 1 + self.rng.below(3) as usize;
                evs.swap(k, k + 1);
                expected.push(v(O::Correct, A::None));
                self.truth.expect_anomaly(AnomalyKind::OutOfOrder, false);
                confirms = Some(version);
            }
            Story::ReorderBeyondWindow => {
                // Revision 2 is delayed; revision 4 happens after revision
                // 3's reorder window closed, so the gap is given up (SEQ_GAP)
                // and revision 2, when it finally comes, is late.
                let gap = self.opts.reorder_window_ms + 1000;
                let mut s4 = b.started(4, 2, "w-2");
                s4.occurred_at = b.at(2) + gap;
                let mut o5 = b.observed(Some(5), 4, version, "r1");
                o5.occurred_at = b.at(2) + gap + b.step;
                evs = vec![b.requested(version), b.failed(3, 1, ErrorClass::Transient), s4, b.started(2, 1, "w-1"), o5];
                expected.push(v(O::Correct, A::None));
                for k in [AnomalyKind::OutOfOrder, AnomalyKind::SeqGap, AnomalyKind::LateEvent] {
                    self.truth.expect_anomaly(k, false);
                }
                confirms = Some(version);
            }
            Story::Conflict => {
                // Two workers claim revision 2: review, ambiguous; sometimes a
                // reviewer then confirms the effect.
                let mut other = b.started(2, 1, "w-2");
                other.event_id.push_str("-other");
                evs = vec![b.requested(version), b.started(2, 1, "w-1"), other];
                expected.push(v(O::Ambiguous, A::ManualReview));
                self.truth.expect_anomaly(AnomalyKind::ConflictingTransition, false);
                if self.rng.chance(0.5) {
                    evs.push(b.decision(3, Decision::Confirm));
                    expected.push(v(O::Correct, A::None));
                    confirms = Some(version);
                }
            }
            Story::Divergent => {
                evs = b.timed_out(version);
                evs.push(b.observed(None, 3, version + 1, "r1"));
                expected.push(v(O::Divergent, A::ManualReview));
                if self.rng.chance(0.5) {
                    evs.push(b.decision(4, Decision::Close));
                    expected.push(v(O::NotApplicable, A::Close));
                }
            }
            Story::DuplicateEffect => {
                evs = b.happy(version);
                evs.push(b.observed(None, 3, version, "r2"));
                expected.extend([v(O::Correct, A::None), v(O::DuplicateEffect, A::Compensate)]);
                if self.rng.chance(0.5) {
                    let body = Body::Compensated { actor: "reviewer".into(), reason: "second copy removed".into() };
                    evs.push(b.ev("s4", Some(4), b.at(4), body));
                }
                confirms = Some(version);
            }
            Story::Cancellation => {
                let body = Body::Cancelled { reason: "entity deleted".into() };
                evs = vec![b.requested(version), b.ev("s2", Some(2), b.at(1), body)];
                expected.push(v(O::NotApplicable, A::Close));
            }
            Story::InvalidTransition => {
                let body = Body::Cancelled { reason: "entity deleted".into() };
                evs = vec![b.requested(version), b.ev("s2", Some(2), b.at(1), body), b.started(3, 1, "w-1")];
                expected.push(v(O::NotApplicable, A::Close));
                self.truth.expect_anomaly(AnomalyKind::InvalidTransition, false);
            }
            Story::StaleVersion => {
                // Two operations on one entity: the newer version is
                // requested while the older one is in flight (which closes
                // the older one: superseded), confirmed, and then the older
                // one's effect shows up after all.
                let newer = OpBuilder { id: format!("{op_id}-b"), ..b.clone() };
                let newer_version = self.bump_version(e);
                evs = vec![
                    b.requested(version),
                    b.started(2, 1, "w-1"),
                    newer.requested(newer_version),
                    newer.started(2, 1, "w-2"),
                    newer.observed(Some(3), 2, newer_version, "r2"),
                    b.observed(Some(3), 3, version, "r1"),
                ];
                self.truth.expect_verdicts(&newer.id, &[v(O::Correct, A::None)], self.opts.keep_verdicts);
                self.ops_made += 1;
                expected.push(v(O::NotApplicable, A::Close));
                // The older effect reached the destination after the newer
                // one was confirmed (flagged), for an operation already
                // closed (invalid).
                self.truth.expect_anomaly(AnomalyKind::StaleVersion, false);
                self.truth.expect_anomaly(AnomalyKind::InvalidTransition, false);
                confirms = Some(newer_version);
            }
            Story::VersionBump => {
                // A version change while an operation is pending.
                // The older one is superseded wherever it stood (pending,
                // processing or awaiting confirmation) and never requeued;
                // the newer one completes.
                let newer = OpBuilder { id: format!("{op_id}-b"), ..b.clone() };
                let newer_version = self.bump_version(e);
                evs = match self.rng.below(3) {
                    0 => vec![b.requested(version)],
                    1 => vec![b.requested(version), b.started(2, 1, "w-1")],
                    _ => b.timed_out(version),
                };
                evs.extend(newer.happy(newer_version));
                self.truth.expect_verdicts(&newer.id, &[v(O::Correct, A::None)], self.opts.keep_verdicts);
                self.ops_made += 1;
                expected.push(v(O::NotApplicable, A::Close));
                confirms = Some(newer_version);
            }
            Story::Orphan => {
                // No request ever comes: both revisions are held (ahead of
                // the expected revision 1), then recorded as orphans when
                // their window ends (a timer).
                evs = vec![b.started(2, 1, "w-1"), b.unknown(3)];
                for _ in 0..2 {
                    self.truth.expect_anomaly(AnomalyKind::OutOfOrder, false);
                    self.truth.expect_anomaly(AnomalyKind::OrphanEvent, true);
                }
                timer_due = Some(b.at(2) + self.opts.reorder_window_ms);
            }
            Story::Garbage => unreachable!("handled above"),
        }
        if let Some(c) = confirms {
            let slot = self.versions.entry(e).or_default();
            debug_assert!(confirmed.is_none_or(|old| old < c), "entity versions only grow");
            slot.1 = Some(slot.1.map_or(c, |old| old.max(c)));
        }
        if let Some(t) = timer_due {
            self.truth.latest_due_ms = self.truth.latest_due_ms.max(t);
        }
        if story != Story::Orphan {
            self.truth.expect_verdicts(&op_id, &expected, self.opts.keep_verdicts);
        }
        self.ops_made += 1;
        self.truth.events += evs.len() as u64;
        self.truth.records += evs.len() as u64;
        unit.records.extend(evs.into_iter().map(InputRecord::Event));
        Some(unit)
    }

    /// The entity of unit `n`: spread over the entities (the same one comes
    /// back every `entities` units); where that one is retired, a new
    /// entity beyond them.
    fn entity_for(&mut self, n: u64) -> u64 {
        let entities = self.opts.entities.max(1);
        let e = n.wrapping_mul(0x9e37_79b9) % entities;
        if !self.retired.contains(&e) {
            return e;
        }
        self.extra_entities += 1;
        entities + self.extra_entities - 1
    }

    /// Hands out the entity's next version.
    fn bump_version(&mut self, e: u64) -> i64 {
        let slot = self.versions.entry(e).or_default();
        slot.0 += 1;
        slot.0
    }

    /// One record the reconciler must dead-letter, of a random kind.
    fn garbage(&mut self, n: u64, t0: i64, unit: &mut Unit) {
        let key = format!("junk-{n}").into_bytes();
        let valid = |entity: &str| {
            ev_of(
                &format!("s{}-junk-{n}", self.opts.seed),
                entity,
                SYNC,
                Some(1),
                t0,
                "e",
                Body::Cancelled { reason: "x".into() },
            )
        };
        // Where the input is read in the Confluent framing, a first byte 00
        // names a schema id (one no registry has), and C3 is no framing.
        let confluent = self.opts.input != crate::codec::InputFraming::SingleObject;
        let single_object = self.opts.input != crate::codec::InputFraming::Confluent;
        let (value, class) = match self.rng.below(6) {
            0 => {
                (Some(b"\x00\x01 not avro at all".to_vec()), if confluent { "unknown_schema_id" } else { "bad_magic" })
            }
            1 => (None, "null_value"),
            2 => (Some(br#"{"event_id":"json-1","body":"Requested"}"#.to_vec()), "bad_magic"),
            3 => {
                // A valid event under another entity's key.
                let e = valid("someone-else");
                (Some(self.codec.encode_event(&e).expect("valid events encode")), "key_mismatch")
            }
            4 => {
                let mut bytes = vec![0xC3, 0x01];
                bytes.extend_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
                bytes.extend_from_slice(b"\x02xx");
                (Some(bytes), if single_object { "unknown_fingerprint" } else { "bad_magic" })
            }
            _ => {
                let e = valid(&String::from_utf8_lossy(&key));
                let bytes = self.codec.encode_event(&e).expect("valid events encode");
                (Some(bytes[..bytes.len() / 2].to_vec()), "truncated")
            }
        };
        self.truth.expect_dead_letter(class);
        self.truth.records += 1;
        unit.records.push_back(InputRecord::Raw { key, value, class });
    }

    /// Admits the next unit if its entity is free.
    fn admit(&mut self) {
        if self.pending.is_none() {
            self.pending = self.build_unit();
        }
        let Some(u) = &self.pending else { return };
        if let Some(e) = u.entity {
            if self.busy_entities.contains(&e) {
                return;
            }
            self.busy_entities.insert(e);
        }
        let u = self.pending.take().expect("checked above");
        self.active.push(u);
    }
}

impl Iterator for Generator {
    type Item = Planned;

    fn next(&mut self) -> Option<Planned> {
        while self.active.len() < self.opts.interleave.max(1) {
            let before = self.active.len();
            self.admit();
            if self.active.len() == before {
                break;
            }
        }
        if self.active.is_empty() {
            return None;
        }
        let i = self.rng.below(self.active.len() as u64) as usize;
        let unit = &mut self.active[i];
        let record = unit.records.pop_front().expect("active units are not empty");
        let due_ms = unit.due_ms;
        if unit.records.is_empty() {
            let done = self.active.swap_remove(i);
            if let Some(e) = done.entity {
                self.busy_entities.remove(&e);
            }
        }
        Some(Planned { due_ms, record })
    }
}
