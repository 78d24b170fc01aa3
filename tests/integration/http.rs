//! The HTTP server of `run` against the real broker: `/metrics` counts what
//! a known run did (checked against an independent replay of the input
//! through the in-memory core, and against the output topics), the state
//! gauges are right after a restart, `/readyz` waits for restoration, the
//! endpoints that change state want the bearer token, the operator API
//! returns explain/review JSON, and the exception panel works in Chromium.

use crate::common;
use common::http::request;
use common::wait_for;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use reconciler::clock::system_clock;
use reconciler::codec::{validate_key, Codec};
use reconciler::config::{Config, Mode};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{Body, Output, SourcePos, Status};
use reconciler::demo;
use reconciler::http::{AppState, Server};
use reconciler::kafka::reader::TopicReader;
use reconciler::metrics::ProbeMetrics;
use reconciler::pipeline::Pipeline;
use reconciler::records::InputRecord;

const TOKEN: &str = "test-token-5f2a";

fn now() -> i64 {
    (system_clock())()
}

/// A pipeline with its HTTP server, the server started before the loop.
struct Served {
    /// What reads send: the configured token's `Authorization`.
    auth: Option<String>,
    server: Option<Server>,
    shutdown: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Served {
    fn start(cfg: &Config) -> Served {
        let mut p = Pipeline::new(cfg.clone(), system_clock()).expect("pipeline starts");
        // The probe worker's metrics, registered beside the pipeline's as
        // `run` does with `[probe] enabled` (the dashboard has probe panels).
        ProbeMetrics::new(p.metrics().registry(), ["crm".to_owned()]);
        let state = AppState::of(&p, cfg.clone(), system_clock());
        let server = Server::start("127.0.0.1:0".parse().unwrap(), state).expect("server starts");
        // Before the loop runs nothing is restored: never ready.
        let (code, body) = request(server.addr(), "GET", "/readyz", &[], "");
        assert_eq!(code, 503, "ready before the pipeline ran: {body}");
        let shutdown = Arc::new(AtomicBool::new(false));
        let flag = shutdown.clone();
        let handle = std::thread::spawn(move || p.run(&flag).expect("pipeline runs"));
        Served { auth: cfg.http.read_authorization(), server: Some(server), shutdown, handle: Some(handle) }
    }

    fn addr(&self) -> SocketAddr {
        self.server.as_ref().unwrap().addr()
    }

    /// `GET path` with the configured token (reads need it).
    fn get(&self, path: &str) -> (u16, String) {
        let auth: Vec<(&str, &str)> = self.auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        request(self.addr(), "GET", path, &auth, "")
    }

    fn metrics(&self) -> Samples {
        let (code, text) = self.get("/metrics");
        assert_eq!(code, 200);
        Samples::parse(&text)
    }

    fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().expect("pipeline thread");
        }
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Parsed Prometheus text: (name, labels) → value.
struct Samples(Vec<(String, BTreeMap<String, String>, f64)>);

impl Samples {
    fn parse(text: &str) -> Samples {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let (series, value) = line.rsplit_once(' ').expect("name value");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("label=value");
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            out.push((name.to_owned(), labels, value.parse().expect("a number")));
        }
        Samples(out)
    }

    /// Sum of the series of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, v)| v)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _, _)| n == name || n.strip_prefix(name).is_some_and(|s| s.starts_with('_')))
    }

    /// Label values → value, of `name`, keyed by the values of `keys`.
    fn by(&self, name: &str, keys: &[&str]) -> BTreeMap<Vec<String>, f64> {
        self.0
            .iter()
            .filter(|(n, _, v)| n == name && *v != 0.0)
            .map(|(_, l, v)| (keys.iter().map(|k| l.get(*k).cloned().unwrap_or_default()).collect(), *v))
            .collect()
    }
}

/// The demo workload with no timer due during the test: windows of five
/// minutes and a reorder window of an hour, events stamped a minute ago.
fn quiet_config(name: &str) -> Config {
    let mut cfg = common::config(name);
    cfg.mode = Mode::Act;
    cfg.time.reorder_window_ms = 3_600_000;
    cfg.metrics.refresh_ms = 100;
    cfg.http.token = Some(TOKEN.into());
    cfg
}

/// What the core makes of `records`, computed without the pipeline.
#[derive(Default)]
struct Expected {
    results: BTreeMap<String, f64>,
    verdicts: BTreeMap<Vec<String>, f64>,
    anomalies: BTreeMap<Vec<String>, f64>,
    commands: BTreeMap<Vec<String>, f64>,
    failures: BTreeMap<Vec<String>, f64>,
    retries: BTreeMap<Vec<String>, f64>,
    confirm_count: BTreeMap<Vec<String>, f64>,
    confirm_sum: BTreeMap<String, f64>,
    manual: BTreeMap<Vec<String>, f64>,
    states: BTreeMap<Vec<String>, f64>,
    review: BTreeMap<Vec<String>, f64>,
    review_since: HashMap<String, i64>,
    requested_min: HashMap<String, i64>,
    engine: MemoryEngine,
}

