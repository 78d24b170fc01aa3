//! The schema registry of the Confluent framing: the reconciler's schemas
//! registered under their subjects at start-up, and the schemas that input
//! records name by id fetched once each, before the records are decoded.
//!
//! The codec does no IO ([`crate::codec`]): this module asks the registry
//! and hands the answers to it. An answer is final (a schema id never
//! changes its schema); an outage is not an answer, so a record whose
//! schema cannot be fetched yet is never dead-lettered: the batch waits
//! and the fetch is retried.

pub mod client;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use client::{RegistryClient, RegistryError};

use crate::codec::framing::confluent_id;
use crate::codec::{Codec, Framing, Learned, SchemaKind};
use crate::config::Config;

/// The subjects and ids of the schemas the reconciler writes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The record type.
    pub kind: SchemaKind,
    /// The topic it is written to.
    pub topic: String,
    /// The subject its schema is under.
    pub subject: String,
    /// The schema's id.
    pub id: u32,
}

/// The codec `cfg` asks for, with the fetcher of input schemas when the
/// Confluent framing is read, and what was registered. With `[codec]
/// output = "confluent"` the verdict, anomaly and command schemas are
/// registered (or, without `auto_register`, looked up) under their
/// subjects; so is the event schema when the input is read in the Confluent
/// framing only (the reconciler writes timer firings and decisions there).
/// A schema the registry refuses stops here, with the subject named.
pub fn codec(cfg: &Config) -> Result<(Codec, Option<SchemaFetcher>, Vec<Registered>), RegistryError> {
    let mut codec = Codec::new().reading(cfg.codec.input);
    if !cfg.codec.uses_registry() {
        return Ok((codec, None, Vec::new()));
    }
    let client = RegistryClient::new(&cfg.schema_registry)?;
    let t = &cfg.topics;
    let mut writes: Vec<(SchemaKind, &str)> = Vec::new();
    if cfg.codec.output == Framing::Confluent {
        writes.extend([
            (SchemaKind::Verdict, t.verdicts.as_str()),
            (SchemaKind::Anomaly, t.anomalies.as_str()),
            (SchemaKind::RepairCommand, t.commands.as_str()),
        ]);
    }
    if cfg.codec.input.written() == Framing::Confluent {
        writes.push((SchemaKind::OperationEvent, t.events.as_str()));
    }
    let mut registered = Vec::new();
    for (kind, topic) in writes {
        let subject = cfg.schema_registry.subject_naming.subject(topic, kind.full_name());
        let text = kind.current_text();
        let id = if cfg.schema_registry.auto_register {
            client.register(&subject, text)?
        } else {
            client.lookup(&subject, text)?.ok_or_else(|| RegistryError::NotFound {
                code: 40403,
                message: format!(
                    "the reconciler's {} schema is not registered under subject {subject:?}; register it \
                     (schemas/ holds it) or set schema_registry.auto_register = true",
                    kind.full_name()
                ),
            })?
        };
        codec = codec.writing_confluent(kind, id);
        registered.push(Registered { kind, topic: topic.to_owned(), subject, id });
    }
    let backoff_max = Duration::from_millis(cfg.schema_registry.retry_backoff_max_ms);
    let fetcher = cfg.codec.input.accepts(Framing::Confluent).then_some(SchemaFetcher { client, backoff_max });
    Ok((codec, fetcher, registered))
}

/// A codec that reads records of either framing, knowing every schema the
/// Confluent-framed `values` name, fetched from `cfg`'s registry if one is
/// configured: for the tools that read what any configuration wrote (an
/// id the registry does not have stays unknown, and its record does not
/// decode, saying so). An outage is an error here: a tool does not wait.
pub fn reader_for<'v>(cfg: &Config, values: impl IntoIterator<Item = &'v [u8]>) -> Result<Codec, RegistryError> {
    let codec = Codec::new().reading(crate::codec::InputFraming::Both);
    if cfg.schema_registry.url.trim().is_empty() {
        return Ok(codec);
    }
    let client = RegistryClient::new(&cfg.schema_registry)?;
    for id in unknown_ids(&codec, values) {
        let answer = ask(&client, id)?;
        codec.schemas().learn(id, answer.as_deref().map_err(Clone::clone));
    }
    Ok(codec)
}

/// The distinct schema ids the Confluent-framed `values` name that `codec`
/// does not know yet, in order.
fn unknown_ids<'v>(codec: &Codec, values: impl IntoIterator<Item = &'v [u8]>) -> Vec<u32> {
    let mut ids: Vec<u32> =
        values.into_iter().filter_map(confluent_id).filter(|id| codec.schemas().needs(*id)).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The registry's answer for schema `id`: its text, or why it has none
/// (an answer too); `Err` when it could not be asked.
fn ask(client: &RegistryClient, id: u32) -> Result<Result<String, String>, RegistryError> {
    match client.schema_by_id(id) {
        Ok(text) => Ok(Ok(text)),
        Err(RegistryError::NotFound { code, message }) => {
            Ok(Err(format!("the registry at {} has none ({code}: {message})", client.url())))
        }
        Err(e) => Err(e),
    }
}

/// Fetches the schemas input records name by id.
#[derive(Debug)]
pub struct SchemaFetcher {
    client: RegistryClient,
    backoff_max: Duration,
}

/// The registry could not be asked: the process is stopping.
#[derive(Debug, thiserror::Error)]
#[error("stopped while waiting for the schema registry")]
pub struct Stopped;

impl SchemaFetcher {
    /// A fetcher over `client`.
    pub fn new(client: RegistryClient, backoff_max: Duration) -> SchemaFetcher {
        SchemaFetcher { client, backoff_max }
    }

    /// Makes `codec` know every schema id the Confluent-framed `values`
    /// name. An id the registry does not have, or a schema that cannot be
    /// read, is learnt as such (its records become dead letters with the
    /// reason). While the registry cannot be reached (or refuses the
    /// reconciler's credentials) the call waits and retries, reporting each
    /// failure to `on_failure` and the recovery to `on_answer`, until it
    /// answers or `stop` is set. Returns the ids learnt.
    pub fn learn<'v>(
        &self,
        codec: &Codec,
        values: impl IntoIterator<Item = &'v [u8]>,
        stop: &AtomicBool,
        mut on_failure: impl FnMut(&RegistryError),
        mut on_answer: impl FnMut(),
    ) -> Result<Vec<(u32, Learned)>, Stopped> {
        let ids = unknown_ids(codec, values);
        let mut learnt = Vec::with_capacity(ids.len());
        for id in ids {
            let mut attempt = 0;
            let answer = loop {
                match ask(&self.client, id) {
                    Ok(answer) => break answer,
                    Err(e) => {
                        on_failure(&e);
                        attempt += 1;
                        let wait = crate::retry::backoff(
                            attempt,
                            Duration::from_millis(100),
                            self.backoff_max,
                            None,
                            fastrand::f64(),
                        );
                        if wait_or_stop(wait, stop) {
                            return Err(Stopped);
                        }
                    }
                }
            };
            on_answer();
            let l = codec.schemas().learn(id, answer.as_deref().map_err(Clone::clone));
            learnt.push((id, l));
        }
        Ok(learnt)
    }
}

/// Waits `wait`, in short steps so that a stop is seen; whether `stop` was
/// set.
fn wait_or_stop(wait: Duration, stop: &AtomicBool) -> bool {
    let until = std::time::Instant::now() + wait;
    while std::time::Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50).min(until - std::time::Instant::now()));
    }
    stop.load(Ordering::Relaxed)
}
