//! `reconciler loadgen verify`: reads the verdict, anomaly and dead-letter
//! topics as any downstream service would and compares them with the
//! ground truth: per operation, the verdicts in order; per kind, the number
//! of anomalies; the number of dead letters (and their classes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;
use std::time::{Duration, Instant};

use crate::codec::Codec;
use crate::config::Config;
use crate::core::{Action, Outcome};
use crate::kafka::reader::TopicReader;
use crate::operator::audit::{self, Untimed};
use crate::operator::{commands, OperatorError};
use crate::records::{headers, Record};

use super::truth::{Expected, GroundTruth};

/// Placeholder for "no verdict" in the confusion table.
pub const NONE: &str = "-";

/// The comparison of a run with its ground truth.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// (expected outcome, actual outcome) → count, verdict by verdict in
    /// each operation's order; `-` where one side has no verdict.
    pub confusion: BTreeMap<(String, String), u64>,
    /// Operations compared: the truth's, and any others that received verdicts.
    pub operations: u64,
    /// Operations whose verdicts (outcome and action, in order) all match.
    pub operations_agreeing: u64,
    /// A few operations that disagree: (operation, expected, actual).
    pub examples: Vec<(String, Vec<String>, Vec<String>)>,
    /// Verdicts the truth expects.
    pub verdicts_expected: u64,
    /// Distinct verdicts read (by verdict_id).
    pub verdicts_seen: u64,
    /// Kind → (expected, seen).
    pub anomalies: BTreeMap<String, (u64, u64)>,
    /// Class → (expected, seen).
    pub dead_letters: BTreeMap<String, (u64, u64)>,
    /// Whether everything was read before the timeout.
    pub complete: bool,
}

impl Report {
    /// 100% agreement: every operation, every anomaly count, every dead letter.
    pub fn agrees(&self) -> bool {
        self.operations_agreeing == self.operations
            && self.verdicts_seen == self.verdicts_expected
            && self.anomalies.values().all(|(e, s)| e == s)
            && self.dead_letters.values().all(|(e, s)| e == s)
    }

    /// The report as text: agreement, the confusion table, anomalies and dead
    /// letters against the truth, examples of disagreement, and AGREE or
    /// DISAGREE.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let pct = 100.0 * self.operations_agreeing as f64 / self.operations.max(1) as f64;
        let _ = writeln!(
            s,
            "operations: {} of {} agree ({pct:.3}%); verdicts: {} seen, {} expected",
            self.operations_agreeing, self.operations, self.verdicts_seen, self.verdicts_expected
        );
        let mut cols: Vec<String> = Outcome::ALL.iter().map(|o| o.as_str().to_owned()).collect();
        cols.push(NONE.into());
        let _ = writeln!(s, "\nconfusion (rows: expected outcome, columns: actual outcome)");
        let _ = write!(s, "{:<18}", "");
        for c in &cols {
            let _ = write!(s, " {:>16}", c);
        }
        let _ = writeln!(s);
        for r in &cols {
            let _ = write!(s, "{r:<18}");
            for c in &cols {
                let n = self.confusion.get(&(r.clone(), c.clone())).copied().unwrap_or(0);
                let _ = write!(s, " {n:>16}");
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "\nanomalies            expected       seen");
        for (k, (e, n)) in &self.anomalies {
            let mark = if e == n { "" } else { "  <-- differs" };
            let _ = writeln!(s, "  {k:<22} {e:>8} {n:>10}{mark}");
        }
        let _ = writeln!(s, "\ndead letters         expected       seen");
        for (k, (e, n)) in &self.dead_letters {
            let mark = if e == n { "" } else { "  <-- differs" };
            let _ = writeln!(s, "  {k:<22} {e:>8} {n:>10}{mark}");
        }
        for (op, e, a) in &self.examples {
            let _ = writeln!(s, "\ndisagrees: {op}\n  expected {e:?}\n  actual   {a:?}");
        }
        let verdict = if self.agrees() { "AGREE" } else { "DISAGREE" };
        let _ = writeln!(s, "\n{verdict}{}", if self.complete { "" } else { " (timed out reading)" });
        s
    }
}

/// A dead letter's identity: the input record it stands for (under
/// at-least-once delivery, after a crash the last batch may be published
/// again, its dead letters included; the copies name the same source). A
/// record without the provenance headers is told apart by its own
/// position.
fn dead_letter_source(r: &Record) -> (String, String, String) {
    let header = |name: &str| r.header(name).map(|v| String::from_utf8_lossy(v).into_owned());
    match (header(headers::SOURCE_TOPIC), header(headers::SOURCE_PARTITION), header(headers::SOURCE_OFFSET)) {
        (Some(t), Some(p), Some(o)) => (t, p, o),
        _ => (format!("{}?", r.topic), r.partition.to_string(), r.offset.to_string()),
    }
}

