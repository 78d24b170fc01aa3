//! A small destination service that holds a known set of effects and
//! answers lookups by idempotency key over HTTP, the way a CRM or a ledger
//! API would: `GET /effects/{key}` is 200 with `{"id": ..., "version": ...}`
//! when it holds the effect and 404 when not. Some keys can be made to fail
//! (503) a number of times first, to flip their answer on every query, or
//! never to answer at all.
//!
//! The demo, the loadgen workload and the tests start it so that the probe
//! worker has something real to ask: it is a fixture of the workloads, not
//! part of the product.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use crate::config::DestinationConfig;
use crate::core::memory::MemoryEngine;
use crate::core::{Event, Output, Policy, RepairAction, RepairCommand, SourcePos};
use crate::probe::answer::answer_event;
use crate::probe::destination::{Answer, Finding};

/// What the destination holds under one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The effect, with its remote id and version.
    Present {
        /// The destination's id of the effect.
        remote_id: String,
        /// The version it carries.
        version: i64,
    },
    /// Nothing (the same as a key it was never told about).
    Absent,
    /// 503 (with `Retry-After: 0`) for the first `failures` queries, then
    /// `then`.
    Unavailable {
        /// Queries answered 503.
        failures: u32,
        /// What it answers afterwards.
        then: Box<Held>,
    },
    /// Present and absent in turn, query after query: a destination whose
    /// answer a second query would contradict.
    Flipping {
        /// The effect's remote id and version when present.
        remote_id: String,
        /// Its version.
        version: i64,
    },
    /// Never answers (the connection stays open).
    Silent,
}

#[derive(Default)]
struct Holdings {
    held: HashMap<String, Held>,
    queries: HashMap<String, u32>,
    /// How long each lookup takes before it answers.
    delay: std::time::Duration,
}

