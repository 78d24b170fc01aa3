//! The worker loop: a consumer-group member on the commands topic that
//! answers each PROBE command by querying its destination and publishing
//! the answer to the input topic.
//!
//! The loop itself is blocking, like the pipeline's; the queries run on a
//! small tokio runtime, many at once, and come back through a channel.
//! Commands finish out of order; a partition's offset only moves past a
//! contiguous run of finished commands, so a restart never skips one.
//!
//! Order of writes for each answer: the ledger (synced), then the input
//! topic (acknowledged), then the ledger's offset. A kill between any two
//! re-reads the command and re-publishes the stored answer unchanged.
//!
//! The ledger is the worker's own: another worker that takes a partition
//! over starts from the group's committed offset. So when partitions are
//! revoked, the worker first settles what it can (waits, within
//! [`REVOKE_PATIENCE`], for the queries in flight, stores and publishes
//! their answers) and commits its finished offsets before it lets go:
//! the new owner does not ask the destination again about commands
//! already answered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::clock::{system_clock, Clock};
use crate::codec::Codec;
use crate::config::{Config, ConfigError};
use crate::core::redact::Redactor;
use crate::core::{RepairAction, RepairCommand};
use crate::crash::{self, CrashPoint};
use crate::kafka::consumer::{Assigned, GroupConsumer, OutOfRange, RevokeHook};
use crate::kafka::producer::Publisher;
use crate::kafka::KafkaError;
use crate::metrics::{ProbeMetrics, ProbeResult};
use crate::records::ProducerRecord;
use crate::signature::ControlKeys;

use super::answer::{answer_event, Outcome};
use super::destination::{Adapter, Finding, ProbeError};
use super::guard::Guard;
use super::ledger::{Ledger, LedgerError};
use crate::core::event::ProbeErrorClass;
use crate::retry::backoff;

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A destination or the worker is misconfigured.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The worker's store failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The query runtime could not start.
    #[error("starting the probe runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// An answer could not be encoded (a bug: the event is built here).
    #[error("encoding an answer: {0}")]
    Encode(#[from] crate::codec::EncodeError),
    /// The schema registry refused or could not be asked (the Confluent
    /// framing).
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
}

impl WorkerError {
    /// Whether starting the worker again may help.
    pub fn retriable(&self) -> bool {
        match self {
            WorkerError::Kafka(e) => e.retriable(),
            WorkerError::Ledger(_) | WorkerError::Runtime(_) => true,
            WorkerError::Config(_) | WorkerError::Encode(_) => false,
            // An outage may pass; a refused schema or credential does not.
            WorkerError::Registry(e) => e.is_outage(),
        }
    }
}

/// One destination: how to ask it and the limits of asking.
struct Destination {
    adapter: Adapter,
    guard: Guard,
}

/// How often answers older than `probe.answer_retention_ms` are forgotten.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// How long the worker waits, when partitions are revoked, for the queries
/// in flight before it lets the partitions go: the group's rebalance waits
/// meanwhile. A query that takes longer is finished and published all the
/// same, but its command may be asked again by the new owner.
pub const REVOKE_PATIENCE: Duration = Duration::from_secs(10);

/// The retry budget of a probe request.
#[derive(Debug, Clone, Copy)]
struct Budget {
    max_attempts: u32,
    initial: Duration,
    max: Duration,
}

/// A probe request that finished: where its command was and its outcome.
struct Done {
    partition: i32,
    offset: i64,
    cmd: RepairCommand,
    outcome: Outcome,
    at: i64,
}

/// What the loop knows of a partition: the offsets handed out and not yet
/// finished, the highest offset seen, and the offset last written to the
/// ledger.
#[derive(Default)]
struct PartitionProgress {
    open: BTreeSet<i64>,
    next: i64,
    written: Option<i64>,
}

impl PartitionProgress {
    /// The next offset to start from: the oldest unfinished one, or past
    /// everything seen.
    fn frontier(&self) -> i64 {
        self.open.first().copied().unwrap_or(self.next)
    }
}

