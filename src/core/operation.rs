//! Per-operation state and the lifecycle's state machine.
//!
//! `transition` is called only for events that detection admitted (in seq
//! order, not duplicates); it moves the operation between the states of
//! [`Status`] and emits the verdicts that the transition itself decides.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::event::{Body, Decision, EffectObserved, ErrorClass, Event, Requested, SourcePos};
use super::output::{
    Action, AnomalyKind, Escalation, ManualDecisionRecord, Outcome, Output, RepairAction, Status, Supersession,
};
use super::policy::Policy;
use super::reason::{Reason, Template};
use super::verdict::{self, VerdictDraft};

/// The expectation, fixed when the operation is requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestInfo {
    /// Event time of the `Requested`: the confirmation window starts here.
    pub requested_at: i64,
    /// Version the effect must carry (from the `Requested` event).
    pub expected_version: Option<i64>,
    /// Fingerprint the effect must carry.
    pub expected_fingerprint: Option<String>,
    /// Key a PROBE or REQUEUE reuses; without one an unknown outcome goes to review.
    pub idempotency_key: Option<String>,
    /// Repeating the call is safe, so an overdue or absent effect may be requeued.
    pub idempotent: bool,
    /// The external system that must hold the effect; with the type, what
    /// the supersede rule compares.
    pub destination: String,
    /// Resolved confirmation window (event, type or default).
    pub confirm_within_ms: i64,
    /// Resolved attempt limit.
    pub max_attempts: i32,
}

/// What was applied at one seq: enough to tell a duplicate emission from a
/// conflicting transition later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRecord {
    /// The event that claimed the seq.
    pub event_id: String,
    /// Digest of its body: equal means a duplicate emission, different a
    /// conflicting transition.
    pub body_hash: u64,
}

/// An event waiting in the reorder buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldEvent {
    /// The event, as it arrived (already redacted).
    pub event: Event,
    /// Where it was read: its outputs name this position when it is applied.
    pub pos: SourcePos,
    /// Event time after which the gap in front of it is given up.
    pub hold_until: i64,
}

/// The latest verdict, kept for the review queue and `explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastVerdict {
    /// The verdict's deterministic id.
    pub verdict_id: String,
    /// What it found; COMPENSATE decisions require DUPLICATE_EFFECT here.
    pub outcome: Outcome,
    /// What it recommended.
    pub action: Action,
    /// Its human sentence.
    pub reason: String,
    /// Event time of its trigger.
    pub decided_at: i64,
}