/// The running service; stops when dropped.
pub struct DestinationServer {
    addr: SocketAddr,
    holdings: Arc<Mutex<Holdings>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl DestinationServer {
    /// Serves `held` on a free local port.
    pub fn start(held: HashMap<String, Held>) -> std::io::Result<DestinationServer> {
        DestinationServer::start_slow(held, std::time::Duration::ZERO)
    }

    /// Serves `held`, each lookup taking `delay` (a slow destination keeps
    /// queries in flight).
    pub fn start_slow(held: HashMap<String, Held>, delay: std::time::Duration) -> std::io::Result<DestinationServer> {
        DestinationServer::start_on("127.0.0.1:0".parse().expect("an address"), held, delay)
    }

    /// Serves `held` on `addr`, each lookup taking `delay`.
    pub fn start_on(
        addr: SocketAddr,
        held: HashMap<String, Held>,
        delay: std::time::Duration,
    ) -> std::io::Result<DestinationServer> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let holdings = Arc::new(Mutex::new(Holdings { held, queries: HashMap::new(), delay }));
        let app = Router::new().route("/effects/{key}", get(lookup)).with_state(holdings.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("destination".into()).spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let stop = async {
                    let _ = rx.await;
                };
                let _ = axum::serve(listener, app).with_graceful_shutdown(stop).await;
            });
            // Silent lookups are still pending: do not wait for them.
            runtime.shutdown_background();
        })?;
        Ok(DestinationServer { addr, holdings, shutdown: Some(tx), thread: Some(thread) })
    }

    /// The URL template a `[destinations.<name>]` of kind http uses for it.
    pub fn url_template(&self) -> String {
        format!("http://{}/effects/{{idempotency_key}}", self.addr)
    }

    /// How the probe worker reaches it: its URL, the JSON pointers of its
    /// answers, the other fields at their defaults.
    pub fn destination(&self) -> DestinationConfig {
        DestinationConfig {
            remote_id_pointer: Some("/id".into()),
            version_pointer: Some("/version".into()),
            ..DestinationConfig::http(self.url_template())
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many times `key` was asked for.
    pub fn queries(&self, key: &str) -> u32 {
        self.holdings.lock().expect("not poisoned").queries.get(key).copied().unwrap_or(0)
    }

    /// How many lookups it served in all.
    pub fn total_queries(&self) -> u64 {
        self.holdings.lock().expect("not poisoned").queries.values().map(|n| u64::from(*n)).sum()
    }
}

impl Drop for DestinationServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn present(remote_id: &str, version: i64) -> Response {
    let body = serde_json::json!({ "id": remote_id, "version": version }).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn lookup(State(h): State<Arc<Mutex<Holdings>>>, Path(key): Path<String>) -> Response {
    let delay = h.lock().expect("not poisoned").delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let answer = {
        let mut h = h.lock().expect("not poisoned");
        let n = {
            let n = h.queries.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let mut held = h.held.get(&key).cloned().unwrap_or(Held::Absent);
        if let Held::Unavailable { failures, then } = held {
            if n <= failures {
                return (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "0")], "busy").into_response();
            }
            held = *then;
        }
        held_answer(held, n)
    };
    match answer {
        Some(r) => r,
        // Silent: hold the connection until the client gives up.
        None => std::future::pending::<Response>().await,
    }
}

fn held_answer(held: Held, n: u32) -> Option<Response> {
    Some(match held {
        Held::Present { remote_id, version } => present(&remote_id, version),
        Held::Flipping { remote_id, version } if n % 2 == 1 => present(&remote_id, version),
        Held::Flipping { .. } | Held::Absent | Held::Unavailable { .. } => {
            (StatusCode::NOT_FOUND, "no such effect").into_response()
        }
        Held::Silent => return None,
    })
}

/// What the probe worker finds under `key` in `held`, once it gets an
/// answer (`None`: it never does).
fn finding(held: Option<&Held>) -> Option<Finding> {
    match held {
        None | Some(Held::Absent) => Some(Finding::Absent),
        Some(Held::Present { remote_id, version }) | Some(Held::Flipping { remote_id, version }) => {
            Some(Finding::Present { remote_id: Some(remote_id.clone()), version: Some(*version), fingerprint: None })
        }
        Some(Held::Unavailable { then, .. }) => finding(Some(then)),
        Some(Held::Silent) => None,
    }
}

/// What the core decides for `events` when a probe worker answers every
/// PROBE command right after it is issued (before its follow-up), from
/// what each destination holds (`held`, by destination name): timers fire
/// in event-time order up to `horizon`, and each PROBE command they produce
/// is followed by the answer the worker publishes. A command to a
/// destination not in `held`, or to a key that never answers, gets no
/// answer (the worker's `ProbeFailed` changes nothing). The demo's
/// prediction and the loadgen truth's offline check use it.
pub fn replay_with_answers(
    policy: &Policy,
    events: impl IntoIterator<Item = Event>,
    horizon: i64,
    held: &HashMap<String, HashMap<String, Held>>,
) -> (Vec<Output>, MemoryEngine) {
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    let mut offset = 0;
    let mut pos = move || {
        offset += 1;
        SourcePos { partition: 0, offset }
    };
    for e in events {
        engine.process(policy, e, pos(), &mut out);
    }
    let mut seen = 0;
    while let Some(next) = engine.ops.values().filter_map(|op| op.timer_at).filter(|t| *t <= horizon).min() {
        engine.run_timers(policy, next, &mut pos, &mut out);
        let commands: Vec<RepairCommand> = out[seen..]
            .iter()
            .filter_map(|o| match o {
                Output::Command(c) if c.action == RepairAction::Probe => Some(c.clone()),
                _ => None,
            })
            .collect();
        seen = out.len();
        for c in commands {
            let Some(destination) = held.get(&c.destination) else { continue };
            let Some(found) = finding(c.idempotency_key.as_ref().and_then(|k| destination.get(k))) else { continue };
            let outcome = Ok((1, Answer { finding: found, query: String::new() }));
            let answer = answer_event(&c, &outcome, c.issued_at + 1, &policy.redactor);
            engine.process(policy, answer, pos(), &mut out);
            seen = out.len();
        }
    }
    (out, engine)
}

/// `n` PROBE commands to `destination`, the `i`th (id `{prefix}cmd-{i}`)
/// asking about `key-{i}` at version 7, as records of `topic`: the
/// backlog the tests and the probe bench give the probe worker.
pub fn probe_commands(topic: &str, destination: &str, prefix: &str, n: usize) -> Vec<crate::records::ProducerRecord> {
    let codec = crate::codec::Codec::new();
    (0..n)
        .map(|i| {
            let c = crate::core::RepairCommand {
                command_id: format!("{prefix}cmd-{i}"),
                verdict_id: format!("v-{i}"),
                operation_id: format!("op-{i}"),
                entity_id: format!("ent-{i}"),
                operation_type: "sync_customer".into(),
                action: crate::core::RepairAction::Probe,
                idempotency_key: Some(format!("key-{i}")),
                destination: destination.into(),
                expected_version: Some(7),
                expected_fingerprint: None,
                issued_at: 0,
            };
            crate::records::ProducerRecord {
                topic: topic.to_owned(),
                key: Some(c.entity_id.clone().into_bytes()),
                value: Some(codec.encode_command(&c).expect("a command encodes")),
                headers: Vec::new(),
            }
        })
        .collect()
}
