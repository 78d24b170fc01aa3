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
use crate::kafka::{KafkaError, Record};

use super::truth::{Expected, GroundTruth};

/// Placeholder for "no verdict" in the confusion table.
pub const NONE: &str = "-";

/// The comparison of a run with its ground truth.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// (expected outcome, actual outcome) → count, verdict by verdict in
    /// each operation's order; `-` where one side has no verdict.
    pub confusion: BTreeMap<(String, String), u64>,
    pub operations: u64,
    /// Operations whose verdicts (outcome and action, in order) all match.
    pub operations_agreeing: u64,
    /// A few operations that disagree: (operation, expected, actual).
    pub examples: Vec<(String, Vec<String>, Vec<String>)>,
    pub verdicts_expected: u64,
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

/// Distinct outputs read so far, counted as they arrive.
#[derive(Default)]
struct Tally {
    read: usize,
    verdict_values: HashSet<Vec<u8>>,
    anomaly_values: HashSet<Vec<u8>>,
    dead_letters: u64,
}

impl Tally {
    fn update(&mut self, cfg: &Config, records: &[Record]) {
        let t = &cfg.topics;
        for r in &records[self.read..] {
            if r.topic == t.dlq {
                // Dead letters keep null values null: count every record.
                self.dead_letters += 1;
            } else if let Some(v) = r.value.as_ref() {
                if r.topic == t.verdicts {
                    self.verdict_values.insert(v.clone());
                } else if r.topic == t.anomalies {
                    self.anomaly_values.insert(v.clone());
                }
            }
        }
        self.read = records.len();
    }
}

/// Reads the output topics until everything the truth expects has arrived
/// (then `settle` longer, to catch extras) or `timeout` passes, and compares.
pub fn verify(cfg: &Config, truth: &GroundTruth, timeout: Duration, settle: Duration) -> Result<Report, KafkaError> {
    let t = &cfg.topics;
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts, &t.anomalies, &t.dlq], t.partitions)?;
    let mut tally = Tally::default();
    let (want_v, want_a) = (truth.verdict_count as usize, truth.anomaly_count() as usize);
    let complete = reader.read_until(timeout, |recs| {
        tally.update(cfg, recs);
        tally.verdict_values.len() >= want_v
            && tally.anomaly_values.len() >= want_a
            && tally.dead_letters >= truth.dead_letters
    });
    let quiet_until = Instant::now() + settle;
    reader.read_until(settle, |_| Instant::now() >= quiet_until);
    Ok(compare(cfg, truth, &reader.records, complete))
}

/// Compares output records (any order across partitions, topic order within
/// one) with the truth.
pub fn compare(cfg: &Config, truth: &GroundTruth, records: &[Record], complete: bool) -> Report {
    let t = &cfg.topics;
    let codec = Codec::new();
    let mut report = Report { complete, verdicts_expected: truth.verdict_count, ..Report::default() };
    let mut actual: HashMap<String, Vec<(Outcome, Action)>> = HashMap::new();
    let mut seen_ids = HashSet::new();
    let mut anomaly_ids = HashSet::new();
    let mut anomalies: BTreeMap<String, u64> = BTreeMap::new();
    let mut dead: BTreeMap<String, u64> = BTreeMap::new();
    for r in records {
        if r.topic == t.dlq {
            let class = r
                .headers
                .iter()
                .find(|(k, _)| k == "reconciler.error.class")
                .and_then(|(_, v)| v.as_deref())
                .map_or_else(|| "?".to_owned(), |v| String::from_utf8_lossy(v).into_owned());
            *dead.entry(class).or_default() += 1;
            continue;
        }
        let Some(value) = r.value.as_deref() else { continue };
        if r.topic == t.verdicts {
            if let Ok(v) = codec.decode_verdict(value) {
                if seen_ids.insert(v.verdict_id.clone()) {
                    actual.entry(v.operation_id).or_default().push((v.outcome, v.action));
                    report.verdicts_seen += 1;
                }
            }
        } else if r.topic == t.anomalies {
            if let Ok(a) = codec.decode_anomaly(value) {
                if anomaly_ids.insert(a.anomaly_id.clone()) {
                    *anomalies.entry(a.kind.as_str().to_owned()).or_default() += 1;
                }
            }
        }
    }
    let label = |(o, a): &(Outcome, Action)| format!("{}/{}", o.as_str(), a.as_str());
    for (op, labels) in &truth.verdicts {
        let expected: Vec<Expected> = labels.iter().filter_map(|l| Expected::parse(l)).collect();
        let got = actual.remove(op).unwrap_or_default();
        tabulate(&mut report, &expected, &got);
        report.operations += 1;
        if expected.len() == got.len() && expected.iter().zip(&got).all(|(e, g)| (e.outcome, e.action) == *g) {
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

fn tabulate(report: &mut Report, expected: &[Expected], got: &[(Outcome, Action)]) {
    for i in 0..expected.len().max(got.len()) {
        let e = expected.get(i).map_or(NONE, |e| e.outcome.as_str());
        let g = got.get(i).map_or(NONE, |g| g.0.as_str());
        *report.confusion.entry((e.to_owned(), g.to_owned())).or_default() += 1;
    }
}