/// Everything the reconciler knows about one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationState {
    /// The operation's id. Not in the state's serialized form
    /// (nor is its type): the store's key holds the id and the summary in
    /// front of the state the type (see `store::encoded::StoredOp`), and
    /// every byte of the value is paid for at every write of it.
    #[serde(skip)]
    pub operation_id: String,
    /// The entity it belongs to, fixed by its first event; an event naming
    /// another entity is flagged, never applied.
    pub entity_id: String,
    /// Its type, fixed by its first event; selects the per-type policy.
    #[serde(skip)]
    pub operation_type: String,
    /// Where it stands in the state machine.
    pub status: Status,
    /// The expectation; `None` until the `Requested` arrives.
    pub request: Option<RequestInfo>,
    /// Confirmation deadline (event time); moves when a new attempt starts
    /// after an overdue verdict, or after a manual requeue.
    pub deadline_at: Option<i64>,
    /// The confirmation deadline is spent: it produced its overdue verdict,
    /// or a machine action's follow-up took its place. New evidence of an
    /// attempt opens a new window.
    pub overdue_judged: bool,
    /// The next seq that may be applied.
    pub next_seq: i64,
    /// What claimed each applied seq: tells a duplicate emission from a
    /// conflicting transition, and names the gaps of a SEQ_GAP. Stored in
    /// a form of its own (`core::applied`: ids in 16 bytes or
    /// as the previous one's beginning and the rest).
    #[serde(with = "super::applied")]
    pub applied_seqs: BTreeMap<i64, SeqRecord>,
    /// The ids of the events taken in (held, flagged, or applied without a
    /// seq) that `applied_seqs` does not name: with those, every event id
    /// taken in, each stored once (layer-1 dedup,
    /// [`OperationState::has_taken_in`]). Each is written with the state
    /// at every batch that touches the operation, so storing the applied
    /// ones twice cost bytes in every write.
    pub seen_event_ids: BTreeSet<String>,
    /// The reorder buffer, in arrival order.
    pub held: Vec<HeldEvent>,
    /// Events flagged ORPHAN_EVENT, kept (bounded) for a request that
    /// arrives after the window: applied then, in seq order.
    pub orphaned: Vec<HeldEvent>,
    /// An attempt was seen (Started, AttemptFailed or OutcomeUnknown):
    /// "never started" must not hang on attempt numbering.
    pub started: bool,
    /// Highest attempt number seen.
    pub attempts: i32,
    /// Distinct remote ids observed, in order; a second one is a duplicate effect.
    pub remote_ids: Vec<String>,
    /// Version last observed at the destination.
    pub observed_version: Option<i64>,
    /// Fingerprint last observed at the destination.
    pub observed_fingerprint: Option<String>,
    /// Event time of the latest event that reached the state machine;
    /// retention of a finished or abandoned operation counts from it too.
    pub last_event_at: i64,
    /// Event time the operation became terminal (starts retention).
    pub terminal_at: Option<i64>,
    /// Event time the operation entered manual review.
    pub review_since: Option<i64>,
    /// Events applied so far (verdict evidence).
    pub events_applied: i64,
    /// Duplicate deliveries and emissions seen so far (verdict evidence).
    pub duplicates_seen: i64,
    /// Events that arrived ahead of their turn so far (verdict evidence).
    pub out_of_order_seen: i64,
    /// Verdicts issued so far; part of each verdict's deterministic id.
    pub verdict_count: u32,
    /// The latest verdict, for the review queue, `explain` and the
    /// COMPENSATE rule. Not in the state's serialized form: the store writes
    /// it beside the state, without the id and the reason while the
    /// operation's own timeline entry of the verdict holds them (see
    /// `store::encoded::LastVerdictRef`), so they are stored once.
    #[serde(skip)]
    pub last_verdict: Option<LastVerdict>,
    /// The manual decision being applied, attached to the verdict it
    /// produces; `None` otherwise.
    pub manual: Option<ManualDecisionRecord>,
    /// The timer currently indexed for this operation (see `deadline`).
    pub timer_at: Option<i64>,
    /// The follow-up armed by the last PROBE or REQUEUE verdict; new
    /// evidence for the operation cancels it.
    pub follow_up: Option<FollowUp>,
    /// Automatic requeues so far (REQUEUE verdicts not decided by a person).
    pub requeues: u32,
    /// The retry a worker scheduled (`AttemptFailed.next_attempt_at`) while
    /// the operation waits for it in RETRY_SCHEDULED.
    pub next_attempt_at: Option<i64>,
    /// A newer request of the same entity, type and destination replaced
    /// this operation: it was closed, or (in review) marked.
    pub superseded_by: Option<Supersession>,
}

/// What the reconciler does if no new evidence arrives for an operation
/// after a machine action was recommended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUp {
    /// Event time of the follow-up.
    pub at: i64,
    /// The action it follows up: an unanswered probe escalates to review,
    /// a requeue nobody picked up is requeued again (up to the limit).
    pub action: RepairAction,
}

/// An operation of an entity that was requested and is not terminal (open
/// or in review): what the supersede rule compares a new request with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenOperation {
    /// The open operation.
    pub operation_id: String,
    /// Its type: only operations of the same type supersede each other.
    pub operation_type: String,
    /// Its destination: only operations of the same destination supersede
    /// each other.
    pub destination: String,
    /// The version it expects: the higher version wins; `None` never
    /// supersedes nor is superseded.
    pub expected_version: Option<i64>,
}

/// Facts about an entity shared by all its operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityState {
    /// Highest version confirmed for the entity by any operation.
    pub confirmed_version: Option<i64>,
    /// Operations of the entity in the store: its facts are removed with
    /// the last of them, so the state stays bounded.
    pub operations: u32,
    /// Its requested, not yet terminal operations.
    pub open: Vec<OpenOperation>,
}

