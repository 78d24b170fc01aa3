//! The network between the pipeline and the broker cut for 30 s in the
//! middle of a run, then restored.
//!
//! How the cut is made: a TCP proxy in this test (`common/proxy.rs`) sits
//! between `reconciler run` and a broker of the test's own. Kafka clients
//! connect to the addresses the broker advertises, so that broker has two
//! client listeners: one the proxy forwards to, which advertises the
//! proxy's address (the pipeline's only way to the broker, bootstrap and
//! every later connection), and a direct one for the test's own clients
//! (the workload's publisher and the readers that check the outputs), which
//! the cut leaves alone. Cutting closes every connection through the proxy
//! and its port, so each reconnection is refused until the restore. (A
//! network namespace with a veth pair taken down would cut the same
//! connections, but needs root and moves the HTTP server the test polls
//! into the namespace; the proxy needs neither.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common;
use common::binary::Binary;
use common::check;
use common::proxy::Proxy;
use common::run::{bounce_port, broker_script, BounceBroker};
use reconciler::pipeline::broker_watch::{ASK_EVERY, UNREACHABLE_AFTER};

/// How long the network stays cut.
const CUT: Duration = Duration::from_secs(30);

/// The alert that covers an unreachable broker, and its threshold in
/// seconds, read from deploy/prometheus/alerts.yml: the test checks the
/// condition the rule evaluates, on the metric the instance serves.
fn broker_alert() -> (String, f64) {
    let rules = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml")).unwrap();
    let at = rules.find("alert: ReconcilerBrokerUnreachable").expect("the alert ReconcilerBrokerUnreachable exists");
    let expr = rules[at..]
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("expr: "))
        .expect("the alert has an expression")
        .to_owned();
    let threshold = expr
        .strip_prefix("time() - reconciler_broker_last_answer_timestamp_seconds > ")
        .unwrap_or_else(|| panic!("the alert's expression changed; this test evaluates it: {expr}"))
        .parse()
        .expect("a threshold in seconds");
    (expr, threshold)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Whether the group's committed offsets reach `target` in every partition.
fn committed_past(cfg: &reconciler::config::Config, target: &BTreeMap<i32, i64>) -> bool {
    let c = check::committed(cfg);
    target.iter().all(|(p, end)| *end == 0 || c.get(p).is_some_and(|n| n >= end))
}

