//! Per-operation state and the state machine of SPEC §4.
//!
//! `transition` is called only for events that detection admitted (in seq
//! order, not duplicates); it moves the operation between seed 000's states
//! and emits the verdicts that the transition itself decides.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::event::{Body, Decision, EffectObserved, ErrorClass, Event, Requested, SourcePos};
use super::output::{Action, AnomalyKind, ManualDecisionRecord, Outcome, Output, Status};
use super::policy::Policy;
use super::verdict::{self, VerdictDraft};

/// The expectation, fixed when the operation is requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestInfo {
    pub requested_at: i64,
    pub expected_version: Option<i64>,
    pub expected_fingerprint: Option<String>,
    pub idempotency_key: Option<String>,
    pub idempotent: bool,
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
    pub event_id: String,
    pub body_hash: u64,
}

/// An event waiting in the reorder buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldEvent {
    pub event: Event,
    pub pos: SourcePos,
    /// Event time after which the gap in front of it is given up.
    pub hold_until: i64,
}

/// The latest verdict, kept for the review queue and `explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastVerdict {
    pub verdict_id: String,
    pub outcome: Outcome,
    pub action: Action,
    pub reason: String,
    pub decided_at: i64,
}

/// Everything the reconciler knows about one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationState {
    pub operation_id: String,
    pub entity_id: String,
    pub operation_type: String,
    pub status: Status,
    pub request: Option<RequestInfo>,
    /// Confirmation deadline (event time); moves when a new attempt starts
    /// after an overdue verdict, or after a manual requeue.
    pub deadline_at: Option<i64>,
    /// The current deadline has produced its overdue verdict.
    pub overdue_judged: bool,
    /// The next seq that may be applied.
    pub next_seq: i64,
    pub applied_seqs: BTreeMap<i64, SeqRecord>,
    /// Every event id taken in (applied, held or flagged): layer-1 dedup.
    pub seen_event_ids: BTreeSet<String>,
    /// The reorder buffer, in arrival order.
    pub held: Vec<HeldEvent>,
    /// Events flagged ORPHAN_EVENT, kept (bounded) for a request that
    /// arrives after the window: applied then, in seq order.
    pub orphaned: Vec<HeldEvent>,
    /// An attempt was seen (Started, AttemptFailed or OutcomeUnknown):
    /// "never started" must not hang on attempt numbering.
    pub started: bool,
    pub attempts: i32,
    pub remote_ids: Vec<String>,
    pub observed_version: Option<i64>,
    pub observed_fingerprint: Option<String>,
    pub last_event_at: i64,
    /// Event time the operation became terminal (starts retention).
    pub terminal_at: Option<i64>,
    /// Event time the operation entered manual review.
    pub review_since: Option<i64>,
    pub events_applied: i64,
    pub duplicates_seen: i64,
    pub out_of_order_seen: i64,
    /// Verdicts issued so far; part of each verdict's deterministic id.
    pub verdict_count: u32,
    pub last_verdict: Option<LastVerdict>,
    pub manual: Option<ManualDecisionRecord>,
    /// The timer currently indexed for this operation (see `deadline`).
    pub timer_at: Option<i64>,
}

/// Facts about an entity shared by all its operations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityState {
    /// Highest version confirmed for the entity by any operation.
    pub confirmed_version: Option<i64>,
}

/// Why a manual decision cannot be applied to an operation. The operator
/// tools check a decision with [`OperationState::check_decision`] before
/// publishing it, and the core refuses the same decisions when it consumes
/// them: one rule, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionRefusal {
    /// Decisions apply only to operations waiting in manual review.
    NotInReview { status: Status },
    /// SPEC §6: COMPENSATE belongs to a DUPLICATE_EFFECT verdict only; other
    /// wrong effects are undone by a `Compensated` business event.
    CompensateWithoutDuplicate { last: Option<Outcome> },
}

