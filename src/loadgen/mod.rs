//! `reconciler loadgen`: a seeded, reproducible workload with every fault
//! the core detects, its ground truth, and the checker that compares a
//! pipeline's outputs with it.
//!
//! - [`scenario`]: the stories, the interleaving and the ground truth built with them.
//! - [`truth`]: the ground-truth file (JSON).
//! - [`publish`](publish()): sends the workload, paced or as fast as possible.
//! - [`verify`]: reads the output topics back and compares.
//! - [`passthrough`]: the bare consume→produce baseline of the benchmarks.
//! - [`destination`]: a small HTTP destination holding known effects, for
//!   the probe worker to query (demo, workload, tests).
//!
//! Time: by default events are stamped hours in the past, so every
//! confirmation deadline is already due when the pipeline reads them; the
//! verdicts that need a deadline to fire are marked in the truth and come
//! once a partition has caught up (the pipeline fires timers only then).
//! For latency runs (`--event-time now --rate R`) events carry the time
//! they are sent, so `received - decided_at` of a verdict is its latency.

pub mod destination;
pub mod passthrough;
pub mod rng;
pub mod scenario;
pub mod truth;
pub mod verify;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::clock::now_ms;
use crate::codec::EncodeError;
use crate::config::Config;
use crate::kafka::producer::{Publisher, Ticket};
use crate::kafka::KafkaError;
use crate::records::ProducerRecord;
use crate::records::Record;

pub use scenario::{Faults, Generator, Options, Planned};
pub use truth::GroundTruth;

/// Why a load generation failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    /// Publishing the workload or reading the outputs back failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A workload event could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// Options that cannot make a workload, or a truth file that cannot be
    /// written or read; the message says which.
    #[error("{0}")]
    Invalid(String),
    /// `loadgen verify`: the outputs differ from the ground truth (the printed
    /// report says where).
    #[error("the outputs disagree with the ground truth")]
    Disagree,
    /// `loadgen verify --state-dir`: the run's state store could not be
    /// checked.
    #[error(transparent)]
    Operator(#[from] crate::operator::OperatorError),
    /// The configuration cannot sign the decisions the workload simulates.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The schema registry refused or could not be asked (the Confluent
    /// framing).
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
}

/// Event time stamped on the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTime {
    /// Hours in the past: every deadline is due at once (preloaded runs).
    Past,
    /// The time each unit is sent (paced runs, latency).
    Now,
}

/// What `reconciler loadgen` generates and how it publishes it.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Operations to create.
    pub operations: u64,
    /// Entities they are spread over (default: operations / 4, at least 64).
    pub entities: Option<u64>,
    /// Seed: the same seed and options give the same records.
    pub seed: u64,
    /// Target rate in records per second; 0 sends as fast as possible.
    pub rate: u64,
    /// Event time of the workload.
    pub event_time: EventTime,
    /// `confirm_within_ms` written into every request.
    pub confirm_within_ms: i64,
    /// Where to write the ground truth (JSON).
    pub truth: Option<std::path::PathBuf>,
    /// No progress bar.
    pub quiet: bool,
    /// The rate of each fault.
    pub faults: Faults,
}

/// What `reconciler loadgen` does besides generating.
#[derive(Debug, Clone)]
pub enum Action {
    /// Compare the output topics with a ground truth (and, with
    /// `state_dir`, check the run's store); fails on any disagreement.
    Verify {
        /// The ground-truth file.
        truth: std::path::PathBuf,
        /// Give up waiting for the outputs after this many seconds.
        timeout_secs: u64,
        /// The state directory of the run to check.
        state_dir: Option<std::path::PathBuf>,
    },
    /// Serve the `probed` story's destination from a ground truth until
    /// the process is interrupted.
    Destination {
        /// The ground-truth file.
        truth: std::path::PathBuf,
        /// Address to listen on.
        bind: std::net::SocketAddr,
    },
    /// Copy `count` records of the input topic to `to` with a bare
    /// consumer and producer (the benchmarks' baseline).
    Passthrough {
        /// Destination topic.
        to: String,
        /// Records to copy.
        count: u64,
        /// Give up after this many seconds.
        timeout_secs: u64,
    },
}

