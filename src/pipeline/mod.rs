//! The run loop: consume a batch → decode → core (in lanes of whole
//! partitions, on `[consumer] apply_threads` threads) → one atomic store
//! write per lane (state, timers, offsets, outbox) → send the outputs →
//! consume and apply the next batches while the broker acknowledges → send
//! the changelog → forget the acknowledged outbox. Outputs are sent as soon
//! as their batch is stored; the idempotent producer keeps them in the
//! input order (see [`in_flight`]).
//!
//! The pipeline decides; the Kafka adapter reports facts. Where it is:
//! - [`apply`]: a batch's own work (decode, core, timeline, metrics), no Kafka;
//! - [`in_flight`]: a stored batch's outputs, changelog and offsets, on their
//!   way out while the next batches are applied;
//! - [`restore`]: what a moved partition restores silently, and the zombie fence;
//! - `timers.rs`: the timer wheel, turning due deadlines into
//!   `DeadlineReached` events in the log;
//! - [`sampler`]: the state gauges, read from the store and the broker;
//! - [`broker_watch`]: whether the broker answers (readiness, and the gauge
//!   the unreachable-broker alert watches);
//! - `exactly_once.rs`: the same loop under `guarantee = "exactly_once"`,
//!   a Kafka transaction per batch before its store write.

mod apply;
mod background;
mod batch_limit;
pub mod broker_watch;
mod exactly_once;
mod in_flight;
pub mod lost_position;
pub mod previous_names;
pub mod restore;
pub mod sampler;
mod timers;

pub use apply::{Applied, Applier};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use crate::clock::Clock;
use crate::codec::{Codec, EncodeError};
use crate::config::{Config, Guarantee, OnLostPosition};
use crate::core::Policy;
use crate::crash::{self, CrashPoint};
use crate::kafka::consumer::{GroupConsumer, OutOfRange};
use crate::kafka::producer::Publisher;
use crate::kafka::transaction::{Transactions, TxnError};
use crate::kafka::watermarks::Watermarks;
use crate::kafka::{admin, permissions, KafkaError};
use crate::metrics::{Metrics, Readiness};
use crate::records::{ProducerRecord, Record, DLQ_HEADER_ROOM};
use crate::store::{changelog, Claims, Store, StoreError};

/// How often an idle at-least-once pipeline compares the group's offsets
/// with its own (see `Pipeline::mend_group_offsets`), and how long it waits
/// for the answer (the run loop waits meanwhile).
const OFFSETS_CHECK_EVERY: Duration = Duration::from_secs(5);
const OFFSETS_CHECK_PATIENCE: Duration = Duration::from_secs(1);

/// Opens the state store of `cfg` (creating its directory): for a live
/// pipeline, or for a rebuild when `replay` is set (see
/// [`Store::open_for_rebuild`]).
fn open_store(cfg: &Config, replay: Option<bool>) -> Result<Store, PipelineError> {
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|source| PipelineError::StateDir { dir: cfg.state_dir.display().to_string(), source })?;
    let events = &cfg.topics.events;
    Ok(match replay {
        None => Store::open_with(&cfg.state_dir, events, cfg.sync_writes, &cfg.store)?,
        Some(_) => Store::open_for_rebuild(&cfg.state_dir, events, &cfg.store)?,
    })
}

/// The partition of a changelog record (from its key).
fn changelog_partition(r: &ProducerRecord) -> Option<i32> {
    changelog::partition_of(r.key.as_deref().unwrap_or_default())
}

