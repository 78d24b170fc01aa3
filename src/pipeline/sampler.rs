//! The state gauges, derived from the store and the broker by a background
//! thread rather than counted as the pipeline goes.
//!
//! Why a periodic scan: the gauges (operations by state, oldest unconfirmed
//! operation per type, open reviews) describe the store, which survives
//! restarts and moves between instances with partitions. Counting
//! transitions in memory would be wrong after a restart or a rebalance
//! unless it were itself persisted and restored; reading the store is right
//! by construction and keeps the hot path and the store format untouched.
//!
//! Its cost is bounded: a pass reads at most `scan_ops_per_sec` operations
//! per second (it pauses to stay under that), so the CPU it takes does not
//! grow with the state; on a large store a pass takes longer and the gauges
//! are refreshed less often (`reconciler_state_scan_duration_seconds` shows
//! how long a pass took). A pass starts `refresh_ms` after the previous one
//! ended, or three times that pass's length if it was longer (so that
//! passes on a large store do not run back to back), and at once when the
//! owned partitions change. Lag is the broker's high watermark minus the
//! next offset to apply, for each owned partition, read on a client of its
//! own so that the consumer's long polls never wait behind it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::clock::Clock;
use crate::config::Config;
use crate::core::{Policy, RepairAction, Status};
use crate::kafka::consumer::Assignment;
use crate::kafka::watermarks::Watermarks;
use crate::metrics::{Metrics, OTHER_TYPE};
use crate::store::{OpSummary, Store};

/// What the sampler reads.
pub struct Source {
    /// The state store.
    pub store: Arc<Store>,
    /// The owned partitions and the next offset to apply in each.
    pub assignment: Arc<Mutex<Assignment>>,
    /// High watermarks, for the lag.
    pub watermarks: Arc<Watermarks>,
    /// The input topic.
    pub topic: String,
    /// The wall clock (ages).
    pub clock: Clock,
    /// The policy (confirmation windows of the types).
    pub policy: Policy,
    /// Time between two passes.
    pub refresh: Duration,
    /// Most operations read per second by a pass.
    pub scan_ops_per_sec: u64,
}

impl Source {
    /// The sampler's view of a pipeline built from `cfg`.
    pub fn new(
        cfg: &Config,
        store: &Arc<Store>,
        assignment: &Arc<Mutex<Assignment>>,
        clock: &Clock,
        watermarks: &Arc<Watermarks>,
    ) -> Source {
        Source {
            store: store.clone(),
            assignment: assignment.clone(),
            watermarks: watermarks.clone(),
            topic: cfg.topics.events.clone(),
            clock: clock.clone(),
            policy: cfg.policy(),
            refresh: Duration::from_millis(cfg.metrics.refresh_ms),
            scan_ops_per_sec: cfg.metrics.scan_ops_per_sec,
        }
    }
}

/// The running sampler; stops (and joins) when dropped.
pub struct Sampler {
    _thread: super::background::Background,
}

impl Sampler {
    /// Starts the sampler's thread.
    pub fn start(metrics: Arc<Metrics>, source: Source) -> Sampler {
        let thread = super::background::Background::spawn("metrics-sampler", move |stop| run(&metrics, &source, stop));
        Sampler { _thread: thread }
    }
}

/// How often the thread looks at the stop flag and the assignment.
const TICK: Duration = Duration::from_millis(100);

/// The rest after a pass, in multiples of the pass's own length (when that
/// is longer than `refresh`): on a store too large for one refresh period,
/// scans take at most a quarter of the sampler's time, rather than running
/// back to back beside the pipeline (6 % of its samples in a profile on a
/// 300,000-operation store).
const REST_PER_PASS: u32 = 3;

/// How long to rest after a pass that took `took`.
fn rest_after(refresh: Duration, took: Duration) -> Duration {
    refresh.max(took * REST_PER_PASS)
}

fn run(metrics: &Metrics, src: &Source, stop: &AtomicBool) {
    // Configured types show an empty review queue as 0 from the first pass.
    let mut shown = Shown { review: src.policy.types.keys().cloned().collect(), ..Shown::default() };
    // When the last pass ended, the rest it earned, and what it covered.
    let mut last: Option<(Instant, Duration, BTreeSet<i32>)> = None;
    while !stop.load(Ordering::SeqCst) {
        let owned = src.assignment.lock().expect("not poisoned").owned.clone();
        let parts: BTreeSet<i32> = owned.keys().copied().collect();
        let due = last.as_ref().is_none_or(|(ended, rest, before)| ended.elapsed() >= *rest || *before != parts);
        if due {
            let began = Instant::now();
            sample_lag(metrics, &src.watermarks, &src.topic, &owned, &mut shown.partitions);
            match src.store.outbox_len() {
                Ok(n) => metrics.set_outbox_pending(n),
                Err(e) => warn!(error = %e, "Reading the outbox size failed"),
            }
            match scan(src, &parts, stop) {
                Ok(Some(summary)) => summary.publish(metrics, src, &mut shown),
                Ok(None) => {} // stopped mid-pass
                Err(e) => warn!(error = %e, "Scanning the state store for metrics failed; retrying next pass"),
            }
            last = Some((Instant::now(), rest_after(src.refresh, began.elapsed()), parts));
        }
        std::thread::sleep(TICK);
    }
}

/// Label values set by the previous pass (to remove those that are gone).
#[derive(Default)]
struct Shown {
    partitions: BTreeSet<i32>,
    unconfirmed: BTreeSet<String>,
    review: BTreeSet<String>,
}

