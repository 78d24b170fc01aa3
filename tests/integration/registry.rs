//! The Confluent schema-registry framing, against a real registry (Apicurio
//! Registry's Confluent-compatible API, which scripts/test.sh starts and
//! names in `SCHEMA_REGISTRY_URL`) and clients nobody here wrote: Python's
//! `confluent_kafka` `AvroSerializer` produces the input and its
//! `AvroDeserializer` reads the verdicts back
//! (tests/interop/confluent_interop.py).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use apache_avro::types::Value;
use apache_avro::Schema;
use reconciler::clock::system_clock;
use reconciler::codec::{Codec, Framing, InputFraming, SchemaKind};
use reconciler::config::Config;
use reconciler::core::Event;
use reconciler::demo;
use reconciler::kafka::producer::Publisher;
use reconciler::records::{InputRecord, ProducerRecord};

use crate::common::check::{check, output_topics, read_all, wait_settled};
use crate::common::{self, Running};

/// The registry's base URL.
fn registry_url() -> String {
    std::env::var("SCHEMA_REGISTRY_URL")
        .expect("SCHEMA_REGISTRY_URL names no schema registry: scripts/test.sh starts one (scripts/registry.sh start)")
}

/// Runs the Python side; its standard output.
fn python(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/confluent_interop.py");
    let out = Command::new("python3").arg(script).args(args).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "confluent_kafka side failed (is confluent-kafka installed? scripts/setup.sh --tests installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Produces the events of `file` to `cfg`'s input with confluent_kafka's
/// serializer, under `schema` (default: the shipped one) and `subject`
/// (default: `<topic>-value`); what the Python side printed.
fn produce(cfg: &Config, file: &Path, schema: Option<&Path>, subject: Option<&str>) -> serde_json::Value {
    produce_compressed(cfg, file, schema, subject, "none")
}

/// [`produce`], the producer's batches compressed with `compression`.
fn produce_compressed(
    cfg: &Config,
    file: &Path,
    schema: Option<&Path>,
    subject: Option<&str>,
    compression: &str,
) -> serde_json::Value {
    let (brokers, url) = (common::brokers(), registry_url());
    let mut args = vec!["produce", "--brokers", &brokers, "--registry", &url, "--topic", &cfg.topics.events];
    args.extend(["--events", file.to_str().unwrap(), "--compression", compression]);
    if let Some(s) = schema {
        args.extend(["--schema", s.to_str().unwrap()]);
    }
    if let Some(s) = subject {
        args.extend(["--subject", s]);
    }
    serde_json::from_str(python(&args).trim()).unwrap()
}

/// An Avro value as JSON, a record of a union as `{"type": full name,
/// "value": ...}` (what the Python side turns into fastavro's union
/// notation).
fn avro_json(v: &Value, s: &Schema) -> serde_json::Value {
    use serde_json::json;
    match (v, s) {
        (Value::Null, _) => serde_json::Value::Null,
        (Value::Boolean(b), _) => json!(b),
        (Value::Int(i), _) => json!(i),
        (Value::Long(i), _) | (Value::TimestampMillis(i), _) => json!(i),
        (Value::Double(d), _) => json!(d),
        (Value::String(t), _) | (Value::Enum(_, t), _) => json!(t),
        (Value::Array(items), Schema::Array(a)) => items.iter().map(|i| avro_json(i, &a.items)).collect(),
        (Value::Union(i, inner), Schema::Union(u)) => {
            let branch = &u.variants()[*i as usize];
            match branch {
                Schema::Record(r) => json!({ "type": r.name.fullname(None), "value": avro_json(inner, branch) }),
                _ => avro_json(inner, branch),
            }
        }
        (Value::Record(fields), Schema::Record(r)) => {
            let mut m = serde_json::Map::new();
            for ((name, value), f) in fields.iter().zip(&r.fields) {
                m.insert(name.clone(), avro_json(value, &f.schema));
            }
            serde_json::Value::Object(m)
        }
        (v, s) => panic!("no JSON form for {v:?} under {s:?}"),
    }
}

/// Writes `events` as the Python side's input: a JSON line per event with
/// its key.
fn events_file(events: &[Event], path: &Path) {
    let codec = Codec::new();
    let schema = codec.schemas().reader(SchemaKind::OperationEvent).clone();
    let mut lines = String::new();
    for e in events {
        let bytes = codec.encode_event(e).unwrap();
        let value = apache_avro::from_avro_datum(&schema, &mut &bytes[reconciler::codec::HEADER_LEN..], None).unwrap();
        let line = serde_json::json!({ "key": e.entity_id, "event": avro_json(&value, &schema) });
        lines.push_str(&line.to_string());
        lines.push('\n');
    }
    std::fs::write(path, lines).unwrap();
}

/// A config of its own topics, reading and writing `input` / `output`
/// framings through the registry.
fn config(name: &str, input: InputFraming, output: Framing) -> Config {
    let mut cfg = common::config(name);
    cfg.codec.input = input;
    cfg.codec.output = output;
    cfg.schema_registry.url = registry_url();
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &[&cfg.topics.events], cfg.topics.partitions, 1).unwrap();
    cfg
}