fn expect(cfg: &Config, records: &[InputRecord]) -> Expected {
    let policy = cfg.policy();
    let codec = Codec::new();
    let mut x = Expected::default();
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let InputRecord::Event(ev) = r else {
            *x.results.entry("dead_lettered".into()).or_default() += 1.0;
            continue;
        };
        // The demo's events are valid under their own key.
        let bytes = codec.encode_event(ev).unwrap();
        validate_key(Some(ev.entity_id.as_bytes()), &codec.decode_event(&bytes).unwrap()).unwrap();
        let class = match &ev.body {
            Body::AttemptFailed { error_class, error_code, .. } => {
                Some((format!("{error_class:?}").to_ascii_uppercase(), error_code.clone()))
            }
            _ => None,
        };
        let op = ev.operation_id.clone();
        let d = x.engine.process(&policy, ev.clone(), SourcePos { partition: 0, offset: i as i64 }, &mut out);
        *x.results.entry(d.as_str().into()).or_default() += 1.0;
        if let (reconciler::core::Disposition::Applied, Some((class, code))) = (d, class) {
            let next = if x.engine.ops[&op].status == Status::ManualReview { "review" } else { "retry" };
            *x.failures.entry(vec![class, next.into()]).or_default() += 1.0;
            if next == "retry" {
                *x.retries.entry(vec![code]).or_default() += 1.0;
            }
        }
    }
    for o in &out {
        match o {
            Output::Verdict(v) => {
                if let Some(m) = &v.evidence.manual_decision {
                    *x.manual.entry(vec![format!("{:?}", m.decision).to_ascii_uppercase()]).or_default() += 1.0;
                }
                let key = vec![v.outcome.as_str().into(), v.action.as_str().into(), v.operation_type.clone()];
                *x.verdicts.entry(key).or_default() += 1.0;
                if v.outcome == reconciler::core::Outcome::Correct && v.state == Status::Confirmed {
                    *x.confirm_count.entry(vec![v.operation_type.clone()]).or_default() += 1.0;
                    *x.confirm_sum.entry(v.operation_type.clone()).or_default() +=
                        (v.decided_at - v.evidence.requested_at.unwrap()) as f64 / 1000.0;
                }
            }
            Output::Anomaly(a) => *x.anomalies.entry(vec![a.kind.as_str().into()]).or_default() += 1.0,
            Output::Command(c) => {
                *x.commands.entry(vec![format!("{:?}", c.action).to_ascii_uppercase()]).or_default() += 1.0
            }
        }
    }
    for op in x.engine.ops.values() {
        *x.states.entry(vec![op.status.as_str().into()]).or_default() += 1.0;
        if op.status == Status::ManualReview {
            *x.review.entry(vec![op.operation_type.clone()]).or_default() += 1.0;
            let since = op.review_since.unwrap();
            let e = x.review_since.entry(op.operation_type.clone()).or_insert(since);
            *e = (*e).min(since);
        }
        if op.awaits_evidence() {
            let at = op.request.as_ref().unwrap().requested_at;
            let e = x.requested_min.entry(op.operation_type.clone()).or_insert(at);
            *e = (*e).min(at);
        }
    }
    x
}

/// The state gauges agree with the expected state at some sample taken
/// between `t0` and `t1` (ages are bounded by when the sample could be taken).
fn state_gauges_match(m: &Samples, x: &Expected, t0: i64, t1: i64) -> bool {
    let ages_ok = |name: &str, at: &HashMap<String, i64>| {
        at.iter().all(|(ty, at)| {
            let age = m.sum(name, &[("type", ty)]);
            age >= (t0 - at) as f64 / 1000.0 - 0.001 && age <= (t1 - at) as f64 / 1000.0 + 0.001
        })
    };
    m.by("reconciler_operations", &["state"]) == x.states
        && m.by("reconciler_review_open", &["type"]) == x.review
        && ages_ok("reconciler_review_oldest_age_seconds", &x.review_since)
        && ages_ok("reconciler_oldest_unconfirmed_age_seconds", &x.requested_min)
}