impl EntityState {
    /// Whether nothing refers to the entity any more (its facts can go).
    pub fn is_unused(&self) -> bool {
        self.operations == 0
    }

    /// Updates the entry of `op` in the open list after it changed.
    pub(crate) fn track(&mut self, op: &OperationState) {
        let req = op.request.as_ref().filter(|_| !op.status.is_terminal());
        let i = self.open.iter().position(|o| o.operation_id == op.operation_id);
        match (req, i) {
            (Some(_), Some(_)) | (None, None) => {}
            (Some(r), None) => self.open.push(OpenOperation {
                operation_id: op.operation_id.clone(),
                operation_type: op.operation_type.clone(),
                destination: r.destination.clone(),
                expected_version: r.expected_version,
            }),
            (None, Some(i)) => {
                self.open.remove(i);
            }
        }
    }

    /// Forgets an operation that left the store.
    pub(crate) fn forget(&mut self, operation_id: &str) {
        self.operations = self.operations.saturating_sub(1);
        self.open.retain(|o| o.operation_id != operation_id);
    }
}

/// Why a manual decision cannot be applied to an operation. The operator
/// tools check a decision with [`OperationState::check_decision`] before
/// publishing it, and the core refuses the same decisions when it consumes
/// them: one rule, in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionRefusal {
    /// Decisions apply only to open operations (requested, not terminal):
    /// waiting for evidence, for a machine action, or in manual review.
    NotOpen {
        /// The operation's current state.
        status: Status,
    },
    /// COMPENSATE belongs to a DUPLICATE_EFFECT verdict only; other
    /// wrong effects are undone by a `Compensated` business event.
    CompensateWithoutDuplicate {
        /// The outcome of the operation's latest verdict, if any.
        last: Option<Outcome>,
    },
    /// An operation replaced by a newer version is never requeued.
    RequeueSuperseded {
        /// The newer operation that replaced it.
        by: Supersession,
    },
}

impl std::fmt::Display for DecisionRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecisionRefusal::NotOpen { status } => write!(
                f,
                "the operation is in state {}; manual decisions apply only to open operations (requested, not yet confirmed, compensated or closed)",
                status.as_str()
            ),
            DecisionRefusal::RequeueSuperseded { by } => write!(
                f,
                "operation {} requested {} since: a superseded operation is never requeued",
                by.operation_id,
                describe_version(by.expected_version)
            ),
            DecisionRefusal::CompensateWithoutDuplicate { last } => write!(
                f,
                "COMPENSATE is allowed only after a DUPLICATE_EFFECT verdict; the last verdict is {}",
                last.map_or("none", |o| o.as_str())
            ),
        }
    }
}

impl OperationState {
    /// Whether an event with id `event_id` was taken in already: applied at
    /// a revision, or held, flagged or applied without one. The revisions
    /// are scanned (an operation has a handful; its whole state is
    /// serialized at each batch anyway).
    pub fn has_taken_in(&self, event_id: &str) -> bool {
        self.seen_event_ids.contains(event_id) || self.applied_seqs.values().any(|r| r.event_id == event_id)
    }

    /// Whether `decision` may be applied now (see [`DecisionRefusal`]).
    pub fn check_decision(&self, decision: Decision) -> Result<(), DecisionRefusal> {
        if !self.is_open() {
            return Err(DecisionRefusal::NotOpen { status: self.status });
        }
        let last = self.last_verdict.as_ref().map(|v| v.outcome);
        if decision == Decision::Compensate && last != Some(Outcome::DuplicateEffect) {
            return Err(DecisionRefusal::CompensateWithoutDuplicate { last });
        }
        if let (Decision::Requeue, Some(by)) = (decision, &self.superseded_by) {
            return Err(DecisionRefusal::RequeueSuperseded { by: by.clone() });
        }
        Ok(())
    }

    /// Requested and not terminal: waiting for evidence, for a machine
    /// action, or in manual review.
    pub fn is_open(&self) -> bool {
        self.awaits_evidence() || self.status == Status::ManualReview
    }