/// The demo workload's events (one copy, without its undecodable record),
/// starting now.
fn workload() -> Vec<Event> {
    demo::workload((system_clock())(), 1)
        .into_iter()
        .filter_map(|r| match r {
            InputRecord::Event(e) => Some(e),
            InputRecord::Raw { .. } => None,
        })
        .collect()
}

fn temp(name: &str) -> PathBuf {
    let dir = common::temp_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs until settled, stops, and checks I1–I4 against the reference
/// (which decodes the input through the same registry); returns the
/// verdict records.
fn settle_and_check(cfg: &Config, running: Running) -> Vec<reconciler::records::Record> {
    settle_and_check_with(cfg, || true, || drop(running.stop()))
}

/// [`settle_and_check`] of an instance that says when it is `ready` and
/// is stopped by `stop`.
fn settle_and_check_with(
    cfg: &Config,
    ready: impl FnMut() -> bool,
    stop: impl FnOnce(),
) -> Vec<reconciler::records::Record> {
    let input = read_all(cfg, &[&cfg.topics.events]);
    let expected = crate::common::check::reference(cfg, &input)
        .streams
        .iter()
        .filter(|((topic, _), _)| *topic == cfg.topics.verdicts)
        .map(|(_, v)| v.len())
        .sum::<usize>();
    wait_settled(cfg, expected, Duration::from_secs(90), ready).unwrap();
    stop();
    let input = read_all(cfg, &[&cfg.topics.events]);
    let outputs = read_all(cfg, &output_topics(cfg));
    let figures = check(cfg, &input, &outputs, &[&cfg.state_dir]);
    println!("{figures:?}");
    read_all(cfg, &[&cfg.topics.verdicts])
}

#[test]
fn events_serialized_by_confluent_kafka_reach_the_predicted_verdicts_which_its_deserializer_reads() {
    let _serial = common::serial();
    let cfg = config("registry-interop", InputFraming::Confluent, Framing::Confluent);
    let dir = temp("registry-interop");
    let events = workload();
    events_file(&events, &dir.join("events.jsonl"));
    let running = Running::start(&cfg, system_clock());
    let produced = produce(&cfg, &dir.join("events.jsonl"), None, None);
    assert_eq!(produced["produced"], events.len());
    let verdicts = settle_and_check(&cfg, running);
    assert!(!verdicts.is_empty());
    let (brokers, url) = (common::brokers(), registry_url());

    // Every input record and every verdict is Confluent-framed.
    let input = read_all(&cfg, &[&cfg.topics.events]);
    assert!(input.iter().all(|r| r.value.as_deref().unwrap()[0] == 0), "the input holds only Confluent records");
    assert!(verdicts.iter().all(|r| r.value.as_deref().unwrap()[0] == 0));

    // confluent_kafka's deserializer reads them, through the registry, as
    // the reconciler's own decoder does.
    let lines = python(&[
        "consume",
        "--brokers",
        &brokers,
        "--registry",
        &url,
        "--topic",
        &cfg.topics.verdicts,
        "--count",
        &verdicts.len().to_string(),
        "--timeout",
        "60",
    ]);
    let theirs: Vec<serde_json::Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(theirs.len(), verdicts.len());
    let codec = crate::common::check::codec_for(&cfg, &input);
    for t in &theirs {
        let r = verdicts
            .iter()
            .find(|r| {
                (r.partition, r.offset) == (t["_partition"].as_i64().unwrap() as i32, t["_offset"].as_i64().unwrap())
            })
            .expect("a verdict at that position");
        let ours = codec.decode_verdict(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(t["verdict_id"], ours.verdict_id.as_str());
        assert_eq!(t["operation_id"], ours.operation_id.as_str());
        assert_eq!(t["outcome"], ours.outcome.as_str());
        assert_eq!(t["action"], ours.action.as_str());
        assert_eq!(t["reason"], ours.reason.as_str());
        let id = u32::from_be_bytes(r.value.as_deref().unwrap()[1..5].try_into().unwrap());
        assert_eq!(t["_schema_id"], id);
    }
}

/// Producers choose how their batches are compressed: records compressed
/// with each codec Kafka defines (gzip, snappy, lz4, zstd) are read, none
/// dead-lettered, and reach the predicted verdicts.
#[test]
fn events_compressed_with_every_codec_kafka_defines_are_read() {
    let _serial = common::serial();
    let cfg = config("registry-compression", InputFraming::Confluent, Framing::SingleObject);
    let dir = temp("registry-compression");
    let events = workload();
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    let running = Running::start(&cfg, system_clock());
    for (codec, part) in codecs.iter().zip(events.chunks(events.len().div_ceil(codecs.len()))) {
        let file = dir.join(format!("{codec}.jsonl"));
        events_file(part, &file);
        let produced = produce_compressed(&cfg, &file, None, None, codec);
        assert_eq!(produced["produced"], part.len(), "{codec}");
    }
    let verdicts = settle_and_check(&cfg, running);
    assert!(!verdicts.is_empty());
    let dead = read_all(&cfg, &[&cfg.topics.dlq]);
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    println!("compression: {} events in 4 codecs, {} verdicts, 0 dead letters", events.len(), verdicts.len());
}

/// A producer on a newer, compatible `OperationEvent` (a field added with a
/// default) is read; records naming a schema that does not resolve, an id
/// the registry does not have, or another framing are dead letters whose
/// headers say why; the good records around them are applied.
#[test]
fn a_compatible_newer_schema_is_read_and_incompatible_unknown_or_unframed_records_are_dead_lettered() {
    let _serial = common::serial();
    let cfg = config("registry-evolution", InputFraming::Confluent, Framing::Confluent);
    let dir = temp("registry-evolution");
    let evolved = dir.join("evolved.avsc");
    let incompatible = dir.join("incompatible.avsc");
    python(&["evolved-schema", "--out", evolved.to_str().unwrap()]);
    python(&["incompatible-schema", "--out", incompatible.to_str().unwrap()]);
    let events = workload();
    let (first, rest) = events.split_at(events.len() / 2);
    events_file(first, &dir.join("first.jsonl"));
    events_file(rest, &dir.join("rest.jsonl"));
    let produce = |file: &str, schema: &Path, subject: Option<&str>| {
        produce(&cfg, &dir.join(file), Some(schema), subject)["schema_id"].as_u64().unwrap() as u32
    };
    let running = Running::start(&cfg, system_clock());
    let current = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/operation_event.avsc"));
    produce("first.jsonl", &current, None);
    // The newer schema under the topic's subject: compatible, registered.
    let newer_id = produce("rest.jsonl", &evolved, None);
    // The incompatible one is refused under the topic's subject (BACKWARD);
    // a producer that registers it elsewhere still writes it to the topic.
    // Its `producer` is a long: the event is written with one.
    events_file(&events[..1], &dir.join("bad.jsonl"));
    let mut bad: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(dir.join("bad.jsonl")).unwrap().trim()).unwrap();
    bad["event"]["producer"] = serde_json::json!(7);
    std::fs::write(dir.join("bad.jsonl"), format!("{bad}\n")).unwrap();
    let subject = format!("{}-incompatible", cfg.topics.events);
    let bad_id = produce("bad.jsonl", &incompatible, Some(&subject));
    // An id the registry does not have, and a single-object record.
    let codec = Codec::new();
    let single = codec.encode_event(&events[0]).unwrap();
    let mut unknown = vec![0, 0x7F, 0xFF, 0xFF, 0xF0];
    unknown.extend_from_slice(&single[reconciler::codec::HEADER_LEN..]);
    let key = Some(events[0].entity_id.clone().into_bytes());
    let rec = |value: Vec<u8>| ProducerRecord {
        topic: cfg.topics.events.clone(),
        key: key.clone(),
        value: Some(value),
        headers: vec![],
    };
    let publisher = Publisher::new(&cfg.kafka, 1_000_000).unwrap();
    publisher.publish_all([(&rec(unknown), None), (&rec(single), None)]).unwrap();

    settle_and_check(&cfg, running);
    let input = read_all(&cfg, &[&cfg.topics.events]);
    let ids: std::collections::BTreeSet<u32> =
        input.iter().filter_map(|r| reconciler::codec::framing::confluent_id(r.value.as_deref().unwrap())).collect();
    assert!(ids.contains(&newer_id) && ids.contains(&bad_id), "{ids:?}");
    let dlq = read_all(&cfg, &[&cfg.topics.dlq]);
    let header = |r: &reconciler::records::Record, k: &str| {
        String::from_utf8(r.headers.iter().find(|(n, _)| n == k).unwrap().1.clone().unwrap()).unwrap()
    };
    let mut classes: Vec<(String, String)> =
        dlq.iter().map(|r| (header(r, "reconciler.error.class"), header(r, "reconciler.error.message"))).collect();
    classes.sort();
    assert_eq!(classes.len(), 3, "{classes:#?}");
    assert_eq!(classes[0].0, "bad_magic", "{classes:#?}");
    assert!(classes[0].1.contains("00 (Confluent schema-registry framing)"), "{}", classes[0].1);
    assert_eq!(classes[1].0, "incompatible_schema");
    assert!(
        classes[1].1.contains(&format!("schema id {bad_id}")) && classes[1].1.contains("producer"),
        "{}",
        classes[1].1
    );
    assert_eq!(classes[2].0, "unknown_schema_id");
    assert!(classes[2].1.contains(&format!("unknown schema id {}", 0x7FFF_FFF0u32)), "{}", classes[2].1);
    // Byte-identical dead letters: the value as it was on the input.
    for d in &dlq {
        let offset: i64 = header(d, "reconciler.source.offset").parse().unwrap();
        let partition: i32 = header(d, "reconciler.source.partition").parse().unwrap();
        let original = input.iter().find(|r| (r.partition, r.offset) == (partition, offset)).unwrap();
        assert_eq!(d.value, original.value);
    }
}

/// A registry outage does not dead-letter good records: the instance
/// (`reconciler run`, through a proxy the test cuts) meets records naming a
/// schema id it has not fetched, waits with its input unmoved and says so
/// on `/metrics`, and processes them once the registry answers again.
#[test]
fn input_waits_out_a_registry_outage_without_dead_letters_and_goes_on_when_it_answers() {
    use crate::common::binary::Binary;
    use crate::common::check::{committed, end_offsets};
    use crate::common::proxy::Proxy;
    let _serial = common::serial();
    let url = registry_url();
    let upstream = url.trim_start_matches("http://").split('/').next().unwrap().to_owned();
    let proxy = Proxy::start(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), upstream.parse().unwrap());
    let mut cfg = config("registry-outage", InputFraming::Confluent, Framing::Confluent);
    cfg.schema_registry.url = url.replace(&upstream, &proxy.addr().to_string());
    cfg.schema_registry.retry_backoff_max_ms = 1_000;
    let dir = temp("registry-outage");
    let bin = Binary::spawn(&cfg, &dir, "outage");
    assert!(bin.wait_ready(Duration::from_secs(60)), "{}", bin.log_tail());

    proxy.cut();
    // A producer on a newer version of the event schema: an id the
    // instance has not fetched.
    let evolved = dir.join("evolved.avsc");
    python(&["evolved-schema", "--out", evolved.to_str().unwrap()]);
    events_file(&workload(), &dir.join("events.jsonl"));
    produce(&cfg, &dir.join("events.jsonl"), Some(&evolved), None);
    let waiting = common::wait_for(Duration::from_secs(60), || {
        bin.metric("reconciler_schema_registry_waiting") == Some(1.0)
            && bin.metric("reconciler_schema_registry_failures_total").unwrap_or(0.0) > 0.0
    });
    assert!(waiting, "the instance does not say it waits for the registry; log:\n{}", bin.log_tail());
    let end = end_offsets(&cfg, &cfg.topics.events);
    let before = committed(&cfg);
    // Held a while: still nothing dead-lettered, judged or committed.
    let held = common::wait_for(Duration::from_secs(5), || {
        !read_all(&cfg, &[&cfg.topics.dlq]).is_empty() || committed(&cfg) != before
    });
    assert!(!held, "records moved during the outage");
    assert!(read_all(&cfg, &[&cfg.topics.verdicts]).is_empty());
    assert!(end.iter().any(|(p, e)| before.get(p).copied().unwrap_or(0) < *e), "{before:?} {end:?}");

    proxy.restore();
    let bin = std::cell::RefCell::new(Some(bin));
    let verdicts = settle_and_check_with(
        &cfg,
        || bin.borrow().as_ref().unwrap().readyz().0 == 200,
        || {
            let b = bin.borrow_mut().take().unwrap();
            assert_eq!(b.metric("reconciler_schema_registry_waiting"), Some(0.0));
            b.stop();
        },
    );
    assert!(!verdicts.is_empty());
    assert!(read_all(&cfg, &[&cfg.topics.dlq]).is_empty(), "a good record was dead-lettered for the outage");
}

