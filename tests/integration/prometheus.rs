//! The Prometheus deployment files: `promtool` accepts the scrape config and
//! the alert rules, the rules' unit tests pass, and every `reconciler_*`
//! metric the rules use is one the binary exports.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use reconciler::metrics::{Metrics, ProbeMetrics};

fn promtool(args: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("promtool is installed (scripts/setup.sh --tests installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_the_rules_and_the_config() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["check", "config", "prometheus.yml"]);
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    promtool(&["test", "rules", "alerts_test.yml"]);
}

#[test]
fn alert_rules_use_only_exported_metrics() {
    let rules = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml"))
        .expect("alerts.yml");
    let used: BTreeSet<String> =
        regex::Regex::new(r"reconciler_[a-z_]+").unwrap().find_iter(&rules).map(|m| m.as_str().to_owned()).collect();
    assert!(used.len() >= 8, "the rules cover accumulation, age, lag and readiness: {used:?}");
    let mut exported: BTreeSet<String> = Metrics::new(&[], 0).names().into_iter().collect();
    exported.extend(ProbeMetrics::new(&::prometheus::Registry::new(), []).names());
    exported.extend(reconciler::metrics::RelayMetrics::new(&::prometheus::Registry::new()).names());
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "alerts.yml uses metrics the binary does not export: {unknown:?}");
}
