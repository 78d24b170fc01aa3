//! Human-readable summaries for the terminal.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::demo::DemoReport;

/// The demo's summary: verdicts by outcome and action, anomalies by kind,
/// dead letters, and a few example verdicts with their reasons.
pub fn render(r: &DemoReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n== reconciler demo ==");
    let _ = writeln!(
        s,
        "published {} input records; {} distinct verdicts arrived ({} predicted by the core)\n",
        r.published,
        r.verdicts.len(),
        r.expected_verdicts
    );
    let mut by: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for v in &r.verdicts {
        *by.entry((v.outcome.as_str(), v.action.as_str())).or_default() += 1;
    }
    let _ = writeln!(s, "Verdicts by outcome / action");
    for ((o, a), n) in &by {
        let _ = writeln!(s, "  {o:<18} {a:<14} {n:>4}");
    }
    let _ = writeln!(s, "\nAnomalies by kind");
    for (k, n) in &r.anomalies {
        let _ = writeln!(s, "  {k:<24} {n:>4}");
    }
    let _ = writeln!(s, "\nDead letters: {}\n", r.dead_letters);
    let answers: Vec<String> = r.probe_answers.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let _ = writeln!(
        s,
        "Probe worker: {} PROBE requests answered by querying the demo's destination ({})\n",
        r.probe_answers.values().sum::<usize>(),
        if answers.is_empty() { "none".to_owned() } else { answers.join(", ") }
    );
    let _ = writeln!(s, "Example verdicts");
    let mut shown = std::collections::BTreeSet::new();
    for v in &r.verdicts {
        // One of each kind, telling apart the follow-ups that escalated and
        // the operations superseded by a newer version.
        let kind = (v.outcome, v.action, v.evidence.escalation, v.evidence.superseded_by.is_some());
        if shown.insert(kind) {
            let _ = writeln!(
                s,
                "  {} {}/{} [{}]\n    {}",
                v.operation_id,
                v.outcome.as_str(),
                v.action.as_str(),
                v.state.as_str(),
                v.reason
            );
        }
    }
    s
}

/// An error and its causes, each said once, for the terminal: library
/// errors often repeat their source in their own message ("metadata of t:
/// BrokerTransportFailure") and `{:#}` would print it again.
pub fn error_causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    /// A cause already said by the message that wraps it is not repeated.
    #[test]
    fn error_causes_are_said_once() {
        let e = anyhow::Error::msg("BrokerTransportFailure")
            .context("metadata of t: BrokerTransportFailure")
            .context("reading the DLQ");
        assert_eq!(super::error_causes(&e), "reading the DLQ: metadata of t: BrokerTransportFailure");
    }
}