#[test]
fn metrics_count_what_a_known_run_did_and_state_gauges_survive_a_restart() {
    let _serial = common::serial();
    let cfg = quiet_config("http-metrics");
    let start = now() - 60_000;
    let records = demo::workload(start, 2);
    let x = expect(&cfg, &records);
    let total = records.len() as f64;
    assert!(x.review.values().sum::<f64>() >= 3.0, "the workload leaves review cases");

    let served = Served::start(&cfg);
    demo::publish(&cfg, &records).unwrap();
    let settled = wait_for(Duration::from_secs(60), || {
        let m = served.metrics();
        m.sum("reconciler_events_total", &[]) >= total
            && m.sum("reconciler_consumer_lag", &[]) == 0.0
            && m.by("reconciler_consumer_lag", &["partition"]).is_empty()
            && m.sum("reconciler_state_scan_operations", &[]) == x.engine.ops.len() as f64
    });
    let m = served.metrics();
    assert!(settled, "the run did not settle: {:?}", m.by("reconciler_events_total", &["result"]));

    // Counters: the same as the independent replay through the core.
    let results: BTreeMap<String, f64> =
        m.by("reconciler_events_total", &["result"]).into_iter().map(|(k, v)| (k[0].clone(), v)).collect();
    assert_eq!(results, x.results, "events by result");
    assert_eq!(m.by("reconciler_verdicts_total", &["outcome", "action", "type"]), x.verdicts);
    assert_eq!(m.by("reconciler_anomalies_total", &["kind"]), x.anomalies);
    assert_eq!(m.by("reconciler_repair_commands_total", &["action"]), x.commands);
    assert_eq!(m.by("reconciler_attempt_failures_total", &["error_class", "next"]), x.failures);
    assert_eq!(m.by("reconciler_retries_by_cause_total", &["error_code"]), x.retries);
    assert!(!x.failures.is_empty() && !x.commands.is_empty() && !x.confirm_count.is_empty() && !x.retries.is_empty());
    assert_eq!(m.by("reconciler_time_to_confirm_seconds_count", &["type"]), x.confirm_count);
    for (ty, secs) in &x.confirm_sum {
        assert!((m.sum("reconciler_time_to_confirm_seconds_sum", &[("type", ty)]) - secs).abs() < 1e-6);
    }
    assert_eq!(m.by("reconciler_manual_decisions_total", &["decision"]), x.manual);
    assert!(!x.manual.is_empty(), "the demo closes a review case by hand");
    assert_eq!(m.sum("reconciler_batch_records_sum", &[]), total);
    assert!(m.sum("reconciler_batch_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(m.sum("reconciler_timers_fired_total", &[]), 0.0, "no deadline was due");

    // Dead letters: by class, as the DLQ topic's provenance headers say.
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.dlq], cfg.topics.partitions).unwrap();
    let want_dlq = x.results["dead_lettered"] as usize;
    assert!(reader.read_until(Duration::from_secs(20), |r| r.len() >= want_dlq));
    let mut classes: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    for r in reader.of(&cfg.topics.dlq) {
        let class = r.headers.iter().find(|(k, _)| k == "reconciler.error.class").unwrap().1.clone().unwrap();
        *classes.entry(vec![String::from_utf8(class).unwrap()]).or_default() += 1.0;
    }
    assert_eq!(m.by("reconciler_dead_letters_total", &["class"]), classes);

    // State gauges, readiness and the rest.
    let t = now();
    assert!(wait_for(Duration::from_secs(10), || state_gauges_match(&served.metrics(), &x, start, now())));
    let m = served.metrics();
    assert_eq!(m.sum("reconciler_ready", &[]), 1.0);
    assert_eq!(m.sum("reconciler_partitions_owned", &[]), 3.0);
    assert_eq!(m.sum("reconciler_outbox_pending", &[]), 0.0);
    for ty in x.requested_min.keys() {
        assert_eq!(m.sum("reconciler_confirm_window_seconds", &[("type", ty)]), 300.0);
    }
    let names = reconciler::metrics::Metrics::new(&[], 0).names();
    for name in &names {
        assert!(m.has(name), "/metrics does not expose {name}");
    }
    // Every series the Grafana dashboard and the alert rules query is one
    // this run exposes, by its exact name (histograms by `_bucket`).
    let metric = regex::Regex::new(r"reconciler_[a-z_]+").unwrap();
    for file in ["deploy/grafana/reconciler.json", "deploy/prometheus/alerts.yml"] {
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        let used: std::collections::BTreeSet<&str> = metric.find_iter(&text).map(|x| x.as_str()).collect();
        assert!(used.len() >= 8, "{file} queries too little: {used:?}");
        // The relay's series are on `reconciler relay`'s own /metrics.
        let relay = reconciler::metrics::RelayMetrics::new(&::prometheus::Registry::new()).names();
        for name in used {
            if name.starts_with("reconciler_relay_") {
                assert!(relay.iter().any(|n| n == name), "{file} queries {name}, which the relay does not export");
                continue;
            }
            assert!(m.0.iter().any(|(n, _, _)| n == name), "{file} queries {name}, which /metrics does not expose");
        }
    }
    served.stop();

    // A new process on the same state: counters start again, the state
    // gauges are read from the store and are the same as before.
    let served = Served::start(&cfg);
    let restarted = now();
    assert!(
        wait_for(Duration::from_secs(30), || state_gauges_match(&served.metrics(), &x, t, now())),
        "after a restart the state gauges differ: {:?}",
        served.metrics().by("reconciler_operations", &["state"])
    );
    let m = served.metrics();
    assert_eq!(m.sum("reconciler_events_total", &[]), 0.0, "nothing was consumed twice");
    assert!(restarted > t);
}

#[test]
fn readyz_is_not_ready_until_the_backlog_of_owned_partitions_is_restored() {
    let _serial = common::serial();
    let mut cfg = quiet_config("http-ready");
    cfg.consumer.batch_size = 200;
    let records = demo::workload(now() - 60_000, 60);
    let backlog = records.len() as f64;
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, t.replication_factor).unwrap();
    demo::publish(&cfg, &records).unwrap();

    let served = Served::start(&cfg);
    let mut samples = Vec::new();
    let ready = wait_for(Duration::from_secs(60), || {
        let (code, body) = served.get("/readyz");
        let after = served.metrics().sum("reconciler_events_total", &[]);
        samples.push((code, after));
        if code == 200 {
            // Ready happened before `after` was read: the backlog was in.
            assert!(after >= backlog, "ready with {after} of {backlog} records applied: {body}");
        } else {
            assert_eq!(code, 503, "{body}");
            assert!(body.contains("\"ready\":false"), "{body}");
        }
        code == 200
    });
    assert!(ready, "never ready; samples {samples:?}");
    assert_eq!(served.get("/healthz").0, 200);
}

