//! `replay`: rebuild the state from the input topic into a fresh state
//! directory, through the pipeline's own code path (a `Pipeline` with a
//! fresh group and store), and summarise what it decided.
//!
//! The replay writes nothing to live topics: its timers never fire (its
//! clock reads "the beginning of time", so every overdue verdict comes from
//! the `DeadlineReached` events already in the log: timers are input, so a
//! replay judges them as the live run did),
//! and its outputs are either discarded or, with an output prefix, published
//! to scratch topics `{prefix}.verdicts`, ... which can then be compared
//! with the live verdict topic.
//!
//! "The end" is the input topic's high watermarks when the replay starts
//! (and reading a topic for the diff stops at its high watermarks): a
//! broker must report them right. tansu's memory engine does not (it
//! reports the last produce batch's base offset + 1, so a replay against it
//! stops early); its sqlite engine and Kafka do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::digest::{state_digest, StateDigest};
use super::OperatorError;
use crate::config::{Config, Topics};
use crate::kafka::reader::{read_to_end, watermarks};
use crate::pipeline::{Pipeline, Stats};

/// How a replay runs.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Must not exist yet, or be empty.
    pub state_dir: PathBuf,
    /// Publish outputs to `{prefix}.verdicts`, `{prefix}.anomalies`,
    /// `{prefix}.dlq`, `{prefix}.commands` (created if missing); without
    /// it outputs are discarded.
    pub output_prefix: Option<String>,
    /// Compare the replayed verdicts with the live verdict topic (needs
    /// `output_prefix`).
    pub diff: bool,
}

/// One partition's progress.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionProgress {
    /// The input partition.
    pub partition: i32,
    /// Records consumed so far.
    pub done: i64,
    /// Records in the partition when the replay started.
    pub total: i64,
}

/// Progress, reported a few times a second.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    /// Each input partition's progress.
    pub partitions: Vec<PartitionProgress>,
    /// Wall time since the replay started.
    pub elapsed_ms: u64,
    /// Records consumed per second so far.
    pub events_per_sec: f64,
    /// Time left at that rate; `None` until something was consumed.
    pub eta_ms: Option<u64>,
}

impl Progress {
    /// Records consumed so far, in all partitions.
    pub fn done(&self) -> i64 {
        self.partitions.iter().map(|p| p.done).sum()
    }

    /// Records to replay, in all partitions.
    pub fn total(&self) -> i64 {
        self.partitions.iter().map(|p| p.total).sum()
    }
}

/// Replayed verdicts against the live verdict topic, by verdict_id.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerdictDiff {
    /// Distinct verdicts in the live topic.
    pub live: usize,
    /// Distinct verdicts in the replay's topic.
    pub replayed: usize,
    /// Same id, same bytes.
    pub equal: usize,
    /// Same id, other bytes.
    pub differing: usize,
    /// In the live topic only (e.g. decided after the replay's end).
    pub missing: usize,
    /// In the replay only.
    pub extra: usize,
    /// Up to ten ids of each kind of difference, for a closer look.
    pub differing_ids: Vec<String>,
    /// Up to ten ids of the `missing` verdicts.
    pub missing_ids: Vec<String>,
    /// Up to ten ids of the `extra` verdicts.
    pub extra_ids: Vec<String>,
}

/// What a replay did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplaySummary {
    /// The directory the state was rebuilt in.
    pub state_dir: String,
    /// Input records replayed (events and dead letters).
    pub events: u64,
    /// Decoded events by how the core accounted for them (applied, duplicate,
    /// held, ...).
    pub by_disposition: BTreeMap<String, u64>,
    /// Verdicts issued.
    pub verdicts: u64,
    /// Anomalies issued.
    pub anomalies: u64,
    /// Records dead-lettered.
    pub dead_letters: u64,
    /// Digest of the rebuilt state; equal to the live store's when both hold
    /// the same state.
    pub digest: StateDigest,
    /// Wall time from the start to the digest (the diff not included).
    pub duration_ms: u64,
    /// `events` per second of `duration_ms`.
    pub events_per_sec: f64,
    /// Where the outputs went (`None`: discarded).
    pub output_topics: Option<Topics>,
    /// The comparison with the live verdict topic (with `diff`).
    pub diff: Option<VerdictDiff>,
}

fn fresh(dir: &std::path::Path) -> Result<(), OperatorError> {
    let used = dir.exists()
        && std::fs::read_dir(dir)
            .map_err(|e| OperatorError::Invalid(format!("reading {}: {e}", dir.display())))?
            .next()
            .is_some();
    if used {
        return Err(OperatorError::Invalid(format!(
            "state directory {} is not empty; a replay needs a fresh one",
            dir.display()
        )));
    }
    Ok(())
}

