//! `reconciler demo` as a newcomer meets it (issue 21): after its summary
//! the pipeline and its exception panel stay up with the demo's state
//! until Ctrl-C, and the panel shows a case of every outcome the demo's
//! verdicts end in.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reconciler::codec::Codec;

#[test]
fn the_demo_keeps_its_panel_up_until_ctrl_c_with_a_case_of_each_outcome_in_headless_chromium() {
    // Topics of its own on the suites' broker; the panel on a free port.
    let cfg = common::config("demo");
    let dir = common::temp_dir("demo-run");
    let file = common::child::write_config(&cfg, &dir);
    let mut toml = std::fs::read_to_string(&file).unwrap();
    toml.push_str("[http]\nbind = \"127.0.0.1:0\"\n");
    std::fs::write(&file, toml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_reconciler"))
        .arg("--config")
        .arg(&file)
        .arg("demo")
        .env("RECONCILER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines, seen) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // The summary, then the panel's address.
    let mut printed = Vec::new();
    let panel = loop {
        let line = seen
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no panel address within 120 s; printed:\n{}", printed.join("\n")));
        printed.push(line.clone());
        if let Some(url) = line.trim().strip_prefix("exception panel") {
            break url.trim().to_owned();
        }
    };
    let out = printed.join("\n");
    assert!(out.contains("Verdicts by outcome"), "the summary came first:\n{out}");
    assert!(
        out.contains("/metrics") || seen.recv_timeout(Duration::from_secs(5)).is_ok_and(|l| l.contains("/metrics"))
    );

    // One operation per outcome its verdicts end in, from the verdict topic.
    let codec = Codec::new();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for r in common::check::read_all(&cfg, &[&cfg.topics.verdicts]) {
        if let Some(v) = r.value.as_deref().and_then(|b| codec.decode_verdict(b).ok()) {
            last.insert(v.operation_id.clone(), v.outcome.as_str().to_owned());
        }
    }
    let mut cases: BTreeMap<String, String> = BTreeMap::new();
    for (op, outcome) in &last {
        cases.entry(outcome.clone()).or_insert_with(|| op.clone());
    }
    let outcomes: Vec<String> = cases.keys().cloned().collect();
    assert_eq!(
        outcomes,
        ["AMBIGUOUS", "CORRECT", "DIVERGENT", "DUPLICATE_EFFECT", "MISSING", "NOT_APPLICABLE"],
        "the demo's verdicts end in every kind of outcome"
    );
    let cases: Vec<(String, String)> = cases.into_iter().map(|(outcome, op)| (op, outcome)).collect();
    let result = common::http::drive_demo_panel(&panel, &cases, "demo-panel");
    assert_eq!(result["ok"], true, "{result}");
    assert!(result["queue_rows"].as_u64().unwrap_or(0) > 0, "{result}");
    for (_, outcome) in &cases {
        assert_eq!(result["outcomes"][outcome]["shown"], outcome.as_str(), "{result}");
    }

    // Ctrl-C stops it cleanly.
    let interrupted = Command::new("kill").arg("-INT").arg(child.id().to_string()).status().unwrap();
    assert!(interrupted.success());
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let rest: Vec<String> = seen.try_iter().collect();
    assert!(status.success(), "the demo exits 0 on Ctrl-C: {status}; printed:\n{}", rest.join("\n"));
    assert!(rest.iter().any(|l| l.contains("Stopping the demo")), "{rest:?}");
    println!("demo panel: {} outcomes shown ({outcomes:?}), {} queue rows", cases.len(), result["queue_rows"]);
}
