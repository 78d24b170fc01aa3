//! The run loop: consume a batch → decode → core (in lanes of whole
//! partitions, on `[consumer] apply_threads` threads) → one atomic store
//! write per lane (state, timers, offsets, outbox) → send the outbox → consume and apply
//! the next batch while the broker acknowledges → forget the acknowledged
//! outbox. At most one batch is in flight, and its outputs are acknowledged
//! before the next batch's are sent, so outputs keep the input order. Plus the timer wheel that turns due deadlines into
//! `DeadlineReached` events in the log. The batch's own work (decode,
//! core, timeline) is in [`apply`].

mod apply;
pub use apply::{Applied, Applier};

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::codec::{validate_key, Codec, DecodeError, EncodeError};
use crate::config::{Config, Topics};
use crate::core::{Event, Output, Policy};
use crate::kafka::consumer::GroupConsumer;
use crate::kafka::producer::{Publisher, Ticket};
use crate::kafka::{admin, KafkaError, Record};
use crate::metrics::{self, Metrics, Readiness};
use crate::store::{OutboxRecord, Store, StoreError};

/// Why the pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Wall-clock milliseconds; injected so tests can move time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
}

/// Counts of what the pipeline did, for logs and the demo.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub records: u64,
    pub by_disposition: BTreeMap<&'static str, u64>,
    pub dead_letters: BTreeMap<&'static str, u64>,
    pub verdicts: u64,
    pub anomalies: u64,
    pub commands: u64,
    pub timers_fired: u64,
    pub batches: u64,
    /// Records applied without publishing while restoring a partition.
    pub restored: u64,
    /// Batches dropped by the zombie fence (see [`crate::restore`]).
    pub fenced: u64,
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
    }
}

/// Everything `run` needs, built from the config.
pub struct Pipeline {
    cfg: Config,
    policy: Policy,
    codec: Codec,
    store: Arc<Store>,
    consumer: GroupConsumer,
    publisher: Arc<Publisher>,
    clock: Clock,
    fence: crate::restore::Fence,
    /// Timers published but not yet consumed back: (operation, due time).
    fired: HashSet<(String, i64)>,
    /// Per owned partition: the high watermark at assignment until the
    /// partition has consumed past it (`None` once it has). Timers wait for
    /// that: below the mark lie the deadline events a previous owner (or a
    /// previous run) already wrote. Past it the partition stays caught up
    /// whatever new traffic arrives.
    catch_up: BTreeMap<i32, Option<i64>>,
    /// Outputs are counted but neither stored nor published (`replay`
    /// without scratch topics).
    discard_outputs: bool,
    pub stats: Stats,
    metrics: Arc<Metrics>,
    /// The last batch: stored, its outputs sent but not yet acknowledged.
    /// Shared with the consumer's revoke callback, which finishes it
    /// before partitions are released.
    in_flight: Arc<Mutex<Option<InFlight>>>,
}

/// Whether the outputs sent as `sent` are all acknowledged (waiting for
/// them if need be).
fn acknowledged(publisher: &Publisher, sent: Sent) -> bool {
    match sent {
        Sent::Nothing => true,
        Sent::Ticket(t) => match publisher.wait(t) {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, "Outputs not acknowledged; publishing them again");
                false
            }
        },
        Sent::Failed => false,
    }
}

/// A batch whose outputs were sent while the next batch is applied.
struct InFlight {
    sent: Sent,
    outbox: Vec<OutboxRecord>,
    /// Its outbox entries in the store.
    seqs: std::ops::Range<u64>,
    /// Its partitions and their next offsets.
    touched: BTreeMap<i32, i64>,
}

/// How a batch's outputs went out.
#[derive(Clone, Copy)]
enum Sent {
    /// No outputs, or outputs discarded (replay).
    Nothing,
    Ticket(Ticket),
    /// Sending failed: publish again before anything else.
    Failed,
}

/// Room for the provenance headers on top of the largest accepted record.
pub const DLQ_HEADER_ROOM: usize = 64 * 1024;

/// How much of an oversize record's value its dead letter keeps.
pub const OVERSIZE_KEPT_BYTES: usize = 64 * 1024;

