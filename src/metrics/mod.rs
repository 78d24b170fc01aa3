//! Prometheus metrics: one registry, one typed method per fact,
//! so that no metric name or label set is spelled anywhere but here.
//!
//! Two kinds of metric live here:
//! - counters and histograms of what this process did (events by result,
//!   verdicts, anomalies, dead letters, batch latency, ...), incremented by
//!   the pipeline as it goes; they start at zero with each process, as
//!   Prometheus counters do;
//! - gauges that describe the *state* (operations by state, oldest
//!   unconfirmed operation, open reviews, consumer lag). Those are derived
//!   from the store and the broker by the pipeline's state sampler
//!   ([`crate::pipeline::sampler`]), never counted incrementally, so they
//!   are right after a restart or a rebalance too.
//!
//! This module is only the typed registry: nothing here reads the store or
//! the broker.
//!
//! Every label is bounded: outcomes, actions, kinds, states, error classes
//! and escalation reasons are closed enums; operation types are the
//! configured ones plus the first `max_operation_types` others seen, then
//! `other`; error codes (free text from the producers) are the first
//! [`MAX_ERROR_CODES`] seen, then `other`; partitions are the input topic's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::core::event::ErrorClass;

mod probe;
pub mod reference;
mod relay;
mod restore;
use crate::core::{
    Action, AnomalyKind, Authenticity, Disposition, Escalation, OperationState, Outcome, Output, RepairAction, Status,
};
pub use probe::{ProbeMetrics, ProbeResult, UNKNOWN_DESTINATION};
pub use relay::{RelayFailure, RelayMetrics, RelayReadiness, WAITING_STATUSES};
pub use restore::{RestoreMetrics, RestoreSource};

/// Everything `registry` holds in the Prometheus text exposition format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).expect("text encoding cannot fail");
    String::from_utf8(buf).expect("the text format is UTF-8")
}

/// The label of operation types (and error codes) beyond the bound.
pub const OTHER_TYPE: &str = "other";

/// Error codes (`AttemptFailed.error_code`) with a label of their own in
/// `reconciler_retries_by_cause_total`; later ones share `other`.
pub const MAX_ERROR_CODES: usize = 32;

/// Labels of a free-text dimension (operation types, error codes): the
/// configured values always have their own; others get one while fewer
/// than `max_dynamic` were seen, then share `other`. Each label has a `V`
/// beside it: the metric handles of that label, resolved once (see
/// [`TypeHandles`]).
struct BoundedLabels<V = ()> {
    /// Looked up for every verdict: FxHash, not SipHash. The map holds at
    /// most the configured values and `max_dynamic` others, so values
    /// chosen to collide could not make it slow.
    known: RwLock<rustc_hash::FxHashMap<String, V>>,
    /// What `other` has beside it.
    other: V,
    dynamic: Mutex<usize>,
    max_dynamic: usize,
}

impl<V: Default> BoundedLabels<V> {
    fn new<'a>(configured: impl IntoIterator<Item = &'a String>, max_dynamic: usize) -> BoundedLabels<V> {
        BoundedLabels {
            known: RwLock::new(configured.into_iter().map(|c| (c.clone(), V::default())).collect()),
            other: V::default(),
            dynamic: Mutex::new(0),
            max_dynamic,
        }
    }

    fn label<'a>(&self, value: &'a str) -> &'a str {
        if self.known.read().expect("not poisoned").contains_key(value) {
            return value;
        }
        let mut dynamic = self.dynamic.lock().expect("not poisoned");
        if *dynamic >= self.max_dynamic || value == OTHER_TYPE {
            return OTHER_TYPE;
        }
        // Another thread may have added it since the read above.
        let mut known = self.known.write().expect("not poisoned");
        if !known.contains_key(value) {
            *dynamic += 1;
            known.insert(value.to_owned(), V::default());
        }
        value
    }

    /// `f` of `value`'s label and what it has beside it.
    fn with<R>(&self, value: &str, f: impl FnOnce(&str, &V) -> R) -> R {
        if let Some((label, v)) = self.known.read().expect("not poisoned").get_key_value(value) {
            return f(label, v);
        }
        let label = self.label(value);
        match self.known.read().expect("not poisoned").get_key_value(label) {
            Some((label, v)) => f(label, v),
            None => f(OTHER_TYPE, &self.other),
        }
    }
}