    /// A new, not yet requested operation, named by its first event.
    pub fn new(ev: &Event) -> Self {
        OperationState {
            operation_id: ev.operation_id.clone(),
            entity_id: ev.entity_id.clone(),
            operation_type: ev.operation_type.clone(),
            status: Status::Unrequested,
            request: None,
            deadline_at: None,
            overdue_judged: false,
            next_seq: 1,
            applied_seqs: BTreeMap::new(),
            seen_event_ids: BTreeSet::new(),
            held: Vec::new(),
            orphaned: Vec::new(),
            started: false,
            attempts: 0,
            remote_ids: Vec::new(),
            observed_version: None,
            observed_fingerprint: None,
            last_event_at: ev.occurred_at,
            terminal_at: None,
            review_since: None,
            events_applied: 0,
            duplicates_seen: 0,
            out_of_order_seen: 0,
            verdict_count: 0,
            last_verdict: None,
            manual: None,
            timer_at: None,
            follow_up: None,
            requeues: 0,
            next_attempt_at: None,
            superseded_by: None,
        }
    }

    fn set_status(&mut self, status: Status, at: i64) {
        if status == Status::ManualReview && self.status != Status::ManualReview {
            self.review_since = Some(at);
        } else if status != Status::ManualReview {
            self.review_since = None;
        }
        // Retention counts from the latest entry into a terminal state.
        if !status.is_terminal() {
            self.terminal_at = None;
        } else if !self.status.is_terminal() || self.terminal_at.is_none() {
            self.terminal_at = Some(at);
        }
        if !status.awaits_evidence() {
            // Settled or with a person: nothing for a machine to follow up.
            self.follow_up = None;
        }
        // A scheduled retry belongs to the failure that announced it
        // (`attempt_failed` sets it again after this).
        self.next_attempt_at = None;
        self.status = status;
    }

    /// Whether the operation still waits for evidence (can go overdue).
    pub fn awaits_evidence(&self) -> bool {
        self.status.awaits_evidence()
    }

    fn idempotent(&self) -> bool {
        self.request.as_ref().is_some_and(|r| r.idempotent)
    }

    /// The resolved confirmation window (0 before the request).
    fn window(&self) -> i64 {
        self.request.as_ref().map_or(0, |r| r.confirm_within_ms)
    }

    fn rearm_deadline(&mut self, from: i64) {
        if let Some(r) = &self.request {
            self.deadline_at = Some(from.saturating_add(r.confirm_within_ms));
            self.overdue_judged = false;
        }
    }

    /// New evidence of an attempt (Started, AttemptFailed, OutcomeUnknown):
    /// it answers any follow-up, and after an overdue verdict or a machine
    /// action it opens a new confirmation window from its own time.
    fn new_attempt_evidence(&mut self, at: i64) {
        self.follow_up = None;
        if self.overdue_judged {
            self.rearm_deadline(at);
        }
    }

    /// Arms the follow-up of a PROBE or REQUEUE verdict decided at `at`.
    /// The confirmation deadline has done its part: until new evidence
    /// arrives the follow-up is the operation's only timer.
    fn arm_follow_up(&mut self, policy: &Policy, action: RepairAction, at: i64) {
        let window = policy.follow_up(&self.operation_type, self.window());
        self.follow_up = Some(FollowUp { at: at.saturating_add(window), action });
        self.overdue_judged = true;
    }