/// Why the pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The broker or the client failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An output could not be encoded (a schema and the code disagree).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The transactional producer cannot go on (fenced by a newer instance
    /// with the same transactional id, or a fatal client error).
    #[error(transparent)]
    Transaction(#[from] TxnError),
    /// The state directory could not be created.
    #[error("creating the state directory {dir}: {source}")]
    StateDir {
        /// The directory.
        dir: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Publishing kept failing with an error no retry cures (no permission,
    /// no such topic, a record the broker refuses) for `[consumer]
    /// give_up_after_ms`: the instance stops instead of retrying forever.
    #[error("publishing outputs failed for {seconds} s with an error that retrying does not cure: {source}")]
    PublishRefused {
        /// How long it kept trying.
        seconds: u64,
        /// The last error.
        #[source]
        source: KafkaError,
    },
    /// A partition's position is outside the input's log (see
    /// [`lost_position`]).
    #[error(transparent)]
    LostPosition(#[from] lost_position::LostPosition),
    /// The schema registry refused a schema at start-up, or could not be
    /// asked.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    /// Stopped while input records waited for the schema registry.
    #[error(transparent)]
    RegistryWait(#[from] crate::registry::Stopped),
    /// A thread of the pipeline panicked.
    #[error("the {0} thread panicked")]
    ThreadPanicked(&'static str),
    /// The configuration cannot run a pipeline (no control keys, ...).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Counts of what the pipeline did, for logs and the demo.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Input records taken in.
    pub records: u64,
    /// Decoded events by how the core accounted for them.
    pub by_disposition: BTreeMap<&'static str, u64>,
    /// Dead letters by error class.
    pub dead_letters: BTreeMap<&'static str, u64>,
    /// Verdicts issued.
    pub verdicts: u64,
    /// Anomalies issued.
    pub anomalies: u64,
    /// Repair commands issued.
    pub commands: u64,
    /// `DeadlineReached` events written.
    pub timers_fired: u64,
    /// Batches committed.
    pub batches: u64,
    /// Records applied without publishing while restoring a partition.
    pub restored: u64,
    /// Batches dropped by the zombie fence (see [`crate::pipeline::restore`]).
    pub fenced: u64,
    /// Transactions aborted (`exactly_once`): their batches were consumed again.
    pub aborted: u64,
}

impl Stats {
    /// Adds the counts of `other` to these.
    pub fn absorb(&mut self, other: Stats) {
        let Stats {
            records,
            by_disposition,
            dead_letters,
            verdicts,
            anomalies,
            commands,
            timers_fired,
            batches,
            restored,
            fenced,
            aborted,
        } = other;
        self.records += records;
        for (k, n) in by_disposition {
            *self.by_disposition.entry(k).or_default() += n;
        }
        for (k, n) in dead_letters {
            *self.dead_letters.entry(k).or_default() += n;
        }
        self.verdicts += verdicts;
        self.anomalies += anomalies;
        self.commands += commands;
        self.timers_fired += timers_fired;
        self.batches += batches;
        self.restored += restored;
        self.fenced += fenced;
        self.aborted += aborted;
    }
}

/// Everything `run` needs, built from the config.
pub struct Pipeline {
    cfg: Config,
    policy: Policy,
    /// Signs the timers this instance fires and verifies control events.
    keys: crate::signature::ControlKeys,
    codec: Codec,
    /// Fetches the schemas Confluent-framed input records name (`None`:
    /// the input is read single-object encoded only).
    schemas: Option<crate::registry::SchemaFetcher>,
    store: Arc<Store>,
    /// The partitions this pipeline writes (see [`Claims`]).
    claims: Claims,
    /// A lost position that stopped an assignment (see [`lost_position`]).
    lost: Arc<std::sync::Mutex<Option<lost_position::LostPosition>>>,
    consumer: GroupConsumer,
    /// The producer of every output (transactional under `exactly_once`).
    publisher: Arc<Publisher>,
    /// Under `exactly_once`: the transactions of `publisher`.
    txn: Option<Transactions>,
    /// The producer of `DeadlineReached` events: `publisher` itself under
    /// `at_least_once`, an idempotent producer of its own under
    /// `exactly_once` (see [`Pipeline::fire_timers`]).
    timer_publisher: Arc<Publisher>,
    clock: Clock,
    fence: restore::Fence,
    /// Per partition restoring its state: records below the offset are
    /// applied without publishing (see [`restore`]).
    restore_until: BTreeMap<i32, i64>,
    timers: timers::TimerWheel,
    /// Watermark queries (catch-up of the timer wheel, lag gauges).
    watermarks: Arc<Watermarks>,
    /// Outputs are counted but neither stored nor published (`replay`
    /// without scratch topics).
    discard_outputs: bool,
    /// What the pipeline did so far.
    pub stats: Stats,
    metrics: Arc<Metrics>,
    /// The stored batches not yet acknowledged (see [`in_flight`]).
    /// Shared with the consumer's revoke callback, which finishes them
    /// before partitions are released.
    in_flight: Arc<Mutex<in_flight::InFlight>>,
    /// How many records the next poll takes (see [`batch_limit`]).
    batch_limit: batch_limit::BatchLimit,
}

impl Pipeline {
    /// Opens the store, creates missing topics, joins the group.
    pub fn new(cfg: Config, clock: Clock) -> Result<Pipeline, PipelineError> {
        Pipeline::open(cfg, clock, None)
    }

    /// A pipeline that rebuilds the state in `cfg.state_dir` from the input
    /// topic (`reconciler replay`): its timers never come due (deadlines
    /// come from the log only), its store skips the write-ahead log (see
    /// [`Store::open_for_rebuild`]), and with `discard_outputs` its outputs
    /// are counted but neither stored nor published.
    pub fn for_replay(cfg: Config, discard_outputs: bool) -> Result<Pipeline, PipelineError> {
        Pipeline::open(cfg, Arc::new(|| i64::MIN), Some(discard_outputs))
    }

    /// `replay`: `None` for a live pipeline, else whether outputs are discarded.
    fn open(mut cfg: Config, clock: Clock, replay: Option<bool>) -> Result<Pipeline, PipelineError> {
        // "One lane per core" resolved once: finding the core count reads
        // the affinity mask and cgroup files, too much for every batch.
        cfg.consumer.apply_threads = cfg.consumer.apply_lanes();
        // First: an instance that could neither sign its timers nor accept
        // a decision must not start (see `core::trust`).
        let keys = cfg.security.keys()?;
        if cfg.security.allow_unsigned_control {
            warn!("security.allow_unsigned_control = true: control events (DeadlineReached, ManualDecision, ProbeFailed) are applied without checking their signature; any producer with write access to the input can force overdue verdicts and decide review cases");
        }
        if replay.is_some() {
            // A rebuild publishes into scratch topics or nowhere: never
            // into the live changelog.
            cfg.topics.no_changelog();
        }
        let t = &cfg.topics;
        // Each start-up step's time at debug: the time to the first
        // verdict is a benchmark target (benches/e2e.rs).
        let began = Instant::now();
        let step = |what: &str| debug!(ms = began.elapsed().as_millis() as u64, "Start-up: {what}");
        // The store opens on a thread of its own while the broker answers
        // the checks below: each takes tens of milliseconds, most of it
        // waiting, and both come before the first verdict. A broker's
        // refusal is still reported first, as when they ran in turn.
        let (broker, store) = std::thread::scope(|s| {
            let opening = s.spawn(|| {
                let opened = open_store(&cfg, replay);
                step("store opened");
                opened
            });
            let broker = (|| {
                // Refused credentials fail here, with the broker's reason,
                // rather than as the next call's timeout.
                crate::kafka::connect::check_credentials(&cfg.kafka)?;
                step("credentials checked");
                if replay.is_none() {
                    // A missing right on an existing topic fails now,
                    // naming the topic and what it is for, not at the first
                    // verdict after the group assigned partitions.
                    permissions::check(&cfg.kafka, &topic_needs(t))?;
                    step("topic rights checked");
                }
                admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, t.replication_factor)?;
                step("topics ensured");
                let watermarks = Arc::new(Watermarks::new(&cfg.kafka)?);
                if replay.is_none() {
                    previous_names::check(&cfg, &watermarks)?;
                }
                let created = match t.changelog() {
                    Some(changelog) => {
                        admin::ensure_changelog(&cfg.kafka, &watermarks, changelog, &t.events, t.replication_factor)?
                    }
                    None => false,
                };
                step("changelog ensured");
                Ok::<_, PipelineError>((watermarks, created))
            })();
            (broker, opening.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        });
        let (watermarks, created) = broker?;
        let store = Arc::new(store?);
        let max_bytes = cfg.consumer.max_record_bytes + DLQ_HEADER_ROOM;
        // A replay publishes into scratch topics or nowhere: no transactions.
        let txn = match (cfg.guarantee, replay) {
            (Guarantee::ExactlyOnce, None) => {
                let retry_for = Duration::from_millis(cfg.consumer.give_up_after_ms);
                let t = Transactions::new(&cfg.kafka, max_bytes, &cfg.transactional_id(), retry_for)?;
                info!(transactional_id = %t.id(), "Exactly-once: transactions initialised (a transaction left open by a previous run is aborted)");
                Some(t)
            }
            _ => None,
        };
        let publisher = match &txn {
            Some(t) => t.publisher(),
            None => Arc::new(Publisher::for_pipeline(&cfg.kafka, max_bytes)?),
        };
        // A transactional producer cannot publish outside a transaction.
        let timer_publisher = match &txn {
            Some(_) => Arc::new(Publisher::for_pipeline(&cfg.kafka, max_bytes)?),
            None => publisher.clone(),
        };
        let metrics = Arc::new(Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types));
        // Each partition starts where its state says (the offsets live
        // beside the state, written in the same batch), after a restore
        // from the changelog when the local state is missing or behind the
        // group's committed offset (see [`restore`]).
        let claims = Claims::default();
        let lost: Arc<std::sync::Mutex<Option<lost_position::LostPosition>>> = Arc::default();
        let restorer = restore::Restorer {
            kafka: cfg.kafka.clone(),
            topic: t.changelog().map(str::to_owned),
            created,
            watermarks: watermarks.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            stall: Duration::from_millis(cfg.consumer.give_up_after_ms),
            undo: txn.is_none().then(|| publisher.clone()),
            claims: claims.clone(),
            input: t.events.clone(),
            on_lost_position: cfg.consumer.on_lost_position,
            max_bytes,
            lost: lost.clone(),
        };
        let start = Box::new(move |p, committed| restorer.assign(p, committed).map_err(|e| e.to_string()));
        let consumer = GroupConsumer::new(&cfg.kafka, &cfg.consumer.group_id, &t.events, start, OutOfRange::Stop)?;
        let fence = restore::Fence::new(&cfg.kafka);
        step("clients created");
        let batch_limit = batch_limit::BatchLimit::new(cfg.consumer.batch_size);
        let (codec, schemas, registered) = crate::registry::codec(&cfg)?;
        for r in &registered {
            info!(subject = %r.subject, id = r.id, topic = %r.topic, schema = r.kind.full_name(), "Schema registered");
        }
        step("schemas registered");
        Ok(Pipeline {
            metrics,
            policy: cfg.policy(),
            keys,
            cfg,
            codec,
            schemas,
            store,
            claims,
            lost,
            consumer,
            publisher,
            txn,
            timer_publisher,
            fence,
            clock,
            restore_until: BTreeMap::new(),
            timers: timers::TimerWheel::default(),
            watermarks,
            discard_outputs: replay == Some(true),
            stats: Stats::default(),
            in_flight: Arc::default(),
            batch_limit,
        })
    }

    /// The partitions the pipeline writes (a standby replica writes only
    /// the others).
    pub fn claims(&self) -> Claims {
        self.claims.clone()
    }

    /// A handle on the partitions this instance owns now.
    pub fn ownership(&self) -> crate::kafka::consumer::Ownership {
        self.consumer.ownership()
    }

    /// The metrics of this pipeline (for the HTTP server).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The state store (read by the operator API while the loop runs).
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Runs until `shutdown` is set; the batch in hand is finished first.
    pub fn run(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let source =
            sampler::Source::new(&self.cfg, &self.store, &self.consumer.assignment, &self.clock, &self.watermarks);
        let _sampler = sampler::Sampler::start(self.metrics.clone(), source);
        let _broker_watch = broker_watch::BrokerWatch::start(
            self.metrics.clone(),
            self.watermarks.clone(),
            self.cfg.topics.events.clone(),
        );
        self.install_revoke_hook();
        self.republish_outbox(shutdown)?;
        let wait = Duration::from_millis(self.cfg.consumer.batch_wait_ms);
        let timer_every = Duration::from_millis(self.cfg.time.timer_interval_ms);
        let mut last_timers = Instant::now();
        let mut last_offsets_check = Instant::now();
        info!(topic = %self.cfg.topics.events, group = %self.cfg.consumer.group_id, "Pipeline running");
        // When the loop last polled: the member was alive then (the zombie
        // fence measures stalls from there).
        let mut last_poll = Instant::now();
        while !shutdown.load(Ordering::SeqCst) {
            let this_poll = Instant::now();
            let (records, revoked) = match self.consumer.poll_batch(self.batch_limit.limit(), wait) {
                Err(KafkaError::PositionOutOfRange { partition, offset, .. }) => {
                    return Err(self.lost_while_running(partition, offset))
                }
                Err(KafkaError::Rebalance(why)) => {
                    let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner()).take();
                    return Err(
                        lost.map_or(PipelineError::Kafka(KafkaError::Rebalance(why)), PipelineError::LostPosition)
                    );
                }
                polled => polled?,
            };
            self.batch_limit.polled(records.len());
            let idle = records.is_empty() && !revoked;
            self.observe_assignment();
            if records.is_empty() || revoked {
                // Nothing to overlap with, or partitions moving: finish
                // the batch in flight now (a new owner reads the group
                // offsets it commits).
                self.finish_in_flight(shutdown)?;
            }
            if records.is_empty() && !revoked && self.txn.is_some() {
                self.skip_markers(this_poll)?;
            }
            if !records.is_empty() {
                self.process(records, last_poll, shutdown)?;
            }
            last_poll = this_poll;
            if last_timers.elapsed() >= timer_every {
                last_timers = Instant::now();
                if let Err(e) = self.fire_timers(shutdown) {
                    // Nothing was recorded as fired: the next tick retries.
                    warn!(error = %e, "Firing timers failed; retrying on the next tick");
                }
            }
            // Idle, so nothing is in flight (finished above).
            if idle && self.txn.is_none() && last_offsets_check.elapsed() >= OFFSETS_CHECK_EVERY {
                last_offsets_check = Instant::now();
                self.mend_group_offsets();
            }
        }
        self.finish_in_flight(shutdown)?;
        info!(records = self.stats.records, verdicts = self.stats.verdicts, "Pipeline stopped");
        Ok(())
    }

    /// Commits again, when idle, the group offsets that are behind what this
    /// member has stored (and acknowledged: nothing is in flight when idle).
    /// An asynchronous commit can be lost, refused in the middle of a
    /// rebalance, and on a broker without Kafka's generation check a stale
    /// member's late commit can set an offset back (both seen on the local
    /// test broker): lag would then stay above zero on an idle partition,
    /// and a new owner would publish the batches in between again.
    /// Partitions still restoring are left alone (their own offset is
    /// behind the group's by design).
    fn mend_group_offsets(&self) {
        let mine: BTreeMap<i32, i64> = {
            let a = self.consumer.assignment.lock().expect("not poisoned");
            a.owned
                .iter()
                .filter(|(p, n)| **n > 0 && !self.restore_until.contains_key(p))
                .map(|(p, n)| (*p, *n))
                .collect()
        };
        if mine.is_empty() {
            return;
        }
        match self.consumer.committed(mine.keys().copied(), OFFSETS_CHECK_PATIENCE) {
            Ok(group) => {
                let behind: BTreeMap<i32, i64> =
                    mine.into_iter().filter(|(p, n)| group.get(p).is_none_or(|c| c < n)).collect();
                if !behind.is_empty() {
                    info!(partitions = ?behind, group = ?group, "Group offsets behind the stored ones; committing them again");
                    self.consumer.commit_for_visibility(&behind);
                }
            }
            Err(e) => debug!(error = %e, "Reading the group's offsets failed; checking again later"),
        }
    }

    /// The error for a fetch position that left the input's log while
    /// running: the instance stops whatever `on_lost_position` says (its
    /// choice applies at the next assignment, where the facts are checked
    /// before any record is applied).
    fn lost_while_running(&self, partition: i32, offset: i64) -> PipelineError {
        self.metrics.restore.lost_position(OnLostPosition::Fail.as_str());
        let input = &self.cfg.topics.events;
        let (low, high) = self.watermarks.range(input, partition, Duration::from_secs(10)).unwrap_or((-1, -1));
        PipelineError::LostPosition(lost_position::LostPosition {
            topic: input.clone(),
            partition,
            whose: "fetch",
            stored: offset,
            low,
            high,
            note: "; found while running: the choice in [consumer] on_lost_position applies when the instance starts again"
                .into(),
        })
    }

    /// Takes in what the consumer reported since the last poll: a newly
    /// assigned partition restores silently up to the group's committed
    /// offset when that is ahead of its own (see [`restore`]) and must catch
    /// up before its timers fire; a partition no longer owned is forgotten.
    fn observe_assignment(&mut self) {
        let (assigned, owned) = {
            let mut a = self.consumer.assignment.lock().expect("not poisoned");
            (std::mem::take(&mut a.assigned), a.owned.keys().copied().collect::<Vec<_>>())
        };
        self.claims.keep_only(&owned);
        self.restore_until.retain(|p, _| owned.contains(p));
        self.timers.retain(&owned);
        for (p, facts) in assigned {
            self.timers.assigned(p);
            match restore::target(facts.start, facts.committed) {
                Some(until) => {
                    self.restore_until.insert(p, until);
                    info!(partition = p, next_offset = ?facts.start, restore_until = until, "Partition assigned; restoring its state from the log without publishing");
                }
                None => {
                    self.restore_until.remove(&p);
                    info!(partition = p, next_offset = ?facts.start, "Partition assigned; resuming from the stored offset");
                }
            }
        }
    }

    /// Outputs of a previous run that were stored but maybe not acknowledged.
    fn republish_outbox(&self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let pending = self.store.pending_outbox()?;
        if pending.is_empty() {
            return Ok(());
        }
        let (first, last) = (pending[0].0, pending[pending.len() - 1].0);
        let (records, changelog) = self.split_changelog(pending.into_iter().map(|(_, r)| r).collect());
        info!(records = records.len(), changelog = changelog.len(), "Re-publishing the outbox of the previous run");
        // Its changelog records are not: the partitions may have moved
        // since, and a new owner's changelog must not get old records after
        // its own. The local state of their partitions is forgotten
        // instead, so that it is restored from the changelog (which lacks
        // only what is re-applied then).
        self.forget_partitions(&changelog)?;
        let republished = records.len();
        let records: Vec<&ProducerRecord> = records.iter().collect();
        match &self.txn {
            // Only an at_least_once run leaves an outbox behind: its last
            // batch goes out once more, in a transaction of its own.
            Some(txn) => self.transact_with_retry(txn, &records, shutdown)?,
            None => self.publish_with_retry(records, shutdown)?,
        }
        crash::point(CrashPoint::AfterRepublish);
        self.store.ack_outbox(first..last + 1)?;
        self.metrics.outbox_republished(republished);
        Ok(())
    }

    /// Publishes until acknowledged; waits out broker outages rather than
    /// moving on (order and completeness matter more than progress). An
    /// error no retry cures (see [`KafkaError::retriable`]) turns readiness
    /// red at once, and after `[consumer] give_up_after_ms` of nothing else
    /// stops the pipeline, so the process exits non-zero instead of
    /// retrying forever.
    fn publish_with_retry(&self, records: Vec<&ProducerRecord>, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let mut waits = crate::retry::Doubling::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut backoff = waits.next_wait();
        let give_up_after = Duration::from_millis(self.cfg.consumer.give_up_after_ms);
        let mut refused_since: Option<Instant> = None;
        loop {
            match self.publisher.publish_all(records.iter().map(|r| (*r, self.route(r)))) {
                Ok(_) => {
                    self.metrics.set_publish_refused(None);
                    return Ok(());
                }
                Err(e) if shutdown.load(Ordering::SeqCst) => return Err(e.into()),
                Err(e) if !e.retriable() => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    self.metrics.set_publish_refused(Some(e.to_string()));
                    if since.elapsed() >= give_up_after {
                        error!(error = %e, seconds = since.elapsed().as_secs(), "Publishing outputs keeps failing with an error retrying does not cure; stopping");
                        return Err(PipelineError::PublishRefused { seconds: since.elapsed().as_secs(), source: e });
                    }
                    self.metrics.publish_retry();
                    error!(error = %e, retry_in_ms = backoff.as_millis() as u64, "Publishing outputs refused: this needs a person (permissions, topics, record size); retrying until give_up_after_ms");
                }
                Err(e) => {
                    refused_since = None;
                    self.metrics.set_publish_refused(None);
                    self.metrics.publish_retry();
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "Publishing outputs failed; retrying");
                }
            }
            std::thread::sleep(backoff);
            backoff = waits.next_wait();
        }
    }

    /// The codec records are read and written with (the framings of
    /// `[codec]`, the schema ids registered at start).
    pub fn codec(&self) -> &Codec {
        &self.codec
    }

    /// Fetches the schemas the batch's Confluent-framed records name that
    /// the codec does not know yet, waiting out a registry outage (the
    /// records are not dead-lettered for it).
    fn learn_schemas(&mut self, records: &[Record], shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let Some(fetcher) = &self.schemas else { return Ok(()) };
        let metrics = &self.metrics;
        let values = records.iter().filter_map(|r| r.value.as_deref());
        let learnt = fetcher.learn(
            &self.codec,
            values,
            shutdown,
            |e| {
                metrics.registry_failure();
                metrics.set_registry_waiting(true);
                warn!(error = %e, "The schema registry does not answer; input waits and the call is retried");
            },
            || metrics.set_registry_waiting(false),
        )?;
        for (id, l) in learnt {
            match l {
                crate::codec::Learned::Unusable(why) => {
                    warn!(id, reason = ?why, "A schema id the input names cannot be read; its records are dead-lettered")
                }
                _ => info!(id, "Schema fetched from the registry"),
            }
        }
        Ok(())
    }

    /// Applies one batch and makes it durable and published.
    fn process(&mut self, records: Vec<Record>, alive_at: Instant, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let started = Instant::now();
        // The age of the batch's oldest record when the batch was taken
        // (its timestamp, the producer's create time, against the clock):
        // the input's share of event→verdict latency, logged with the batch.
        let waited_ms = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| records.iter().filter_map(|r| r.timestamp).min().map(|t| (self.clock)() - t))
            .flatten();
        self.learn_schemas(&records, shutdown)?;
        let mut next = self.consumer.assignment.lock().expect("not poisoned").owned.clone();
        let stored = next.clone();
        let applier = Applier {
            discard_outputs: self.discard_outputs,
            ..Applier::new(&self.cfg, &self.store, &self.policy, &self.codec, &self.keys, &self.metrics)
        };
        let Applied { batch, touched, deadlines } =
            applier.apply(&records, &mut next, &self.restore_until, &mut self.stats)?;
        if touched.is_empty() {
            self.timers.consumed(deadlines);
            return Ok(());
        }
        // Zombie fence: write nothing if the group may have moved these
        // partitions while this batch was being built.
        if !self.fence.check(alive_at, self.consumer.assignment_lost()) {
            warn!(partitions = ?touched.keys().collect::<Vec<_>>(), "Batch dropped: the assignment may be lost (stalled or expelled)");
            self.stats.fenced += 1;
            self.rewind(&stored, &touched);
            return Ok(());
        }
        if self.txn.is_some() {
            let batch = exactly_once::PendingTransaction {
                records: records.len(),
                started,
                encoded: batch,
                touched,
                deadlines,
            };
            return self.process_in_transaction(batch, stored, alive_at);
        }
        let applied = started.elapsed();
        let seqs = self.store.write_encoded(&batch)?;
        crash::point(CrashPoint::AfterStore);
        let stored = started.elapsed();
        self.stored(&touched, deadlines);
        // Sent at once: the idempotent producer keeps them behind the
        // earlier batches' (see [`in_flight`]).
        let (outbox, changelog) = self.split_changelog(batch.into_outbox());
        let sent = if self.discard_outputs { in_flight::Sent::Nothing } else { self.send_outputs(&outbox) };
        let (outputs, next_offsets) = (outbox.len(), tracing::enabled!(tracing::Level::DEBUG).then(|| touched.clone()));
        self.put_in_flight(in_flight::SentBatch { sent, outbox, changelog, seqs, touched });
        let handed_over = started.elapsed();
        // The earlier batches move on as far as their acknowledgements
        // allow; the loop waits only when too many are in flight.
        self.advance_in_flight(shutdown)?;
        self.stats.batches += 1;
        let cycle = started.elapsed();
        self.metrics.batch(records.len(), cycle);
        self.batch_limit.waited(cycle - handed_over, cycle);
        debug!(
            records = records.len(),
            outputs,
            apply_us = applied.as_micros() as u64,
            store_us = (stored - applied).as_micros() as u64,
            in_flight_us = (cycle - handed_over).as_micros() as u64,
            total_us = cycle.as_micros() as u64,
            oldest_record_ms = ?waited_ms,
            next_offsets = ?next_offsets.unwrap_or_default(),
            "Batch committed"
        );
        Ok(())
    }

    /// A batch that writes nothing: its partitions (`touched`) go back to
    /// their offsets before it (`stored`), so it is consumed again if they
    /// are still ours.
    fn rewind(&self, stored: &BTreeMap<i32, i64>, touched: &BTreeMap<i32, i64>) {
        self.consumer.rewind(&stored.iter().filter(|(p, _)| touched.contains_key(p)).map(|(p, n)| (*p, *n)).collect());
    }

    /// A batch is applied and durable: the next starts past its offsets,
    /// restores move on, its deadlines are consumed back.
    fn stored(&mut self, touched: &BTreeMap<i32, i64>, deadlines: Vec<(String, i64)>) {
        {
            let mut a = self.consumer.assignment.lock().expect("not poisoned");
            for (p, n) in touched {
                if let Some(slot) = a.owned.get_mut(p) {
                    *slot = (*slot).max(*n);
                }
            }
        }
        restore::advance(&mut self.restore_until, touched);
        self.timers.consumed(deadlines);
    }

    /// The partition a record of the outbox goes to: a changelog record to
    /// its state's, every other by its key.
    fn route(&self, r: &ProducerRecord) -> Option<i32> {
        self.cfg.topics.changelog().filter(|t| r.topic == *t).and_then(|_| changelog_partition(r))
    }

    /// Splits records of the outbox into outputs and changelog records.
    fn split_changelog(&self, records: Vec<ProducerRecord>) -> (Vec<ProducerRecord>, Vec<ProducerRecord>) {
        match self.cfg.topics.changelog() {
            Some(topic) => records.into_iter().partition(|r| r.topic != topic),
            None => (records, Vec::new()),
        }
    }

    /// Publishes `DeadlineReached` for the due timers of owned, caught-up
    /// partitions (see [`timers`]), and sets readiness.
    fn fire_timers(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let now = (self.clock)();
        let (owned, received) = {
            let a = self.consumer.assignment.lock().expect("not poisoned");
            (a.owned.clone(), a.received)
        };
        let topic = &self.cfg.topics.events;
        let marks = timers::Marks { consumer: &self.consumer, watermarks: &self.watermarks, topic };
        let (due, caught_up) = self.timers.due(&self.store, &self.codec, &self.keys, &marks, &owned, now)?;
        // The outbox was re-published before the loop began.
        self.metrics.set_readiness(Readiness {
            assigned: received,
            partitions: owned.len(),
            restored: caught_up,
            ready: received && caught_up == owned.len(),
            ..Readiness::default()
        });
        if due.is_empty() {
            // Nothing to publish: every timer due is in flight already.
            self.timers.fired(due);
            return Ok(());
        }
        // A failed publish purges the producer: nothing else may be in
        // flight then, or it would be sent again.
        self.finish_in_flight(shutdown)?;
        // To the operation's own partition, whatever the key would hash to:
        // the timer must be judged by the owner of the operation's state.
        //
        // Never in a transaction, under either guarantee: the events are
        // input, not outputs, and firing changes no state (a timer fired
        // twice is judged once, see [`timers`]), so there is nothing to
        // commit atomically with them. A transaction would only add a way
        // to lose them: a firing cut short by a crash is aborted when the
        // instance restarts, which leaves an abort marker in the input
        // topic, and a broker that lists that old abort in every later
        // read_committed fetch (noida-db 0.2.3 does, Apache Kafka lists
        // only those overlapping the fetched range) makes librdkafka drop
        // every later record of the same producer there: the firing done
        // again after the restart would never be consumed.
        let records = due.iter().map(|d| (&d.record, Some(d.partition)));
        let (ticket, _) = self.timer_publisher.send_all(records)?;
        crash::point(CrashPoint::TimerSent);
        self.timer_publisher.wait(ticket)?;
        crash::point(CrashPoint::TimerFired);
        // Only once acknowledged: a failed firing is retried next tick.
        self.stats.timers_fired += due.len() as u64;
        self.metrics.timers_fired(due.len());
        debug!(count = due.len(), "Timers fired");
        self.timers.fired(due);
        Ok(())
    }
}

/// The topic rights a running pipeline needs (docs/operations.md, "Kafka permissions").
fn topic_needs(t: &crate::config::Topics) -> Vec<permissions::Need> {
    use permissions::{Need, Operation::*};
    let mut needs = vec![
        Need {
            topic: t.events.clone(),
            operations: vec![Read, Write],
            purpose: "read the events and publish its timers",
        },
        Need { topic: t.verdicts.clone(), operations: vec![Write], purpose: "publish verdicts" },
        Need { topic: t.anomalies.clone(), operations: vec![Write], purpose: "publish anomalies" },
        Need { topic: t.dlq.clone(), operations: vec![Write], purpose: "publish dead letters" },
        Need { topic: t.commands.clone(), operations: vec![Write], purpose: "publish repair and probe commands" },
    ];
    if let Some(changelog) = t.changelog() {
        needs.push(Need {
            topic: changelog.to_owned(),
            operations: vec![Read, Write],
            purpose: "write the state changelog and restore from it",
        });
    }
    needs
}