impl Workload {
    /// The generator options for these arguments at wall time `now_ms`.
    pub fn options(&self, cfg: &Config, now_ms: i64) -> Result<Options, LoadgenError> {
        self.faults.validate().map_err(LoadgenError::Invalid)?;
        if self.operations == 0 {
            return Err(LoadgenError::Invalid("--operations must be at least 1".into()));
        }
        if self.faults.probed > 0.0 && self.event_time == EventTime::Past {
            return Err(LoadgenError::Invalid(
                "--probed needs --event-time now: with past event times every follow-up is due at once and would race the probe worker's answer".into(),
            ));
        }
        if self.confirm_within_ms <= 0 {
            return Err(LoadgenError::Invalid("--confirm-within-ms must be positive".into()));
        }
        let mut o = Options::preload(self.operations, self.seed, now_ms);
        if let Some(e) = self.entities {
            if e == 0 {
                return Err(LoadgenError::Invalid("--entities must be at least 1".into()));
            }
            o.entities = e;
        }
        o.faults = self.faults.clone();
        o.confirm_within_ms = self.confirm_within_ms;
        o.reorder_window_ms = cfg.time.reorder_window_ms;
        o.policy = cfg.policy();
        o.input = cfg.codec.input;
        if self.event_time == EventTime::Now {
            o.start_ms = now_ms;
            o.step_ms = 0;
            // Space units so that records go out at `rate`.
            let per_unit = records_per_unit(&o);
            let rate = self.rate.max(1) as f64;
            o.unit_spacing_us = ((1e6 * per_unit / rate).round() as i64).max(1);
        }
        Ok(o)
    }
}

/// Average records per unit of a workload with these options (measured on
/// a sample of it).
pub fn records_per_unit(o: &Options) -> f64 {
    let mut sample = o.clone();
    sample.operations = 20_000;
    let mut gen = Generator::new(sample);
    let n = gen.by_ref().count();
    let t = gen.into_truth();
    let units: u64 = t.stories.values().sum();
    n as f64 / units.max(1) as f64
}

/// What a publication did.
#[derive(Debug, Clone)]
pub struct Published {
    /// Records sent and acknowledged (events and broken records).
    pub records: u64,
    /// Wall time from the start to the last acknowledgement.
    pub elapsed: Duration,
}

/// A topic in memory: records appended as a producer keyed by entity and a
/// broker would place them (a partition by a hash of the key, offsets from
/// 0 in each), and handed back as a consumer reads them. For replaying a
/// workload through the pipeline's batch step without a broker (the
/// rebuild bench, tests).
#[derive(Debug, Clone)]
pub struct MemoryTopic {
    /// The next offset of each partition.
    next: Vec<i64>,
}

impl MemoryTopic {
    /// An empty topic of `partitions` partitions (at least one).
    pub fn new(partitions: i32) -> MemoryTopic {
        MemoryTopic { next: vec![0; partitions.max(1) as usize] }
    }

    /// `r` as consumed: in its key's partition, at that partition's next offset.
    pub fn append(&mut self, r: ProducerRecord) -> Record {
        let key = r.key.as_deref().unwrap_or_default();
        let partition = (xxhash_rust::xxh3::xxh3_64(key) % self.next.len() as u64) as i32;
        self.append_to(partition, r)
    }

    /// `r` as consumed from `partition` (a timer firing goes to its
    /// operation's partition, whatever its key hashes to).
    pub fn append_to(&mut self, partition: i32, r: ProducerRecord) -> Record {
        let partition = partition as usize;
        let offset = self.next[partition];
        self.next[partition] += 1;
        Record {
            topic: r.topic.into(),
            partition: partition as i32,
            offset,
            timestamp: None,
            key: r.key,
            value: r.value,
            headers: r.headers,
        }
    }
}