fn sample_lag(
    metrics: &Metrics,
    watermarks: &Watermarks,
    topic: &str,
    owned: &BTreeMap<i32, i64>,
    shown: &mut BTreeSet<i32>,
) {
    let mut now = BTreeSet::new();
    for (p, next) in owned {
        match watermarks.high(topic, *p, Duration::from_secs(2)) {
            Ok(high) => {
                metrics.set_lag(*p, (high - next).max(0));
                now.insert(*p);
            }
            Err(e) => warn!(partition = p, error = %e, "Reading the high watermark for lag failed"),
        }
    }
    for gone in shown.difference(&now) {
        metrics.clear_lag(*gone);
    }
    // A partition whose watermark could not be read keeps its last value.
    shown.retain(|p| owned.contains_key(p));
    shown.extend(now);
}

/// Updates `ty`'s value in `map` with `update`, or inserts `first` for
/// it, copying `ty` only then.
fn merge<V>(map: &mut HashMap<String, V>, ty: &str, first: V, update: impl FnOnce(&mut V)) {
    match map.get_mut(ty) {
        Some(v) => update(v),
        None => {
            map.insert(ty.to_owned(), first);
        }
    }
}

/// What one pass found.
#[derive(Default)]
struct Summary {
    by_state: BTreeMap<Status, i64>,
    /// Operation type → earliest `requested_at` among operations awaiting evidence.
    oldest_requested: HashMap<String, i64>,
    /// Operation type → (count, earliest `review_since`).
    review: HashMap<String, (i64, i64)>,
    /// Operations waiting for a PROBE / a REQUEUE to be answered.
    follow_ups: (i64, i64),
    operations: i64,
    took: Duration,
}

fn scan(src: &Source, parts: &BTreeSet<i32>, stop: &AtomicBool) -> Result<Option<Summary>, crate::store::StoreError> {
    let started = Instant::now();
    let rate = src.scan_ops_per_sec.max(1) as f64;
    let mut s = Summary::default();
    let mut stopped = false;
    for p in parts {
        src.store.scan_summaries(*p, |op| {
            s.add(&op);
            if s.operations % 1024 == 0 {
                if stop.load(Ordering::SeqCst) {
                    stopped = true;
                    return false;
                }
                // Rate limit: the pass may not run ahead of its budget.
                let budget = Duration::from_secs_f64(s.operations as f64 / rate);
                if let Some(ahead) = budget.checked_sub(started.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
            true
        })?;
        if stopped {
            return Ok(None);
        }
    }
    s.took = started.elapsed();
    Ok(Some(s))
}

impl Summary {
    /// Counts one operation. Its type is copied only for a type the pass
    /// has not met yet: a pass reads up to `scan_ops_per_sec` operations a
    /// second beside the pipeline.
    fn add(&mut self, op: &OpSummary<&str>) {
        self.operations += 1;
        *self.by_state.entry(op.status).or_default() += 1;
        if op.status.awaits_evidence() {
            if let Some(at) = op.requested_at {
                merge(&mut self.oldest_requested, op.operation_type, at, |e| *e = (*e).min(at));
            }
        }
        match op.follow_up {
            Some(RepairAction::Probe) => self.follow_ups.0 += 1,
            Some(RepairAction::Requeue) => self.follow_ups.1 += 1,
            None => {}
        }
        if op.status == Status::ManualReview {
            let since = op.review_since;
            merge(&mut self.review, op.operation_type, (1, since), |e| *e = (e.0 + 1, e.1.min(since)));
        }
    }

    fn publish(self, m: &Metrics, src: &Source, shown: &mut Shown) {
        m.set_operations(|st| self.by_state.get(&st).copied().unwrap_or(0));
        m.set_follow_ups(self.follow_ups.0, self.follow_ups.1);
        let now = (src.clock)();
        let age = |at: i64| (now - at).max(0) as f64 / 1000.0;
        // Several raw types may share the `other` label: keep the oldest.
        let mut oldest: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for (ty, at) in &self.oldest_requested {
            let label = m.type_label(ty).to_owned();
            let window = src.policy.confirm_within(if label == OTHER_TYPE { "" } else { ty }, None);
            let e = oldest.entry(label).or_insert((*at, window));
            e.0 = e.0.min(*at);
        }
        for (label, (at, window)) in &oldest {
            m.set_unconfirmed(label, age(*at), *window as f64 / 1000.0);
        }
        let now_labels: BTreeSet<String> = oldest.into_keys().collect();
        for gone in shown.unconfirmed.difference(&now_labels) {
            m.clear_unconfirmed(gone);
        }
        shown.unconfirmed = now_labels;

        let mut review: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for (ty, (n, since)) in &self.review {
            let e = review.entry(m.type_label(ty).to_owned()).or_insert((0, *since));
            e.0 += n;
            e.1 = e.1.min(*since);
        }
        for (label, (n, since)) in &review {
            m.set_review(label, Some((*n, age(*since))));
        }
        let now_labels: BTreeSet<String> = review.into_keys().collect();
        for gone in shown.review.difference(&now_labels) {
            // An emptied queue shows 0 rather than vanishing, so that
            // "review queue size" panels and alerts see it drop.
            m.set_review(gone, None);
        }
        shown.review.extend(now_labels);
        m.set_scan(self.took, self.operations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_pass_earns_a_longer_rest() {
        let refresh = Duration::from_secs(5);
        assert_eq!(rest_after(refresh, Duration::from_millis(40)), refresh);
        assert_eq!(rest_after(refresh, Duration::from_secs(3)), Duration::from_secs(9));
    }
}
