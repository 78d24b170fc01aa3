//! The ground truth of a generated workload: what the reconciler must
//! publish for it, written down while the workload is built (by the
//! construction of each story), never by running the reconciler's own core.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::{Action, AnomalyKind, Outcome};

/// One verdict the reconciler must issue for an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Expected {
    /// Outcome the verdict must have.
    pub outcome: Outcome,
    /// Action the verdict must recommend.
    pub action: Action,
    /// Decided only when a timer fires (wall clock): a confirmation
    /// deadline or a follow-up; then the event time it is due (the
    /// verdict's `decided_at`).
    pub timer_at: Option<i64>,
}

impl Expected {
    /// Decided when `outcome`/`action` follows from the events alone.
    pub fn now(outcome: Outcome, action: Action) -> Expected {
        Expected { outcome, action, timer_at: None }
    }

    /// Decided by a timer due at event time `at`.
    pub fn at(outcome: Outcome, action: Action, at: i64) -> Expected {
        Expected { outcome, action, timer_at: Some(at) }
    }

    /// Whether the verdict waits for a timer (it comes only once the pipeline
    /// fires it).
    pub fn needs_timer(&self) -> bool {
        self.timer_at.is_some()
    }

    /// `OUTCOME/ACTION`, with `+timer@T` when a timer due at `T` must fire first.
    pub fn label(&self) -> String {
        let timer = self.timer_at.map_or_else(String::new, |t| format!("+timer@{t}"));
        format!("{}/{}{timer}", self.outcome.as_str(), self.action.as_str())
    }

    /// The inverse of [`label`](Self::label); `None` for a malformed label.
    pub fn parse(label: &str) -> Option<Expected> {
        let (pair, timer_at) = match label.split_once("+timer@") {
            Some((p, t)) => (p, Some(t.parse().ok()?)),
            None => (label, None),
        };
        let (o, a) = pair.split_once('/')?;
        Some(Expected {
            outcome: Outcome::ALL.into_iter().find(|x| x.as_str() == o)?,
            action: Action::ALL.into_iter().find(|x| x.as_str() == a)?,
            timer_at,
        })
    }
}

/// Settings of the reconciler the truth was computed for (its own defaults
/// unless told otherwise); a run with other settings may legitimately differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assumptions {
    /// Reorder window the stories with gaps were built against (a gap outlasts
    /// it, an orphan waits exactly it).
    pub reorder_window_ms: i64,
    /// Retention must be longer than the age of the oldest event at run time.
    pub min_retention_ms: i64,
    /// Follow-up window after PROBE / REQUEUE; `None`: the confirmation window.
    pub follow_up_ms: Option<i64>,
    /// Automatic requeues per operation in all.
    pub max_requeues: u32,
}

/// Everything the reconciler must publish for a workload (the JSON file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// Seed the workload was generated with.
    pub seed: u64,
    /// Operations created.
    pub operations: u64,
    /// Entities the operations were spread over (not counting those taken in
    /// place of retired ones).
    pub entities: u64,
    /// Records published to the input topic.
    pub records: u64,
    /// Of those, decodable events (the rest are dead letters).
    pub events: u64,
    /// Of `records`, those that must be dead-lettered.
    pub dead_letters: u64,
    /// `dead_letters` by the error class the reconciler must give them (see
    /// [`crate::codec::DecodeError::class`]).
    pub dead_letters_by_class: BTreeMap<String, u64>,
    /// Settings of the reconciler the truth holds for.
    pub assumes: Assumptions,
    /// How many units of each story the workload holds.
    pub stories: BTreeMap<String, u64>,
    /// Verdicts expected in all.
    pub verdict_count: u64,
    /// Of `verdict_count`, those that need a deadline to fire first.
    pub timer_verdicts: u64,
    /// Expected anomalies by kind (all of them).
    pub anomalies: BTreeMap<String, u64>,
    /// Of `anomalies`, those that need a timer (orphans found at window end).
    pub timer_anomalies: BTreeMap<String, u64>,
    /// Event time (ms) by which every timer-dependent output is due: a
    /// pipeline fires them once the wall clock has passed it.
    pub latest_due_ms: i64,
    /// Per operation, its verdicts in order (`OUTCOME/ACTION[+timer]`).
    pub verdicts: BTreeMap<String, Vec<String>>,
    /// What the probed story's destination holds, by idempotency key (keys
    /// it does not hold are absent): `reconciler loadgen destination`
    /// serves it to the probe worker.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub destination: BTreeMap<String, HeldEffect>,
}