/// Distinct outputs read so far, counted as they arrive.
#[derive(Default)]
struct Tally {
    read: usize,
    verdict_values: HashSet<Vec<u8>>,
    anomaly_values: HashSet<Vec<u8>>,
    dead_letters: HashSet<(String, String, String)>,
}

impl Tally {
    fn update(&mut self, cfg: &Config, records: &[Record]) {
        let t = &cfg.topics;
        for r in &records[self.read..] {
            if *r.topic == *t.dlq {
                // Dead letters keep null values null: told apart by source.
                self.dead_letters.insert(dead_letter_source(r));
            } else if let Some(v) = r.value.as_ref() {
                if *r.topic == *t.verdicts {
                    self.verdict_values.insert(v.clone());
                } else if *r.topic == *t.anomalies {
                    self.anomaly_values.insert(v.clone());
                }
            }
        }
        self.read = records.len();
    }
}

/// Reads the output topics until everything the truth expects has arrived
/// (then `settle` longer, to catch extras) or `timeout` passes, and compares.
pub fn verify(
    cfg: &Config,
    truth: &GroundTruth,
    timeout: Duration,
    settle: Duration,
) -> Result<Report, super::LoadgenError> {
    let t = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts, &t.anomalies, &t.dlq], t.partitions)?;
    let mut tally = Tally::default();
    let (want_v, want_a) = (truth.verdict_count as usize, truth.anomaly_count() as usize);
    let complete = reader.read_until(timeout, |recs| {
        tally.update(cfg, recs);
        tally.verdict_values.len() >= want_v
            && tally.anomaly_values.len() >= want_a
            && tally.dead_letters.len() as u64 >= truth.dead_letters
    });
    let quiet_until = Instant::now() + settle;
    reader.read_until(settle, |_| Instant::now() >= quiet_until);
    let codec = crate::registry::reader_for(cfg, reader.records.iter().filter_map(|r| r.value.as_deref()))?;
    Ok(compare_with(&codec, cfg, truth, &reader.records, complete))
}

/// Compares output records (any order across partitions, topic order within
/// one) with the truth.
pub fn compare(cfg: &Config, truth: &GroundTruth, records: &[Record], complete: bool) -> Report {
    compare_with(&Codec::new(), cfg, truth, records, complete)
}

/// [`compare`], decoding the outputs with `codec` (one that knows the
/// schema ids Confluent-framed outputs name).
pub fn compare_with(codec: &Codec, cfg: &Config, truth: &GroundTruth, records: &[Record], complete: bool) -> Report {
    let t = &cfg.topics;
    let mut report = Report { complete, verdicts_expected: truth.verdict_count, ..Report::default() };
    let mut actual: HashMap<String, Vec<Seen>> = HashMap::new();
    let mut seen_ids = HashSet::new();
    let mut anomaly_ids = HashSet::new();
    let mut dead_ids = HashSet::new();
    let mut anomalies: BTreeMap<String, u64> = BTreeMap::new();
    let mut dead: BTreeMap<String, u64> = BTreeMap::new();
    for r in records {
        if *r.topic == *t.dlq {
            if !dead_ids.insert(dead_letter_source(r)) {
                continue; // a copy re-published after a crash
            }
            let class = r
                .header(headers::ERROR_CLASS)
                .map_or_else(|| "?".to_owned(), |v| String::from_utf8_lossy(v).into_owned());
            *dead.entry(class).or_default() += 1;
            continue;
        }
        let Some(value) = r.value.as_deref() else { continue };
        if *r.topic == *t.verdicts {
            if let Ok(v) = codec.decode_verdict(value) {
                if seen_ids.insert(v.verdict_id.clone()) {
                    actual.entry(v.operation_id).or_default().push((v.outcome, v.action, v.decided_at));
                    report.verdicts_seen += 1;
                }
            }
        } else if *r.topic == *t.anomalies {
            if let Ok(a) = codec.decode_anomaly(value) {
                if anomaly_ids.insert(a.anomaly_id.clone()) {
                    *anomalies.entry(a.kind.as_str().to_owned()).or_default() += 1;
                }
            }
        }
    }
    let label = |(o, a, at): &Seen| format!("{}/{}@{at}", o.as_str(), a.as_str());
    // A verdict matches when outcome and action do, and a timer's verdict
    // is decided at the time its timer was due.
    let matches =
        |e: &Expected, (o, a, at): &Seen| (e.outcome, e.action) == (*o, *a) && e.timer_at.is_none_or(|t| t == *at);
    for (op, labels) in &truth.verdicts {
        let expected: Vec<Expected> = labels.iter().filter_map(|l| Expected::parse(l)).collect();
        let got = actual.remove(op).unwrap_or_default();
        tabulate(&mut report, &expected, &got);
        report.operations += 1;
        if expected.len() == got.len() && expected.iter().zip(&got).all(|(e, g)| matches(e, g)) {
            report.operations_agreeing += 1;
        } else if report.examples.len() < 5 {
            let e = expected.iter().map(|e| e.label()).collect();
            report.examples.push((op.clone(), e, got.iter().map(label).collect()));
        }
    }
    // Verdicts for operations the truth does not know (none expected).
    for (op, got) in actual {
        tabulate(&mut report, &[], &got);
        report.operations += 1;
        if report.examples.len() < 5 {
            report.examples.push((op, Vec::new(), got.iter().map(label).collect()));
        }
    }
    for (k, e) in &truth.anomalies {
        report.anomalies.insert(k.clone(), (*e, anomalies.remove(k).unwrap_or(0)));
    }
    for (k, n) in anomalies {
        report.anomalies.insert(k, (0, n));
    }
    for (k, e) in &truth.dead_letters_by_class {
        report.dead_letters.insert(k.clone(), (*e, dead.remove(k).unwrap_or(0)));
    }
    for (k, n) in dead {
        report.dead_letters.insert(k, (0, n));
    }
    report
}

