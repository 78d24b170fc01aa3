//! The fleet view (issue 17) on the real broker: two instances in one
//! group, each announcing itself on the fleet topic. Each answers locally
//! only for the partitions it owns now; with `?scope=fleet` any of them
//! answers for both (the review queue merged, an operation explained and
//! resolved by its owner), and the panel on one instance resolves a case
//! the other owns, in headless Chromium.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use reconciler::clock::system_clock;
use reconciler::config::{Config, Mode};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{SourcePos, Status};
use reconciler::demo;
use reconciler::http::{AppState, Fleet, Server};
use reconciler::kafka::consumer::Ownership;
use reconciler::pipeline::Pipeline;
use reconciler::records::InputRecord;
use serde_json::Value;

use crate::common;
use common::http::request;
use common::wait_for;

const TOKEN: &str = "fleet-token-81c3";

/// One instance: pipeline, HTTP server and its part in the fleet.
struct Instance {
    url: String,
    metrics: Arc<reconciler::metrics::Metrics>,
    addr: SocketAddr,
    ownership: Ownership,
    shutdown: Arc<AtomicBool>,
    pipeline: Option<JoinHandle<()>>,
    server: Option<Server>,
    fleet: Option<Fleet>,
}

impl Instance {
    fn start(cfg: &Config, state_dir: std::path::PathBuf) -> Instance {
        let mut cfg = cfg.clone();
        cfg.state_dir = state_dir;
        let mut p = Pipeline::new(cfg.clone(), system_clock()).expect("pipeline starts");
        let state = AppState::of(&p, cfg.clone(), system_clock());
        let server = Server::start("127.0.0.1:0".parse().unwrap(), state.clone()).expect("server starts");
        let url = cfg.http.advertised(server.addr()).expect("a loopback address is advertised");
        let shutdown = Arc::new(AtomicBool::new(false));
        let fleet = Fleet::start(&state, url.clone(), shutdown.clone()).expect("joins the fleet");
        let ownership = p.ownership();
        let metrics = p.metrics();
        let flag = shutdown.clone();
        let pipeline = std::thread::spawn(move || p.run(&flag).expect("pipeline runs"));
        Instance {
            url,
            metrics,
            addr: server.addr(),
            ownership,
            shutdown,
            pipeline: Some(pipeline),
            server: Some(server),
            fleet: Some(fleet),
        }
    }

    /// `GET path` with the token (reads need it when one is configured).
    fn get(&self, path: &str) -> (u16, Value) {
        let auth = format!("Bearer {TOKEN}");
        let (code, text) = request(self.addr, "GET", path, &[("Authorization", &auth)], "");
        (code, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")))
    }

    fn owned(&self) -> BTreeSet<i32> {
        self.ownership.owned()
    }

    /// The value of metric `name` with `label` (name, value) if given.
    fn metric(&self, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let want = label.map(|(k, v)| format!("{k}=\"{v}\""));
        self.metrics.render().lines().find_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').map_or((series, ""), |(n, rest)| (n, rest));
            (n == name && want.as_ref().is_none_or(|w| labels.contains(w.as_str()))).then(|| value.parse().ok())?
        })
    }

    fn restores(&self, source: &str) -> f64 {
        self.metric("reconciler_partition_restores_total", Some(("source", source))).unwrap_or(0.0)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        if let Some(h) = self.pipeline.take() {
            let _ = h.join();
        }
        if let Some(f) = self.fleet.take() {
            f.join();
        }
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}

