//! The outbox relay's metrics (`reconciler relay`): rows
//! published, publish failures by class, rows moved to dead_letter, and
//! the outbox itself as the relay last counted it (backlog and age by
//! status), which the dead-letter alerts watch.

use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, gauge_vec, int_counter, int_gauge, int_gauge_vec};

/// Why a publish of an outbox row failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayFailure {
    /// The broker could not be reached or did not answer in time: not the
    /// row's fault, so the row's attempts are not counted; the relay backs off.
    Outage,
    /// The broker (or the client for it) refused this row (too large,
    /// invalid): counted as an attempt of the row.
    Row,
    /// Refused for every row (no permission, no such topic): needs a person.
    Refused,
}

impl RelayFailure {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RelayFailure::Outage => "outage",
            RelayFailure::Row => "row",
            RelayFailure::Refused => "refused",
        }
    }
}

/// The outbox statuses the gauges report (published rows are history).
pub const WAITING_STATUSES: [&str; 2] = ["pending", "dead_letter"];

/// Whether the relay can do its work: not while the broker refuses every
/// row for a reason that is not the row's (no permission, no such topic),
/// which only a person can cure. Shared between the relay, which sets it,
/// and its `/readyz`, which answers from it.
#[derive(Clone)]
pub struct RelayReadiness {
    refused: Arc<Mutex<Option<String>>>,
    gauge: IntGauge,
}

impl RelayReadiness {
    /// The refusal in force (`None`: ready).
    pub fn refused(&self) -> Option<String> {
        self.refused.lock().expect("not poisoned").clone()
    }

    /// Publishing is refused for every row (with the error), or no longer.
    pub fn set_refused(&self, error: Option<String>) {
        self.gauge.set(i64::from(error.is_none()));
        *self.refused.lock().expect("not poisoned") = error;
    }
}

/// The relay's metrics.
pub struct RelayMetrics {
    readiness: RelayReadiness,
    published: IntCounter,
    failures: IntCounterVec,
    dead_lettered: IntCounter,
    rounds: IntCounter,
    rows: IntGaugeVec,
    oldest: GaugeVec,
}

impl RelayMetrics {
    /// Registers the metrics in `r`, every series present from the start.
    pub fn new(r: &Registry) -> RelayMetrics {
        let ready = int_gauge(
            r,
            "reconciler_relay_ready",
            "1 when the relay's /readyz says ready; 0 while the broker refuses every row for a reason that is not the row's (no permission, no such topic).",
        );
        ready.set(1);
        let m = RelayMetrics {
            readiness: RelayReadiness { refused: Arc::new(Mutex::new(None)), gauge: ready },
            published: int_counter(
                r,
                "reconciler_relay_published_total",
                "Outbox rows published to the input topic and acknowledged by the broker (a row re-published after a relay crash counts again).",
            ),
            failures: counter(
                r,
                "reconciler_relay_publish_failures_total",
                "Outbox rows whose publish failed, by class: outage (broker unreachable or slow; not counted against the row), row (refused for this row; counted as an attempt), refused (no permission or no such topic).",
                &["class"],
            ),
            dead_lettered: int_counter(
                r,
                "reconciler_relay_dead_lettered_total",
                "Outbox rows moved to dead_letter after failing relay.max_attempts times.",
            ),
            rounds: int_counter(r, "reconciler_relay_rounds_total", "Claims of a batch of outbox rows (empty ones too)."),
            rows: int_gauge_vec(
                r,
                "reconciler_relay_outbox_rows",
                "Rows of the outbox by status (pending, dead_letter), as the relay last counted them.",
                &["status"],
            ),
            oldest: gauge_vec(
                r,
                "reconciler_relay_outbox_oldest_seconds",
                "Age of the oldest row of the outbox by status (pending, dead_letter), in seconds since it was written; 0 when there is none.",
                &["status"],
            ),
        };
        for f in [RelayFailure::Outage, RelayFailure::Row, RelayFailure::Refused] {
            m.failures.with_label_values(&[f.label()]);
        }
        for s in WAITING_STATUSES {
            m.rows.with_label_values(&[s]);
            m.oldest.with_label_values(&[s]);
        }
        m
    }

    /// `n` rows were acknowledged.
    pub fn published(&self, n: usize) {
        self.published.inc_by(n as u64);
    }

    /// `n` rows failed with `class`.
    pub fn failed(&self, class: RelayFailure, n: usize) {
        self.failures.with_label_values(&[class.label()]).inc_by(n as u64);
    }

    /// `n` rows became dead letters.
    pub fn dead_lettered(&self, n: usize) {
        self.dead_lettered.inc_by(n as u64);
    }

    /// The relay's readiness, to share with its `/readyz`.
    pub fn readiness(&self) -> RelayReadiness {
        self.readiness.clone()
    }

    /// A claim ran.
    pub fn round(&self) {
        self.rounds.inc();
    }

    /// Every metric, whether or not it has a value yet (dashboards, alert
    /// rules and the metrics reference are checked against these).
    pub fn collectors(&self) -> Vec<&dyn Collector> {
        let all: Vec<&dyn Collector> = vec![
            &self.published,
            &self.failures,
            &self.dead_lettered,
            &self.rounds,
            &self.rows,
            &self.oldest,
            &self.readiness.gauge,
        ];
        all
    }

    /// The name of every metric.
    pub fn names(&self) -> Vec<String> {
        self.collectors().iter().flat_map(|c| c.desc()).map(|d| d.fq_name.clone()).collect()
    }

    /// The outbox as counted: rows and the oldest row's age of `status`.
    pub fn set_outbox(&self, status: &str, rows: i64, oldest_secs: f64) {
        self.rows.with_label_values(&[status]).set(rows);
        self.oldest.with_label_values(&[status]).set(oldest_secs);
    }
}