/// A verdict as read: outcome, action, decided_at.
type Seen = (Outcome, Action, i64);

fn tabulate(report: &mut Report, expected: &[Expected], got: &[Seen]) {
    for i in 0..expected.len().max(got.len()) {
        let e = expected.get(i).map_or(NONE, |e| e.outcome.as_str());
        let g = got.get(i).map_or(NONE, |g| g.0.as_str());
        *report.confusion.entry((e.to_owned(), g.to_owned())).or_default() += 1;
    }
}

/// The operations of the state directory `dir` (of the run that processed
/// the workload) open without a timer; see [`audit::untimed`].
pub fn untimed_in(cfg: &Config, dir: &std::path::Path) -> Result<Vec<Untimed>, OperatorError> {
    let cfg = Config { state_dir: dir.to_owned(), ..cfg.clone() };
    let view = commands::open_view(&cfg)?;
    Ok(audit::untimed(&view.store)?)
}

/// What [`untimed_in`] found, for a terminal.
pub fn render_untimed(dir: &std::path::Path, untimed: &[Untimed]) -> String {
    let mut s = String::new();
    if untimed.is_empty() {
        let _ = writeln!(s, "state {}: every operation is terminal, in review, or has a timer", dir.display());
        return s;
    }
    let _ = writeln!(s, "state {}: {} operation(s) open without a timer:", dir.display(), untimed.len());
    for u in untimed.iter().take(10) {
        let _ = writeln!(
            s,
            "  {} (partition {}, {}, timer {:?})",
            u.operation_id,
            u.partition,
            u.state.as_str(),
            u.timer_at
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::{Generator, Options};

    /// Under at-least-once a batch may be published again after a crash,
    /// its dead letters included: a copy names the same input record and
    /// is the same dead letter, wherever it landed in the DLQ.
    #[test]
    fn a_dead_letter_published_twice_is_counted_once() {
        let cfg = Config::default();
        let mut o = Options::preload(200, 3, 1_800_000_000_000);
        o.faults = crate::loadgen::Faults { garbage: 0.2, ..crate::loadgen::Faults::none() };
        let mut g = Generator::new(o);
        g.by_ref().for_each(drop);
        let mut truth = g.into_truth();
        // Only the dead letters matter here.
        truth.verdicts.clear();
        truth.verdict_count = 0;
        assert!(truth.dead_letters > 2);
        let dead = |n: u64, dlq_offset: i64| {
            let h = |k: &str, v: String| (k.to_owned(), Some(v.into_bytes()));
            Record {
                topic: cfg.topics.dlq.as_str().into(),
                partition: 0,
                offset: dlq_offset,
                timestamp: None,
                key: None,
                value: None,
                headers: vec![
                    h("reconciler.error.class", "null_value".into()),
                    h("reconciler.source.topic", cfg.topics.events.clone()),
                    h("reconciler.source.partition", "1".into()),
                    h("reconciler.source.offset", n.to_string()),
                ],
            }
        };
        truth.dead_letters_by_class = BTreeMap::from([("null_value".to_owned(), truth.dead_letters)]);
        let mut records: Vec<Record> = (0..truth.dead_letters).map(|n| dead(n, n as i64)).collect();
        // The last two re-published after a restart, at later DLQ offsets.
        records.push(dead(truth.dead_letters - 1, 1_000));
        records.push(dead(truth.dead_letters - 2, 1_001));
        let report = compare(&cfg, &truth, &records, true);
        assert_eq!(report.dead_letters["null_value"], (truth.dead_letters, truth.dead_letters));
        // The copy stands for an original that was lost...
        let mut without_original = records.clone();
        without_original.remove(truth.dead_letters as usize - 1);
        let report = compare(&cfg, &truth, &without_original, true);
        assert_eq!(report.dead_letters["null_value"].1, truth.dead_letters);
        // ...but a record missing for real is still missed.
        let report = compare(&cfg, &truth, &records[1..], true);
        assert_eq!(report.dead_letters["null_value"].1, truth.dead_letters - 1);
        assert!(!report.agrees());
    }
}
