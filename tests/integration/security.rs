//! The trust boundary on the input topic (issue 18), on the broker: a
//! forged `DeadlineReached` and a forged `ManualDecision` (valid Avro, no
//! signature or one of a key rotated out) change nothing and are reported
//! as FORGED_CONTROL_EVENT anomalies naming their producer and position;
//! the timer the wheel itself fires and a decision `resolve` signs are
//! applied; and a replay of that log gives byte-identical verdicts and
//! anomalies.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use common::{check, config, Running};
use reconciler::clock::system_clock;
use reconciler::codec::Codec;
use reconciler::core::event::{Body, Decision, EffectObserved, Event, EvidenceSource, Requested};
use reconciler::core::{AnomalyKind, Outcome, Status};
use reconciler::kafka::producer::Publisher;
use reconciler::operator::commands::open_view;
use reconciler::operator::replay::{self, ReplayOptions};
use reconciler::operator::{explain, resolve, ResolveRequest};
use reconciler::records::{event_record, signed, Record};
use reconciler::signature::ControlKeys;

fn event(op: &str, id: &str, seq: Option<i64>, at: i64, producer: &str, body: Body) -> Event {
    Event {
        event_id: id.into(),
        operation_id: op.into(),
        entity_id: format!("{op}-entity"),
        operation_type: "sync_customer".into(),
        seq,
        occurred_at: at,
        producer: producer.into(),
        body,
    }
}

fn requested(confirm_within_ms: i64) -> Body {
    Body::Requested(Requested {
        expected_version: Some(7),
        idempotent: false,
        destination: "crm".into(),
        confirm_within_ms: Some(confirm_within_ms),
        ..Default::default()
    })
}

#[test]
fn forged_control_events_change_nothing_signed_ones_apply_and_a_replay_agrees() {
    let _serial = common::serial();
    let cfg = config("security");
    let codec = Codec::new();
    let t = &cfg.topics;
    let now = (system_clock())();
    let running = Running::start(&cfg, system_clock());
    let publisher = Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes).unwrap();
    let publish = |records: Vec<reconciler::records::ProducerRecord>| {
        publisher.publish_all(records.iter().map(|r| (r, None))).unwrap();
    };
    let rec = |e: &Event| event_record(&codec, &t.events, e).unwrap();
    // "victim" waits ten minutes for its confirmation; "case" is DIVERGENT
    // and waits for a person; "due" has a one-second window, so the wheel
    // fires its deadline while the test runs.
    let observed = Body::EffectObserved(EffectObserved {
        remote_id: Some("crm-1".into()),
        observed_version: Some(6),
        observed_fingerprint: None,
        source: EvidenceSource::DestinationQuery,
        evidence_ref: None,
    });
    publish(vec![
        rec(&event("victim", "v1", Some(1), now, "billing", requested(600_000))),
        rec(&event("case", "c1", Some(1), now, "billing", requested(600_000))),
        rec(&event("case", "c2", None, now + 5, "billing", observed)),
        rec(&event("due", "d1", Some(1), now, "billing", requested(1_000))),
    ]);
    // The forgeries: the victim's deadline as if it had passed (no
    // signature; it would give a MISSING verdict now), and a CONFIRM of the
    // case signed with a key no instance has any more.
    let forged_deadline = Event::deadline_reached("victim", "victim-entity", "sync_customer", now + 600_000);
    let decision = Body::ManualDecision {
        actor: "mallory".into(),
        decision: Decision::Confirm,
        note: "looks fine".into(),
        evidence_checked: vec![],
    };
    let old_key = ControlKeys::new([b"a-control-key-rotated-out".to_vec()]);
    let forged_decision = signed(rec(&event("case", "m1", None, now + 10, "billing", decision)), &old_key);
    publish(vec![rec(&forged_deadline), forged_decision]);

    let outputs = |topic: &str| check::read_all(&cfg, &[topic]);
    let anomalies_of = |kind: AnomalyKind| {
        outputs(&t.anomalies)
            .iter()
            .map(|r| codec.decode_anomaly(r.value.as_deref().unwrap()).unwrap())
            .filter(|a| a.kind == kind)
            .collect::<Vec<_>>()
    };
    let verdicts = || {
        outputs(&t.verdicts)
            .iter()
            .map(|r| codec.decode_verdict(r.value.as_deref().unwrap()).unwrap())
            .map(|v| (v.operation_id.clone(), v))
            .collect::<BTreeMap<_, _>>()
    };
    let settled = common::wait_for(Duration::from_secs(60), || {
        anomalies_of(AnomalyKind::ForgedControlEvent).len() == 2 && verdicts().contains_key("due")
    });
    assert!(settled, "no two FORGED_CONTROL_EVENT anomalies and an overdue verdict for due: {:?}", verdicts());

    // The forged ones: each with its producer and its position in the input.
    let input: Vec<Record> = outputs(&t.events);
    let position = |id: &str| {
        let r = input
            .iter()
            .find(|r| codec.decode_event(r.value.as_deref().unwrap()).is_ok_and(|e| e.event_id == id))
            .unwrap();
        (r.partition, r.offset)
    };
    let forged = anomalies_of(AnomalyKind::ForgedControlEvent);
    for (ev, op, producer) in [(forged_deadline.event_id.as_str(), "victim", "reconciler"), ("m1", "case", "billing")] {
        let a = forged.iter().find(|a| a.event_id == ev).unwrap_or_else(|| panic!("{ev} not flagged: {forged:?}"));
        assert_eq!((a.operation_id.as_str(), a.producer.as_deref()), (op, Some(producer)));
        assert_eq!((a.source_partition, a.source_offset), position(ev));
    }
    let v = verdicts();
    assert!(!v.contains_key("victim"), "the forged deadline gave a verdict: {:?}", v.get("victim"));
    assert_eq!(v["case"].outcome, Outcome::Divergent, "the forged CONFIRM was not applied");
    assert_eq!(v["due"].outcome, Outcome::Missing, "the wheel's own, signed, timer was applied");

    // A decision `resolve` signs is applied.
    let view = open_view(&cfg).unwrap();
    let req = ResolveRequest {
        operation_id: "case".into(),
        decision: Decision::Confirm,
        actor: "ana".into(),
        note: "v6 is what the CRM should hold".into(),
        evidence_checked: vec!["crm record".into()],
    };
    let prepared = resolve::prepare(&view.store, &req, (system_clock())()).unwrap();
    drop(view);
    resolve::publish(&publisher, &codec, &cfg.security.keys().unwrap(), &t.events, &prepared).unwrap();
    let confirmed = common::wait_for(Duration::from_secs(30), || verdicts()["case"].outcome == Outcome::Correct);
    assert!(confirmed, "the signed decision was not applied: {:?}", verdicts()["case"]);
    running.stop();
    let view = open_view(&cfg).unwrap();
    let x = explain(&view.store, "victim").unwrap().expect("the victim is still there");
    assert_eq!(x.state, Status::Pending, "the forged deadline changed nothing");
    assert!(x.timeline.iter().any(|e| e.entry.anomalies.iter().any(|a| a.kind == AnomalyKind::ForgedControlEvent)));
    drop(view);

    // The log replayed (with the same keys) into empty state: the same
    // verdicts and anomalies, byte for byte.
    let opts = ReplayOptions {
        state_dir: common::temp_dir("security-replay").join("state"),
        output_prefix: Some(common::unique("security-scratch")),
        diff: true,
    };
    let summary = replay::replay(&cfg, &opts, &AtomicBool::new(false), |_| {}).unwrap();
    let diff = summary.diff.unwrap();
    assert_eq!((diff.equal, diff.differing, diff.missing, diff.extra), (diff.live, 0, 0, 0), "{diff:?}");
    let prefix = opts.output_prefix.unwrap();
    let values = |topic: &str| {
        let mut v: Vec<Vec<u8>> = outputs(topic).into_iter().filter_map(|r| r.value).collect();
        v.sort();
        v
    };
    assert_eq!(values(&t.anomalies), values(&format!("{prefix}.anomalies")), "anomaly streams differ");
    println!(
        "security: 2 forged control events refused, {} verdicts and {} anomalies replayed byte for byte",
        diff.live,
        values(&t.anomalies).len()
    );
}