    /// Applies an admitted event's body. Returns false when the body cannot
    /// follow the current state (the caller records INVALID_TRANSITION).
    pub(crate) fn transition(
        &mut self,
        policy: &Policy,
        entity: &mut EntityState,
        ev: &Event,
        pos: SourcePos,
        out: &mut Vec<Output>,
    ) -> bool {
        let at = ev.occurred_at;
        let status = self.status;
        let open = self.awaits_evidence();
        let trigger = Trigger::of(ev, pos);
        match &ev.body {
            Body::Requested(r) => {
                if status != Status::Unrequested {
                    return false;
                }
                self.request(policy, ev, r);
            }
            Body::Started { attempt, .. } => {
                if !open {
                    return false;
                }
                self.new_attempt_evidence(at);
                self.attempts = self.attempts.max(*attempt);
                self.started = true;
                self.set_status(Status::Processing, at);
            }
            Body::AttemptFailed { attempt, error_class, error_code, next_attempt_at, .. } => {
                if !open {
                    return false;
                }
                self.new_attempt_evidence(at);
                self.attempts = self.attempts.max(*attempt);
                self.started = true;
                let max = self.request.as_ref().map_or(1, |r| r.max_attempts);
                if *error_class == ErrorClass::Transient && self.attempts < max {
                    self.set_status(Status::RetryScheduled, at);
                    if let Some(next) = *next_attempt_at {
                        // Not overdue before the scheduled retry
                        // has had its own confirmation window.
                        self.next_attempt_at = Some(next);
                        let after_retry = next.saturating_add(self.window());
                        self.deadline_at = Some(self.deadline_at.map_or(after_retry, |d| d.max(after_retry)));
                    }
                } else {
                    self.set_status(Status::ManualReview, at);
                    let reason = if *error_class == ErrorClass::Permanent {
                        Reason::of(Template::FailedPermanently, &[attempt, error_code])
                    } else {
                        Reason::of(Template::FailedAtLimit, &[attempt, error_code, &max])
                    };
                    self.verdict(policy, trigger, Outcome::Missing, Action::ManualReview, reason, out);
                }
            }
            Body::OutcomeUnknown { attempt, .. } => {
                if !open {
                    return false;
                }
                self.new_attempt_evidence(at);
                self.attempts = self.attempts.max(*attempt);
                self.started = true;
                self.set_status(Status::AwaitingConfirmation, at);
            }
            Body::EffectObserved(o) => return self.effect_observed(policy, entity, ev, pos, o, out),
            Body::EffectAbsent { source, .. } => {
                if !(open || status == Status::ManualReview) {
                    return false;
                }
                let source = verdict::source_name(*source);
                if self.idempotent() || !self.started {
                    let why = if self.idempotent() { "the operation is idempotent" } else { "it was never started" };
                    let requeue = Reason::of(Template::AbsentRequeue, &[&source, &why]);
                    let escalate = |n| Reason::of(Template::AbsentExhausted, &[&source, &n]);
                    self.requeue_or_escalate(policy, trigger, requeue, escalate, out);
                } else {
                    self.set_status(Status::ManualReview, at);
                    let reason = Reason::of(Template::AbsentReview, &[&source]);
                    self.verdict(policy, trigger, Outcome::Missing, Action::ManualReview, reason, out);
                }
            }
            Body::Compensated { .. } => {
                if matches!(status, Status::Compensated | Status::NotApplicable | Status::Closed | Status::Unrequested)
                {
                    return false;
                }
                self.set_status(Status::Compensated, at);
            }
            Body::Cancelled { reason } => {
                if status.is_terminal() || status == Status::Unrequested {
                    return false;
                }
                self.set_status(Status::NotApplicable, at);
                let reason = Reason::of(Template::Cancelled, &[reason]);
                self.verdict(policy, trigger, Outcome::NotApplicable, Action::Close, reason, out);
            }
            Body::ManualDecision { actor, decision, note, evidence_checked } => {
                if self.check_decision(*decision).is_err() {
                    return false;
                }
                self.manual = Some(ManualDecisionRecord {
                    actor: actor.clone(),
                    decision: *decision,
                    note: note.clone(),
                    evidence_checked: evidence_checked.clone(),
                });
                let (new_status, outcome, action, what) = match decision {
                    Decision::Confirm => (Status::Confirmed, Outcome::Correct, Action::None, "confirmed the effect"),
                    Decision::Requeue => {
                        (Status::RetryScheduled, Outcome::Missing, Action::Requeue, "requeued the operation")
                    }
                    Decision::Compensate => (
                        Status::Compensated,
                        Outcome::DuplicateEffect,
                        Action::Compensate,
                        "decided to compensate the duplicate",
                    ),
                    Decision::Close => (Status::Closed, Outcome::NotApplicable, Action::Close, "closed the operation"),
                };
                if *decision == Decision::Confirm {
                    if let Some(v) = self.request.as_ref().and_then(|r| r.expected_version) {
                        entity.confirmed_version = entity.confirmed_version.max(Some(v));
                    }
                }
                self.set_status(new_status, at);
                if *decision == Decision::Requeue {
                    // A person's requeue is followed up like the machine's
                    // (it is not one of the automatic ones it counts).
                    self.arm_follow_up(policy, RepairAction::Requeue, at);
                }
                let reason = Reason::of(Template::Manual, &[actor, &what, note]);
                self.verdict(policy, trigger, outcome, action, reason, out);
                self.manual = None;
            }
            // Timers are handled by `apply` before admission; one never
            // reaches the state machine.
            Body::DeadlineReached { .. } => return false,
            // No evidence either way: the state stays as it is (the timeline
            // keeps the failure for explain) and the follow-up deadline the
            // PROBE verdict armed escalates the case if nothing else comes.
            // A failure that arrives after the case was settled is harmless.
            Body::ProbeFailed { .. } => return status != Status::Unrequested,
        }
        true
    }

