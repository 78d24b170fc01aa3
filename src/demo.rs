//! The demo workload: a small, realistic set of operations with every kind
//! of fault the reconciler detects, stamped relative to a start time.
//!
//! The same workload drives `reconciler demo` and the integration tests;
//! its records are [`InputRecord`]s, as loadgen's are.
//! Its expected verdicts are not written down by hand: they come from
//! running the workload through the in-memory core, so the demo's "settled"
//! condition is "the broker pipeline produced what the core predicts".

use crate::core::event::{Body, Decision, EffectObserved, ErrorClass, Event, EvidenceSource, Requested};
use crate::records::InputRecord;

struct Builder {
    start: i64,
    records: Vec<InputRecord>,
    copy: usize,
}

impl Builder {
    #[allow(clippy::too_many_arguments)]
    fn ev(&self, op: &str, entity: &str, ty: &str, seq: Option<i64>, dt: i64, id: &str, body: Body) -> Event {
        Event {
            event_id: format!("{op}-{}-{id}", self.copy),
            operation_id: format!("{op}-{}", self.copy),
            entity_id: format!("{entity}-{}", self.copy),
            operation_type: ty.to_owned(),
            seq,
            occurred_at: self.start + dt,
            producer: "demo".into(),
            body,
        }
    }

    fn push(&mut self, e: Event) {
        self.records.push(InputRecord::Event(e));
    }
}

fn requested(version: i64, idempotent: bool, key: bool) -> Body {
    Body::Requested(Requested {
        expected_version: Some(version),
        expected_fingerprint: None,
        idempotency_key: key.then(|| format!("idem-v{version}")),
        idempotent,
        destination: "crm".into(),
        confirm_within_ms: None,
        max_attempts: None,
    })
}

fn started(worker: &str) -> Body {
    Body::Started { attempt: 1, worker: worker.into() }
}

fn observed(version: i64, remote: &str, source: EvidenceSource) -> Body {
    Body::EffectObserved(EffectObserved {
        remote_id: Some(remote.into()),
        observed_version: Some(version),
        observed_fingerprint: None,
        source,
        evidence_ref: Some("GET /customers?idempotency_key=... -> 200".into()),
    })
}

fn unknown() -> Body {
    Body::OutcomeUnknown { attempt: 1, detail: "read timeout after request was sent (contact: ops@example.com)".into() }
}