impl std::fmt::Display for DecisionRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecisionRefusal::NotInReview { status } => write!(
                f,
                "the operation is in state {}; manual decisions apply only to operations in MANUAL_REVIEW",
                status.as_str()
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
    /// Whether `decision` may be applied now (see [`DecisionRefusal`]).
    pub fn check_decision(&self, decision: Decision) -> Result<(), DecisionRefusal> {
        if self.status != Status::ManualReview {
            return Err(DecisionRefusal::NotInReview { status: self.status });
        }
        let last = self.last_verdict.as_ref().map(|v| v.outcome);
        if decision == Decision::Compensate && last != Some(Outcome::DuplicateEffect) {
            return Err(DecisionRefusal::CompensateWithoutDuplicate { last });
        }
        Ok(())
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
        self.status = status;
    }

    /// Whether the operation still waits for evidence (can go overdue).
    pub fn awaits_evidence(&self) -> bool {
        self.status.awaits_evidence()
    }

    fn idempotent(&self) -> bool {
        self.request.as_ref().is_some_and(|r| r.idempotent)
    }

    fn rearm_deadline(&mut self, from: i64) {
        if let Some(r) = &self.request {
            self.deadline_at = Some(from.saturating_add(r.confirm_within_ms));
            self.overdue_judged = false;
        }
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
                self.attempts = self.attempts.max(*attempt);
                self.started = true;
                if self.overdue_judged {
                    self.rearm_deadline(at);
                }
                self.set_status(Status::Processing, at);
            }
            Body::AttemptFailed { attempt, error_class, error_code, .. } => {
                if !open {
                    return false;
                }
                self.attempts = self.attempts.max(*attempt);
                self.started = true;
                let max = self.request.as_ref().map_or(1, |r| r.max_attempts);
                if *error_class == ErrorClass::Transient && self.attempts < max {
                    self.set_status(Status::RetryScheduled, at);
                } else {
                    self.set_status(Status::ManualReview, at);
                    let reason = if *error_class == ErrorClass::Permanent {
                        format!("Attempt {attempt} failed permanently ({error_code}): the effect does not exist and retrying will not create it.")
                    } else {
                        format!("Attempt {attempt} failed ({error_code}) and the limit of {max} attempts is reached: the effect does not exist.")
                    };
                    self.verdict(policy, ev, pos, Outcome::Missing, Action::ManualReview, reason, out);
                }
            }
            Body::OutcomeUnknown { attempt, .. } => {
                if !open {
                    return false;
                }
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
                    self.set_status(Status::RetryScheduled, at);
                    let why = if self.idempotent() { "the operation is idempotent" } else { "it was never started" };
                    let reason = format!("A {source} found no effect; requeue is safe because {why}.");
                    self.verdict(policy, ev, pos, Outcome::Missing, Action::Requeue, reason, out);
                } else {
                    self.set_status(Status::ManualReview, at);
                    let reason = format!("A {source} found no effect, but the operation is not idempotent and was attempted: a person must decide.");
                    self.verdict(policy, ev, pos, Outcome::Missing, Action::ManualReview, reason, out);
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
                let reason = format!("Cancelled: {reason}.");
                self.verdict(policy, ev, pos, Outcome::NotApplicable, Action::Close, reason, out);
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
                if *decision == Decision::Requeue {
                    self.rearm_deadline(at);
                }
                self.set_status(new_status, at);
                let reason = format!("{actor} {what} after manual review: {note}");
                self.verdict(policy, ev, pos, outcome, action, reason, out);
                self.manual = None;
            }
            // Timers are handled by `apply` before admission; one never
            // reaches the state machine.
            Body::DeadlineReached { .. } => return false,
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
        if matches!(self.status, Status::Compensated | Status::NotApplicable | Status::Closed | Status::Unrequested) {
            return false;
        }
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
                    let reason = format!(
                        "A {source} found the effect a second time under remote id {rid} (first: {}): it exists more than once.",
                        self.remote_ids[0]
                    );
                    self.verdict(policy, ev, pos, Outcome::DuplicateEffect, Action::Compensate, reason, out);
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
            let reason = format!("A {source} found the effect with {expected} as expected.");
            self.verdict(policy, ev, pos, Outcome::Correct, Action::None, reason, out);
        } else {
            self.set_status(Status::ManualReview, at);
            let observed = describe_expectation(o.observed_version, o.observed_fingerprint.as_deref());
            let reason = format!("A {source} found the effect with {observed} where {expected} was expected: never overwritten automatically.");
            self.verdict(policy, ev, pos, Outcome::Divergent, Action::ManualReview, reason, out);
        }
        true
    }

    /// The overdue verdict of SPEC §7, when a confirmation deadline is reached.
    pub(crate) fn judge_overdue(&mut self, policy: &Policy, ev: &Event, pos: SourcePos, out: &mut Vec<Output>) {
        let at = ev.occurred_at;
        let idempotent = self.idempotent();
        let has_key = self.request.as_ref().is_some_and(|r| r.idempotency_key.is_some());
        let window = self.request.as_ref().map_or(0, |r| r.confirm_within_ms);
        let (status, outcome, action, reason) = match self.status {
            Status::Pending => (
                Status::RetryScheduled,
                Outcome::Missing,
                Action::Requeue,
                format!("Never started within {window} ms of the request: requeue is safe."),
            ),
            Status::Processing | Status::RetryScheduled if idempotent => (
                Status::RetryScheduled,
                Outcome::Missing,
                Action::Requeue,
                format!("No effect confirmed within {window} ms after {} attempt(s); the operation is idempotent, so requeue.", self.attempts),
            ),
            Status::Processing | Status::RetryScheduled => (
                Status::ManualReview,
                Outcome::Ambiguous,
                Action::ManualReview,
                format!("No effect confirmed within {window} ms after {} attempt(s), and the operation is not idempotent: a retry could duplicate it.", self.attempts),
            ),
            Status::AwaitingConfirmation if has_key => (
                Status::AwaitingConfirmation,
                Outcome::Ambiguous,
                Action::Probe,
                format!("The outcome of attempt {} is unknown after {window} ms: probe the destination with the idempotency key.", self.attempts),
            ),
            Status::AwaitingConfirmation => (
                Status::ManualReview,
                Outcome::Ambiguous,
                Action::ManualReview,
                format!("The outcome of attempt {} is unknown after {window} ms and there is no idempotency key to probe with.", self.attempts),
            ),
            _ => return,
        };
        self.overdue_judged = true;
        self.set_status(status, at);
        self.verdict(policy, ev, pos, outcome, action, reason, out);
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
        self.verdict(policy, ev, pos, Outcome::Ambiguous, Action::ManualReview, reason, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn verdict(
        &mut self,
        policy: &Policy,
        ev: &Event,
        pos: SourcePos,
        outcome: Outcome,
        action: Action,
        reason: String,
        out: &mut Vec<Output>,
    ) {
        verdict::emit(self, policy, VerdictDraft { trigger: ev, pos, outcome, action, reason }, out);
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