/// Publishes everything `gen` yields to the input topic and returns the
/// ground truth. With `paced`, each record waits for its unit's due time
/// (event time = wall time); otherwise records go out as fast as the broker
/// acknowledges them, in chunks.
pub fn publish(
    cfg: &Config,
    mut gen: Generator,
    paced: bool,
    progress: bool,
) -> Result<(Published, GroundTruth), LoadgenError> {
    const CHUNK: usize = 10_000;
    /// Paced chunks sent and not yet acknowledged, at most.
    const MAX_UNACKNOWLEDGED: usize = 256;
    // Written in the framing the input is read in.
    let (codec, _, _) = crate::registry::codec(cfg)?;
    gen.set_codec(codec.clone());
    // The workload's operator decisions are signed as `resolve` signs
    // them: the reconciler applies a control event only when it is signed
    // (see `core::trust`).
    let keys = cfg.security.keys()?;
    let publisher = Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes)?;
    let bar = if progress { ProgressBar::new(gen.truth().operations) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} operations, {msg} [{elapsed_precise}, eta {eta}]")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let mut chunk: Vec<ProducerRecord> = Vec::with_capacity(CHUNK);
    let mut records = 0u64;
    // Paced, a chunk goes out without waiting for its acknowledgements
    // (they are awaited a few chunks later): a record is sent when it is
    // due, so its event time is its send time. Waiting for each chunk's
    // acknowledgements let the sender fall behind and then send a burst
    // of overdue records, which a latency run counted as the pipeline's.
    let mut unacknowledged: VecDeque<Ticket> = VecDeque::new();
    let flush = |chunk: &mut Vec<ProducerRecord>, unacknowledged: &mut VecDeque<Ticket>| -> Result<(), LoadgenError> {
        if chunk.is_empty() {
            return Ok(());
        }
        if paced {
            unacknowledged.push_back(publisher.send_all(chunk.iter().map(|r| (r, None)))?.0);
            while unacknowledged.len() > MAX_UNACKNOWLEDGED {
                publisher.wait(unacknowledged.pop_front().expect("not empty"))?;
            }
        } else {
            publisher.publish_all(chunk.iter().map(|r| (r, None)))?;
        }
        chunk.clear();
        Ok(())
    };
    while let Some(p) = gen.next() {
        if paced {
            let wait = p.due_ms - now_ms();
            if wait > 0 {
                flush(&mut chunk, &mut unacknowledged)?;
                std::thread::sleep(Duration::from_millis(wait as u64));
            }
        }
        chunk.push(p.record.to_outbox(&codec, &keys, &cfg.topics.events)?);
        records += 1;
        if chunk.len() >= CHUNK {
            flush(&mut chunk, &mut unacknowledged)?;
        }
        if records % 1000 == 0 {
            bar.set_position(gen.operations_made());
            let secs = started.elapsed().as_secs_f64().max(1e-6);
            bar.set_message(format!("{records} records, {:.0} records/s", records as f64 / secs));
        }
    }
    flush(&mut chunk, &mut unacknowledged)?;
    for ticket in unacknowledged {
        publisher.wait(ticket)?;
    }
    bar.set_position(gen.operations_made());
    bar.finish();
    Ok((Published { records, elapsed: started.elapsed() }, gen.into_truth()))
}