/// Replays `cfg`'s input topic up to its end at the start, calling
/// `on_progress` a few times a second. Stops early (with an error) when
/// `interrupt` is set.
pub fn replay(
    cfg: &Config,
    opts: &ReplayOptions,
    interrupt: &AtomicBool,
    mut on_progress: impl FnMut(&Progress),
) -> Result<ReplaySummary, OperatorError> {
    if opts.diff && opts.output_prefix.is_none() {
        return Err(OperatorError::Invalid(
            "--diff needs --output-prefix: the replayed verdicts must go somewhere".into(),
        ));
    }
    fresh(&opts.state_dir)?;
    let started = Instant::now();
    let marks = watermarks(&cfg.kafka, &cfg.topics.events)?;
    let mut rcfg = cfg.clone();
    rcfg.state_dir = opts.state_dir.clone();
    let stamp = crate::clock::now_ms();
    rcfg.consumer.group_id = format!("{}.replay-{}-{stamp}", cfg.consumer.group_id, std::process::id());
    if let Some(prefix) = &opts.output_prefix {
        rcfg.topics = Topics { events: cfg.topics.events.clone(), ..Topics::named(prefix, cfg.topics.partitions) };
    }
    let mut pipeline = Pipeline::for_replay(rcfg.clone(), opts.output_prefix.is_none())?;
    let store = pipeline.store();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::spawn(move || pipeline.run(&flag).map(|()| pipeline.stats));
    let progress = |store: &crate::store::Store| -> Result<Progress, OperatorError> {
        let mut partitions = Vec::new();
        for (p, (low, high)) in &marks {
            let next = store.next_offset(*p)?.unwrap_or(*low);
            partitions.push(PartitionProgress {
                partition: *p,
                done: (next.min(*high) - low).max(0),
                total: high - low,
            });
        }
        let elapsed = started.elapsed();
        let done: i64 = partitions.iter().map(|p| p.done).sum();
        let total: i64 = partitions.iter().map(|p| p.total).sum();
        let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
        let eta_ms = (rate > 0.0).then(|| ((total - done) as f64 / rate * 1000.0) as u64);
        Ok(Progress { partitions, elapsed_ms: elapsed.as_millis() as u64, events_per_sec: rate, eta_ms })
    };
    let outcome = loop {
        let p = progress(&store);
        match &p {
            Ok(p) => on_progress(p),
            Err(_) => break p.map(|_| ()),
        }
        if p.as_ref().is_ok_and(|p| p.done() >= p.total()) {
            break Ok(());
        }
        if interrupt.load(Ordering::SeqCst) {
            break Err(OperatorError::Invalid("replay interrupted".into()));
        }
        if handle.is_finished() {
            break Ok(()); // its error is reported below
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    stop.store(true, Ordering::SeqCst);
    let stats: Stats = handle.join().map_err(|_| OperatorError::Invalid("the replay pipeline panicked".into()))??;
    outcome?;
    let p = progress(&store)?;
    if p.done() < p.total() {
        return Err(OperatorError::Invalid(format!("the replay stopped at {} of {} records", p.done(), p.total())));
    }
    on_progress(&p);
    // The rebuilt store has no write-ahead log: make it durable now.
    store.flush()?;
    let digest = state_digest(&store)?;
    drop(store);
    let duration = started.elapsed();
    let diff = if opts.diff { Some(diff_verdicts(cfg, &rcfg.topics.verdicts)?) } else { None };
    Ok(ReplaySummary {
        state_dir: opts.state_dir.display().to_string(),
        events: stats.records,
        by_disposition: stats.by_disposition.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        verdicts: stats.verdicts,
        anomalies: stats.anomalies,
        dead_letters: stats.dead_letters.values().sum(),
        digest,
        duration_ms: duration.as_millis() as u64,
        events_per_sec: stats.records as f64 / duration.as_secs_f64().max(1e-3),
        output_topics: opts.output_prefix.as_ref().map(|_| rcfg.topics.clone()),
        diff,
    })
}

/// Verdicts by id (the last copy of an id re-published at least once).
fn verdicts_by_id(cfg: &Config, topic: &str) -> Result<BTreeMap<String, Vec<u8>>, OperatorError> {
    let records = read_to_end(&cfg.kafka, topic, Duration::from_secs(120))?;
    let codec = crate::registry::reader_for(cfg, records.iter().filter_map(|r| r.value.as_deref()))?;
    let mut out = BTreeMap::new();
    for r in records {
        let Some(v) = r.value else { continue };
        match codec.decode_verdict(&v) {
            Ok(verdict) => {
                out.insert(verdict.verdict_id, v);
            }
            Err(e) => tracing::warn!(topic, partition = r.partition, offset = r.offset, error = %e, "Not a verdict"),
        }
    }
    Ok(out)
}

/// Compares `replayed` (a verdict topic) with the live verdict topic.
pub fn diff_verdicts(cfg: &Config, replayed: &str) -> Result<VerdictDiff, OperatorError> {
    let live = verdicts_by_id(cfg, &cfg.topics.verdicts)?;
    let again = verdicts_by_id(cfg, replayed)?;
    let mut d = VerdictDiff { live: live.len(), replayed: again.len(), ..Default::default() };
    let note = |ids: &mut Vec<String>, id: &str| {
        if ids.len() < 10 {
            ids.push(id.to_owned());
        }
    };
    for (id, bytes) in &live {
        match again.get(id) {
            Some(b) if b == bytes => d.equal += 1,
            Some(_) => {
                d.differing += 1;
                note(&mut d.differing_ids, id);
            }
            None => {
                d.missing += 1;
                note(&mut d.missing_ids, id);
            }
        }
    }
    for id in again.keys().filter(|id| !live.contains_key(*id)) {
        d.extra += 1;
        note(&mut d.extra_ids, id);
    }
    Ok(d)
}