/// A migration's topic: the first half of the workload single-object
/// encoded, the rest through confluent_kafka's serializer. With `input =
/// "both"` every record is read, and a replay of the topic gives
/// byte-identical verdicts.
#[test]
fn a_topic_mixing_both_framings_is_read_whole_and_replays_byte_identical() {
    use reconciler::operator::replay::{self, ReplayOptions};
    let _serial = common::serial();
    let cfg = config("registry-mixed", InputFraming::Both, Framing::Confluent);
    let dir = temp("registry-mixed");
    let events = workload();
    let (first, rest) = events.split_at(events.len() / 2);
    events_file(rest, &dir.join("rest.jsonl"));
    let running = Running::start(&cfg, system_clock());
    let codec = Codec::new();
    let single: Vec<ProducerRecord> =
        first.iter().map(|e| reconciler::records::event_record(&codec, &cfg.topics.events, e).unwrap()).collect();
    Publisher::new(&cfg.kafka, 1_000_000).unwrap().publish_all(single.iter().map(|r| (r, None))).unwrap();
    produce(&cfg, &dir.join("rest.jsonl"), None, None);
    let verdicts = settle_and_check(&cfg, running);
    assert!(!verdicts.is_empty());
    let input = read_all(&cfg, &[&cfg.topics.events]);
    let firsts: std::collections::BTreeSet<u8> = input.iter().map(|r| r.value.as_deref().unwrap()[0]).collect();
    assert_eq!(firsts, [0x00, 0xC3].into(), "both framings on the input");

    let opts = ReplayOptions {
        state_dir: common::temp_dir("registry-mixed-replay").join("state"),
        output_prefix: Some(common::unique("scratch")),
        diff: true,
    };
    let summary = replay::replay(&cfg, &opts, &std::sync::atomic::AtomicBool::new(false), |_| {}).unwrap();
    let diff = summary.diff.unwrap();
    assert!(diff.live > 0);
    assert_eq!((diff.equal, diff.differing, diff.missing, diff.extra), (diff.live, 0, 0, 0), "{diff:?}");
}

