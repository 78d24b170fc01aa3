//! Metrics of the state changelog and of restores: how each
//! assigned partition got its state, how long a changelog restore took and
//! how far one in progress is, and what the changelog still owes.

use prometheus::core::Collector;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, gauge_vec, int_counter, int_gauge, int_gauge_vec};

/// Where an assigned partition's state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreSource {
    /// Read from the changelog topic.
    Changelog,
    /// Replayed from the input topic without publishing, up to the group's
    /// committed offset (no changelog, or it could not be used).
    Input,
    /// The local store was current: nothing to restore.
    Local,
    /// A standby replica here had the state: caught up from where it was.
    Standby,
}

impl RestoreSource {
    const ALL: [RestoreSource; 4] =
        [RestoreSource::Changelog, RestoreSource::Input, RestoreSource::Local, RestoreSource::Standby];

    fn label(self) -> &'static str {
        match self {
            RestoreSource::Changelog => "changelog",
            RestoreSource::Input => "input",
            RestoreSource::Local => "local",
            RestoreSource::Standby => "standby",
        }
    }
}

/// The changelog and restore metrics.
pub struct RestoreMetrics {
    restores: IntCounterVec,
    records: IntCounter,
    duration: GaugeVec,
    remaining: IntGaugeVec,
    started: GaugeVec,
    published: IntCounter,
    pending: IntGauge,
    set_back: IntCounter,
    standby_partitions: IntGauge,
    standby_lag: IntGauge,
    standby_records: IntCounter,
    lost_positions: IntCounterVec,
}

impl RestoreMetrics {
    /// Registers them in `r`, every source's series present from the start.
    pub fn new(r: &Registry) -> RestoreMetrics {
        let m = RestoreMetrics {
            restores: counter(
                r,
                "reconciler_partition_restores_total",
                "Partitions assigned, by where their state came from: changelog, input (replayed without publishing), local (already current) or standby (a standby replica here, caught up from where it was).",
                &["source"],
            ),
            records: int_counter(
                r,
                "reconciler_changelog_restored_records_total",
                "Changelog records read into the store by restores.",
            ),
            duration: gauge_vec(
                r,
                "reconciler_changelog_restore_seconds",
                "Wall time of the last restore of a partition from the changelog.",
                &["partition"],
            ),
            remaining: int_gauge_vec(
                r,
                "reconciler_changelog_restore_remaining_records",
                "Offsets of the changelog partition still to read by the restore in progress (0 when none runs).",
                &["partition"],
            ),
            started: gauge_vec(
                r,
                "reconciler_changelog_restore_started_timestamp_seconds",
                "Start (Unix time) of the restore of a partition from the changelog in progress; 0 when none runs.",
                &["partition"],
            ),
            published: int_counter(
                r,
                "reconciler_changelog_records_total",
                "Changelog records published (acknowledged by the broker).",
            ),
            pending: int_gauge(
                r,
                "reconciler_changelog_pending_records",
                "Changelog records of stored batches not yet published: the changelog's lag behind the local state.",
            ),
            set_back: int_counter(
                r,
                "reconciler_changelog_set_back_records_total",
                "Changelog records published by restores to set back a batch whose changelog its owner cut short (a crash while publishing it).",
            ),
            standby_partitions: int_gauge(
                r,
                "reconciler_standby_partitions",
                "Partitions this instance keeps a standby replica of (tails their changelog; [consumer] standby_replicas).",
            ),
            standby_lag: int_gauge(
                r,
                "reconciler_standby_lag_records",
                "Changelog records of this instance's standby partitions not yet applied to its store (their sum; 0 without standbys).",
            ),
            standby_records: int_counter(
                r,
                "reconciler_standby_records_total",
                "Changelog records applied by standby replicas.",
            ),
            lost_positions: counter(
                r,
                "reconciler_lost_positions_total",
                "Assigned partitions whose stored position was outside the input's log (the topic created again, truncated, or retention past it), by what was done: fail (stopped for a person), restore (state restored from the changelog) or reset (state forgotten, the log read from its start).",
                &["action"],
            ),
        };
        for action in ["fail", "restore", "reset"] {
            m.lost_positions.with_label_values(&[action]);
        }
        for s in RestoreSource::ALL {
            m.restores.with_label_values(&[s.label()]);
        }
        m
    }

    /// An assigned partition's stored position was outside the input's
    /// log, and `action` (`fail`, `restore` or `reset`) was taken.
    pub fn lost_position(&self, action: &str) {
        self.lost_positions.with_label_values(&[action]).inc();
    }

    /// An assigned partition got its state from `source`.
    pub fn restored(&self, source: RestoreSource) {
        self.restores.with_label_values(&[source.label()]).inc();
    }

    /// `partition` was assigned: its series exist from now on (0 until a
    /// changelog restore sets them), so dashboards and alerts see them.
    pub fn assigned(&self, partition: i32) {
        let label = partition.to_string();
        self.started.with_label_values(&[&label]);
        self.remaining.with_label_values(&[&label]);
        self.duration.with_label_values(&[&label]);
    }

    /// A changelog restore of `partition` began at Unix time `at` (seconds).
    pub fn restore_started(&self, partition: i32, at: f64) {
        self.started.with_label_values(&[&partition.to_string()]).set(at);
    }

    /// A restore of `partition` in progress has `remaining` offsets left.
    pub fn restore_progress(&self, partition: i32, remaining: i64) {
        self.remaining.with_label_values(&[&partition.to_string()]).set(remaining);
    }

    /// A changelog restore of `partition` ended after `seconds`, having
    /// read `records`.
    pub fn restore_finished(&self, partition: i32, seconds: f64, records: u64) {
        let label = partition.to_string();
        self.started.with_label_values(&[&label]).set(0.0);
        self.remaining.with_label_values(&[&label]).set(0);
        self.duration.with_label_values(&[&label]).set(seconds);
        self.records.inc_by(records);
    }

    /// This instance keeps a standby of `partitions` partitions now.
    pub fn standby(&self, partitions: usize) {
        self.standby_partitions.set(partitions as i64);
    }

    /// Its standby partitions are `lag` changelog records behind in all.
    pub fn standby_lag(&self, lag: i64) {
        self.standby_lag.set(lag);
    }

    /// A standby replica applied `n` changelog records.
    pub fn standby_applied(&self, n: usize) {
        self.standby_records.inc_by(n as u64);
    }

    /// A restore set back a batch cut short with `n` changelog records.
    pub fn set_back(&self, n: usize) {
        self.set_back.inc_by(n as u64);
    }

    /// `n` changelog records were acknowledged.
    pub fn changelog_published(&self, n: usize) {
        self.published.inc_by(n as u64);
    }

    /// `n` changelog records wait for their batch's outputs.
    pub fn set_changelog_pending(&self, n: usize) {
        self.pending.set(n as i64);
    }

    /// Every metric, whether or not it has a value yet (dashboards, alert
    /// rules and the metrics reference are checked against these).
    pub fn collectors(&self) -> Vec<&dyn Collector> {
        let all: Vec<&dyn Collector> = vec![
            &self.restores,
            &self.records,
            &self.duration,
            &self.remaining,
            &self.started,
            &self.published,
            &self.pending,
            &self.set_back,
            &self.standby_partitions,
            &self.standby_lag,
            &self.standby_records,
            &self.lost_positions,
        ];
        all
    }

    /// The name of every metric.
    pub fn names(&self) -> Vec<String> {
        self.collectors().iter().flat_map(|c| c.desc()).map(|d| d.fq_name.clone()).collect()
    }
}