    fn request(&mut self, policy: &Policy, ev: &Event, r: &Requested) {
        let confirm_within_ms = policy.confirm_within(&ev.operation_type, r.confirm_within_ms);
        self.request = Some(RequestInfo {
            requested_at: ev.occurred_at,
            expected_version: r.expected_version,
            expected_fingerprint: r.expected_fingerprint.clone(),
            idempotency_key: r.idempotency_key.clone(),
            idempotent: r.idempotent,
            destination: r.destination.clone(),
            confirm_within_ms,
            max_attempts: policy.max_attempts(&ev.operation_type, r.max_attempts),
        });
        self.deadline_at = Some(ev.occurred_at.saturating_add(confirm_within_ms));
        self.next_seq = self.next_seq.max(ev.seq.unwrap_or(1).saturating_add(1));
        self.set_status(Status::Pending, ev.occurred_at);
    }

    fn effect_observed(
        &mut self,
        policy: &Policy,
        entity: &mut EntityState,
        ev: &Event,
        pos: SourcePos,
        o: &EffectObserved,
        out: &mut Vec<Output>,
    ) -> bool {
        let at = ev.occurred_at;
        // An older version reaching the destination after a newer one was
        // confirmed is worth knowing whatever became of this operation
        // (a superseded one included): the destination may now hold it.
        if let (Some(v), Some(c)) = (o.observed_version, entity.confirmed_version) {
            if v < c {
                let detail = format!(
                    "Effect for version {v} observed, but version {c} is already confirmed for entity {}.",
                    self.entity_id
                );
                out.push(Output::Anomaly(verdict::anomaly(
                    AnomalyKind::StaleVersion,
                    self,
                    ev,
                    pos,
                    detail,
                    Vec::new(),
                )));
            }
        }
        if matches!(self.status, Status::Compensated | Status::NotApplicable | Status::Closed | Status::Unrequested) {
            return false;
        }
        let trigger = Trigger::of(ev, pos);
        let source = verdict::source_name(o.source);
        let new_remote = o.remote_id.as_ref().filter(|rid| !self.remote_ids.contains(rid));
        if self.status == Status::Confirmed && new_remote.is_none() {
            // A repeated observation of a confirmed effect proves nothing
            // new, and must not overwrite the evidence that confirmed it.
            return true;
        }
        if o.observed_version.is_some() {
            self.observed_version = o.observed_version;
        }
        if o.observed_fingerprint.is_some() {
            self.observed_fingerprint = o.observed_fingerprint.clone();
        }
        if let Some(rid) = &o.remote_id {
            if !self.remote_ids.contains(rid) {
                self.remote_ids.push(rid.clone());
                if self.remote_ids.len() > 1 {
                    self.set_status(Status::ManualReview, at);
                    let reason = Reason::of(Template::DuplicateEffect, &[&source, rid, &self.remote_ids[0]]);
                    self.verdict(policy, trigger, Outcome::DuplicateEffect, Action::Compensate, reason, out);
                    return true;
                }
            }
        }
        if self.remote_ids.len() > 1 {
            // A known duplicate effect waits for its compensation or a
            // person; seeing one of its copies again does not settle it.
            return true;
        }
        let req = self.request.as_ref().expect("requested: status is not Unrequested");
        let version_ok = match (req.expected_version, o.observed_version) {
            (Some(e), Some(v)) => e == v,
            (Some(_), None) => req.expected_fingerprint.is_some(),
            (None, _) => true,
        };
        let fingerprint_ok = match (&req.expected_fingerprint, &o.observed_fingerprint) {
            (Some(e), Some(f)) => e == f,
            (Some(_), None) => req.expected_version.is_some() && o.observed_version.is_some(),
            (None, _) => true,
        };
        let expected = describe_expectation(req.expected_version, req.expected_fingerprint.as_deref());
        if version_ok && fingerprint_ok {
            let confirmed = o.observed_version.or(req.expected_version);
            entity.confirmed_version = entity.confirmed_version.max(confirmed);
            self.set_status(Status::Confirmed, at);
            let reason = Reason::of(Template::AsExpected, &[&source, &expected]);
            self.verdict(policy, trigger, Outcome::Correct, Action::None, reason, out);
        } else {
            self.set_status(Status::ManualReview, at);
            let observed = describe_expectation(o.observed_version, o.observed_fingerprint.as_deref());
            let reason = Reason::of(Template::Divergent, &[&source, &observed, &expected]);
            self.verdict(policy, trigger, Outcome::Divergent, Action::ManualReview, reason, out);
        }
        true
    }

