//! The metrics reference (`docs/metrics.md`), generated from the metrics
//! each process registers: name, type, labels and help text come from the
//! same collectors `/metrics` serves, so the page cannot drift from them.

use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::Registry;

use super::{Metrics, ProbeMetrics, RelayMetrics};

/// One metric as `/metrics` serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricDoc {
    /// Its full name (`reconciler_events_total`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names.
    pub labels: Vec<String>,
    /// Its help text.
    pub help: String,
}

/// The metrics of `collectors`, in the order given.
pub fn describe(collectors: &[&dyn Collector]) -> Vec<MetricDoc> {
    let mut out = Vec::new();
    for c in collectors {
        let kinds: Vec<MetricType> = c.collect().iter().map(|f| f.get_field_type()).collect();
        for (i, d) in c.desc().into_iter().enumerate() {
            let kind = match kinds.get(i) {
                Some(MetricType::COUNTER) => "counter",
                Some(MetricType::GAUGE) => "gauge",
                Some(MetricType::HISTOGRAM) => "histogram",
                Some(MetricType::SUMMARY) => "summary",
                _ => "untyped",
            };
            out.push(MetricDoc {
                name: d.fq_name.clone(),
                kind,
                labels: d.variable_labels.clone(),
                help: d.help.clone(),
            });
        }
    }
    out
}

/// Each process's metrics: `reconciler run`, the probe worker, the relay.
pub fn processes() -> Vec<(&'static str, &'static str, Vec<MetricDoc>)> {
    let run = Metrics::new(&[], 32);
    let probe = ProbeMetrics::new(&Registry::new(), Vec::<String>::new());
    let relay = RelayMetrics::new(&Registry::new());
    vec![
        (
            "The pipeline (`reconciler run`)",
            "Served at `/metrics` on `http.bind`.",
            describe(&run.collectors()),
        ),
        (
            "The probe worker (`reconciler probe`)",
            "Served at `/metrics` on `probe.bind`; when `probe.enabled` runs the worker inside `reconciler run`, on the pipeline's `/metrics`.",
            describe(&probe.collectors()),
        ),
        (
            "The outbox relay (`reconciler relay`)",
            "Served at `/metrics` on `relay.bind`.",
            describe(&relay.collectors()),
        ),
    ]
}

const INTRO: &str = "# Metrics reference

<!-- Generated from the registered metrics by `reconciler reference metrics`;
     edit the help texts in src/metrics/, not this page. -->

Every metric each process serves in the Prometheus text format, with its
type, its labels and its help text. The alert rules built on them are in
`deploy/prometheus/alerts.yml`, and what to do when one fires is in
[operations.md](operations.md#runbooks). Label values are bounded: operation
types beyond `[types]` and `metrics.max_operation_types` share the label
`other`.
";

/// The whole reference page, as committed in `docs/metrics.md`.
pub fn markdown() -> String {
    let mut out = String::from(INTRO);
    for (title, served, metrics) in processes() {
        out.push_str(&format!("\n## {title}\n\n{served}\n\n"));
        out.push_str("| metric | type | labels | meaning |\n|---|---|---|---|\n");
        for m in metrics {
            let labels = if m.labels.is_empty() {
                String::new()
            } else {
                m.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ")
            };
            out.push_str(&format!("| `{}` | {} | {} | {} |\n", m.name, m.kind, labels, m.help.replace('|', "\\|")));
        }
    }
    out
}