#[test]
fn a_30_s_network_cut_turns_readiness_red_fires_the_alert_and_the_restored_run_loses_nothing() {
    let _serial = common::serial();
    let (alert_expr, alert_after) = broker_alert();
    // The broker: a direct listener on `port` for the test's clients, one
    // behind the proxy for the pipeline (advertised as the proxy).
    let port = bounce_port() + 5;
    let proxy_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = proxy_listener.local_addr().unwrap().port();
    let proxied_port = common::free_port();
    let controller = port + 1000;
    let listeners = format!(
        "listeners=PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxied_port},CONTROLLER://127.0.0.1:{controller}"
    );
    let advertised = format!("advertised.listeners=PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxy_port}");
    let protocols = "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT";
    // Apache Kafka whatever BROKER_ENGINE says: per-listener advertised
    // addresses are what makes the proxy the pipeline's only way in.
    broker_script(port, &["start", "kafka", &listeners, &advertised, protocols], &[]);
    let _broker = BounceBroker(port);
    let upstream: SocketAddr = format!("127.0.0.1:{proxied_port}").parse().unwrap();
    let proxy = Proxy::start(proxy_listener, upstream);

    let mut cfg = common::config("netcut");
    cfg.kafka.insert("bootstrap.servers".into(), format!("127.0.0.1:{port}"));
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let mut through_proxy = cfg.clone();
    through_proxy.kafka.insert("bootstrap.servers".into(), proxy.addr().to_string());
    let dir = common::temp_dir("netcut-run");

    // About 40 s of input at 300 records/s; the cut comes a few seconds in.
    let paced = common::Paced::start(&cfg, 3_000, 41, 300);
    let instance = Binary::spawn(&through_proxy, &dir, "reconciler");
    assert!(instance.wait_ready(Duration::from_secs(60)), "never ready; log:\n{}", instance.log_tail());
    let mut verdicts = common::VerdictCount::new(&cfg);
    assert!(
        common::wait_for(Duration::from_secs(60), || verdicts.now() >= 100),
        "no verdicts before the cut; log:\n{}",
        instance.log_tail()
    );
    assert!(proxy.accepted() > 0, "the pipeline did not connect through the proxy");
    // Ready before the cut (a moment of red under a loaded machine is not
    // what this test is about: it waits for green).
    assert!(instance.wait_ready(Duration::from_secs(30)), "ready before the cut: {:?}", instance.readyz());
    let last_answer = instance.metric("reconciler_broker_last_answer_timestamp_seconds").unwrap_or(0.0);
    assert!(unix_now() - last_answer <= alert_after, "the alert's condition `{alert_expr}` holds before the cut");
    let verdicts_before = verdicts.now();

    // The cut.
    proxy.cut();
    let cut_at = Instant::now();
    let mut red_after: Option<Duration> = None;
    let mut red_body = String::new();
    let mut alert_after_cut: Option<Duration> = None;
    let mut committed_early: Option<BTreeMap<i32, i64>> = None;
    while cut_at.elapsed() < CUT {
        let (code, body) = instance.readyz();
        if code == 503 && red_after.is_none() {
            red_after = Some(cut_at.elapsed());
            red_body = body;
        }
        let last_answer = instance.metric("reconciler_broker_last_answer_timestamp_seconds").unwrap_or(0.0);
        if unix_now() - last_answer > alert_after && alert_after_cut.is_none() {
            alert_after_cut = Some(cut_at.elapsed());
        }
        if committed_early.is_none() && cut_at.elapsed() >= Duration::from_secs(5) {
            committed_early = Some(check::committed(&cfg));
        }
        std::thread::sleep(Duration::from_millis(250)); // sampling period of /readyz and /metrics
    }
    let committed_during = check::committed(&cfg);
    let backlog_end = check::end_offsets(&cfg, &cfg.topics.events);
    let backlog: i64 = backlog_end.iter().map(|(p, e)| e - committed_during.get(p).copied().unwrap_or(0)).sum();
    let (code, body) = instance.readyz();
    assert_eq!(code, 503, "/readyz at the end of the {} s cut (first red after {red_after:?}): {body}", CUT.as_secs());

    // The restore.
    proxy.restore();
    let restored_at = Instant::now();
    assert!(
        instance.wait_ready(Duration::from_secs(90)),
        "not ready again after the restore; log:\n{}",
        instance.log_tail()
    );
    let green_after = restored_at.elapsed();
    assert!(
        common::wait_for(Duration::from_secs(120), || committed_past(&cfg, &backlog_end)),
        "the backlog of the cut did not drain; committed {:?}, target {backlog_end:?}",
        check::committed(&cfg)
    );
    let drained_after = restored_at.elapsed();

    let (f, report) = common::binary::verify_and_check(&cfg, paced, instance, "network cut");

    let secs = |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    println!(
        "network cut: {} s cut after {verdicts_before} verdicts; readiness red {} after the cut (bound {} s + one ask), \
         alert condition `{alert_expr}` true {} after; backlog at the restore {backlog} records; ready again {:.1} s \
         and backlog drained {:.1} s after the restore",
        CUT.as_secs(),
        secs(red_after),
        UNREACHABLE_AFTER.as_secs(),
        secs(alert_after_cut),
        green_after.as_secs_f64(),
        drained_after.as_secs_f64()
    );
    // Nothing went through while cut: the group's offsets stood still.
    assert_eq!(committed_early, Some(committed_during), "offsets moved during the cut: was it cut?");
    assert!(backlog > 0, "no input arrived during the cut");
    let bound = UNREACHABLE_AFTER + 2 * ASK_EVERY + Duration::from_secs(3);
    let red = red_after.unwrap_or_else(|| panic!("/readyz stayed 200 through the {} s cut", CUT.as_secs()));
    assert!(red <= bound, "/readyz went red {red:?} after the cut, past its bound {bound:?}");
    assert!(red_body.contains("broker_unreachable") && red_body.contains("has not answered"), "{red_body}");
    assert!(alert_after_cut.is_some(), "the alert's condition `{alert_expr}` never held during the cut");
    assert!(report.complete && report.agrees(), "{}", report.render());
    assert_eq!((f.losses, f.divergent), (0, 0));
}