    /// A MISSING / REQUEUE verdict (`requeue` says why), unless the
    /// operation was requeued automatically `max_requeues` times in all
    /// already: then MISSING / MANUAL_REVIEW (`escalate` of that count says
    /// why).
    fn requeue_or_escalate(
        &mut self,
        policy: &Policy,
        trigger: Trigger<'_>,
        requeue: Reason,
        escalate: impl FnOnce(u32) -> Reason,
        out: &mut Vec<Output>,
    ) {
        let at = trigger.at;
        if self.requeues < policy.max_requeues(&self.operation_type) {
            self.requeues += 1;
            self.set_status(Status::RetryScheduled, at);
            self.arm_follow_up(policy, RepairAction::Requeue, at);
            self.verdict(policy, trigger, Outcome::Missing, Action::Requeue, requeue, out);
        } else {
            self.overdue_judged = true;
            self.set_status(Status::ManualReview, at);
            let reason = escalate(self.requeues);
            let draft = VerdictDraft::new(trigger, Outcome::Missing, Action::ManualReview, reason)
                .escalated(Escalation::RequeuesExhausted);
            verdict::emit(self, policy, draft, out);
        }
    }

    /// The overdue verdict, when a confirmation deadline is reached.
    pub(crate) fn judge_overdue(&mut self, policy: &Policy, ev: &Event, pos: SourcePos, out: &mut Vec<Output>) {
        let at = ev.occurred_at;
        let trigger = Trigger::of(ev, pos);
        let idempotent = self.idempotent();
        let has_key = self.request.as_ref().is_some_and(|r| r.idempotency_key.is_some());
        let window = self.window();
        let attempts = self.attempts;
        self.overdue_judged = true;
        match self.status {
            Status::Pending => self.requeue_or_escalate(
                policy,
                trigger,
                Reason::of(Template::NeverStarted, &[&window]),
                |n| Reason::of(Template::NeverStartedExhausted, &[&window, &n]),
                out,
            ),
            Status::Processing | Status::RetryScheduled if idempotent => self.requeue_or_escalate(
                policy,
                trigger,
                Reason::of(Template::NoEffectRequeue, &[&window, &attempts]),
                |n| Reason::of(Template::NoEffectExhausted, &[&window, &attempts, &n]),
                out,
            ),
            Status::Processing | Status::RetryScheduled => {
                self.set_status(Status::ManualReview, at);
                let reason = Reason::of(Template::NoEffectReview, &[&window, &attempts]);
                self.verdict(policy, trigger, Outcome::Ambiguous, Action::ManualReview, reason, out);
            }
            Status::AwaitingConfirmation if has_key => {
                self.set_status(Status::AwaitingConfirmation, at);
                self.arm_follow_up(policy, RepairAction::Probe, at);
                let reason = Reason::of(Template::UnknownProbe, &[&attempts, &window]);
                self.verdict(policy, trigger, Outcome::Ambiguous, Action::Probe, reason, out);
            }
            Status::AwaitingConfirmation => {
                self.set_status(Status::ManualReview, at);
                let reason = Reason::of(Template::UnknownNoKey, &[&attempts, &window]);
                self.verdict(policy, trigger, Outcome::Ambiguous, Action::ManualReview, reason, out);
            }
            _ => {}
        }
    }