/// The ACLs the "Kafka permissions" table of docs/operations.md lists, for `cfg`: one
/// (resource type, name, operations) per row.
fn documented_acls(cfg: &reconciler::config::Config) -> Vec<(String, String, Vec<String>)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let section =
        page.split("### Kafka permissions").nth(1).expect("docs/operations.md has a Kafka permissions section");
    let t = &cfg.topics;
    let txn = cfg.transactional_id();
    let mut rows = Vec::new();
    for line in section.lines().take_while(|l| !l.starts_with('#')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || cells[1] == "resource" || cells[1].starts_with("---") {
            continue;
        }
        let name = match cells[2].trim_matches('`') {
            "topics.events" => t.events.clone(),
            "topics.verdicts" => t.verdicts.clone(),
            "topics.anomalies" => t.anomalies.clone(),
            "topics.dlq" => t.dlq.clone(),
            "topics.commands" => t.commands.clone(),
            "topics.changelog" => t.changelog().expect("on").to_owned(),
            "consumer.group_id" => cfg.consumer.group_id.clone(),
            "consumer.transactional_id" => txn.clone(),
            other => {
                panic!("The Kafka permissions of docs/operations.md name a setting this test does not know: {other}")
            }
        };
        let ops = cells[3].split(',').map(|o| o.trim().to_owned()).collect();
        rows.push((cells[1].to_owned(), name, ops));
    }
    assert!(rows.len() >= 8, "the Kafka permissions table of docs/operations.md: {rows:?}");
    rows
}

/// `scripts/broker.sh acl` on `port`: `verb` (--add or --remove) the
/// ALLOW of `operations` on resource `kind` `name` for User:reconciler.
fn acl(port: u16, tls: &std::path::Path, verb: &str, kind: &str, name: &str, operations: &[String]) {
    let flag = format!("--{kind}");
    let mut args = vec!["acl", verb, "--force", "--allow-principal", "User:reconciler", flag.as_str(), name];
    for op in operations {
        args.extend(["--operation", op.as_str()]);
    }
    common::run::broker_script(port, &args, &[("BROKER_TLS_DIR", tls.to_str().unwrap())]);
}