fn ids(cases: &Value) -> BTreeSet<String> {
    cases.as_array().unwrap().iter().map(|c| c["operation_id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn any_instance_answers_for_the_fleet_and_resolves_through_the_owner_also_in_chromium() {
    let _serial = common::serial();
    let mut cfg = common::config("fleet");
    cfg.mode = Mode::Act;
    cfg.time.reorder_window_ms = 3_600_000;
    cfg.http.token = Some(TOKEN.into());
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let records = demo::workload((system_clock())() - 60_000, 3);
    // The review queue the core leaves, computed without the pipeline.
    let mut engine = MemoryEngine::default();
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if let InputRecord::Event(ev) = r {
            engine.process(&cfg.policy(), ev.clone(), SourcePos { partition: 0, offset: i as i64 }, &mut out);
        }
    }
    let review: BTreeSet<String> =
        engine.ops.values().filter(|o| o.status == Status::ManualReview).map(|o| o.operation_id.clone()).collect();
    assert!(review.len() >= 6, "the demo workload leaves cases for review: {review:?}");

    let a = Instance::start(&cfg, common::temp_dir("fleet-a"));
    let b = Instance::start(&cfg, common::temp_dir("fleet-b"));
    demo::publish(&cfg, &records).unwrap();
    let partitions = cfg.topics.partitions as usize;
    assert!(
        wait_for(Duration::from_secs(90), || {
            let (oa, ob) = (a.owned(), b.owned());
            !oa.is_empty() && !ob.is_empty() && oa.len() + ob.len() == partitions
        }),
        "the two instances never shared the partitions"
    );
    // Both announced, with what they own now.
    assert!(
        wait_for(Duration::from_secs(30), || {
            let (code, f) = a.get("/api/fleet");
            code == 200 && {
                let live: Vec<(String, BTreeSet<i32>)> = f["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["live"] == true)
                    .map(|m| {
                        let owned = m["owned"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap() as i32).collect();
                        (m["url"].as_str().unwrap().to_owned(), owned)
                    })
                    .collect();
                live.len() == 2
                    && live.contains(&(a.url.clone(), a.owned()))
                    && live.contains(&(b.url.clone(), b.owned()))
            }
        }),
        "A's /api/fleet never listed both members with their partitions: {}",
        a.get("/api/fleet").1
    );

    // The fleet's queue, from either instance, is the whole queue, each
    // case tagged with its owner; locally each lists only its own.
    assert!(
        wait_for(Duration::from_secs(60), || ids(&a.get("/api/review?scope=fleet").1["cases"]) == review),
        "A's fleet queue {:?} is not the queue {review:?}",
        ids(&a.get("/api/review?scope=fleet").1["cases"])
    );
    let (_, fleet) = b.get("/api/review?scope=fleet");
    assert_eq!(ids(&fleet["cases"]), review, "B's fleet queue");
    let (_, local_a) = a.get("/api/review");
    let (_, local_b) = b.get("/api/review");
    let (la, lb) = (ids(&local_a), ids(&local_b));
    assert!(la.is_disjoint(&lb) && la.union(&lb).cloned().collect::<BTreeSet<_>>() == review, "{la:?} {lb:?}");
    for case in fleet["cases"].as_array().unwrap() {
        let owner = if la.contains(case["operation_id"].as_str().unwrap()) { &a.url } else { &b.url };
        assert_eq!(case["instance"].as_str(), Some(owner.as_str()), "{case}");
        let p = case["partition"].as_i64().unwrap() as i32;
        assert!((if owner == &a.url { a.owned() } else { b.owned() }).contains(&p), "{case}");
    }
    assert!(fleet["members"].as_array().unwrap().iter().all(|m| m["error"].is_null()), "{fleet}");
    // A case of B's: A does not present it as its own, but finds it in the
    // fleet.
    let theirs = lb.iter().next().expect("B owns a case").clone();
    let (code, body) = a.get(&format!("/api/operations/{theirs}"));
    assert_eq!(code, 404, "A answered for B's case: {body}");
    let (code, body) = a.get(&format!("/api/operations/{theirs}?scope=fleet"));
    assert_eq!((code, body["instance"].as_str()), (200, Some(b.url.as_str())), "{body}");
    assert_eq!(a.get("/api/review?scope=everywhere").0, 400);

    // Resolving B's case through A without the fleet scope is refused; with
    // it, A hands the decision to B, whose state takes it.
    let decide = |path: &str, auth: &str| {
        let body = r#"{"decision":"CLOSE","actor":"fleet-test","note":"resolved through A"}"#;
        request(a.addr, "POST", path, &[("Authorization", auth)], body)
    };
    let auth = format!("Bearer {TOKEN}");
    let (code, text) = decide(&format!("/api/operations/{theirs}/resolve"), &auth);
    assert_eq!(code, 404, "{text}");
    let (code, text) = decide(&format!("/api/operations/{theirs}/resolve?scope=fleet"), "Bearer wrong");
    assert_eq!(code, 401, "{text}");
    let (code, text) = decide(&format!("/api/operations/{theirs}/resolve?scope=fleet"), &auth);
    assert_eq!(code, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["instance"].as_str(), Some(b.url.as_str()), "{answer}");
    assert!(
        wait_for(Duration::from_secs(30), || b.get(&format!("/api/operations/{theirs}")).1["state"] == "CLOSED"),
        "B's state did not take the decision: {}",
        b.get(&format!("/api/operations/{theirs}")).1
    );

    // The panel on A resolves another case of B's, in headless Chromium.
    let other = lb
        .iter()
        .find(|id| **id != theirs && id.starts_with("rejected-"))
        .or_else(|| lb.iter().find(|id| **id != theirs));
    if let Some(op) = other {
        let result = common::http::drive_panel(&format!("http://{}/", a.addr), op, "CLOSE", TOKEN, "panel-fleet");
        assert!(result["applied"].as_str().unwrap().contains("CLOSED"), "{result}");
        let b_host = b.url.trim_start_matches("http://");
        assert!(result["row_text"].as_str().unwrap().contains(b_host), "the row names its owner {b_host}: {result}");
        assert!(
            wait_for(Duration::from_secs(30), || b.get(&format!("/api/operations/{op}")).1["state"] == "CLOSED"),
            "B's state did not take the panel's decision"
        );
    } else {
        panic!("B owns only one case: {lb:?}");
    }

    // The CLI asks the fleet the same way: the queue without the two cases
    // resolved above, and B's case explained by B.
    let config = common::child::write_config(&cfg, &common::temp_dir("fleet-cli"));
    let cli = |args: &[&str]| {
        // The members' reads need the fleet's token: the CLI's own config
        // gives it, from the environment.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_reconciler"))
            .env("RECONCILER_HTTP__TOKEN", TOKEN)
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "reconciler {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let resolved: BTreeSet<String> = [theirs.clone(), other.unwrap().clone()].into();
    let want: BTreeSet<String> = review.difference(&resolved).cloned().collect();
    assert!(
        wait_for(Duration::from_secs(30), || {
            let listed: Value = serde_json::from_str(&cli(&["review", "--fleet", "--json"])).unwrap();
            ids(&listed["cases"]) == want
        }),
        "`review --fleet` never listed the queue without the resolved cases"
    );
    let text = cli(&["review", "--fleet"]);
    assert!(text.contains(&a.url) && text.contains(&b.url), "{text}");
    let mine = lb.iter().find(|id| !resolved.contains(*id)).or_else(|| la.iter().next()).unwrap();
    let text = cli(&["explain", "--fleet", mine]);
    let owner = if lb.contains(mine) { &b.url } else { &a.url };
    assert!(text.starts_with(&format!("Owned by {owner}")) && text.contains(mine.as_str()), "{text}");
}

/// With `[consumer] standby_replicas = 1`, each of two instances tails the
/// changelog of the other's partitions. When A stops, B takes A's
/// partitions over from its standby state: caught up from where the
/// standby was (`reconciler_partition_restores_total{source="standby"}`),
/// not restored from the changelog's beginning nor replayed. The whole
/// run then equals the reference byte for byte, with B's final state the
/// reference state.
#[test]
fn a_standby_replica_takes_a_moved_partition_over_without_restoring_it() {
    let _serial = common::serial();
    let mut cfg = common::config("standby");
    cfg.consumer.standby_replicas = 1;
    cfg.time.reorder_window_ms = 2_000;
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let records = demo::workload((system_clock())(), 8);
    let part = |i: usize, n: usize| &records[records.len() * i / n..records.len() * (i + 1) / n];
    let caught_up = || common::check::caught_up(&cfg);
    let (dir_a, dir_b) = (common::temp_dir("standby-a"), common::temp_dir("standby-b"));
    common::logs::capture();
    let log = common::logs::mark();
    let a = Instance::start(&cfg, dir_a.clone());
    demo::publish(&cfg, part(0, 3)).unwrap();
    assert!(wait_for(Duration::from_secs(60), || a.owned().len() == 3 && caught_up()), "A did not catch up");
    let b = Instance::start(&cfg, dir_b.clone());
    assert!(
        wait_for(Duration::from_secs(90), || !a.owned().is_empty()
            && !b.owned().is_empty()
            && a.owned().len() + b.owned().len() == 3),
        "A and B never shared the partitions"
    );
    demo::publish(&cfg, part(1, 3)).unwrap();
    // B's standby of A's partitions has caught up with their changelog.
    let theirs = a.owned();
    let standby_current = || {
        b.metric("reconciler_standby_partitions", None) == Some(theirs.len() as f64)
            && b.metric("reconciler_standby_lag_records", None) == Some(0.0)
            && caught_up()
    };
    assert!(
        wait_for(Duration::from_secs(60), standby_current),
        "B's standby of A's partitions {theirs:?} never caught up (B owns {:?}); the fleet's log:\n{}\n{}",
        b.owned(),
        common::logs::since(log)
            .lines()
            .filter(|l| l.contains("tandby") || l.contains("ssign") || l.contains("evoked"))
            .collect::<Vec<_>>()
            .join("\n"),
        b.metrics.render()
    );
    let applied = b.metric("reconciler_standby_records_total", None).unwrap();
    assert!(applied > 0.0, "B's standby applied nothing");
    let before = |source: &str| b.restores(source);
    let (changelog_before, input_before, standby_before) = (before("changelog"), before("input"), before("standby"));

    // A leaves; B takes its partitions over from the standby state.
    drop(a);
    assert!(wait_for(Duration::from_secs(60), || b.owned().len() == 3), "B did not take A's partitions over");
    demo::publish(&cfg, part(2, 3)).unwrap();
    assert!(wait_for(Duration::from_secs(90), caught_up), "B did not catch up after the takeover");
    assert_eq!(
        b.restores("standby") - standby_before,
        theirs.len() as f64,
        "A's partitions taken over from the standby state"
    );
    assert_eq!(b.restores("changelog"), changelog_before, "a partition was restored from the changelog");
    assert_eq!(b.restores("input"), input_before, "a partition replayed the input");
    // Every timer of the workload fires within seconds: wait for them too.
    let verdicts = |cfg: &Config| common::check::read_all(cfg, &[&cfg.topics.verdicts]).len();
    let mut last = (verdicts(&cfg), std::time::Instant::now());
    assert!(
        wait_for(Duration::from_secs(60), || {
            let n = verdicts(&cfg);
            if n != last.0 {
                last = (n, std::time::Instant::now());
            }
            last.1.elapsed() > Duration::from_secs(5) && caught_up()
        }),
        "the verdicts never settled"
    );
    drop(b);
    let input = common::check::read_all(&cfg, &[&cfg.topics.events]);
    let outputs = common::check::read_all(&cfg, &common::check::output_topics(&cfg));
    let mut f = common::check::check(&cfg, &input, &outputs, &[&dir_a, &dir_b]);
    f.iterations = 1;
    f.print(&format!(
        "standby takeover ({} partitions from the standby state, {applied} standby records)",
        theirs.len()
    ));
    assert_eq!((f.losses, f.divergent), (0, 0));
}