#[test]
fn endpoints_that_change_state_require_the_bearer_token() {
    let _serial = common::serial();
    let cfg = quiet_config("http-auth");
    let served = Served::start(&cfg);
    let body = r#"{"decision":"CLOSE","actor":"a","note":"n"}"#;
    for path in ["/api/operations/op-1/resolve", "/api/dlq/redrive"] {
        let (code, text) = request(served.addr(), "POST", path, &[], body);
        assert_eq!(code, 401, "{path} without a token: {text}");
        assert!(text.contains("missing bearer token"), "{text}");
        let (code, text) = request(served.addr(), "POST", path, &[("Authorization", "Bearer wrong")], body);
        assert_eq!(code, 401, "{path} with a wrong token: {text}");
        let (code, _) = request(served.addr(), "POST", path, &[("Authorization", TOKEN)], body);
        assert_eq!(code, 401, "{path} without the Bearer scheme");
        // Issue 18: a page of another origin may not change state, even
        // with the token; the panel's own origin may.
        let auth = format!("Bearer {TOKEN}");
        let foreign = [("Authorization", auth.as_str()), ("Origin", "https://evil.example")];
        let (code, text) = request(served.addr(), "POST", path, &foreign, body);
        assert_eq!(code, 403, "{path} from another origin: {text}");
        assert!(text.contains("CSRF"), "{text}");
        let cross = [("Authorization", auth.as_str()), ("Sec-Fetch-Site", "cross-site")];
        assert_eq!(request(served.addr(), "POST", path, &cross, body).0, 403, "{path} cross-site");
        let own = format!("http://{}", served.addr());
        let same = [("Authorization", auth.as_str()), ("Origin", own.as_str()), ("Sec-Fetch-Site", "same-origin")];
        let (code, text) = request(served.addr(), "POST", path, &same, body);
        assert!(code != 403 && code != 401, "{path} from its own origin is let through: {code} {text}");
        // A body over the limit is refused before it is read.
        let big = format!(r#"{{"decision":"CLOSE","actor":"a","note":"{}"}}"#, "n".repeat(70 * 1024));
        let (code, text) = request(served.addr(), "POST", path, &[("Authorization", auth.as_str())], &big);
        assert_eq!(code, 413, "{path} with a 70 KiB body: {text}");
    }
    served.stop();

    // Behind a proxy that names the caller: the actor is the caller.
    let mut cfg = quiet_config("http-actor");
    cfg.http.actor_header = Some("X-Forwarded-User".into());
    let served = Served::start(&cfg);
    let auth = format!("Bearer {TOKEN}");
    let path = "/api/operations/op-1/resolve";
    let (code, text) = request(served.addr(), "POST", path, &[("Authorization", &auth)], body);
    assert_eq!(code, 401, "no caller named: {text}");
    assert!(text.contains("X-Forwarded-User"), "{text}");
    let as_bob = [("Authorization", auth.as_str()), ("X-Forwarded-User", "bob")];
    let (code, text) = request(served.addr(), "POST", path, &as_bob, body);
    assert_eq!(code, 403, "bob may not decide as a: {text}");
    let as_a = [("Authorization", auth.as_str()), ("X-Forwarded-User", "a")];
    let (code, text) = request(served.addr(), "POST", path, &as_a, body);
    assert_eq!(code, 404, "the caller named in the body: past the checks, op-1 is unknown: {text}");
    served.stop();

    // No token configured: the endpoints are off, whatever is sent.
    let mut cfg = quiet_config("http-auth-off");
    cfg.http.token = None;
    let served = Served::start(&cfg);
    let auth = format!("Bearer {TOKEN}");
    for path in ["/api/operations/op-1/resolve", "/api/dlq/redrive"] {
        let (code, text) = request(served.addr(), "POST", path, &[("Authorization", &auth)], body);
        assert_eq!(code, 403, "{text}");
        assert!(text.contains("no http.token is configured"), "{text}");
    }
}

/// With a token configured, the endpoints that read want it too (or the
/// read token, which grants reads only); the probes' and the scraper's
/// endpoints and the panel's static files stay open. Without any token,
/// reads are open.
#[test]
fn reads_require_a_token_when_one_is_configured() {
    const READ_TOKEN: &str = "read-token-77c1";
    let _serial = common::serial();
    let mut cfg = quiet_config("http-read-auth");
    cfg.http.read_token = Some(READ_TOKEN.into());
    let served = Served::start(&cfg);
    assert!(wait_for(Duration::from_secs(30), || served.get("/readyz").0 == 200), "never ready");
    let reads = ["/api/review", "/api/review?scope=fleet", "/api/operations/op-1", "/api/dlq", "/api/fleet"];
    let (token, read_token) = (format!("Bearer {TOKEN}"), format!("Bearer {READ_TOKEN}"));
    for path in reads {
        let (code, text) = request(served.addr(), "GET", path, &[], "");
        assert_eq!(code, 401, "{path} without a token: {text}");
        assert!(text.contains("missing bearer token"), "{text}");
        let (code, text) = request(served.addr(), "GET", path, &[("Authorization", "Bearer wrong")], "");
        assert_eq!(code, 401, "{path} with a wrong token: {text}");
        for auth in [&token, &read_token] {
            let (code, text) = request(served.addr(), "GET", path, &[("Authorization", auth)], "");
            assert!(code != 401 && code != 403, "{path} with {auth}: {code} {text}");
        }
    }
    // The answers themselves, with either token.
    for auth in [&token, &read_token] {
        for path in ["/api/review", "/api/dlq", "/api/fleet"] {
            assert_eq!(request(served.addr(), "GET", path, &[("Authorization", auth)], "").0, 200, "{path}");
        }
    }
    // The read token changes nothing.
    let body = r#"{"decision":"CLOSE","actor":"a","note":"n"}"#;
    let (code, text) =
        request(served.addr(), "POST", "/api/operations/op-1/resolve", &[("Authorization", &read_token)], body);
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("reads only"), "{text}");
    // Probes, the scraper and the panel's files need nothing.
    for path in ["/healthz", "/readyz", "/metrics", "/", "/panel.js", "/panel.css"] {
        assert_eq!(request(served.addr(), "GET", path, &[], "").0, 200, "{path}");
    }
    served.stop();

    let mut cfg = quiet_config("http-read-open");
    cfg.http.token = None;
    let served = Served::start(&cfg);
    for path in ["/api/review", "/api/dlq", "/api/fleet"] {
        assert_eq!(request(served.addr(), "GET", path, &[], "").0, 200, "{path} with no token configured");
    }
    served.stop();
}

/// `/api/dlq` reads the outbox's database (the services' own) through a
/// bounded pool: a burst of concurrent reads leaves at most
/// `outbox::POOL_SIZE` connections open, kept for the next reads, instead
/// of opening one per request.
#[test]
fn the_dead_letter_monitor_reads_the_outbox_through_a_bounded_pool() {
    let _serial = common::serial();
    let pg = common::postgres::PgCluster::start();
    pg.execute(reconciler::outbox::SCHEMA);
    let mut cfg = quiet_config("http-dlq-pool");
    cfg.relay.connection_env = format!("DLQ_POOL_TEST_DB_{}", std::process::id());
    std::env::set_var(&cfg.relay.connection_env, pg.connection());
    let served = Served::start(&cfg);
    let others =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    assert_eq!(pg.number(others), 0);
    std::thread::scope(|s| {
        let reads: Vec<_> = (0..8).map(|_| s.spawn(|| served.get("/api/dlq"))).collect();
        for r in reads {
            let (code, text) = r.join().unwrap();
            assert_eq!(code, 200, "{text}");
            assert_eq!(json(&text)["outbox"]["available"], true, "{text}");
        }
    });
    let open = pg.number(others);
    assert!(
        (1..=reconciler::outbox::POOL_SIZE as i64).contains(&open),
        "{open} connections after 8 concurrent reads (pool of {})",
        reconciler::outbox::POOL_SIZE
    );
    served.stop();
}

