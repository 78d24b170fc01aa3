//! The probe worker's metrics: probe requests by destination and result,
//! queries by outcome, query latency, requests in flight and the circuit
//! breakers. Registered in the registry they are given: the pipeline's
//! when the worker runs inside `run`, a registry of their own when it runs
//! alone.
//!
//! Destination labels are bounded: the configured destinations, and
//! `unknown` for any other name a command carries.

use std::collections::BTreeSet;

use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use super::{counter, int_gauge_vec};
use crate::core::event::ProbeErrorClass;

/// The label of a destination no `[destinations.<name>]` declares.
pub const UNKNOWN_DESTINATION: &str = "unknown";

/// How a probe request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// The destination holds the effect.
    Observed,
    /// The destination has no such effect.
    Absent,
    /// No answer within the retry budget (a `ProbeFailed` was published).
    Failed,
}

impl ProbeResult {
    fn label(self) -> &'static str {
        match self {
            ProbeResult::Observed => "observed",
            ProbeResult::Absent => "absent",
            ProbeResult::Failed => "failed",
        }
    }
}

/// The probe worker's metrics.
pub struct ProbeMetrics {
    destinations: BTreeSet<String>,
    probes: IntCounterVec,
    queries: IntCounterVec,
    latency: HistogramVec,
    in_flight: IntGaugeVec,
    circuit_open: IntGaugeVec,
    republished: IntCounterVec,
    skipped: IntCounterVec,
}

impl ProbeMetrics {
    /// Registers the metrics of the given destinations in `r`, each with
    /// its series present from the start (an alert on a rate needs them).
    pub fn new(r: &Registry, destinations: impl IntoIterator<Item = String>) -> ProbeMetrics {
        let destinations: BTreeSet<String> = destinations.into_iter().collect();
        let m = ProbeMetrics {
            probes: counter(
                r,
                "reconciler_probes_total",
                "Probe requests answered, by destination and result (observed, absent, failed).",
                &["destination", "result"],
            ),
            queries: counter(
                r,
                "reconciler_probe_queries_total",
                "Queries sent to destinations, by destination and outcome (ok or a ProbeFailed error class).",
                &["destination", "outcome"],
            ),
            latency: {
                let h = HistogramVec::new(
                    HistogramOpts::new("reconciler_probe_query_seconds", "Wall time of one destination query.")
                        .buckets(prometheus::exponential_buckets(0.001, 2.0, 16).expect("valid buckets")),
                    &["destination"],
                )
                .expect("valid metric");
                r.register(Box::new(h.clone())).expect("registered once");
                h
            },
            in_flight: int_gauge_vec(
                r,
                "reconciler_probes_in_flight",
                "Probe requests being worked on (queries and back-off), by destination.",
                &["destination"],
            ),
            circuit_open: int_gauge_vec(
                r,
                "reconciler_probe_circuit_open",
                "1 while a destination's circuit breaker refuses queries, else 0.",
                &["destination"],
            ),
            republished: counter(
                r,
                "reconciler_probe_answers_republished_total",
                "Answers published again from the worker's store for a command delivered again (no new query).",
                &["destination"],
            ),
            skipped: counter(
                r,
                "reconciler_probe_commands_skipped_total",
                "Records of the commands topic the worker does not answer, by reason (requeue, undecodable).",
                &["reason"],
            ),
            destinations,
        };
        for d in m.destinations.iter().map(String::as_str).chain([UNKNOWN_DESTINATION]) {
            for res in [ProbeResult::Observed, ProbeResult::Absent, ProbeResult::Failed] {
                m.probes.with_label_values(&[d, res.label()]);
            }
            m.queries.with_label_values(&[d, "ok"]);
            m.latency.with_label_values(&[d]);
            m.in_flight.with_label_values(&[d]);
            m.circuit_open.with_label_values(&[d]);
            m.republished.with_label_values(&[d]);
        }
        m
    }

    /// The bounded label of destination `name`.
    pub fn destination<'a>(&self, name: &'a str) -> &'a str {
        if self.destinations.contains(name) {
            name
        } else {
            UNKNOWN_DESTINATION
        }
    }

    /// A probe request ended.
    pub fn probe(&self, destination: &str, result: ProbeResult) {
        self.probes.with_label_values(&[self.destination(destination), result.label()]).inc();
    }

    /// One query ended after `seconds` (`error`: `None` when answered).
    pub fn query(&self, destination: &str, error: Option<ProbeErrorClass>, seconds: f64) {
        let d = self.destination(destination);
        let outcome = error.map_or("ok", ProbeErrorClass::as_str);
        self.queries.with_label_values(&[d, outcome]).inc();
        self.latency.with_label_values(&[d]).observe(seconds);
    }

    /// A probe request of `destination` started (`+1`) or ended (`-1`).
    pub fn in_flight(&self, destination: &str, delta: i64) {
        self.in_flight.with_label_values(&[self.destination(destination)]).add(delta);
    }

    /// The state of `destination`'s circuit breaker.
    pub fn circuit(&self, destination: &str, open: bool) {
        self.circuit_open.with_label_values(&[self.destination(destination)]).set(i64::from(open));
    }

    /// An answer was published again from the store.
    pub fn republished(&self, destination: &str) {
        self.republished.with_label_values(&[self.destination(destination)]).inc();
    }

    /// A record of the commands topic was not a probe request.
    pub fn skipped(&self, reason: &str) {
        self.skipped.with_label_values(&[reason]).inc();
    }

    /// Every metric, whether or not it has a value yet (dashboards, alert
    /// rules and the metrics reference are checked against these).
    pub fn collectors(&self) -> Vec<&dyn Collector> {
        let all: Vec<&dyn Collector> = vec![
            &self.probes,
            &self.queries,
            &self.latency,
            &self.in_flight,
            &self.circuit_open,
            &self.republished,
            &self.skipped,
        ];
        all
    }

    /// The name of every metric.
    pub fn names(&self) -> Vec<String> {
        self.collectors().iter().flat_map(|c| c.desc()).map(|d| d.fq_name.clone()).collect()
    }
}