/// An answer ready to publish: where its command was read, the command's
/// id and the answer's record.
type Answered = (i32, i64, String, ProducerRecord);

/// What the loop keeps between rounds, shared with the revoke hook.
struct Flow {
    progress: BTreeMap<i32, PartitionProgress>,
    /// Commands being queried, with the other places the same command was
    /// read meanwhile (a partition revoked and assigned back is read again
    /// from the ledger's offset; the pipeline re-sends a command after its
    /// own crash): those wait for the one answer.
    querying: HashMap<String, Vec<(i32, i64)>>,
    /// Queries started and not yet received back from `answers`.
    in_flight: usize,
    answers: Receiver<Done>,
}

/// Turns finished queries into answers, stores them, publishes them and
/// moves the offsets: what the loop does on each pass and the revoke hook
/// does once more before partitions are released.
struct Settler {
    codec: Codec,
    events: String,
    commands: String,
    redactor: Redactor,
    keys: ControlKeys,
    ledger: Arc<Ledger>,
    metrics: Arc<ProbeMetrics>,
    publisher: Publisher,
    /// When answers are recorded in the ledger.
    clock: Clock,
}

/// The probe worker.
pub struct ProbeWorker {
    cfg: Config,
    codec: Codec,
    redactor: Redactor,
    /// Signs every answer: a `ProbeFailed` is applied only signed, and the
    /// others are then known to be the worker's (see `core::trust`).
    keys: ControlKeys,
    ledger: Arc<Ledger>,
    destinations: Arc<BTreeMap<String, Arc<Destination>>>,
    metrics: Arc<ProbeMetrics>,
    runtime: tokio::runtime::Runtime,
    /// Wall clock: when an answer was given (its event's time, and how
    /// long the ledger keeps it).
    clock: Clock,
}