/// An effect the loadgen destination holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldEffect {
    /// The destination's id of it.
    pub remote_id: String,
    /// The version it carries.
    pub version: i64,
}

impl GroundTruth {
    /// What the destination service serves for this truth.
    pub fn held(&self) -> std::collections::HashMap<String, super::destination::Held> {
        self.destination
            .iter()
            .map(|(k, e)| {
                (k.clone(), super::destination::Held::Present { remote_id: e.remote_id.clone(), version: e.version })
            })
            .collect()
    }
}

impl GroundTruth {
    pub(crate) fn new(seed: u64, operations: u64, entities: u64, assumes: Assumptions) -> GroundTruth {
        GroundTruth {
            seed,
            operations,
            entities,
            records: 0,
            events: 0,
            dead_letters: 0,
            dead_letters_by_class: BTreeMap::new(),
            assumes,
            stories: BTreeMap::new(),
            verdict_count: 0,
            timer_verdicts: 0,
            anomalies: AnomalyKind::ALL.iter().map(|k| (k.as_str().to_owned(), 0)).collect(),
            timer_anomalies: BTreeMap::new(),
            latest_due_ms: i64::MIN,
            verdicts: BTreeMap::new(),
            destination: BTreeMap::new(),
        }
    }

    pub(crate) fn expect_verdicts(&mut self, operation_id: &str, verdicts: &[Expected], keep: bool) {
        self.verdict_count += verdicts.len() as u64;
        self.timer_verdicts += verdicts.iter().filter(|v| v.needs_timer()).count() as u64;
        if let Some(t) = verdicts.iter().filter_map(|v| v.timer_at).max() {
            self.latest_due_ms = self.latest_due_ms.max(t);
        }
        if keep {
            self.verdicts.insert(operation_id.to_owned(), verdicts.iter().map(Expected::label).collect());
        }
    }

    pub(crate) fn expect_anomaly(&mut self, kind: AnomalyKind, needs_timer: bool) {
        *self.anomalies.entry(kind.as_str().to_owned()).or_default() += 1;
        if needs_timer {
            *self.timer_anomalies.entry(kind.as_str().to_owned()).or_default() += 1;
        }
    }

    pub(crate) fn expect_dead_letter(&mut self, class: &str) {
        self.dead_letters += 1;
        *self.dead_letters_by_class.entry(class.to_owned()).or_default() += 1;
    }

    /// Total expected anomalies.
    pub fn anomaly_count(&self) -> u64 {
        self.anomalies.values().sum()
    }

    /// Writes the truth to `path` as JSON.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let f = std::io::BufWriter::new(std::fs::File::create(path)?);
        serde_json::to_writer(f, self).map_err(std::io::Error::other)
    }

    /// Reads a truth written by [`write`](Self::write).
    pub fn read(path: &std::path::Path) -> std::io::Result<GroundTruth> {
        let f = std::io::BufReader::new(std::fs::File::open(path)?);
        serde_json::from_reader(f).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for outcome in Outcome::ALL {
            for action in Action::ALL {
                for timer_at in [None, Some(1_700_000_300_000), Some(-5)] {
                    let e = Expected { outcome, action, timer_at };
                    assert_eq!(Expected::parse(&e.label()), Some(e));
                }
            }
        }
        assert_eq!(Expected::parse("CORRECT"), None);
        assert_eq!(Expected::parse("CORRECT/NONE+timer@soon"), None);
    }
}