/// Adds the provenance headers of SPEC §8 to a dead letter.
///
/// Byte-identical, except for records over the size limit: no producer
/// could publish those whole, so their dead letter keeps the key, the
/// headers and the first 64 KiB of the value, with
/// `reconciler.value.truncated` giving the original length.
pub fn dead_letter(topic: &str, r: &Record, err: &DecodeError) -> OutboxRecord {
    let mut headers = r.headers.clone();
    let mut value = r.value.clone();
    if let (DecodeError::Oversize { .. }, Some(v)) = (err, value.as_mut()) {
        if v.len() > OVERSIZE_KEPT_BYTES {
            headers.push(("reconciler.value.truncated".to_owned(), Some(v.len().to_string().into_bytes())));
            v.truncate(OVERSIZE_KEPT_BYTES);
        }
    }
    let mut add = |k: &str, v: String| headers.push((k.to_owned(), Some(v.into_bytes())));
    add("reconciler.error.class", err.class().to_owned());
    add("reconciler.error.message", err.to_string());
    add("reconciler.source.topic", r.topic.clone());
    add("reconciler.source.partition", r.partition.to_string());
    add("reconciler.source.offset", r.offset.to_string());
    add("reconciler.source.timestamp", r.timestamp.map_or_else(String::new, |t| t.to_string()));
    OutboxRecord { topic: topic.to_owned(), key: r.key.clone(), value, headers }
}

/// An input record as the core sees it, or why it goes to the dead letters.
pub fn decode_record(codec: &Codec, max_record_bytes: usize, r: &Record) -> Result<Event, DecodeError> {
    let size = r.size();
    if size > max_record_bytes {
        return Err(DecodeError::Oversize { size, limit: max_record_bytes });
    }
    let value = r.value.as_deref().ok_or(DecodeError::NullValue)?;
    let ev = codec.decode_event(value)?;
    validate_key(r.key.as_deref(), &ev)?;
    Ok(ev)
}

/// An event as it goes to the input topic `topic`: keyed by its entity
/// (timer firings, manual decisions and generated workloads all use it).
pub fn event_record(codec: &Codec, topic: &str, ev: &Event) -> Result<OutboxRecord, EncodeError> {
    Ok(OutboxRecord {
        topic: topic.to_owned(),
        key: Some(ev.entity_id.as_bytes().to_vec()),
        value: Some(codec.encode_event(ev)?),
        headers: Vec::new(),
    })
}