/// The handles of one operation type's label, each resolved when first
/// used: `with_label_values` hashes every label a byte at a time, locks the
/// vector and clones the child's handle, about 600 instructions per output
/// in a profile of the rebuild bench, where a resolved handle is one atomic
/// add. Resolving on first use keeps the exposition as it was: a series
/// appears once it is counted.
#[derive(Default)]
struct TypeHandles {
    /// `reconciler_verdicts_total` by outcome, then action.
    verdicts: [[OnceLock<IntCounter>; Action::ALL.len()]; Outcome::ALL.len()],
    time_to_confirm: OnceLock<Histogram>,
}

/// Whether the instance can do its work: assigned partitions restored
/// (caught up with what was in them at assignment), the previous run's
/// outbox re-published, publishing not refused, and the broker answering.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// Partitions assigned and all of them restored; as [`Metrics::readiness`]
    /// reports it, also publishing not refused.
    pub ready: bool,
    /// The group has assigned this member its partitions (possibly none).
    pub assigned: bool,
    /// Partitions owned.
    pub partitions: usize,
    /// Owned partitions whose state is restored.
    pub restored: usize,
    /// Publishing is refused with an error no retry cures (the error).
    pub publish_refused: Option<String>,
    /// The pipeline stopped and waits for a person (why).
    pub stopped: Option<String>,
    /// The broker has not answered for longer than the pipeline's bound
    /// (how long, and the last error).
    pub broker_unreachable: Option<String>,
}

impl Readiness {
    /// Whether the instance can do its work, all conditions together.
    fn can_work(&self) -> bool {
        self.ready && self.publish_refused.is_none() && self.broker_unreachable.is_none() && self.stopped.is_none()
    }
}

/// All metrics of one reconciler process.
pub struct Metrics {
    /// The changelog's and the restores' metrics.
    pub restore: RestoreMetrics,
    registry: Registry,
    types: BoundedLabels<TypeHandles>,
    error_codes: BoundedLabels,
    events: IntCounterVec,
    /// `events` of each [`Disposition`], resolved once: counted per record.
    events_by_disposition: [IntCounter; 5],
    dead_letters: IntCounterVec,
    verdicts: IntCounterVec,
    anomalies: IntCounterVec,
    /// `anomalies` of each kind, resolved when first counted.
    anomalies_by_kind: [OnceLock<IntCounter>; AnomalyKind::ALL.len()],
    commands: IntCounterVec,
    /// `commands` of each action, resolved when first counted.
    commands_by_action: [OnceLock<IntCounter>; RepairAction::ALL.len()],
    attempt_failures: IntCounterVec,
    retries_by_cause: IntCounterVec,
    escalations: IntCounterVec,
    superseded: IntCounterVec,
    forged_control_events: IntCounterVec,
    manual_decisions: IntCounterVec,
    time_to_confirm: HistogramVec,
    batch_duration: Histogram,
    batch_records: Histogram,
    timers_fired: IntCounter,
    publish_retries: IntCounter,
    registry_failures: IntCounter,
    registry_waiting: IntGauge,
    outbox_republished: IntCounter,
    transactions: IntCounterVec,
    operations: IntGaugeVec,
    follow_ups: IntGaugeVec,
    oldest_unconfirmed: GaugeVec,
    confirm_window: GaugeVec,
    review_open: IntGaugeVec,
    review_oldest: GaugeVec,
    consumer_lag: IntGaugeVec,
    outbox_pending: IntGauge,
    dlq_waiting: IntGaugeVec,
    dlq_oldest_waiting: Gauge,
    partitions_owned: IntGauge,
    ready_gauge: IntGauge,
    broker_last_answer: Gauge,
    scan_duration: Gauge,
    scan_operations: IntGauge,
    readiness: Mutex<Readiness>,
    ready: AtomicBool,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let m = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let m = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn int_gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let m = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let m = IntGauge::new(name, help).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn gauge(r: &Registry, name: &str, help: &str) -> Gauge {
    let m = Gauge::new(name, help).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn int_counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let m = IntCounter::new(name, help).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let m = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric");
    r.register(Box::new(m.clone())).expect("registered once");
    m
}

/// The `reason` label of an escalation.
fn escalation_label(e: Escalation) -> &'static str {
    match e {
        Escalation::ProbeUnanswered => "probe_unanswered",
        Escalation::RequeuesExhausted => "requeues_exhausted",
    }
}