/// `reconciler loadgen [verify|passthrough]`: runs the command and prints
/// its summary on stdout.
pub fn command(cfg: &Config, action: Option<Action>, args: &Workload) -> Result<(), LoadgenError> {
    let t = &cfg.topics;
    match action {
        None => {
            // Before any topic is created: no key to sign the workload's
            // decisions with (`publish` needs one), or refused credentials.
            cfg.security.keys()?;
            crate::kafka::connect::check_credentials(&cfg.kafka)?;
            crate::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, t.replication_factor)?;
            let opts = args.options(cfg, now_ms())?;
            if opts.faults.probed > 0.0 {
                // The probe worker asks the destination while the workload
                // is still being sent: its truth must be out first (the
                // generator is deterministic, a dry pass gives the same).
                let mut dry = Generator::new(opts.clone());
                dry.by_ref().for_each(drop);
                let truth = dry.into_truth();
                if let Some(path) = &args.truth {
                    truth.write(path).map_err(|e| LoadgenError::Invalid(format!("writing {}: {e}", path.display())))?;
                    println!(
                        "ground truth written to {} before publishing: serve its destination with `reconciler loadgen destination --truth {}`",
                        path.display(),
                        path.display()
                    );
                }
            }
            let paced = args.rate > 0;
            let (published, truth) = publish(cfg, Generator::new(opts), paced, !args.quiet)?;
            let secs = published.elapsed.as_secs_f64().max(1e-9);
            println!(
                "published {} records ({} events, {} dead letters to be) of {} operations to {} in {secs:.2} s = {:.0} records/s",
                published.records,
                truth.events,
                truth.dead_letters,
                truth.operations,
                t.events,
                published.records as f64 / secs
            );
            println!(
                "expected: {} verdicts ({} after a deadline fires), {} anomalies",
                truth.verdict_count,
                truth.timer_verdicts,
                truth.anomaly_count()
            );
            if let Some(path) = &args.truth {
                truth.write(path).map_err(|e| LoadgenError::Invalid(format!("writing {}: {e}", path.display())))?;
                println!("ground truth written to {}", path.display());
            }
            Ok(())
        }
        Some(Action::Verify { truth, timeout_secs, state_dir }) => {
            let truth = GroundTruth::read(&truth)
                .map_err(|e| LoadgenError::Invalid(format!("reading {}: {e}", truth.display())))?;
            let wait = truth.latest_due_ms - now_ms();
            if wait > 0 {
                println!(
                    "note: some verdicts need deadlines that fall due in {} s (event time = wall time)",
                    wait / 1000
                );
            }
            let report = verify::verify(cfg, &truth, Duration::from_secs(timeout_secs), Duration::from_secs(2))?;
            print!("{}", report.render());
            let mut agrees = report.agrees();
            if let Some(dir) = state_dir {
                let untimed = verify::untimed_in(cfg, &dir)?;
                print!("{}", verify::render_untimed(&dir, &untimed));
                agrees &= untimed.is_empty();
            }
            if agrees {
                Ok(())
            } else {
                Err(LoadgenError::Disagree)
            }
        }
        Some(Action::Destination { truth, bind }) => {
            let truth = GroundTruth::read(&truth)
                .map_err(|e| LoadgenError::Invalid(format!("reading {}: {e}", truth.display())))?;
            let server = destination::DestinationServer::start_on(bind, truth.held(), Duration::ZERO)
                .map_err(|e| LoadgenError::Invalid(format!("listening on {bind}: {e}")))?;
            println!(
                "serving {} effects of destination {} on {} until interrupted",
                truth.destination.len(),
                scenario::PROBED_DESTINATION,
                server.url_template()
            );
            loop {
                // Nothing to do but answer; the signal ends the process.
                std::thread::park();
            }
        }
        Some(Action::Passthrough { to, count, timeout_secs }) => {
            crate::kafka::admin::ensure_topics(&cfg.kafka, &[to.as_str()], t.partitions, t.replication_factor)?;
            let moved =
                passthrough::run(&cfg.kafka, &t.events, t.partitions, &to, count, Duration::from_secs(timeout_secs))?;
            let secs = moved.elapsed.as_secs_f64().max(1e-9);
            println!(
                "passthrough: {} records in {secs:.3} s = {:.0} records/s",
                moved.records,
                moved.records as f64 / secs
            );
            Ok(())
        }
    }
}