impl ProbeWorker {
    /// A worker for `cfg`'s destinations, its metrics registered in
    /// `registry`. Secrets are read and the store opened here: a missing
    /// environment variable fails now, with the field named.
    pub fn new(cfg: Config, registry: &prometheus::Registry) -> Result<ProbeWorker, WorkerError> {
        cfg.validate()?;
        let keys = cfg.security.keys()?;
        let mut destinations = BTreeMap::new();
        for (name, d) in &cfg.destinations {
            let dest = Destination { adapter: Adapter::build(name, d)?, guard: Guard::new(d) };
            destinations.insert(name.clone(), Arc::new(dest));
        }
        std::fs::create_dir_all(&cfg.probe.state_dir).map_err(|e| ConfigError::Invalid {
            field: "probe.state_dir".into(),
            reason: format!("cannot create {}: {e}", cfg.probe.state_dir.display()),
        })?;
        let ledger = Arc::new(Ledger::open(&cfg.probe.state_dir)?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("probe")
            .enable_all()
            .build()
            .map_err(WorkerError::Runtime)?;
        let metrics = Arc::new(ProbeMetrics::new(registry, cfg.destinations.keys().cloned()));
        let redactor = cfg.policy().redactor;
        // Commands are read, and answers written to the input, in the
        // framings of `[codec]`.
        let (codec, _, _) = crate::registry::codec(&cfg)?;
        Ok(ProbeWorker {
            cfg,
            codec,
            redactor,
            keys,
            ledger,
            destinations: Arc::new(destinations),
            metrics,
            runtime,
            clock: system_clock(),
        })
    }

    /// The worker reading time from `clock` rather than the system's.
    pub fn with_clock(mut self, clock: Clock) -> ProbeWorker {
        self.clock = clock;
        self
    }

    /// The worker's metrics.
    pub fn metrics(&self) -> Arc<ProbeMetrics> {
        self.metrics.clone()
    }

    /// Answers commands until `shutdown` is set, starting over after an
    /// error that may go away (the broker unreachable, a rebalance that
    /// failed, the store busy) as the pipeline waits such errors out; other
    /// errors end it. Requests in flight at shutdown or at an error are left
    /// unfinished: the next start reads them again.
    pub fn run(&mut self, shutdown: &AtomicBool) -> Result<(), WorkerError> {
        loop {
            match self.run_once(shutdown) {
                Ok(()) => return Ok(()),
                Err(e) if e.retriable() => {
                    warn!(error = %e, "The probe worker failed; starting over in 5 s");
                    let until = Instant::now() + Duration::from_secs(5);
                    while Instant::now() < until {
                        if shutdown.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        std::thread::sleep(Duration::from_millis(100)); // shutdown check interval
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn run_once(&mut self, shutdown: &AtomicBool) -> Result<(), WorkerError> {
        let cfg = &self.cfg;
        let ledger = self.ledger.clone();
        // Where the worker left off, or where the group did (another
        // instance had the partition), whichever is further.
        let commands = cfg.topics.commands.clone();
        let start = Box::new(move |p, committed: Option<i64>| {
            let own = ledger.next_offset(&commands, p).map_err(|e| e.to_string())?;
            Ok(Assigned { start: own.max(committed), committed })
        });
        // Started before the pipeline, the worker creates the topics it
        // reads and writes, as the pipeline would.
        let t = &cfg.topics;
        crate::kafka::connect::check_credentials(&cfg.kafka)?;
        crate::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, t.replication_factor)?;
        // A commands topic created again starts over: the ledger, not the
        // position, keeps a command from being asked twice.
        let consumer =
            GroupConsumer::new(&cfg.kafka, &cfg.probe.group_id, &cfg.topics.commands, start, OutOfRange::FromStart)?;
        let publisher = Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes)?;
        let budget = Budget {
            max_attempts: cfg.probe.max_attempts,
            initial: Duration::from_millis(cfg.probe.backoff_initial_ms),
            max: Duration::from_millis(cfg.probe.backoff_max_ms),
        };
        let max_in_flight = cfg.probe.max_in_flight;
        let (tx, rx) = channel::<Done>();
        let settler = Arc::new(Settler {
            codec: self.codec.clone(),
            events: cfg.topics.events.clone(),
            commands: cfg.topics.commands.clone(),
            redactor: self.redactor.clone(),
            keys: self.keys.clone(),
            ledger: self.ledger.clone(),
            metrics: self.metrics.clone(),
            publisher,
            clock: self.clock.clone(),
        });
        let flow = Arc::new(Mutex::new(Flow {
            progress: BTreeMap::new(),
            querying: HashMap::new(),
            in_flight: 0,
            answers: rx,
        }));
        consumer.on_revoke(revoke_hook(settler.clone(), flow.clone()));
        info!(group = %cfg.probe.group_id, topic = %cfg.topics.commands, destinations = self.destinations.len(), "Probe worker started");
        let mut last_circuits = Instant::now();
        let mut last_purge: Option<Instant> = None;
        while !shutdown.load(Ordering::Relaxed) {
            // Not locked while polling: a revocation runs the hook, which
            // takes the flow, inside the poll.
            let in_flight = flow.lock().expect("not poisoned").in_flight;
            let room = max_in_flight.saturating_sub(in_flight);
            let mut stored = Vec::new();
            let polled = if room > 0 {
                let wait = if in_flight > 0 { Duration::ZERO } else { Duration::from_millis(100) };
                Some(consumer.poll_batch(room, wait)?)
            } else {
                None
            };
            let mut f = flow.lock().expect("not poisoned");
            let f = &mut *f;
            if let Some((records, revoked)) = polled {
                if revoked {
                    let owned = consumer.assignment.lock().expect("not poisoned").owned.clone();
                    f.progress.retain(|p, _| owned.contains_key(p));
                }
                for r in records {
                    let p = f.progress.entry(r.partition).or_default();
                    p.open.insert(r.offset);
                    p.next = p.next.max(r.offset + 1);
                    match self.start(&r)? {
                        Started::Skipped => {
                            p.open.remove(&r.offset);
                        }
                        Started::Stored(cmd, record) => stored.push((r.partition, r.offset, cmd, record)),
                        Started::Query(cmd) => match f.querying.get_mut(&cmd.command_id) {
                            Some(waiting) => waiting.push((r.partition, r.offset)),
                            None => {
                                f.querying.insert(cmd.command_id.clone(), Vec::new());
                                self.spawn(r.partition, r.offset, cmd, budget, &tx);
                                f.in_flight += 1;
                            }
                        },
                    }
                }
            }
            let mut done: Vec<Done> = Vec::new();
            if f.in_flight > 0 && stored.is_empty() {
                match f.answers.recv_timeout(Duration::from_millis(if room > 0 { 5 } else { 50 })) {
                    Ok(d) => done.push(d),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => unreachable!("the loop holds a sender"),
                }
            }
            done.extend(f.answers.try_iter());
            let moved = settler.settle(f, done, stored)?;
            // For lag, and for another worker taking a partition over.
            consumer.commit_for_visibility(&moved);
            if last_circuits.elapsed() >= Duration::from_secs(1) {
                for (name, d) in self.destinations.iter() {
                    self.metrics.circuit(name, d.guard.circuit_open());
                }
                last_circuits = Instant::now();
            }
            if last_purge.is_none_or(|t| t.elapsed() >= PURGE_EVERY) {
                let n = self.ledger.purge((self.clock)().saturating_sub(cfg.probe.answer_retention_ms))?;
                if n > 0 {
                    info!(answers = n, "Forgot answers older than probe.answer_retention_ms");
                }
                last_purge = Some(Instant::now());
            }
        }
        let in_flight = flow.lock().expect("not poisoned").in_flight;
        info!(in_flight, "Probe worker stopping; unfinished requests are answered after the next start");
        Ok(())
    }

    /// Takes record `r` of the commands topic: a probe request to query, one
    /// already answered (republished from the ledger), or anything else
    /// (skipped).
    fn start(&self, r: &crate::records::Record) -> Result<Started, WorkerError> {
        let cmd = match r.value.as_deref().map(|v| self.codec.decode_command(v)) {
            Some(Ok(c)) => c,
            other => {
                let why = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "a null value".into(),
                };
                warn!(partition = r.partition, offset = r.offset, error = %why, "Skipping an undecodable command");
                self.metrics.skipped("undecodable");
                return Ok(Started::Skipped);
            }
        };
        if cmd.action != RepairAction::Probe {
            self.metrics.skipped("requeue");
            return Ok(Started::Skipped);
        }
        if let Some((key, value)) = self.ledger.answer(&cmd.command_id)? {
            self.metrics.republished(&cmd.destination);
            let record = ProducerRecord {
                topic: self.cfg.topics.events.clone(),
                key: Some(key),
                value: Some(value),
                headers: Vec::new(),
            };
            return Ok(Started::Stored(cmd.command_id, record));
        }
        Ok(Started::Query(cmd))
    }

    /// Starts the queries of `cmd` (read at `partition`/`offset`) on the
    /// runtime; the outcome comes back through `tx`.
    fn spawn(&self, partition: i32, offset: i64, cmd: RepairCommand, budget: Budget, tx: &Sender<Done>) {
        let dest = self.destinations.get(&cmd.destination).cloned();
        let metrics = self.metrics.clone();
        let tx = tx.clone();
        let clock = self.clock.clone();
        self.runtime.spawn(async move {
            metrics.in_flight(&cmd.destination, 1);
            let outcome = match dest {
                Some(d) => probe(&d, &cmd, budget, &metrics).await,
                None => Err((
                    0,
                    ProbeError::new(
                        ProbeErrorClass::UnknownDestination,
                        format!("no [destinations.{}] is configured", cmd.destination),
                    ),
                )),
            };
            metrics.in_flight(&cmd.destination, -1);
            // The loop outlives its tasks unless it is stopping; then the
            // request is answered after the next start.
            let _ = tx.send(Done { partition, offset, cmd, outcome, at: clock() });
        });
    }
}

impl Settler {
    /// Settles one pass of the loop: the queries in `done` become answers,
    /// stored in the ledger (synced) before anything is published; with the answers
    /// found `stored` in the ledger and the places that waited for them,
    /// they are published, their offsets finished, and each partition's
    /// offset written to the ledger past its contiguous finished commands.
    /// Returns the partitions whose offset moved, with it.
    fn settle(&self, f: &mut Flow, done: Vec<Done>, stored: Vec<Answered>) -> Result<BTreeMap<i32, i64>, WorkerError> {
        f.in_flight -= done.len();
        let mut finished = stored;
        let from = finished.len();
        self.finish(done, &mut finished)?;
        // The same answer for the places that waited for it.
        let mut waited = Vec::new();
        for (_, _, id, record) in &finished[from..] {
            for (p, o) in f.querying.remove(id).unwrap_or_default() {
                waited.push((p, o, id.clone(), record.clone()));
            }
        }
        finished.extend(waited);
        if !finished.is_empty() {
            crash::point(CrashPoint::ProbeAfterLedger);
            let records: Vec<&ProducerRecord> = finished.iter().map(|(_, _, _, r)| r).collect();
            self.publisher.publish_all(records.into_iter().map(|r| (r, None)))?;
            crash::point(CrashPoint::ProbeAfterPublish);
            for (partition, offset, _, _) in finished {
                if let Some(p) = f.progress.get_mut(&partition) {
                    p.open.remove(&offset);
                }
            }
        }
        self.advance(&mut f.progress)
    }

    /// Turns finished requests into answer records, stored in the ledger
    /// (synced) before anything is published.
    fn finish(&self, done: Vec<Done>, finished: &mut Vec<Answered>) -> Result<(), WorkerError> {
        if done.is_empty() {
            return Ok(());
        }
        // Each command is queried once at a time (the flow's `querying`
        // map holds the other reads of it), and one with an answer stored
        // is never queried: none of these has an answer yet.
        let mut fresh: Vec<Answered> = Vec::with_capacity(done.len());
        for d in done {
            let ev = answer_event(&d.cmd, &d.outcome, d.at, &self.redactor);
            let record = crate::records::event_record(&self.codec, &self.events, &ev)?;
            let record = crate::records::signed(record, &self.keys);
            let result = match &d.outcome {
                Ok((_, a)) if matches!(a.finding, Finding::Absent) => ProbeResult::Absent,
                Ok(_) => ProbeResult::Observed,
                Err((_, e)) => {
                    warn!(command = %d.cmd.command_id, destination = %d.cmd.destination, class = e.class.as_str(), detail = %e.detail, "Probe failed");
                    ProbeResult::Failed
                }
            };
            self.metrics.probe(&d.cmd.destination, result);
            fresh.push((d.partition, d.offset, d.cmd.command_id, record));
        }
        if !fresh.is_empty() {
            self.ledger.record(
                (self.clock)(),
                fresh.iter().map(|(_, _, id, r)| {
                    (id.as_str(), r.key.as_deref().unwrap_or_default(), r.value.as_deref().unwrap_or_default())
                }),
            )?;
        }
        finished.extend(fresh);
        Ok(())
    }

    /// Moves each partition's offset in the ledger past its contiguous
    /// finished commands; returns the partitions whose offset moved.
    fn advance(&self, progress: &mut BTreeMap<i32, PartitionProgress>) -> Result<BTreeMap<i32, i64>, WorkerError> {
        let mut moved = BTreeMap::new();
        for (partition, p) in progress.iter_mut() {
            let frontier = p.frontier();
            if p.written != Some(frontier) {
                self.ledger.advance(&self.commands, *partition, frontier)?;
                p.written = Some(frontier);
                moved.insert(*partition, frontier);
            }
        }
        Ok(moved)
    }
}

/// What runs when partitions are revoked, before they are released: waits
/// up to [`REVOKE_PATIENCE`] for the queries in flight, settles them, and
/// returns every partition's finished offset for the consumer to commit
/// (synchronously) before it lets go. Without it the new owner would
/// start from the last commit and ask again about the commands answered
/// since.
fn revoke_hook(settler: Arc<Settler>, flow: Arc<Mutex<Flow>>) -> RevokeHook {
    Box::new(move || {
        let mut f = flow.lock().unwrap_or_else(|e| e.into_inner());
        let until = Instant::now() + REVOKE_PATIENCE;
        let mut done = Vec::new();
        while done.len() < f.in_flight {
            match f.answers.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(d) => done.push(d),
                Err(_) => break,
            }
        }
        let unfinished = f.in_flight - done.len();
        if unfinished > 0 {
            warn!(
                unfinished,
                "Partitions revoked with probe requests still in flight; the new owner may ask about them again"
            );
        }
        if let Err(e) = settler.settle(&mut f, done, Vec::new()) {
            warn!(error = %e, "Settling answers before releasing partitions failed; the new owner may ask about them again");
            return None;
        }
        let finished: BTreeMap<i32, i64> = f.progress.iter().map(|(p, pp)| (*p, pp.frontier())).collect();
        Some(finished).filter(|m| !m.is_empty())
    })
}

/// What became of a command record.
enum Started {
    /// Not a probe request (or undecodable): finished at once.
    Skipped,
    /// Answered before: its stored answer, to publish again.
    Stored(String, ProducerRecord),
    /// A probe request to query.
    Query(RepairCommand),
}

/// Queries `dest` about `cmd` until it answers, refuses, or the budget is
/// spent, backing off between queries.
async fn probe(dest: &Destination, cmd: &RepairCommand, budget: Budget, metrics: &ProbeMetrics) -> Outcome {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = Instant::now();
        let result = dest.guard.run(dest.adapter.query(cmd)).await;
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(answer) => {
                metrics.query(&cmd.destination, None, took);
                return Ok((attempt, answer));
            }
            Err(e) => {
                metrics.query(&cmd.destination, Some(e.class), took);
                if !e.retriable() || attempt >= budget.max_attempts {
                    return Err((attempt, e));
                }
                // An open circuit says when it lets a trial through: wait
                // for that rather than spend the budget without a query.
                let wait = match (e.class, e.retry_after) {
                    (ProbeErrorClass::CircuitOpen, Some(open)) => open,
                    _ => backoff(attempt, budget.initial, budget.max, e.retry_after, fastrand::f64()),
                };
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::DestinationConfig;
    use crate::loadgen::destination::{DestinationServer, Held};
    use crate::probe::destination::Finding;

    /// A destination that fails three times while its breaker opens after
    /// two failures: the probe waits for each trial (not a back-off of a
    /// few ms that would find the circuit still open and spend the budget)
    /// and gets the answer on the sixth attempt.
    #[test]
    fn an_open_circuit_is_waited_for_not_counted_through() {
        let held = HashMap::from([(
            "k".to_owned(),
            Held::Unavailable { failures: 3, then: Box::new(Held::Present { remote_id: "r".into(), version: 7 }) },
        )]);
        let server = DestinationServer::start(held).unwrap();
        let cfg = DestinationConfig { concurrency: 1, failure_threshold: 2, open_for_ms: 300, ..server.destination() };
        let dest = Destination { adapter: Adapter::build("crm", &cfg).unwrap(), guard: Guard::new(&cfg) };
        let cmd = crate::probe::answer::probe_command("c");
        let budget = Budget { max_attempts: 6, initial: Duration::from_millis(10), max: Duration::from_millis(20) };
        let metrics = ProbeMetrics::new(&prometheus::Registry::new(), ["crm".to_owned()]);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome = rt.block_on(probe(&dest, &cmd, budget, &metrics));
        let (attempts, answer) = outcome.unwrap_or_else(|(n, e)| panic!("failed after {n}: {e:?}"));
        // 503, 503 (opens), open: wait, trial 503 (opens again), open: wait, trial 200.
        assert_eq!(attempts, 6);
        assert!(matches!(answer.finding, Finding::Present { version: Some(7), .. }), "{answer:?}");
        assert_eq!(server.queries("k"), 4, "no query while the circuit was open");
    }
}