/// Publishes the quiet demo workload and waits until all of it is applied.
fn served_workload(name: &str) -> (Config, Served, Expected, Vec<InputRecord>) {
    served_workload_of(quiet_config(name))
}

fn served_workload_of(cfg: Config) -> (Config, Served, Expected, Vec<InputRecord>) {
    let records = demo::workload(now() - 60_000, 1);
    let x = expect(&cfg, &records);
    let served = Served::start(&cfg);
    demo::publish(&cfg, &records).unwrap();
    let total = records.len() as f64;
    assert!(
        wait_for(Duration::from_secs(60), || served.metrics().sum("reconciler_events_total", &[]) >= total),
        "the workload was not applied"
    );
    (cfg, served, x, records)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The verdicts of the verdict topic for `operation_id`, waiting until
/// `done` accepts them.
fn verdicts_for(
    cfg: &Config,
    operation_id: &str,
    done: impl Fn(&[reconciler::core::Verdict]) -> bool,
) -> Vec<reconciler::core::Verdict> {
    let codec = Codec::new();
    let mut reader = TopicReader::new(&cfg.kafka, &[&cfg.topics.verdicts], cfg.topics.partitions).unwrap();
    let decode = |recs: &[reconciler::records::Record]| -> Vec<reconciler::core::Verdict> {
        recs.iter()
            .filter_map(|r| codec.decode_verdict(r.value.as_deref()?).ok())
            .filter(|v| v.operation_id == operation_id)
            .collect()
    };
    reader.read_until(Duration::from_secs(30), |recs| done(&decode(recs)));
    decode(&reader.of(&cfg.topics.verdicts).cloned().collect::<Vec<_>>())
}

#[test]
fn operator_api_explains_reviews_and_resolves_through_the_log() {
    let _serial = common::serial();
    let (cfg, served, x, records) = served_workload("http-api");
    let auth = format!("Bearer {TOKEN}");

    // The review queue: exactly the operations the core left in review.
    let (code, text) = served.get("/api/review");
    assert_eq!(code, 200, "{text}");
    let queue = json(&text);
    let mut ids: Vec<&str> = queue.as_array().unwrap().iter().map(|c| c["operation_id"].as_str().unwrap()).collect();
    ids.sort();
    let mut want: Vec<&str> =
        x.engine.ops.values().filter(|o| o.status == Status::ManualReview).map(|o| o.operation_id.as_str()).collect();
    want.sort();
    assert_eq!(ids, want);
    for case in queue.as_array().unwrap() {
        assert!(case["age_ms"].as_i64().unwrap() >= 0 && case["entity_id"].is_string(), "{case}");
        assert!(!case["reason"].as_str().unwrap().is_empty() && case["recommended_action"].is_string(), "{case}");
    }
    let (_, text) = served.get("/api/review?outcome=DIVERGENT");
    let divergent = json(&text);
    assert_eq!(divergent.as_array().unwrap().len(), 1, "{divergent}");
    assert_eq!(divergent[0]["operation_id"], "divergent-0");
    let (_, text) = served.get("/api/review?type=no_such_type");
    assert_eq!(json(&text), serde_json::json!([]));
    let (_, text) = served.get("/api/review?older_than=1d");
    assert_eq!(json(&text), serde_json::json!([]), "every case entered review about a minute ago");
    let ids_of = |path: &str| -> Vec<String> {
        let mut v: Vec<String> = json(&served.get(path).1)
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["operation_id"].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids_of("/api/review?older_than=10s"), ids_of("/api/review"));
    assert_eq!(served.get("/api/review?outcome=WRONG").0, 400);
    assert_eq!(served.get("/api/review?older_than=soon").0, 400);

    // Explain: state, evidence and the timeline of what arrived.
    let (code, text) = served.get("/api/operations/divergent-0");
    assert_eq!(code, 200, "{text}");
    let op = json(&text);
    assert_eq!(op["state"], "MANUAL_REVIEW");
    assert_eq!(op["expected"]["version"], 7);
    assert_eq!(op["observed"]["version"], 8);
    let arrived =
        records.iter().filter(|r| matches!(r, InputRecord::Event(e) if e.operation_id == "divergent-0")).count();
    assert_eq!(op["timeline"].as_array().unwrap().len(), arrived, "{op}");
    assert!(op["timeline"][0]["offset"].is_i64());
    let allowed: Vec<&str> = op["allowed_decisions"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(allowed.contains(&"CONFIRM") && !allowed.contains(&"COMPENSATE"), "{allowed:?}");
    assert_eq!(served.get("/api/operations/no-such-op").0, 404);

    // Resolve: refused decisions and bad bodies are told apart; a good one
    // goes through the log and comes back as a verdict.
    let post = |body: &str| {
        request(served.addr(), "POST", "/api/operations/divergent-0/resolve", &[("Authorization", &auth)], body)
    };
    let (code, text) = post(r#"{"decision":"COMPENSATE","actor":"api-test","note":"n"}"#);
    assert_eq!(code, 409, "{text}");
    let (code, text) = post(r#"{"decision":"CONFIRM","actor":" ","note":"n"}"#);
    assert_eq!(code, 400, "{text}");
    let (code, text) = post(r#"{"decision":"MAYBE","actor":"a","note":"n"}"#);
    assert_eq!(code, 400, "{text}");
    let (code, text) = request(
        served.addr(),
        "POST",
        "/api/operations/no-such-op/resolve",
        &[("Authorization", &auth)],
        r#"{"decision":"CONFIRM","actor":"a","note":"n"}"#,
    );
    assert_eq!(code, 404, "{text}");
    let (code, text) = post(
        r#"{"decision":"confirm","actor":"api-test","note":"v8 is right: the CRM applied a later fix","evidence_checked":["crm"]}"#,
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(json(&text)["published"], true);

    let verdicts = verdicts_for(&cfg, "divergent-0", |vs| vs.iter().any(|v| v.evidence.manual_decision.is_some()));
    let decided = verdicts.iter().find(|v| v.evidence.manual_decision.is_some()).expect("a verdict for the decision");
    assert_eq!((decided.outcome.as_str(), decided.state.as_str()), ("CORRECT", "CONFIRMED"));
    assert_eq!(decided.evidence.manual_decision.as_ref().unwrap().actor, "api-test");
    assert!(wait_for(Duration::from_secs(10), || json(&served.get("/api/operations/divergent-0").1)["state"]
        == "CONFIRMED"));
    let op = json(&served.get("/api/operations/divergent-0").1);
    let last = op["timeline"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["manual"]["actor"], "api-test", "{last}");
    assert!(!json(&served.get("/api/review").1).as_array().unwrap().iter().any(|c| c["operation_id"] == "divergent-0"));

    // Re-drive: a dry run says what would go; a real one puts the dead
    // letters back into the input, where (still null) they are
    // dead-lettered again.
    let redrive = |body: &str| request(served.addr(), "POST", "/api/dlq/redrive", &[("Authorization", &auth)], body);
    let (code, text) = redrive(r#"{"dry_run":true}"#);
    assert_eq!(code, 400, "a re-drive must say what to take: {text}");
    assert_eq!(redrive(r#"{"positions":["zero"]}"#).0, 400);
    let nulls = served.metrics().sum("reconciler_dead_letters_total", &[("class", "null_value")]);
    assert!(nulls >= 1.0);
    let (code, text) = redrive(r#"{"class":"null_value","dry_run":true}"#);
    assert_eq!(code, 200, "a dry run needs no actor: {text}");
    let (code, text) = redrive(r#"{"class":"null_value"}"#);
    assert_eq!(code, 400, "a re-drive must say who re-drives: {text}");
    let (code, text) = redrive(r#"{"class":"null_value","dry_run":true,"actor":"api-test"}"#);
    assert_eq!(code, 200, "{text}");
    let report = json(&text);
    assert_eq!((report["dry_run"].as_bool(), report["sent"].as_f64()), (Some(true), Some(nulls)), "{report}");
    let (code, text) = redrive(r#"{"class":"null_value","actor":"api-test","note":"producer fixed"}"#);
    assert_eq!(code, 200, "{text}");
    assert_eq!(json(&text)["sent"].as_f64(), Some(nulls), "{text}");
    assert!(
        wait_for(Duration::from_secs(30), || served
            .metrics()
            .sum("reconciler_dead_letters_total", &[("class", "null_value")])
            == 2.0 * nulls),
        "the re-driven records were not consumed again"
    );
    // The monitor: the re-driven dead letters are audited and not offered
    // again; their second dead letters (still null) wait.
    let (code, text) = served.get("/api/dlq");
    assert_eq!(code, 200, "{text}");
    let k = &json(&text)["kafka"];
    assert_eq!(k["redriven"].as_f64(), Some(nulls), "{k}");
    assert_eq!(k["total"].as_f64().unwrap(), k["waiting"].as_f64().unwrap() + nulls, "{k}");
    let null_class = k["by_class"].as_array().unwrap().iter().find(|c| c["class"] == "null_value").cloned();
    assert_eq!(null_class.map(|c| c["count"].as_f64()), Some(Some(nulls)), "{k}");
    assert_eq!(
        (k["audit"][0]["actor"].as_str(), k["audit"][0]["note"].as_str()),
        (Some("api-test"), Some("producer fixed")),
        "{k}"
    );
    assert!(k["samples"][0]["source"]["offset"].is_i64(), "samples carry their provenance: {k}");
    assert!(k["oldest_waiting_ms"].is_i64(), "{k}");
    let (code, text) = redrive(r#"{"class":"null_value","dry_run":true,"actor":"api-test"}"#);
    assert_eq!(
        (code, json(&text)["sent"].as_f64()),
        (200, Some(nulls)),
        "only the new dead letters are offered: {text}"
    );
}

#[test]
fn the_exception_panel_resolves_a_review_case_in_headless_chromium() {
    let _serial = common::serial();
    let (cfg, served, x, _) = served_workload("http-browser");
    let op = "rejected-0";
    assert_eq!(x.engine.ops[op].status, Status::ManualReview);
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("panel-browser");
    let result = common::http::drive_panel(&format!("http://{}/", served.addr()), op, "CLOSE", TOKEN, "panel-browser");
    assert!(result["row_text"].as_str().unwrap().contains("MISSING"), "{result}");
    assert!(result["timeline_rows"].as_u64().unwrap() >= 2, "{result}");
    assert!(result["wrong_token"].as_str().unwrap().contains("401"), "{result}");
    assert!(result["before_token"].as_str().unwrap().contains("Enter the API token"), "{result}");
    // Nothing is decided for the person: the form starts without a decision.
    assert_eq!(result["preselected_decision"], "", "{result}");
    assert!(result["applied"].as_str().unwrap().contains("CLOSED"), "{result}");
    // The browser reports the refused request; nothing else may go wrong.
    let errors = result["console_errors"].as_array().unwrap();
    assert!(errors.iter().all(|e| e.as_str().unwrap().contains("401 (Unauthorized)")), "{result}");
    for shot in ["1-queue.png", "2-operation.png", "3-resolved.png"] {
        assert!(shots.join(shot).metadata().is_ok_and(|m| m.len() > 10_000), "screenshot {shot}");
    }
    eprintln!("panel screenshots in {}", shots.display());

    // The decision went through the log: the verdict topic has it.
    let verdicts = verdicts_for(&cfg, op, |vs| vs.iter().any(|v| v.evidence.manual_decision.is_some()));
    let v = verdicts.iter().find(|v| v.evidence.manual_decision.is_some()).expect("the decision's verdict");
    assert_eq!((v.outcome.as_str(), v.action.as_str(), v.state.as_str()), ("NOT_APPLICABLE", "CLOSE", "CLOSED"));
    assert_eq!(verdicts.iter().filter(|v| v.evidence.manual_decision.is_some()).count(), 1, "one decision only");
    let m = v.evidence.manual_decision.as_ref().unwrap();
    assert_eq!(m.actor, "browser-test");
    assert_eq!(m.evidence_checked, vec!["crm record".to_owned(), "panel timeline".to_owned()]);
}

#[test]
fn the_dead_letter_tab_redrives_from_the_dlq_and_the_outbox_in_headless_chromium() {
    let _serial = common::serial();
    // An outbox with one dead letter, reachable from this instance.
    let pg = common::postgres::PgCluster::start();
    pg.execute(reconciler::outbox::SCHEMA);
    let ev = reconciler::core::event::Event {
        event_id: "ev-too-large".into(),
        operation_id: "op-too-large".into(),
        entity_id: "ent-too-large".into(),
        operation_type: "sync_customer".into(),
        seq: Some(1),
        occurred_at: now(),
        producer: "crm".into(),
        body: Body::Started { attempt: 1, worker: "w".into() },
    };
    let hex: String = Codec::new().encode_event(&ev).unwrap().iter().map(|b| format!("{b:02x}")).collect();
    pg.execute(&format!(
        "INSERT INTO reconciler_outbox (entity_id, event, status, attempts, last_error) \
         VALUES ('ent-too-large', '\\x{hex}', 'dead_letter', 10, 'MessageSizeTooLarge: Broker: Message size too large')"
    ));
    let mut cfg = quiet_config("http-dlq-browser");
    cfg.relay.connection_env = format!("DLQ_BROWSER_TEST_DB_{}", std::process::id());
    std::env::set_var(&cfg.relay.connection_env, pg.connection());
    let (cfg, served, _, _) = served_workload_of(cfg);
    // The tab lists waiting dead letters oldest first (the DLQ record's
    // timestamp, then its position). Which is oldest depends on the
    // batches the workload was applied in (a bad_magic record of one
    // partition may be dead-lettered a batch before a null_value of
    // another), so the expected first row is read from the DLQ itself.
    let dead_letters = served.metrics().sum("reconciler_dead_letters_total", &[]) as usize;
    let mut dlq = Vec::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            dlq = common::check::read_all(&cfg, &[&cfg.topics.dlq]);
            dlq.len() >= dead_letters
        }),
        "{} of {dead_letters} dead letters in the DLQ",
        dlq.len()
    );
    let oldest = dlq.iter().min_by_key(|r| (r.timestamp.unwrap_or(i64::MAX), r.partition, r.offset)).unwrap();
    let oldest_class =
        String::from_utf8_lossy(oldest.header(reconciler::records::headers::ERROR_CLASS).unwrap()).into_owned();
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dlq-browser");
    let result = common::http::drive_dlq_tab(&format!("http://{}/", served.addr()), TOKEN, "dlq-browser");
    let waiting = result["dlq_rows"].as_u64().unwrap();
    let first = result["dlq_first"].as_str().unwrap();
    assert!(
        waiting >= 1
            && first.starts_with(&format!("{}/{} ", oldest.partition, oldest.offset))
            && first.contains(&oldest_class),
        "the oldest dead letter ({}/{}, {oldest_class}) first: {result}",
        oldest.partition,
        oldest.offset
    );
    assert!(
        dlq.iter().any(|r| r.header(reconciler::records::headers::ERROR_CLASS) == Some(&b"null_value"[..])),
        "a null value is dead-lettered"
    );
    assert_eq!(result["outbox_rows"], 1, "{result}");
    assert!(result["outbox_first"].as_str().unwrap().contains("MessageSizeTooLarge"), "{result}");
    assert!(result["outbox_first"].as_str().unwrap().contains("ev-too-large"), "the event is decoded: {result}");
    assert_eq!(result["badge"].as_str().unwrap(), (waiting + 1).to_string(), "{result}");
    assert_eq!(result["selected"], "(2 selected)", "{result}");
    let dry = result["dry_run"].as_str().unwrap();
    assert!(
        dry.contains("DLQ: 1 would be re-driven")
            && dry.contains("outbox: 1 row would be re-driven")
            && dry.contains("nothing was sent"),
        "{result}"
    );
    assert_eq!(result["still_selected"], "(2 selected)", "a dry run keeps the selection: {result}");
    let done = result["redriven"].as_str().unwrap();
    assert!(
        done.contains("DLQ: 1 re-driven") && done.contains("outbox: 1 row re-driven") && done.contains("browser-test"),
        "{result}"
    );
    let audit = result["audit"].as_array().unwrap();
    assert!(audit.len() >= 2 && audit.iter().take(2).all(|a| a.as_str().unwrap().contains("browser-test")), "{result}");
    // What was re-driven is not offered again.
    let after: Vec<&str> =
        result["dlq_positions_after"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert!(!after.contains(&result["position"].as_str().unwrap()), "{result}");
    assert_eq!(result["outbox_rows_after"], 0, "{result}");
    // The loads before the token was entered are refused; nothing else
    // may go wrong.
    let errors = result["console_errors"].as_array().unwrap();
    assert!(errors.iter().all(|e| e.as_str().unwrap().contains("401 (Unauthorized)")), "{result}");
    for shot in ["1-dead-letters.png", "2-redriven.png"] {
        assert!(shots.join(shot).metadata().is_ok_and(|m| m.len() > 10_000), "screenshot {shot}");
    }
    eprintln!("dead-letter tab screenshots in {}", shots.display());

    // The API, the audit topic and the database say the same.
    let position = result["position"].as_str().unwrap().replace(':', "/");
    let audits = reconciler::operator::dlq::audits(&cfg.kafka, &cfg.topics.dlq_audit().unwrap()).unwrap();
    let a = &audits[&format!("{}/{position}", cfg.topics.dlq)];
    assert_eq!((a.actor.as_str(), a.to_topic.as_str()), ("browser-test", cfg.topics.events.as_str()));
    let (code, text) = served.get("/api/dlq");
    assert_eq!(code, 200, "{text}");
    let d = json(&text);
    assert_eq!(d["outbox"]["audit"][0]["actor"], "browser-test", "{d}");
    assert_eq!(d["outbox"]["pending"], 1, "the re-driven row waits for a relay: {d}");
    assert_eq!(d["outbox"]["audit"][0]["last_error"], "MessageSizeTooLarge: Broker: Message size too large", "{d}");
}

#[test]
fn run_serves_http_from_its_config_and_logs_json_lines_that_name_the_operation() {
    let _serial = common::serial();
    let cfg = quiet_config("http-binary");
    let t = &cfg.topics;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_reconciler"))
        .args(["--log-format", "json", "--brokers", &common::brokers(), "run"])
        .env("RECONCILER_LOG", "debug,rdkafka=warn")
        .env("RECONCILER_STATE_DIR", &cfg.state_dir)
        .env("RECONCILER_CONSUMER__GROUP_ID", &cfg.consumer.group_id)
        .env("RECONCILER_TOPICS__EVENTS", &t.events)
        .env("RECONCILER_TOPICS__VERDICTS", &t.verdicts)
        .env("RECONCILER_TOPICS__ANOMALIES", &t.anomalies)
        .env("RECONCILER_TOPICS__DLQ", &t.dlq)
        .env("RECONCILER_TOPICS__COMMANDS", &t.commands)
        // Its own changelog and fleet too: a second run of this test on the
        // same broker would otherwise restore the first one's state.
        .env("RECONCILER_TOPICS__CHANGELOG", t.changelog().unwrap_or_default())
        .env("RECONCILER_TOPICS__FLEET", t.fleet().unwrap_or_default())
        .env("RECONCILER_TOPICS__PARTITIONS", "3")
        .env("RECONCILER_TIME__REORDER_WINDOW_MS", "3600000")
        .env("RECONCILER_HTTP__BIND", "127.0.0.1:0")
        .env("RECONCILER_HTTP__TOKEN", TOKEN)
        .env("RECONCILER_SECURITY__CONTROL_KEYS", format!("[{:?}]", common::CONTROL_KEY))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (rx, collector) = common::child::stderr_lines(&mut child);
    // The address comes from the log line of the server (port 0: any).
    let addr: SocketAddr = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server's log line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("HTTP server listening")) {
            break v["fields"]["addr"].as_str().unwrap().parse().unwrap();
        }
    };
    let records = demo::workload(now() - 60_000, 1);
    demo::publish(&cfg, &records).unwrap();
    let total = records.len() as f64;
    let applied = wait_for(Duration::from_secs(60), || {
        let (_, text) = request(addr, "GET", "/metrics", &[], "");
        Samples::parse(&text).sum("reconciler_events_total", &[]) >= total
    });
    // Ready once the workload is applied: readiness is published by the
    // run loop and the broker watch, so it is polled, and what it last
    // said is kept for the failure message.
    let mut readyz = (0, String::new());
    let ready = wait_for(Duration::from_secs(30), || {
        readyz = request(addr, "GET", "/readyz", &[], "");
        readyz.0 == 200
    });
    assert!(ready, "/readyz: {readyz:?}");
    // The token came from RECONCILER_HTTP__TOKEN: accepted (then 404).
    let auth = format!("Bearer {TOKEN}");
    let body = r#"{"decision":"CLOSE","actor":"a","note":"n"}"#;
    let (code, text) = request(addr, "POST", "/api/operations/no-such-op/resolve", &[("Authorization", &auth)], body);
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    let lines = collector.join().unwrap();
    assert!(applied, "the workload was not applied");
    assert_eq!(code, 404, "{text}");
    assert!(status.success(), "run exits 0 on SIGTERM");

    let mut about_operations = 0;
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let f = &v["fields"];
        if f.get("operation_id").is_some() {
            about_operations += 1;
            assert!(f["entity_id"].is_string(), "a line about an operation without entity_id: {line}");
        }
    }
    let verdicts = lines.iter().filter(|l| l.contains("\"message\":\"Verdict\"")).count();
    let anomalies = lines.iter().filter(|l| l.contains("\"message\":\"Anomaly\"")).count();
    assert_eq!(verdicts as f64, x_count(&cfg, &records, |o| matches!(o, Output::Verdict(_))));
    assert_eq!(anomalies as f64, x_count(&cfg, &records, |o| matches!(o, Output::Anomaly(_))));
    assert!(about_operations >= verdicts + anomalies);
}

/// How many outputs of the core for `records` satisfy `pred`.
fn x_count(cfg: &Config, records: &[InputRecord], pred: impl Fn(&Output) -> bool) -> f64 {
    let (outputs, _) = demo::predict(cfg, records, 0);
    outputs.iter().filter(|o| pred(o)).count() as f64
}