/// The pipeline against Apache Kafka with SASL/SCRAM-SHA-256 over TLS
/// (`SASL_SSL`; a certificate authority and a broker certificate made
/// here) and the KRaft authorizer, nothing allowed without an ACL (`
/// scripts/broker.sh start kafka-secure`, on a port of its own). The
/// reconciler's principal is granted exactly the ACLs docs/operations.md lists, on
/// topics created beforehand by an administrator:
/// - a wrong password fails at start-up, at once, with the broker's reason;
/// - without Write on the verdicts topic, the start is refused, naming the
///   topic, the operation and what it is for;
/// - with the listed rights, it runs the demo workload to its predicted
///   verdicts.
#[test]
fn over_sasl_ssl_with_the_documented_acls_it_runs_and_a_missing_right_or_password_fails_at_start() {
    let _serial = common::serial();
    let tls = common::temp_dir("tls");
    common::tls::make(&tls);
    let port = common::run::bounce_port() + 3;
    let tls_env = [("BROKER_TLS_DIR", tls.to_str().unwrap())];
    common::run::broker_script(port, &["start", "kafka-secure"], &tls_env);
    let _broker = common::run::BounceBroker(port);
    let mut cfg = config("secure");
    reconciler::demo::configure(&mut cfg);
    let ca = tls.join("ca.pem");
    let sasl = |user: &str, password: &str| {
        let mut kafka = cfg.kafka.clone();
        for (k, v) in [
            ("bootstrap.servers", format!("127.0.0.1:{port}")),
            ("security.protocol", "SASL_SSL".into()),
            ("sasl.mechanisms", "SCRAM-SHA-256".into()),
            ("sasl.username", user.into()),
            ("sasl.password", password.into()),
            ("ssl.ca.location", ca.to_str().unwrap().into()),
        ] {
            kafka.insert(k.into(), v);
        }
        kafka
    };
    // The administrator creates the topics: the reconciler has no Create.
    let admin = sasl("admin", "reconciler-admin-secret");
    let t = cfg.topics.clone();
    reconciler::kafka::admin::ensure_topics(&admin, &t.all(), t.partitions, 1).unwrap();
    let marks = reconciler::kafka::watermarks::Watermarks::new(&admin).unwrap();
    reconciler::kafka::admin::ensure_changelog(&admin, &marks, t.changelog().expect("on"), &t.events, 1).unwrap();
    drop(marks);
    cfg.kafka = sasl("reconciler", "reconciler-scram-secret");
    let acls = documented_acls(&cfg);
    for (kind, name, ops) in &acls {
        acl(port, &tls, "--add", kind, name, ops);
    }

    let mut wrong = cfg.clone();
    wrong.kafka.insert("sasl.password".into(), "not-the-password".into());
    let started = std::time::Instant::now();
    let err = reconciler::pipeline::Pipeline::new(wrong, system_clock()).err().expect("refused").to_string();
    let took = started.elapsed();
    assert!(err.contains("refused this client's credentials") && err.contains("sasl.*"), "{err}");
    assert!(err.contains("SCRAM-SHA-256"), "the broker's reason: {err}");
    assert!(took < Duration::from_secs(10), "at once, not as a timeout: {took:?}");

    let write = ["Write".to_owned()];
    acl(port, &tls, "--remove", "topic", &t.verdicts, &write);
    let err = reconciler::pipeline::Pipeline::new(cfg.clone(), system_clock()).err().expect("refused").to_string();
    assert!(err.contains(&format!("Write topic {}", t.verdicts)) && err.contains("publish verdicts"), "{err}");
    acl(port, &tls, "--add", "topic", &t.verdicts, &write);

    let start = (system_clock())();
    let records = reconciler::demo::workload(start, 1);
    let (outputs, _) = reconciler::demo::predict(&cfg, &records, start + 3_600_000);
    let want = outputs.iter().filter(|o| matches!(o, reconciler::core::Output::Verdict(_))).count();
    let running = Running::start(&cfg, system_clock());
    let mut producer = cfg.clone();
    producer.kafka = admin.clone();
    reconciler::demo::publish(&producer, &records).unwrap();
    let mut reader = reconciler::kafka::reader::TopicReader::new(&admin, &[&cfg.topics.verdicts], 3).unwrap();
    let settled = reader.read_until(Duration::from_secs(90), |recs| {
        recs.iter().filter_map(|r| r.value.as_deref()).collect::<std::collections::HashSet<_>>().len() >= want
    });
    running.stop();
    assert!(settled, "the predicted {want} verdicts did not arrive over SASL_SSL");
    println!(
        "SASL_SSL + ACLs: wrong password refused in {took:?}; missing Write on verdicts refused at start ({err}); {want} verdicts with the {} ACL rows of docs/operations.md",
        acls.len()
    );
}