/// An output of the core as it is published.
pub fn output_record(codec: &Codec, t: &Topics, o: &Output) -> Result<OutboxRecord, EncodeError> {
    let (topic, value) = match o {
        Output::Verdict(v) => (&t.verdicts, codec.encode_verdict(v)?),
        Output::Anomaly(a) => (&t.anomalies, codec.encode_anomaly(a)?),
        Output::Command(c) => (&t.commands, codec.encode_command(c)?),
    };
    Ok(OutboxRecord {
        topic: topic.clone(),
        key: Some(o.entity_id().as_bytes().to_vec()),
        value: Some(value),
        headers: Vec::new(),
    })
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
        let t = &cfg.topics;
        admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, t.replication_factor)?;
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(|e| KafkaError::Other(format!("creating {}: {e}", cfg.state_dir.display())))?;
        let store = Arc::new(match replay {
            None => Store::open_with(&cfg.state_dir, &t.events, cfg.sync_writes, &cfg.store)?,
            Some(_) => Store::open_for_rebuild(&cfg.state_dir, &t.events, &cfg.store)?,
        });
        let publisher = Arc::new(Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes + DLQ_HEADER_ROOM)?);
        let consumer = GroupConsumer::new(&cfg.kafka, &cfg.consumer.group_id, &t.events, store.clone())?;
        let fence = crate::restore::Fence::new(&cfg.kafka);
        let metrics = Arc::new(Metrics::new(cfg.types.keys(), cfg.metrics.max_operation_types));
        Ok(Pipeline {
            metrics,
            policy: cfg.policy(),
            cfg,
            codec: Codec::new(),
            store,
            consumer,
            publisher,
            fence,
            clock,
            fired: HashSet::new(),
            catch_up: BTreeMap::new(),
            discard_outputs: replay == Some(true),
            stats: Stats::default(),
            in_flight: Arc::new(Mutex::new(None)),
        })
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
        let source = metrics::sampler::Source::new(&self.cfg, &self.store, &self.consumer.assignment, &self.clock);
        let _sampler = metrics::Sampler::start(self.metrics.clone(), source);
        self.install_revoke_hook();
        self.republish_outbox(shutdown)?;
        let wait = Duration::from_millis(self.cfg.consumer.batch_wait_ms);
        let timer_every = Duration::from_millis(self.cfg.time.timer_interval_ms);
        let mut last_timers = Instant::now();
        info!(topic = %self.cfg.topics.events, group = %self.cfg.consumer.group_id, "Pipeline running");
        // When the loop last polled: the member was alive then (the zombie
        // fence measures stalls from there).
        let mut last_poll = Instant::now();
        while !shutdown.load(Ordering::SeqCst) {
            let this_poll = Instant::now();
            let (records, revoked) = self.consumer.poll_batch(self.cfg.consumer.batch_size, wait)?;
            if records.is_empty() || revoked {
                // Nothing to overlap with, or partitions moving: finish
                // the batch in flight now (a new owner reads the group
                // offsets it commits).
                self.finish_in_flight(shutdown)?;
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
        }
        self.finish_in_flight(shutdown)?;
        info!(records = self.stats.records, verdicts = self.stats.verdicts, "Pipeline stopped");
        Ok(())
    }

    /// Outputs of a previous run that were stored but maybe not acknowledged.
    fn republish_outbox(&self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let pending = self.store.pending_outbox()?;
        if pending.is_empty() {
            return Ok(());
        }
        info!(records = pending.len(), "Re-publishing the outbox of the previous run");
        let (first, last) = (pending[0].0, pending[pending.len() - 1].0);
        self.publish_with_retry(pending.iter().map(|(_, r)| r).collect(), shutdown)?;
        crate::faults::point("pipeline::after_republish");
        self.store.ack_outbox(first..last + 1)?;
        self.metrics.outbox_republished(pending.len());
        Ok(())
    }

    /// Publishes until acknowledged; waits out broker outages rather than
    /// moving on (order and completeness matter more than progress).
    fn publish_with_retry(&self, records: Vec<&OutboxRecord>, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.publisher.publish_all(records.iter().map(|r| (*r, None))) {
                Ok(_) => return Ok(()),
                Err(e) if !shutdown.load(Ordering::SeqCst) => {
                    self.metrics.publish_retry();
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "Publishing outputs failed; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Applies one batch and makes it durable and published.
    fn process(&mut self, records: Vec<Record>, alive_at: Instant, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let started = Instant::now();
        let (mut next, restore_until) = {
            let a = self.consumer.assignment.lock().expect("not poisoned");
            (a.owned.clone(), a.restore_until.clone())
        };
        let stored = next.clone();
        let applier = Applier {
            discard_outputs: self.discard_outputs,
            ..Applier::new(&self.cfg, &self.store, &self.policy, &self.codec, &self.metrics)
        };
        let Applied { batch, touched, deadlines } =
            applier.apply(&records, &mut next, &restore_until, &mut self.stats)?;
        for d in deadlines {
            self.fired.remove(&d);
        }
        if touched.is_empty() {
            return Ok(());
        }
        // Zombie fence: write nothing if the group may have moved these
        // partitions while this batch was being built.
        if !self.fence.check(alive_at, self.consumer.assignment_lost()) {
            warn!(partitions = ?touched.keys().collect::<Vec<_>>(), "Batch dropped: the assignment may be lost (stalled or expelled)");
            self.stats.fenced += 1;
            self.consumer.rewind(&stored.into_iter().filter(|(p, _)| touched.contains_key(p)).collect());
            return Ok(());
        }
        let applied = started.elapsed();
        let seqs = self.store.write_encoded(&batch)?;
        crate::faults::point("pipeline::after_store");
        let stored = started.elapsed();
        {
            // Applied and durable: the next batch starts past these offsets.
            let mut a = self.consumer.assignment.lock().expect("not poisoned");
            for (p, n) in &touched {
                if let Some(slot) = a.owned.get_mut(p) {
                    *slot = (*slot).max(*n);
                }
            }
            crate::restore::advance(&mut a.restore_until, &touched);
        }
        // The previous batch's outputs were being acknowledged while this
        // one was applied; they go first, so outputs keep the input order.
        self.finish_in_flight(shutdown)?;
        let acked = started.elapsed();
        let outbox = batch.into_outbox();
        let sent = if self.discard_outputs || outbox.is_empty() {
            Sent::Nothing
        } else {
            match self.publisher.send_all(outbox.iter().map(|r| (r, None))) {
                Ok((ticket, _)) => Sent::Ticket(ticket),
                Err(e) => {
                    warn!(error = %e, "Sending outputs failed; retrying after the next batch is stored");
                    Sent::Failed
                }
            }
        };
        self.stats.batches += 1;
        self.metrics.batch(records.len(), started.elapsed());
        debug!(
            records = records.len(),
            outputs = outbox.len(),
            apply_us = applied.as_micros() as u64,
            store_us = (stored - applied).as_micros() as u64,
            previous_ack_us = (acked - stored).as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            next_offsets = ?touched,
            "Batch committed"
        );
        *self.in_flight.lock().expect("not poisoned") = Some(InFlight { sent, outbox, seqs, touched });
        Ok(())
    }

    /// Waits until the outputs of the batch in flight are acknowledged
    /// (publishing them again until they are), then forgets them in the
    /// outbox and commits the group offsets past the batch (so a new owner
    /// of its partitions restores it silently rather than publishing again).
    fn finish_in_flight(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let Some(f) = self.in_flight.lock().expect("not poisoned").take() else { return Ok(()) };
        if !acknowledged(&self.publisher, f.sent) {
            self.metrics.publish_retry();
            self.publish_with_retry(f.outbox.iter().collect(), shutdown)?;
        }
        crate::faults::point("pipeline::after_publish");
        self.store.ack_outbox(f.seqs)?;
        self.consumer.commit_for_visibility(&f.touched);
        Ok(())
    }

    /// Lets the consumer finish the batch in flight when partitions are
    /// revoked, before they are released (see
    /// [`crate::kafka::consumer::RevokeHook`]). What it cannot finish
    /// (outputs not acknowledged) stays for the run loop, which publishes
    /// it again.
    fn install_revoke_hook(&self) {
        let (in_flight, publisher, store) = (self.in_flight.clone(), self.publisher.clone(), self.store.clone());
        self.consumer.on_revoke(Box::new(move || {
            let mut slot = in_flight.lock().expect("not poisoned");
            let mut f = slot.take()?;
            if !acknowledged(&publisher, f.sent) {
                f.sent = Sent::Failed;
                *slot = Some(f);
                return None;
            }
            if let Err(e) = store.ack_outbox(f.seqs.clone()) {
                warn!(error = %e, "Forgetting acknowledged outputs failed; the run loop retries");
                f.sent = Sent::Nothing;
                *slot = Some(f);
                return None;
            }
            Some(f.touched)
        }));
    }

    /// Whether partition `p` (next offset `next`) has consumed everything
    /// that was in it when it was assigned.
    fn caught_up(&mut self, p: i32, next: i64) -> bool {
        let target = match self.catch_up.get(&p) {
            Some(None) => return true,
            Some(Some(t)) => *t,
            None => match self.consumer.high_watermark(p) {
                Ok(high) if high >= 0 => high,
                _ => return false,
            },
        };
        // Past the target, or only transaction markers left before it.
        let done = next >= target || self.consumer.position(p).is_some_and(|pos| pos >= target);
        self.catch_up.insert(p, if done { None } else { Some(target) });
        done
    }

    /// Publishes `DeadlineReached` for due timers of owned, caught-up
    /// partitions. A partition still catching up (replay) fires nothing: its
    /// deadline events may still be ahead in the log.
    fn fire_timers(&mut self, shutdown: &AtomicBool) -> Result<(), PipelineError> {
        let now = (self.clock)();
        let (owned, received) = {
            let mut a = self.consumer.assignment.lock().expect("not poisoned");
            for p in std::mem::take(&mut a.assigned) {
                self.catch_up.remove(&p);
            }
            (a.owned.clone(), a.received)
        };
        self.catch_up.retain(|p, _| owned.contains_key(p));
        let mut events = Vec::new();
        let mut readiness = Readiness { assigned: received, partitions: owned.len(), ..Readiness::default() };
        for (p, next) in owned {
            if !self.caught_up(p, next) {
                continue;
            }
            readiness.restored += 1;
            for t in self.store.due_timers(p, now, 10_000)? {
                if self.fired.contains(&(t.operation_id.clone(), t.at)) {
                    continue;
                }
                let ev = Event::deadline_reached(&t.operation_id, &t.entity_id, &t.operation_type, t.at);
                let rec = event_record(&self.codec, &self.cfg.topics.events, &ev)?;
                debug!(operation_id = %t.operation_id, entity_id = %t.entity_id, due = t.at, "Timer due");
                events.push((rec, p, (t.operation_id, t.at)));
            }
        }
        // The outbox was re-published before the loop began.
        readiness.ready = received && readiness.restored == readiness.partitions;
        self.metrics.set_readiness(readiness);
        if events.is_empty() {
            return Ok(());
        }
        // A failed publish purges the producer: nothing else may be in
        // flight then, or it would be sent again.
        self.finish_in_flight(shutdown)?;
        // To the operation's own partition, whatever the key would hash to:
        // the timer must be judged by the owner of the operation's state.
        self.publisher.publish_all(events.iter().map(|(r, p, _)| (r, Some(*p))))?;
        crate::faults::point("pipeline::timer_fired");
        // Only once acknowledged: a failed firing is retried next tick.
        self.fired.extend(events.iter().map(|(_, _, k)| k.clone()));
        self.stats.timers_fired += events.len() as u64;
        self.metrics.timers_fired(events.len());
        debug!(count = events.len(), "Timers fired");
        Ok(())
    }
}