    /// A follow-up came due with no new evidence since the PROBE or REQUEUE
    /// verdict that armed it: an unanswered probe goes to a
    /// person; a requeue nobody picked up is requeued again, up to the limit.
    pub(crate) fn follow_up_due(&mut self, policy: &Policy, ev: &Event, pos: SourcePos, out: &mut Vec<Output>) {
        let Some(f) = self.follow_up.take() else { return };
        let trigger = Trigger::of(ev, pos);
        let window = policy.follow_up(&self.operation_type, self.window());
        match f.action {
            RepairAction::Probe => {
                self.set_status(Status::ManualReview, trigger.at);
                let reason = Reason::of(Template::ProbeUnanswered, &[&window]);
                let draft = VerdictDraft::new(trigger, Outcome::Ambiguous, Action::ManualReview, reason)
                    .escalated(Escalation::ProbeUnanswered);
                verdict::emit(self, policy, draft, out);
            }
            RepairAction::Requeue => self.requeue_or_escalate(
                policy,
                trigger,
                Reason::of(Template::RequeueAgain, &[&window]),
                |n| Reason::of(Template::RequeueExhausted, &[&n, &window]),
                out,
            ),
        }
    }

    /// Supersede: a newer request of the same entity, operation type and
    /// destination (`by`, triggered by its Requested) replaced this
    /// operation. Open, it is closed NOT_APPLICABLE / CLOSE and never
    /// requeued; in review it stays there, marked. Returns whether the
    /// operation changed.
    pub(crate) fn supersede(
        &mut self,
        policy: &Policy,
        by: &Supersession,
        trigger: Trigger<'_>,
        out: &mut Vec<Output>,
    ) -> bool {
        if self.status == Status::ManualReview {
            if self.superseded_by.is_some() {
                return false;
            }
            self.superseded_by = Some(by.clone());
            return true;
        }
        if !self.awaits_evidence() {
            return false;
        }
        self.superseded_by = Some(by.clone());
        self.set_status(Status::NotApplicable, trigger.at);
        let mine = self.request.as_ref().and_then(|r| r.expected_version);
        let reason = Reason::of(
            Template::Superseded,
            &[&by.operation_id, &describe_version(by.expected_version), &describe_version(mine)],
        );
        self.verdict(policy, trigger, Outcome::NotApplicable, Action::Close, reason, out);
        true
    }

    /// Marks the operation for review after a conflicting transition.
    pub(crate) fn conflict(
        &mut self,
        policy: &Policy,
        ev: &Event,
        pos: SourcePos,
        reason: String,
        out: &mut Vec<Output>,
    ) {
        if self.status.is_terminal() || self.status == Status::Unrequested {
            return;
        }
        self.set_status(Status::ManualReview, ev.occurred_at);
        self.verdict(policy, Trigger::of(ev, pos), Outcome::Ambiguous, Action::ManualReview, Reason::text(reason), out);
    }

    fn verdict(
        &mut self,
        policy: &Policy,
        trigger: Trigger<'_>,
        outcome: Outcome,
        action: Action,
        reason: Reason,
        out: &mut Vec<Output>,
    ) {
        verdict::emit(self, policy, VerdictDraft::new(trigger, outcome, action, reason), out);
    }
}

/// What decided a verdict: an event (its id and time) at a log position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trigger<'a> {
    pub event_id: &'a str,
    pub at: i64,
    pub pos: SourcePos,
}

impl<'a> Trigger<'a> {
    pub fn of(ev: &'a Event, pos: SourcePos) -> Trigger<'a> {
        Trigger { event_id: &ev.event_id, at: ev.occurred_at, pos }
    }
}

fn describe_expectation(version: Option<i64>, fingerprint: Option<&str>) -> String {
    match (version, fingerprint) {
        (Some(v), Some(f)) => format!("version {v} and fingerprint {f}"),
        (Some(v), None) => format!("version {v}"),
        (None, Some(f)) => format!("fingerprint {f}"),
        (None, None) => "no version or fingerprint".to_owned(),
    }
}

fn describe_version(version: Option<i64>) -> String {
    version.map_or_else(|| "no version".to_owned(), |v| format!("version {v}"))
}