/// A failed attempt's class and code, read before the event goes to the
/// core (which consumes it), for [`Metrics::event`].
#[derive(Debug, Clone)]
pub struct Failure {
    class: ErrorClass,
    code: String,
}

impl Failure {
    /// The failure an event reports, if it is an `AttemptFailed`.
    pub fn of(body: &crate::core::Body) -> Option<Failure> {
        match body {
            crate::core::Body::AttemptFailed { error_class, error_code, .. } => {
                Some(Failure { class: *error_class, code: error_code.clone() })
            }
            _ => None,
        }
    }
}

impl Metrics {
    /// Metrics whose operation type labels are the `configured` types plus
    /// up to `max_dynamic_types` others.
    pub fn new<'a>(configured: impl IntoIterator<Item = &'a String>, max_dynamic_types: usize) -> Metrics {
        let r = Registry::new();
        let events = counter(
                &r,
                "reconciler_events_total",
                "Input records by how they were accounted for: applied, duplicate, held, anomalous, ignored (a timer of a removed operation) or dead_lettered.",
                &["result"],
        );
        let m = Metrics {
            types: BoundedLabels::new(configured, max_dynamic_types),
            error_codes: BoundedLabels::new(&[], MAX_ERROR_CODES),
            events_by_disposition: Disposition::ALL.map(|d| events.with_label_values(&[d.as_str()])),
            events,
            dead_letters: counter(
                &r,
                "reconciler_dead_letters_total",
                "Records sent to the dead-letter topic, by error class.",
                &["class"],
            ),
            verdicts: counter(
                &r,
                "reconciler_verdicts_total",
                "Verdicts published, by outcome, action and operation type.",
                &["outcome", "action", "type"],
            ),
            anomalies: counter(&r, "reconciler_anomalies_total", "Anomalies published, by kind.", &["kind"]),
            anomalies_by_kind: Default::default(),
            commands_by_action: Default::default(),
            commands: counter(
                &r,
                "reconciler_repair_commands_total",
                "Commands published on the commands topic, by action: PROBE (in both modes) and REQUEUE (act mode).",
                &["action"],
            ),
            attempt_failures: counter(
                &r,
                "reconciler_attempt_failures_total",
                "Failed attempts applied, by error class and what followed: retry (RETRY_SCHEDULED) or review (MANUAL_REVIEW).",
                &["error_class", "next"],
            ),
            retries_by_cause: counter(
                &r,
                "reconciler_retries_by_cause_total",
                "Failed attempts followed by a retry (RETRY_SCHEDULED), by error_code: what the retries are spent on.",
                &["error_code"],
            ),
            escalations: counter(
                &r,
                "reconciler_escalations_total",
                "Follow-ups that sent an operation to manual review, by reason: probe_unanswered (no evidence after a PROBE), requeues_exhausted (requeued max_requeues times, still not confirmed).",
                &["reason"],
            ),
            superseded: counter(
                &r,
                "reconciler_superseded_total",
                "Operations replaced by a request for a higher version of the same entity, type and destination: closed (NOT_APPLICABLE) or marked in review.",
                &["result"],
            ),
            forged_control_events: counter(
                &r,
                "reconciler_forged_control_events_total",
                "Control events (DeadlineReached, ManualDecision, ProbeFailed) refused for want of a valid signature: by body, and whether unsigned or with a bad signature. Each is also a FORGED_CONTROL_EVENT anomaly.",
                &["body", "authenticity"],
            ),
            manual_decisions: counter(
                &r,
                "reconciler_manual_decisions_total",
                "Manual decisions applied, by decision.",
                &["decision"],
            ),
            time_to_confirm: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "reconciler_time_to_confirm_seconds",
                        "Event time from Requested to the CORRECT verdict, by operation type.",
                    )
                    .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 86400.0]),
                    &["type"],
                )
                .expect("valid metric");
                r.register(Box::new(h.clone())).expect("registered once");
                h
            },
            batch_duration: histogram(
                &r,
                "reconciler_batch_duration_seconds",
                "Wall time to apply, store, publish and acknowledge one batch.",
                prometheus::exponential_buckets(0.0005, 2.0, 16).expect("valid buckets"),
            ),
            batch_records: histogram(
                &r,
                "reconciler_batch_records",
                "Input records per batch.",
                prometheus::exponential_buckets(1.0, 4.0, 9).expect("valid buckets"),
            ),
            timers_fired: int_counter(
                &r,
                "reconciler_timers_fired_total",
                "DeadlineReached events written to the input topic.",
            ),
            publish_retries: int_counter(
                &r,
                "reconciler_publish_retries_total",
                "Failed attempts to publish outputs, retried with backoff (broker unreachable or refusing).",
            ),
            registry_failures: int_counter(
                &r,
                "reconciler_schema_registry_failures_total",
                "Failed calls to the schema registry for the schema an input record names by id (unreachable, server error, credentials refused); the batch waits and the call is retried.",
            ),
            registry_waiting: int_gauge(
                &r,
                "reconciler_schema_registry_waiting",
                "1 while input records wait for the schema registry to answer, else 0: the partitions make no progress meanwhile and no record is dead-lettered for it.",
            ),
            outbox_republished: int_counter(
                &r,
                "reconciler_outbox_republished_total",
                "Outputs a previous run stored but left unacknowledged by the broker, re-published at start (the pipeline's output outbox in its state store).",
            ),
            transactions: counter(
                &r,
                "reconciler_transactions_total",
                "Kafka transactions of guarantee = exactly_once, by result (committed, aborted: nothing of it visible, done again).",
                &["result"],
            ),
            operations: int_gauge_vec(
                &r,
                "reconciler_operations",
                "Operations in the state store of the owned partitions, by state.",
                &["state"],
            ),
            follow_ups: int_gauge_vec(
                &r,
                "reconciler_follow_ups_waiting",
                "Operations waiting for a machine action (PROBE or REQUEUE) to be answered before their follow-up, by action.",
                &["action"],
            ),
            oldest_unconfirmed: gauge_vec(
                &r,
                "reconciler_oldest_unconfirmed_age_seconds",
                "Age (wall clock minus requested_at) of the oldest operation still awaiting evidence, by operation type.",
                &["type"],
            ),
            confirm_window: gauge_vec(
                &r,
                "reconciler_confirm_window_seconds",
                "The configured confirmation window of each operation type that has unconfirmed operations.",
                &["type"],
            ),
            review_open: int_gauge_vec(
                &r,
                "reconciler_review_open",
                "Operations waiting in manual review, by operation type.",
                &["type"],
            ),
            review_oldest: gauge_vec(
                &r,
                "reconciler_review_oldest_age_seconds",
                "Age (wall clock minus entry into review) of the oldest operation in manual review, by operation type.",
                &["type"],
            ),
            consumer_lag: int_gauge_vec(
                &r,
                "reconciler_consumer_lag",
                "Records of the input topic not yet applied, by owned partition.",
                &["partition"],
            ),
            outbox_pending: int_gauge(
                &r,
                "reconciler_outbox_pending",
                "Outputs in the pipeline's output outbox: stored with their batch, not yet acknowledged by the broker.",
            ),
            dlq_waiting: {
                let g = int_gauge_vec(
                    &r,
                    "reconciler_dlq_waiting",
                    "Dead letters on the DLQ topic not re-driven yet, by error class (read from the DLQ and its audit topic every metrics.dlq_refresh_ms).",
                    &["class"],
                );
                for class in crate::codec::DecodeError::CLASSES {
                    g.with_label_values(&[class]).set(0);
                }
                g
            },
            dlq_oldest_waiting: gauge(
                &r,
                "reconciler_dlq_oldest_waiting_seconds",
                "Age of the oldest dead letter not re-driven yet, in seconds (0 when there is none).",
            ),
            partitions_owned: int_gauge(&r, "reconciler_partitions_owned", "Input partitions owned by this instance."),
            ready_gauge: int_gauge(
                &r,
                "reconciler_ready",
                "1 when owned partitions are restored, the outputs a previous run left unacknowledged re-published, publishing not refused, the broker answering and the pipeline not stopped, else 0.",
            ),
            broker_last_answer: gauge(
                &r,
                "reconciler_broker_last_answer_timestamp_seconds",
                "When the broker last answered this instance's metadata request (Unix time, seconds; asked every second).",
            ),
            scan_duration: gauge(
                &r,
                "reconciler_state_scan_duration_seconds",
                "Wall time of the last scan of the state store behind the state gauges.",
            ),
            scan_operations: int_gauge(
                &r,
                "reconciler_state_scan_operations",
                "Operations read by the last scan of the state store.",
            ),
            readiness: Mutex::new(Readiness::default()),
            ready: AtomicBool::new(false),
            restore: RestoreMetrics::new(&r),
            registry: r,
        };
        for s in Status::ALL {
            m.operations.with_label_values(&[s.as_str()]).set(0);
        }
        // Every closed label from the start, so rates and alerts see the first one.
        for a in [RepairAction::Probe, RepairAction::Requeue] {
            m.follow_ups.with_label_values(&[a.as_str()]).set(0);
        }
        for e in Escalation::ALL {
            m.escalations.with_label_values(&[escalation_label(e)]);
        }
        for r in ["closed", "marked"] {
            m.superseded.with_label_values(&[r]);
        }
        for r in ["committed", "aborted"] {
            m.transactions.with_label_values(&[r]);
        }
        for body in ["DeadlineReached", "ManualDecision", "ProbeFailed"] {
            for a in [Authenticity::Unsigned, Authenticity::BadSignature] {
                m.forged_control_events.with_label_values(&[body, a.as_str()]);
            }
        }
        m
    }

    /// The operation type label of `operation_type` (bounded).
    pub fn type_label<'a>(&self, operation_type: &'a str) -> &'a str {
        self.types.label(operation_type)
    }

    /// One decoded event and how the core accounted for it. `failed` is
    /// [`Failure::of`] its body; `op` the operation after it.
    pub fn event(&self, d: Disposition, failed: Option<Failure>, op: Option<&OperationState>) {
        self.events_by_disposition[d as usize].inc();
        if let (Disposition::Applied, Some(f), Some(op)) = (d, failed, op) {
            let retry = op.status == Status::RetryScheduled;
            let next = if retry { "retry" } else { "review" };
            self.attempt_failures.with_label_values(&[f.class.as_str(), next]).inc();
            if retry {
                self.retries_by_cause.with_label_values(&[self.error_codes.label(&f.code)]).inc();
            }
        }
    }

    /// An operation replaced by a newer version: `closed`, or marked in review.
    pub fn superseded(&self, closed: bool) {
        self.superseded.with_label_values(&[if closed { "closed" } else { "marked" }]).inc();
    }

    /// A control event with body `body` refused for `auth` (never
    /// [`Authenticity::Signed`]).
    pub fn forged_control_event(&self, body: &str, auth: Authenticity) {
        self.forged_control_events.with_label_values(&[body, auth.as_str()]).inc();
    }

    /// Sets the number of operations waiting for a follow-up, by action.
    pub fn set_follow_ups(&self, probe: i64, requeue: i64) {
        self.follow_ups.with_label_values(&[RepairAction::Probe.as_str()]).set(probe);
        self.follow_ups.with_label_values(&[RepairAction::Requeue.as_str()]).set(requeue);
    }

    /// One record sent to the dead-letter topic.
    pub fn dead_letter(&self, class: &str) {
        self.events.with_label_values(&["dead_lettered"]).inc();
        self.dead_letters.with_label_values(&[class]).inc();
    }

    /// One output of the core, as it goes to the outbox.
    pub fn output(&self, o: &Output) {
        match o {
            Output::Verdict(v) => {
                self.types.with(&v.operation_type, |ty, handles| {
                    let (outcome, action) = (v.outcome, v.action);
                    handles.verdicts[outcome as usize][action as usize]
                        .get_or_init(|| self.verdicts.with_label_values(&[outcome.as_str(), action.as_str(), ty]))
                        .inc();
                    if outcome == Outcome::Correct && v.state == Status::Confirmed {
                        if let Some(req) = v.evidence.requested_at {
                            let secs = (v.decided_at - req).max(0) as f64 / 1000.0;
                            handles
                                .time_to_confirm
                                .get_or_init(|| self.time_to_confirm.with_label_values(&[ty]))
                                .observe(secs);
                        }
                    }
                });
                if let Some(m) = &v.evidence.manual_decision {
                    self.manual_decisions.with_label_values(&[m.decision.as_str()]).inc();
                }
                if let Some(e) = v.evidence.escalation {
                    self.escalations.with_label_values(&[escalation_label(e)]).inc();
                }
            }
            Output::Anomaly(a) => self.anomalies_by_kind[a.kind as usize]
                .get_or_init(|| self.anomalies.with_label_values(&[a.kind.as_str()]))
                .inc(),
            Output::Command(c) => self.commands_by_action[c.action as usize]
                .get_or_init(|| self.commands.with_label_values(&[c.action.as_str()]))
                .inc(),
        }
    }

    /// One committed batch of `records` input records.
    pub fn batch(&self, records: usize, took: Duration) {
        self.batch_records.observe(records as f64);
        self.batch_duration.observe(took.as_secs_f64());
    }

    /// `n` timers fired (their `DeadlineReached` events acknowledged).
    pub fn timers_fired(&self, n: usize) {
        self.timers_fired.inc_by(n as u64);
    }

    /// One failed attempt to publish outputs, to be retried.
    pub fn publish_retry(&self) {
        self.publish_retries.inc();
    }

    /// A failed call to the schema registry, to be retried.
    pub fn registry_failure(&self) {
        self.registry_failures.inc();
    }

    /// Whether input records are waiting for the schema registry.
    pub fn set_registry_waiting(&self, waiting: bool) {
        self.registry_waiting.set(i64::from(waiting));
    }

    /// `n` outputs of a previous run re-published from the outbox at start.
    pub fn outbox_republished(&self, n: usize) {
        self.outbox_republished.inc_by(n as u64);
    }

    /// A transaction committed (`true`) or aborted.
    pub fn transaction(&self, committed: bool) {
        self.transactions.with_label_values(&[if committed { "committed" } else { "aborted" }]).inc();
    }

    /// Sets readiness as the run loop sees it (partitions restored).
    pub fn set_readiness(&self, r: Readiness) {
        let mut current = self.readiness.lock().expect("not poisoned");
        let refused = current.publish_refused.take();
        let stopped = current.stopped.take();
        let unreachable = current.broker_unreachable.take();
        *current = Readiness { publish_refused: refused, broker_unreachable: unreachable, stopped, ..r };
        self.publish_readiness(&current);
    }

    /// The broker answered at wall-clock time `at_ms`.
    pub fn broker_answered(&self, at_ms: i64) {
        self.broker_last_answer.set(at_ms as f64 / 1000.0);
    }

    /// The broker has not answered for longer than the bound (`Some`,
    /// saying how long and why), or answers again (`None`): not ready
    /// meanwhile.
    pub fn set_broker_unreachable(&self, why: Option<String>) {
        let mut current = self.readiness.lock().expect("not poisoned");
        if current.broker_unreachable != why {
            current.broker_unreachable = why;
            self.publish_readiness(&current);
        }
    }

    /// Publishing outputs is refused with an error no retry cures (`Some`,
    /// with the error), or no longer (`None`): not ready meanwhile.
    pub fn set_publish_refused(&self, error: Option<String>) {
        let mut current = self.readiness.lock().expect("not poisoned");
        if current.publish_refused != error {
            current.publish_refused = error;
            self.publish_readiness(&current);
        }
    }

    /// The pipeline stopped for a reason a person must act on (`why`):
    /// not ready from now on.
    pub fn set_stopped(&self, why: String) {
        let mut current = self.readiness.lock().expect("not poisoned");
        current.stopped = Some(why);
        self.publish_readiness(&current);
    }

    fn publish_readiness(&self, r: &Readiness) {
        let ready = r.can_work();
        self.ready.store(ready, Ordering::SeqCst);
        self.ready_gauge.set(i64::from(ready));
        self.partitions_owned.set(r.partitions as i64);
    }

    /// Whether the instance can do its work (what `/readyz` answers).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The readiness details (the body of `/readyz`).
    pub fn readiness(&self) -> Readiness {
        let mut r = self.readiness.lock().expect("not poisoned").clone();
        r.ready = r.can_work();
        r
    }

    /// The dead letters not re-driven yet: how many per error class (every
    /// known class has its series, at 0 when it has none) and the oldest's age.
    pub fn set_dead_letters_waiting(&self, by_class: &[(String, i64)], oldest_secs: f64) {
        self.dlq_waiting.reset();
        for class in crate::codec::DecodeError::CLASSES {
            self.dlq_waiting.with_label_values(&[class]).set(0);
        }
        for (class, n) in by_class {
            self.dlq_waiting.with_label_values(&[class.as_str()]).set(*n);
        }
        self.dlq_oldest_waiting.set(oldest_secs);
    }

    /// Outputs stored and not yet acknowledged.
    pub fn set_outbox_pending(&self, n: usize) {
        self.outbox_pending.set(n as i64);
    }

    /// The lag of owned partition `partition`.
    pub fn set_lag(&self, partition: i32, lag: i64) {
        self.consumer_lag.with_label_values(&[partition.to_string().as_str()]).set(lag);
    }

    /// Removes the lag of a partition no longer owned.
    pub fn clear_lag(&self, partition: i32) {
        let _ = self.consumer_lag.remove_label_values(&[partition.to_string().as_str()]);
    }

    /// Operations in the store by state (`count` of each state).
    pub fn set_operations(&self, count: impl Fn(Status) -> i64) {
        for st in Status::ALL {
            self.operations.with_label_values(&[st.as_str()]).set(count(st));
        }
    }

    /// The oldest unconfirmed operation of type label `ty` (age in
    /// seconds) and that type's confirmation window (seconds).
    pub fn set_unconfirmed(&self, ty: &str, age_secs: f64, window_secs: f64) {
        self.oldest_unconfirmed.with_label_values(&[ty]).set(age_secs);
        self.confirm_window.with_label_values(&[ty]).set(window_secs);
    }

    /// Type label `ty` has no unconfirmed operation any more.
    pub fn clear_unconfirmed(&self, ty: &str) {
        let _ = self.oldest_unconfirmed.remove_label_values(&[ty]);
        let _ = self.confirm_window.remove_label_values(&[ty]);
    }

    /// The review queue of type label `ty`: its size and the age (seconds)
    /// of its oldest case, or `None` when it is empty (shown as 0 rather
    /// than vanishing, so that panels and alerts see it drop).
    pub fn set_review(&self, ty: &str, open: Option<(i64, f64)>) {
        match open {
            Some((n, oldest)) => {
                self.review_open.with_label_values(&[ty]).set(n);
                self.review_oldest.with_label_values(&[ty]).set(oldest);
            }
            None => {
                self.review_open.with_label_values(&[ty]).set(0);
                let _ = self.review_oldest.remove_label_values(&[ty]);
            }
        }
    }

    /// How long the last scan of the store took and how many operations it read.
    pub fn set_scan(&self, took: Duration, operations: i64) {
        self.scan_duration.set(took.as_secs_f64());
        self.scan_operations.set(operations);
    }

    /// Every metric, whether or not it has a value yet (dashboards, alert
    /// rules and the metrics reference are checked against these).
    pub fn collectors(&self) -> Vec<&dyn Collector> {
        let mut all: Vec<&dyn Collector> = vec![
            &self.events,
            &self.dead_letters,
            &self.verdicts,
            &self.anomalies,
            &self.commands,
            &self.attempt_failures,
            &self.retries_by_cause,
            &self.escalations,
            &self.superseded,
            &self.forged_control_events,
            &self.manual_decisions,
            &self.time_to_confirm,
            &self.batch_duration,
            &self.batch_records,
            &self.timers_fired,
            &self.publish_retries,
            &self.registry_failures,
            &self.registry_waiting,
            &self.outbox_republished,
            &self.transactions,
            &self.operations,
            &self.follow_ups,
            &self.oldest_unconfirmed,
            &self.confirm_window,
            &self.review_open,
            &self.review_oldest,
            &self.consumer_lag,
            &self.outbox_pending,
            &self.dlq_waiting,
            &self.dlq_oldest_waiting,
            &self.partitions_owned,
            &self.ready_gauge,
            &self.broker_last_answer,
            &self.scan_duration,
            &self.scan_operations,
        ];
        all.extend(self.restore.collectors());
        all
    }

    /// The name of every metric.
    pub fn names(&self) -> Vec<String> {
        self.collectors().iter().flat_map(|c| c.desc()).map(|d| d.fq_name.clone()).collect()
    }

    /// The registry, for metrics registered next to the pipeline's (the
    /// probe worker's inside `run`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run loop sets readiness at every timer tick: an unreachable
    /// broker, reported by another thread, must survive those updates.
    #[test]
    fn an_unreachable_broker_keeps_readiness_red_across_the_run_loops_updates() {
        let m = Metrics::new(&[], 10);
        let caught_up = Readiness { ready: true, assigned: true, partitions: 3, restored: 3, ..Readiness::default() };
        m.set_readiness(caught_up.clone());
        assert!(m.is_ready() && m.readiness().ready);
        m.set_broker_unreachable(Some("the broker has not answered for 10 s".into()));
        m.set_readiness(caught_up.clone());
        let r = m.readiness();
        assert!(!m.is_ready() && !r.ready, "{r:?}");
        assert_eq!(r.broker_unreachable.as_deref(), Some("the broker has not answered for 10 s"));
        assert!(m.render().contains("reconciler_ready 0"));
        m.set_broker_unreachable(None);
        assert!(m.is_ready() && m.readiness().ready);
        assert!(m.render().contains("reconciler_ready 1"));
    }

    #[test]
    fn type_labels_are_bounded() {
        let configured = ["sync_customer".to_owned()];
        let m = Metrics::new(&configured, 2);
        assert_eq!(m.type_label("sync_customer"), "sync_customer");
        assert_eq!(m.type_label("a"), "a");
        assert_eq!(m.type_label("b"), "b");
        assert_eq!(m.type_label("c"), OTHER_TYPE);
        assert_eq!(m.type_label("a"), "a");
        assert_eq!(m.type_label("sync_customer"), "sync_customer");
    }

    fn verdict(ty: &str, outcome: Outcome, action: Action, state: Status) -> Output {
        use crate::core::output::{Evidence, Verdict};
        Output::Verdict(Verdict {
            verdict_id: "v".into(),
            operation_id: "op".into(),
            entity_id: "e".into(),
            operation_type: ty.into(),
            outcome,
            action,
            state,
            reason: "r".into(),
            decided_at: 5_000,
            trigger_event_id: "ev".into(),
            evidence: Evidence {
                expected_version: None,
                expected_fingerprint: None,
                observed_version: None,
                observed_fingerprint: None,
                remote_ids: Vec::new(),
                idempotency_key: None,
                attempts: 1,
                requested_at: Some(1_000),
                last_event_at: 5_000,
                events_applied: 2,
                duplicates_seen: 0,
                out_of_order_seen: 0,
                trigger_partition: 0,
                trigger_offset: 1,
                manual_decision: None,
                requeues: 0,
                follow_up_at: None,
                next_attempt_at: None,
                superseded_by: None,
                escalation: None,
            },
        })
    }

    /// The handles resolved once count into the series `with_label_values`
    /// names: one per outcome, action and type label, types beyond the
    /// bound under `other`, and a series appears only once counted.
    #[test]
    fn outputs_are_counted_by_their_labels() {
        let m = Metrics::new(&["sync".to_owned()], 1);
        let correct = |ty| verdict(ty, Outcome::Correct, Action::None, Status::Confirmed);
        for o in [
            correct("sync"),
            correct("sync"),
            verdict("sync", Outcome::Missing, Action::Requeue, Status::RetryScheduled),
            correct("a"),
            correct("b"),
            correct("c"),
            correct("a"),
        ] {
            m.output(&o);
        }
        let text = m.render();
        let series = |labels: &str| {
            let prefix = format!("reconciler_verdicts_total{{{labels}}} ");
            text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map(str::to_owned)
        };
        assert_eq!(series(r#"action="NONE",outcome="CORRECT",type="sync""#).as_deref(), Some("2"), "{text}");
        assert_eq!(series(r#"action="REQUEUE",outcome="MISSING",type="sync""#).as_deref(), Some("1"), "{text}");
        assert_eq!(series(r#"action="NONE",outcome="CORRECT",type="a""#).as_deref(), Some("2"), "{text}");
        assert_eq!(series(r#"action="NONE",outcome="CORRECT",type="other""#).as_deref(), Some("2"), "{text}");
        assert_eq!(series(r#"action="NONE",outcome="MISSING",type="sync""#), None, "{text}");
        assert!(text.contains(r#"reconciler_time_to_confirm_seconds_count{type="sync"} 2"#), "{text}");
        assert!(text.contains(r#"reconciler_time_to_confirm_seconds_count{type="other"} 2"#), "{text}");
        assert!(!text.contains("reconciler_anomalies_total{"), "{text}");
    }

    #[test]
    fn every_state_is_exposed_from_the_start() {
        let m = Metrics::new(&[], 0);
        let text = m.render();
        for s in Status::ALL {
            assert!(text.contains(&format!("reconciler_operations{{state=\"{}\"}} 0", s.as_str())), "{text}");
        }
    }
}