/// The workload: `copies` copies of each story, starting at `start` (ms).
/// Deadlines use the per-type windows of [`demo_types`].
pub fn workload(start: i64, copies: usize) -> Vec<InputRecord> {
    let mut b = Builder { start, records: Vec::new(), copy: 0 };
    use EvidenceSource::*;
    for copy in 0..copies {
        b.copy = copy;
        let s = "sync_customer";
        // Happy path: the worker's response proves the effect.
        for (i, body) in
            [requested(3, true, true), started("w-1"), observed(3, "crm-100", WorkerResponse)].into_iter().enumerate()
        {
            let e = b.ev("ok", "cust-100", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // A timeout after sending, then the destination query finds v7.
        for (i, body) in [requested(7, true, true), started("w-1"), unknown()].into_iter().enumerate() {
            let e = b.ev("timeout-found", "cust-452", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        let e = b.ev("timeout-found", "cust-452", s, None, 100, "q", observed(7, "crm-452", DestinationQuery));
        b.push(e);
        // A timeout after sending; the query finds nothing: requeue (idempotent).
        for (i, body) in [requested(2, true, true), started("w-2"), unknown()].into_iter().enumerate() {
            let e = b.ev("timeout-absent", "cust-453", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        let e = b.ev(
            "timeout-absent",
            "cust-453",
            s,
            None,
            100,
            "q",
            Body::EffectAbsent { source: DestinationQuery, evidence_ref: Some("query-77".into()) },
        );
        b.push(e);
        // A timeout after sending; the query finds another version: review,
        // never overwrite.
        for (i, body) in [requested(7, true, true), started("w-1"), unknown()].into_iter().enumerate() {
            let e = b.ev("divergent", "cust-454", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        let e = b.ev("divergent", "cust-454", s, None, 100, "q", observed(8, "crm-454", DestinationQuery));
        b.push(e);
        // The effect exists twice.
        for (i, body) in
            [requested(1, true, true), started("w-3"), observed(1, "crm-500", WorkerResponse)].into_iter().enumerate()
        {
            let e = b.ev("dup-effect", "cust-500", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        let e = b.ev("dup-effect", "cust-500", s, None, 200, "q", observed(1, "crm-501", DestinationQuery));
        b.push(e);
        // Never started: overdue, missing, requeue.
        let e = b.ev("never-started", "cust-600", s, Some(1), 0, "e0", requested(1, true, true));
        b.push(e);
        // Outcome unknown, nobody checks: overdue, ambiguous, probe by key.
        for (i, body) in [requested(4, true, true), started("w-1"), unknown()].into_iter().enumerate() {
            let e = b.ev("silent", "cust-601", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // Not idempotent, started, silent: overdue, ambiguous, review.
        for (i, body) in [requested(1, false, false), started("w-9")].into_iter().enumerate() {
            let e = b.ev(
                "invoice-silent",
                "inv-77",
                "send_invoice",
                Some(i as i64 + 1),
                i as i64 * 10,
                &format!("e{i}"),
                body,
            );
            b.push(e);
        }
        // Two workers transitioned the same revision.
        for (i, body) in [requested(5, true, true), started("w-1")].into_iter().enumerate() {
            let e = b.ev("race", "cust-700", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        let e = b.ev("race", "cust-700", s, Some(2), 15, "e1x", started("w-2"));
        b.push(e);
        // Reordered: revision 3 arrives before 2.
        let e = b.ev("reordered", "cust-800", s, Some(1), 0, "e0", requested(2, true, true));
        b.push(e);
        let e = b.ev("reordered", "cust-800", s, Some(3), 20, "e2", observed(2, "crm-800", WorkerResponse));
        b.push(e);
        let e = b.ev("reordered", "cust-800", s, Some(2), 10, "e1", started("w-1"));
        b.push(e);
        // Outcome unknown, and the probe worker asks the demo's
        // destination (see `destination_truth`): it holds the same version,
        // another version, or nothing.
        for (op, entity, version) in
            [("probed-same", "cust-910", 11), ("probed-other", "cust-911", 12), ("probed-absent", "cust-912", 13)]
        {
            for (i, body) in [requested(version, true, true), started("w-4"), unknown()].into_iter().enumerate() {
                let mut e = b.ev(op, entity, s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
                if let Body::Requested(r) = &mut e.body {
                    r.idempotency_key = Some(probe_key(op, copy));
                }
                b.push(e);
            }
        }
        // Redelivered and re-emitted.
        let r = b.ev("redelivered", "cust-900", s, Some(1), 0, "e0", requested(9, true, true));
        b.push(r.clone());
        b.push(r);
        let st = b.ev("redelivered", "cust-900", s, Some(2), 10, "e1", started("w-1"));
        b.push(st.clone());
        let mut again = st;
        again.event_id.push_str("-republished");
        b.push(again);
        let e = b.ev("redelivered", "cust-900", s, Some(3), 20, "e2", observed(9, "crm-900", WorkerResponse));
        b.push(e);
        // Cancelled, then a stray start: not applicable, invalid transition.
        for (i, body) in
            [requested(1, true, true), Body::Cancelled { reason: "customer deleted".into() }, started("w-1")]
                .into_iter()
                .enumerate()
        {
            let e = b.ev("cancelled", "cust-950", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // A transient failure, retried at the time the worker scheduled,
        // then confirmed.
        let busy = Body::AttemptFailed {
            attempt: 1,
            error_class: ErrorClass::Transient,
            error_code: "HTTP_503".into(),
            detail: "destination busy".into(),
            next_attempt_at: Some(b.start + 30),
        };
        for (i, body) in [
            requested(6, true, true),
            started("w-1"),
            busy,
            Body::Started { attempt: 2, worker: "w-2".into() },
            observed(6, "crm-965", WorkerResponse),
        ]
        .into_iter()
        .enumerate()
        {
            let e = b.ev("retried", "cust-965", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // A permanent failure.
        let fail = Body::AttemptFailed {
            attempt: 1,
            error_class: ErrorClass::Permanent,
            error_code: "HTTP_422".into(),
            detail: "customer email rejected: jane@example.com".into(),
            next_attempt_at: None,
        };
        for (i, body) in [requested(1, true, true), started("w-1"), fail].into_iter().enumerate() {
            let e = b.ev("rejected", "cust-960", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // The version changes while the older sync is in flight:
        // the older one is superseded (closed, never requeued), the newer
        // one completes.
        for (i, body) in [requested(1, true, true), started("w-1")].into_iter().enumerate() {
            let e = b.ev("bumped-v1", "cust-970", s, Some(i as i64 + 1), i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        for (i, body) in
            [requested(2, true, true), started("w-2"), observed(2, "crm-970", WorkerResponse)].into_iter().enumerate()
        {
            let e = b.ev("bumped-v2", "cust-970", s, Some(i as i64 + 1), 50 + i as i64 * 10, &format!("e{i}"), body);
            b.push(e);
        }
        // A manual decision closing a review case (after the race above).
        let e = b.ev(
            "race",
            "cust-700",
            s,
            None,
            500,
            "decision",
            Body::ManualDecision {
                actor: "ana".into(),
                decision: Decision::Confirm,
                note: "CRM shows v5 from worker w-1; w-2 was a stale retry".into(),
                evidence_checked: vec!["crm record".into(), "worker logs".into()],
            },
        );
        b.push(e);
        // Garbage.
        // Random bytes, a null value, JSON instead of Avro.
        b.records.push(InputRecord::Raw {
            key: format!("cust-x-{copy}").into_bytes(),
            value: Some(b"\x00\x01 not avro at all".to_vec()),
            class: "bad_magic",
        });
        b.records.push(InputRecord::Raw {
            key: format!("cust-y-{copy}").into_bytes(),
            value: None,
            class: "null_value",
        });
        b.records.push(InputRecord::Raw {
            key: format!("cust-z-{copy}").into_bytes(),
            value: Some(br#"{"event_id":"json-1","body":"Requested"}"#.to_vec()),
            class: "bad_magic",
        });
        // A valid event under another key than its entity.
        let e = b.ev("misrouted", "cust-990", s, Some(1), 0, "e0", requested(1, true, true));
        let value = Some(crate::codec::Codec::new().encode_event(&e).expect("the demo's events encode"));
        b.records.push(InputRecord::Raw {
            key: format!("not-{}", e.entity_id).into_bytes(),
            value,
            class: "key_mismatch",
        });
    }
    b.records
}

/// The idempotency key of probed story `op` in copy `copy`.
fn probe_key(op: &str, copy: usize) -> String {
    format!("{op}-{copy}")
}

/// The destination the demo starts for the probe worker: what `crm` holds
/// under each idempotency key of the workload. The probed stories find the
/// expected version (11), another one (12 asked, 9 held) or nothing; the
/// `silent` stories' destination never answers, so their probes fail and
/// the cases escalate at their follow-up.
pub fn destination_truth(copies: usize) -> HashMap<String, Held> {
    let mut held = HashMap::new();
    for copy in 0..copies {
        held.insert(
            probe_key("probed-same", copy),
            Held::Present { remote_id: format!("crm-910-{copy}"), version: 11 },
        );
        held.insert(
            probe_key("probed-other", copy),
            Held::Present { remote_id: format!("crm-911-{copy}"), version: 9 },
        );
        held.insert(probe_key("probed-absent", copy), Held::Absent);
    }
    // requested(4, ..) of the silent stories.
    held.insert("idem-v4".into(), Held::Silent);
    held
}

/// Per-type confirmation windows of the demo (short, so it ends quickly).
pub fn demo_types() -> [(&'static str, i64); 2] {
    [("sync_customer", 3_000), ("send_invoice", 4_000)]
}

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::system_clock;
use crate::codec::Codec;
use crate::config::{Config, DestinationConfig, TypeConfig};
use crate::core::memory::MemoryEngine;
use crate::core::{Output, Verdict};
use crate::kafka::producer::Publisher;
use crate::kafka::reader::TopicReader;
use crate::loadgen::destination::{DestinationServer, Held};
use crate::pipeline::{Pipeline, PipelineError};
use crate::probe::answer::PRODUCER;
use crate::probe::ProbeWorker;

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The probe worker failed.
    #[error(transparent)]
    Probe(#[from] crate::probe::WorkerError),
    /// The demo's destination service could not start.
    #[error("starting the demo's destination service: {0}")]
    Destination(#[source] std::io::Error),
    /// The panel's HTTP server could not start.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    /// `[http] bind` is not an address.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// What the demo saw on the output topics.
#[derive(Debug, Default)]
pub struct DemoReport {
    /// Input records published (valid events and the deliberately broken
    /// records).
    pub published: usize,
    /// Distinct verdicts the in-memory core predicts for the workload.
    pub expected_verdicts: usize,
    /// Distinct verdicts that arrived, by `decided_at`, then operation.
    pub verdicts: Vec<Verdict>,
    /// Distinct anomalies that arrived, by kind.
    pub anomalies: BTreeMap<String, usize>,
    /// Records read from the dead-letter topic.
    pub dead_letters: usize,
    /// The probe worker's answers on the input topic, by body
    /// (EffectObserved, EffectAbsent, ProbeFailed).
    pub probe_answers: BTreeMap<String, usize>,
    /// Every predicted verdict arrived before the timeout.
    pub settled: bool,
}

/// How the demo's probe worker reaches the demo's destination: short
/// timeouts, so the silent stories' probes fail before their follow-up.
fn demo_destination(server: &DestinationServer) -> DestinationConfig {
    DestinationConfig {
        timeout_ms: 500,
        concurrency: 8,
        failure_threshold: 20,
        open_for_ms: 5_000,
        ..server.destination()
    }
}

/// Adds the demo's per-type windows to a config.
pub fn configure(cfg: &mut Config) {
    for (ty, ms) in demo_types() {
        cfg.types.entry(ty.to_owned()).or_insert(TypeConfig { confirm_within_ms: Some(ms), ..TypeConfig::default() });
    }
}

/// What the core decides for the workload when every timer up to
/// `horizon` (event time) has fired: the outputs and the final state.
pub fn predict(cfg: &Config, records: &[InputRecord], horizon: i64) -> (Vec<Output>, MemoryEngine) {
    let policy = cfg.policy();
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    let events = records.iter().filter_map(|r| match r {
        InputRecord::Event(e) => Some(e.clone()),
        _ => None,
    });
    engine.replay(&policy, events, horizon, &mut out);
    (out, engine)
}

/// The verdicts the core predicts once every confirmation deadline (but no
/// retention) has passed.
pub fn predicted_verdicts(cfg: &Config, records: &[InputRecord], start: i64) -> Vec<Verdict> {
    predict(cfg, records, start + 3_600_000)
        .0
        .into_iter()
        .filter_map(|o| match o {
            Output::Verdict(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// The verdicts the core predicts when the probe worker answers every PROBE
/// command from `truth` (the demo's `crm`) right after it is issued, with
/// every timer up to an hour ahead fired (see
/// [`replay_with_answers`](crate::loadgen::destination::replay_with_answers)).
pub fn predicted_verdicts_with_probes(
    cfg: &Config,
    records: &[InputRecord],
    start: i64,
    truth: &HashMap<String, Held>,
) -> Vec<Verdict> {
    let events = records.iter().filter_map(|r| r.event().cloned());
    let held = HashMap::from([("crm".to_owned(), truth.clone())]);
    crate::loadgen::destination::replay_with_answers(&cfg.policy(), events, start + 3_600_000, &held)
        .0
        .into_iter()
        .filter_map(|o| match o {
            Output::Verdict(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// Publishes the workload to the input topic (the entity id as key, except
/// for the deliberately broken records).
pub fn publish(cfg: &Config, records: &[InputRecord]) -> Result<usize, PipelineError> {
    let codec = Codec::new();
    let keys = cfg.security.loaded();
    let out = records.iter().map(|r| r.to_outbox(&codec, &keys, &cfg.topics.events)).collect::<Result<Vec<_>, _>>()?;
    let publisher = Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes)?;
    Ok(publisher.publish_all(out.iter().map(|r| (r, None)))?)
}

/// Runs the whole demo: publish, run the pipeline (and its HTTP server,
/// the exception panel, on `[http] bind`) until the verdicts the core
/// predicts have all arrived (or `timeout`), and report what arrived.
/// `linger` gets the report and the panel's address while everything still
/// runs, and the demo stops when it returns: `reconciler demo` prints the
/// report there and keeps the panel up until Ctrl-C.
pub fn run(
    cfg: &Config,
    copies: usize,
    timeout: Duration,
    linger: impl FnOnce(&DemoReport, Option<std::net::SocketAddr>),
) -> Result<DemoReport, DemoError> {
    let start = (system_clock())();
    let records = workload(start, copies);
    // The destination the probe worker asks, and the worker itself.
    let truth = destination_truth(copies);
    let destination = DestinationServer::start(truth.clone()).map_err(DemoError::Destination)?;
    let mut cfg = cfg.clone();
    if cfg.security.control_keys.is_empty() && !cfg.security.allow_unsigned_control {
        // The demo's timers and decisions are signed as in production; a
        // key for this run only, unless one is configured.
        let key: String = std::iter::repeat_with(fastrand::alphanumeric).take(32).collect();
        tracing::info!(
            "No security.control_keys configured: the demo signs its control events with a key made for this run"
        );
        cfg.security.control_keys = vec![key];
    }
    cfg.destinations.insert("crm".into(), demo_destination(&destination));
    cfg.probe.state_dir = cfg.state_dir.join("probe");
    let cfg = &cfg;
    let predicted = predicted_verdicts_with_probes(cfg, &records, start, &truth);
    let shutdown = Arc::new(AtomicBool::new(false));
    let mut pipeline = Pipeline::new(cfg.clone(), system_clock())?;
    let mut prober = ProbeWorker::new(cfg.clone(), &prometheus::Registry::new())?;
    // The panel, over the pipeline's own store, metrics and ownership.
    let server = match cfg.http.bind_addr()? {
        Some(addr) => {
            let state = crate::http::AppState::of(&pipeline, cfg.clone(), system_clock());
            Some(crate::http::Server::start(addr, state)?)
        }
        None => None,
    };
    let published = publish(cfg, &records)?;
    let flag = shutdown.clone();
    let worker = std::thread::spawn(move || pipeline.run(&flag).map(|_| pipeline.stats));
    let flag = shutdown.clone();
    let probe_thread = std::thread::spawn(move || prober.run(&flag));
    let t = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts, &t.anomalies, &t.dlq, &t.events], t.partitions)
        .map_err(PipelineError::from)?;
    let verdict_topic = t.verdicts.clone();
    let want = predicted.len();
    let settled = reader.read_until(timeout, |recs| {
        let distinct: std::collections::HashSet<&[u8]> =
            recs.iter().filter(|r| *r.topic == *verdict_topic).filter_map(|r| r.value.as_deref()).collect();
        distinct.len() >= want
    });
    // Let the tail of anomalies and dead letters arrive as well.
    reader.read_until(Duration::from_millis(500), |_| false);
    let report = report_of(&reader, cfg, published, want, settled);
    linger(&report, server.as_ref().map(crate::http::Server::addr));
    drop(server);
    shutdown.store(true, Ordering::SeqCst);
    match worker.join() {
        Ok(r) => {
            r?;
        }
        Err(_) => return Err(PipelineError::ThreadPanicked("pipeline").into()),
    }
    match probe_thread.join() {
        Ok(r) => r?,
        Err(_) => return Err(PipelineError::ThreadPanicked("probe worker").into()),
    }
    Ok(report)
}

/// What the demo's reader found on the output topics.
fn report_of(reader: &TopicReader, cfg: &Config, published: usize, want: usize, settled: bool) -> DemoReport {
    let t = &cfg.topics;
    let codec = Codec::new();
    let mut probe_answers = BTreeMap::new();
    let mut answer_ids = std::collections::HashSet::new();
    for r in reader.of(&t.events) {
        if let Some(e) = r.value.as_deref().and_then(|b| codec.decode_event(b).ok()) {
            if e.producer == PRODUCER && answer_ids.insert(e.event_id.clone()) {
                *probe_answers.entry(e.body.name().to_owned()).or_default() += 1;
            }
        }
    }
    let mut seen = HashMap::new();
    for r in reader.of(&t.verdicts) {
        if let Some(v) = r.value.as_deref().and_then(|b| codec.decode_verdict(b).ok()) {
            seen.entry(v.verdict_id.clone()).or_insert(v);
        }
    }
    let mut verdicts: Vec<Verdict> = seen.into_values().collect();
    verdicts.sort_by(|a, b| (a.decided_at, &a.operation_id).cmp(&(b.decided_at, &b.operation_id)));
    let mut anomalies = BTreeMap::new();
    let mut anomaly_ids = std::collections::HashSet::new();
    for r in reader.of(&t.anomalies) {
        if let Some(a) = r.value.as_deref().and_then(|b| codec.decode_anomaly(b).ok()) {
            if anomaly_ids.insert(a.anomaly_id.clone()) {
                *anomalies.entry(a.kind.as_str().to_owned()).or_default() += 1;
            }
        }
    }
    DemoReport {
        published,
        expected_verdicts: want,
        verdicts,
        anomalies,
        dead_letters: reader.of(&t.dlq).count(),
        probe_answers,
        settled,
    }
}