/// Every tool in the Confluent framing: loadgen writes its workload (and
/// the decisions it simulates) framed for the registry, the pipeline reads
/// it, the probe worker reads the Confluent-framed commands and writes its
/// answers framed the same, and `loadgen verify` reads the outputs back;
/// the workload's undecodable records get the classes this framing gives
/// them. Everything agrees with the ground truth.
#[test]
fn loadgen_and_the_probe_worker_in_the_confluent_framing_agree_with_the_ground_truth() {
    let _serial = common::serial();
    let cfg = config("registry-loadgen", InputFraming::Confluent, Framing::Confluent);
    // Undecodable records ten times as often as by default.
    let faults = reconciler::loadgen::Faults { probed: 0.2, garbage: 0.02, ..Default::default() };
    let truth = crate::loadgen::probed_workload_agrees(cfg, 1_000, faults);
    assert!(truth.dead_letters > 0);
}

/// A schema the registry refuses under its subject's compatibility rule
/// stops the start, naming the subject: the verdicts' subject already
/// holds another record type, which the reconciler's `Verdict` cannot
/// follow under BACKWARD.
#[test]
fn a_schema_the_registry_refuses_stops_the_start_naming_the_subject() {
    let _serial = common::serial();
    let cfg = config("registry-refused", InputFraming::SingleObject, Framing::Confluent);
    let dir = temp("registry-refused");
    events_file(&workload()[..1], &dir.join("one.jsonl"));
    let subject = format!("{}-value", cfg.topics.verdicts);
    produce(&cfg, &dir.join("one.jsonl"), None, Some(&subject));
    let err = match reconciler::pipeline::Pipeline::new(cfg.clone(), system_clock()) {
        Ok(_) => panic!("the start was not refused"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("incompatible") && err.contains(&format!("{subject:?}")), "{err}");
}
