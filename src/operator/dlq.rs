//! Dead letters: `dlq inspect` shows them with their provenance, `dlq
//! redrive` re-publishes chosen ones to the input topic after a fix (a new
//! schema shipped, a larger size limit, a corrected producer config).
//!
//! A re-driven record is the dead letter's key, value and original headers,
//! unchanged; the reconciler's provenance headers are stripped and one
//! header is added, `reconciler.redriven.from` = `topic/partition/offset`
//! of the dead letter, so the input log itself records the re-drive. It goes
//! to the partition it was first read from (beside its entity's other
//! events). Re-driving twice is harmless for valid events: the core counts
//! the second copy as a duplicate delivery.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::OperatorError;
use crate::codec::DecodeError;
use crate::config::Topics;
use crate::kafka::producer::Publisher;
use crate::kafka::reader::read_to_end;
use crate::kafka::KafkaError;
use crate::records::Record;
use crate::records::{headers, ProducerRecord};

/// Prefix of the headers the reconciler adds to dead letters.
pub const PROVENANCE_PREFIX: &str = "reconciler.";

/// Whether header `name` is one the reconciler added to a dead letter
/// (stripped on a re-drive). A control event's signature
/// ([`crate::signature::HEADER`]) shares the prefix but belongs to the
/// record: a re-driven decision keeps it, and is applied only with it.
fn provenance(name: &str) -> bool {
    name.starts_with(PROVENANCE_PREFIX) && name != crate::signature::HEADER
}
/// Added to a re-driven record: where its dead letter was.
pub use crate::records::headers::REDRIVEN_FROM;

/// How long reading a whole DLQ may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a dead letter's record was first read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Source {
    /// Topic the record was read from (`reconciler.source.topic`).
    pub topic: String,
    /// Its partition there (`reconciler.source.partition`); `None` when the
    /// header is missing or unreadable.
    pub partition: Option<i32>,
    /// Its offset there (`reconciler.source.offset`).
    pub offset: Option<i64>,
    /// Its broker timestamp, ms (`reconciler.source.timestamp`); `None` when it
    /// had none.
    pub timestamp: Option<i64>,
}

/// One dead letter and its provenance.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Partition of the dead letter in the DLQ.
    pub partition: i32,
    /// Offset of the dead letter in the DLQ (`dlq redrive --offset` takes
    /// both, as `PARTITION:OFFSET`).
    pub offset: i64,
    /// Broker timestamp of the dead letter, ms.
    pub timestamp: Option<i64>,
    /// The key as text (lossy UTF-8).
    pub key: Option<String>,
    /// Length of the value kept in the DLQ (`None`: null value).
    pub value_bytes: Option<usize>,
    /// Error class (`reconciler.error.class`: `bad_magic`, `oversize`, ...;
    /// see [`crate::codec::DecodeError::class`]).
    pub class: String,
    /// Why the record could not be used (`reconciler.error.message`).
    pub message: String,
    /// Where the record was first read.
    pub source: Source,
    /// Set when the value was cut to fit a producer (oversize): its
    /// original length. Such a dead letter cannot be re-driven.
    pub truncated_from: Option<usize>,
    /// The record had been re-driven before (from this dead letter).
    pub redriven_from: Option<String>,
    /// This dead letter was re-driven: the audit record (then it is not
    /// offered again).
    pub redriven: Option<RedriveAudit>,
    /// The record's own headers (without the reconciler's), lossy UTF-8.
    pub headers: Vec<(String, Option<String>)>,
    /// The DLQ record as read: what a re-drive sends on.
    #[serde(skip)]
    pub record: Record,
}

/// Which dead letters to take.
#[derive(Debug, Clone, Default)]
pub struct DlqFilter {
    /// Error class (`bad_magic`, `oversize`, ...; see `DecodeError::CLASSES`).
    pub class: Option<String>,
    /// Exact dead letters, as (DLQ partition, DLQ offset).
    pub positions: Vec<(i32, i64)>,
    /// At most this many (the oldest first).
    pub limit: Option<usize>,
    /// Also dead letters already re-driven (with their audit record).
    pub include_redriven: bool,
}

impl DlqFilter {
    /// Refuses a class no dead letter can have: a typo would otherwise
    /// read as "nothing to re-drive".
    fn check(&self) -> Result<(), OperatorError> {
        match &self.class {
            Some(c) if !DecodeError::CLASSES.contains(&c.as_str()) => Err(OperatorError::Invalid(format!(
                "unknown error class {c:?}: the classes are {}",
                DecodeError::CLASSES.join(", ")
            ))),
            _ => Ok(()),
        }
    }

    fn selects(&self, d: &DeadLetter) -> bool {
        (self.include_redriven || d.redriven.is_none())
            && self.class.as_ref().is_none_or(|c| *c == d.class)
            && (self.positions.is_empty() || self.positions.contains(&(d.partition, d.offset)))
    }
}

fn text(r: &Record, name: &str) -> Option<String> {
    r.header(name).map(|v| String::from_utf8_lossy(v).into_owned())
}

fn parsed<T: std::str::FromStr>(r: &Record, name: &str) -> Option<T> {
    text(r, name).and_then(|s| s.parse().ok())
}

/// A DLQ record read back, with its provenance headers parsed.
pub fn dead_letter(r: Record) -> DeadLetter {
    DeadLetter {
        partition: r.partition,
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()),
        value_bytes: r.value.as_ref().map(Vec::len),
        class: text(&r, headers::ERROR_CLASS).unwrap_or_default(),
        message: text(&r, headers::ERROR_MESSAGE).unwrap_or_default(),
        source: Source {
            topic: text(&r, headers::SOURCE_TOPIC).unwrap_or_default(),
            partition: parsed(&r, headers::SOURCE_PARTITION),
            offset: parsed(&r, headers::SOURCE_OFFSET),
            timestamp: parsed(&r, headers::SOURCE_TIMESTAMP),
        },
        truncated_from: parsed(&r, headers::VALUE_TRUNCATED),
        redriven_from: text(&r, REDRIVEN_FROM),
        redriven: None,
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !provenance(k))
            .map(|(k, v)| (k.clone(), v.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())))
            .collect(),
        record: r,
    }
}

/// Who re-drove one dead letter, when, why and to where: a record of the
/// audit topic (JSON), keyed by [`RedriveAudit::dead_letter`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveAudit {
    /// The dead letter, as `topic/partition/offset`.
    pub dead_letter: String,
    /// Its error class.
    pub class: String,
    /// Its key as text (lossy UTF-8).
    pub key: Option<String>,
    /// Who re-drove it.
    pub actor: String,
    /// Why (what was fixed).
    pub note: String,
    /// When, ms since the epoch (the operator's wall clock).
    pub at_ms: i64,
    /// The topic it was re-published to.
    pub to_topic: String,
    /// The partition it went to (`None`: chosen by key).
    pub to_partition: Option<i32>,
    /// Whether the re-drive finished: written `sending` before the record
    /// is published and `sent` once it is acknowledged, so that a re-drive
    /// cut short in between is never offered again as new (records of
    /// earlier versions carry no state: sent).
    #[serde(default)]
    pub state: RedriveState,
}

/// See [`RedriveAudit::state`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedriveState {
    /// The record may or may not have reached the input: the re-drive
    /// stopped before it was acknowledged. Re-driving it again by position
    /// is allowed; a copy that did get through is a duplicate delivery
    /// downstream (same event id, same `reconciler.redriven.from`).
    Sending,
    /// The record was acknowledged by the broker.
    #[default]
    Sent,
}

/// `topic/partition/offset` of a dead letter: the audit's key.
pub fn position(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

/// The audit records of `audit_topic` by dead letter (the last one wins);
/// empty when the topic does not exist yet. Records that are not audit
/// records are ignored.
pub fn audits(
    kafka: &BTreeMap<String, String>,
    audit_topic: &str,
) -> Result<BTreeMap<String, RedriveAudit>, OperatorError> {
    let records = match read_to_end(kafka, audit_topic, READ_TIMEOUT) {
        Ok(r) => r,
        Err(KafkaError::UnknownTopic(_)) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(records
        .iter()
        .filter_map(|r| serde_json::from_slice::<RedriveAudit>(r.value.as_deref()?).ok())
        .map(|a| (a.dead_letter.clone(), a))
        .collect())
}

/// The dead letters of `topics.dlq` that `filter` selects, oldest first
/// (by DLQ partition and offset), each with its audit record if it was
/// re-driven.
pub fn inspect(
    kafka: &BTreeMap<String, String>,
    topics: &Topics,
    filter: &DlqFilter,
) -> Result<Vec<DeadLetter>, OperatorError> {
    filter.check()?;
    let mut audited = match topics.dlq_audit() {
        Some(t) => audits(kafka, &t)?,
        None => BTreeMap::new(),
    };
    let mut out: Vec<DeadLetter> = read_to_end(kafka, &topics.dlq, READ_TIMEOUT)?
        .into_iter()
        .map(|r| {
            let mut d = dead_letter(r);
            d.redriven = audited.remove(&position(&d.record.topic, d.partition, d.offset));
            d
        })
        .filter(|d| filter.selects(d))
        .collect();
    if let Some(n) = filter.limit {
        out.truncate(n);
    }
    Ok(out)
}

/// Dead letters of one error class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassCount {
    /// The error class.
    pub class: String,
    /// How many.
    pub count: usize,
    /// When the oldest was dead-lettered (its DLQ timestamp), ms.
    pub oldest_ms: Option<i64>,
}

/// What the dead-letter monitor shows of the DLQ topic.
#[derive(Debug, Clone, Serialize)]
pub struct DlqSummary {
    /// The DLQ topic.
    pub topic: String,
    /// The audit topic (`None`: no audit).
    pub audit_topic: Option<String>,
    /// Dead letters on the topic.
    pub total: usize,
    /// Of those, not re-driven yet.
    pub waiting: usize,
    /// Of those, re-driven (named by the audit).
    pub redriven: usize,
    /// When the oldest waiting one was dead-lettered, ms.
    pub oldest_waiting_ms: Option<i64>,
    /// The waiting ones by class, the largest first.
    pub by_class: Vec<ClassCount>,
    /// Waiting dead letters with their provenance, the oldest first.
    pub samples: Vec<DeadLetter>,
    /// The latest re-drives, the latest first.
    pub audit: Vec<RedriveAudit>,
}

/// Sums up `letters` (every dead letter, re-driven ones included), with up
/// to `samples` samples and audit records.
pub fn summary(letters: Vec<DeadLetter>, topics: &Topics, samples: usize) -> DlqSummary {
    let total = letters.len();
    let (redriven, waiting): (Vec<DeadLetter>, Vec<DeadLetter>) =
        letters.into_iter().partition(|d| d.redriven.is_some());
    let mut classes: BTreeMap<&str, (usize, Option<i64>)> = BTreeMap::new();
    for d in &waiting {
        let c = classes.entry(d.class.as_str()).or_default();
        c.0 += 1;
        c.1 = match (c.1, d.timestamp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let mut by_class: Vec<ClassCount> = classes
        .into_iter()
        .map(|(class, (count, oldest_ms))| ClassCount { class: class.to_owned(), count, oldest_ms })
        .collect();
    by_class.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.class.cmp(&b.class)));
    let mut audit: Vec<RedriveAudit> = redriven.into_iter().filter_map(|d| d.redriven).collect();
    audit.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| a.dead_letter.cmp(&b.dead_letter)));
    audit.truncate(samples);
    let mut waiting = waiting;
    waiting.sort_by_key(|d| (d.timestamp.unwrap_or(i64::MAX), d.partition, d.offset));
    let oldest_waiting_ms = waiting.iter().filter_map(|d| d.timestamp).min();
    let count = waiting.len();
    waiting.truncate(samples);
    DlqSummary {
        topic: topics.dlq.clone(),
        audit_topic: topics.dlq_audit(),
        total,
        waiting: count,
        redriven: total - count,
        oldest_waiting_ms,
        by_class,
        samples: waiting,
        audit,
    }
}

/// The dead-letter gauges of `run`: every `metrics.dlq_refresh_ms` the DLQ
/// and its audit are read and [`crate::metrics::Metrics::set_dead_letters_waiting`]
/// is set, until `stop`. Nothing when the refresh is 0.
pub fn watch(
    cfg: crate::config::Config,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let every = Duration::from_millis(cfg.metrics.dlq_refresh_ms);
    if every.is_zero() {
        return None;
    }
    let spawned = std::thread::Builder::new().name("dlq-gauges".into()).spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let all = DlqFilter { include_redriven: true, ..DlqFilter::default() };
            match inspect(&cfg.kafka, &cfg.topics, &all) {
                Ok(letters) => {
                    let s = summary(letters, &cfg.topics, 0);
                    let now = crate::clock::now_ms();
                    let oldest = s.oldest_waiting_ms.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
                    let by: Vec<(String, i64)> = s.by_class.iter().map(|c| (c.class.clone(), c.count as i64)).collect();
                    metrics.set_dead_letters_waiting(&by, oldest);
                }
                Err(e) => tracing::warn!(error = %e, "Reading the DLQ for its gauges failed"),
            }
            let until = std::time::Instant::now() + every;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(200)); // the stop flag's polling interval
            }
        }
    });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "Could not start the DLQ gauges");
            None
        }
    }
}

/// The input record that re-drives `d`, and its partition.
pub fn redrive_record(d: &DeadLetter, input_topic: &str) -> Result<(ProducerRecord, Option<i32>), String> {
    if let Some(len) = d.truncated_from {
        return Err(format!(
            "its value was truncated from {len} bytes in the DLQ; the original is not there to re-drive"
        ));
    }
    let r = &d.record;
    let mut headers: Vec<(String, Option<Vec<u8>>)> =
        r.headers.iter().filter(|(k, _)| !provenance(k)).cloned().collect();
    headers.push((REDRIVEN_FROM.to_owned(), Some(format!("{}/{}/{}", r.topic, r.partition, r.offset).into_bytes())));
    let rec = ProducerRecord { topic: input_topic.to_owned(), key: r.key.clone(), value: r.value.clone(), headers };
    // Its first partition when it came from the input topic; else by key.
    let partition = d.source.partition.filter(|_| d.source.topic == input_topic);
    Ok((rec, partition))
}

/// One dead letter of a re-drive.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveItem {
    /// Partition of the dead letter in the DLQ.
    pub dlq_partition: i32,
    /// Offset of the dead letter in the DLQ.
    pub dlq_offset: i64,
    /// Its error class.
    pub class: String,
    /// Its key as text (lossy UTF-8).
    pub key: Option<String>,
    /// The input partition it goes to (`None`: chosen by key).
    pub to_partition: Option<i32>,
    /// Why it was not sent (`None`: sent, or would be in a dry run).
    pub skipped: Option<String>,
}

/// What a re-drive did.
#[derive(Debug, Clone, Serialize)]
pub struct RedriveReport {
    /// Nothing was sent: the report says what would have been.
    pub dry_run: bool,
    /// Dead letters re-published to the input topic (in a dry run: that would
    /// be).
    pub sent: usize,
    /// Dead letters that cannot be re-driven (each item says why).
    pub skipped: usize,
    /// Who re-drove them and why (recorded in the audit).
    pub actor: String,
    /// Every dead letter selected, sent or not, oldest first.
    pub items: Vec<RedriveItem>,
}

/// Who re-drives, and why: what the audit records.
#[derive(Debug, Clone)]
pub struct Redriver {
    /// Who (a person's name or id; the authenticated caller over HTTP with
    /// `[http] actor_header`).
    pub actor: String,
    /// What was fixed.
    pub note: String,
    /// The wall clock now, ms (the audit's `at_ms`).
    pub at_ms: i64,
}

/// Re-publishes the dead letters `filter` selects to `topics.events`
/// (nothing in a dry run), then records each in the audit topic. The
/// filter must select something explicitly: a class or positions. A dead
/// letter already re-driven is not selected by a class; named by position,
/// it is skipped with the audit's account.
pub fn redrive(
    kafka: &BTreeMap<String, String>,
    topics: &Topics,
    filter: &DlqFilter,
    max_record_bytes: usize,
    who: &Redriver,
    dry_run: bool,
) -> Result<RedriveReport, OperatorError> {
    if filter.class.is_none() && filter.positions.is_empty() {
        return Err(OperatorError::Invalid(
            "choose what to re-drive: an error class or dead-letter positions (partition:offset)".into(),
        ));
    }
    if !dry_run && who.actor.trim().is_empty() {
        return Err(OperatorError::Invalid("say who re-drives: an actor is required (it goes to the audit)".into()));
    }
    let (dlq_topic, input_topic) = (topics.dlq.as_str(), topics.events.as_str());
    let selected = DlqFilter { include_redriven: !filter.positions.is_empty(), ..filter.clone() };
    let letters = inspect(kafka, topics, &selected)?;
    // Every position asked for must be there: nothing is sent otherwise.
    let absent: Vec<String> = filter
        .positions
        .iter()
        .filter(|(p, o)| !letters.iter().any(|d| (d.partition, d.offset) == (*p, *o)))
        .map(|(p, o)| format!("{p}:{o}"))
        .collect();
    if !absent.is_empty() {
        return Err(OperatorError::Invalid(format!(
            "no dead letter at {} in {dlq_topic}{}; nothing was re-driven",
            absent.join(", "),
            if filter.class.is_some() { " with that class" } else { "" }
        )));
    }
    let mut items = Vec::new();
    let mut records = Vec::new();
    for d in &letters {
        let outcome = match &d.redriven {
            Some(a) if a.state == RedriveState::Sent => {
                Err(format!("already re-driven by {} at {} ms ({})", a.actor, a.at_ms, a.note))
            }
            // Cut short before its acknowledgement: sent again when asked
            // for by position (a class never selects it).
            _ => redrive_record(d, input_topic),
        };
        let (to_partition, skipped) = match outcome {
            Ok((rec, p)) => {
                records.push((rec, p, d));
                (p, None)
            }
            Err(why) => (None, Some(why)),
        };
        items.push(RedriveItem {
            dlq_partition: d.partition,
            dlq_offset: d.offset,
            class: d.class.clone(),
            key: d.key.clone(),
            to_partition,
            skipped,
        });
    }
    if !dry_run && !records.is_empty() {
        // The audit topic first: a re-drive it cannot record does not
        // happen. Compacted and keyed by the dead letter, so the record of
        // each re-drive outlives the DLQ's own retention.
        let audit_topic = topics.dlq_audit();
        if let Some(t) = &audit_topic {
            crate::kafka::admin::ensure_compacted(kafka, t, 1, topics.replication_factor)?;
        }
        let publisher = Publisher::new(kafka, max_record_bytes + crate::records::DLQ_HEADER_ROOM)?;
        let audit = |state: RedriveState| -> Vec<ProducerRecord> {
            let Some(t) = &audit_topic else { return Vec::new() };
            records
                .iter()
                .map(|(_, p, d)| {
                    let a = RedriveAudit {
                        dead_letter: position(&d.record.topic, d.partition, d.offset),
                        class: d.class.clone(),
                        key: d.key.clone(),
                        actor: who.actor.clone(),
                        note: who.note.clone(),
                        at_ms: who.at_ms,
                        to_topic: input_topic.to_owned(),
                        to_partition: *p,
                        state,
                    };
                    ProducerRecord {
                        topic: t.clone(),
                        key: Some(a.dead_letter.clone().into_bytes()),
                        value: Some(serde_json::to_vec(&a).expect("plain data serializes")),
                        headers: Vec::new(),
                    }
                })
                .collect()
        };
        // The intent first: a re-drive cut short after this is never
        // offered again as new.
        publisher.publish_all(audit(RedriveState::Sending).iter().map(|r| (r, None)))?;
        publisher.publish_all(records.iter().map(|(r, p, _)| (r, *p)))?;
        crate::crash::point(crate::crash::CrashPoint::DlqRedriven);
        let audit = audit(RedriveState::Sent);
        publisher.publish_all(audit.iter().map(|r| (r, None)))?;
        for (_, p, d) in &records {
            tracing::info!(
                dlq_partition = d.partition,
                dlq_offset = d.offset,
                class = %d.class,
                key = d.key.as_deref().unwrap_or(""),
                to_topic = input_topic,
                to_partition = p.map_or_else(|| "by key".to_owned(), |p| p.to_string()),
                actor = %who.actor,
                "Dead letter re-driven"
            );
        }
    }
    let sent = records.len();
    Ok(RedriveReport { dry_run, sent, skipped: items.len() - sent, actor: who.actor.clone(), items })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(partition: i32, offset: i64, class: &str, at: i64, redriven_by: Option<&str>) -> DeadLetter {
        let record = Record {
            topic: "dlq".into(),
            partition,
            offset,
            timestamp: Some(at),
            key: Some(b"k".to_vec()),
            value: None,
            headers: vec![(headers::ERROR_CLASS.into(), Some(class.as_bytes().to_vec()))],
        };
        let mut d = dead_letter(record);
        d.redriven = redriven_by.map(|actor| RedriveAudit {
            dead_letter: position("dlq", partition, offset),
            class: class.into(),
            key: Some("k".into()),
            actor: actor.into(),
            note: String::new(),
            at_ms: at + 1000,
            to_topic: "in".into(),
            to_partition: None,
            state: RedriveState::Sent,
        });
        d
    }

    /// The monitor counts only what waits, by class with the oldest age, and
    /// lists the latest re-drives first.
    #[test]
    fn the_summary_counts_waiting_dead_letters_by_class_and_lists_re_drives() {
        let topics = Topics { dlq: "dlq".into(), ..Topics::default() };
        let letters = vec![
            letter(0, 0, "bad_magic", 100, Some("ana")),
            letter(0, 1, "bad_magic", 300, None),
            letter(1, 0, "null_value", 200, None),
            letter(1, 1, "bad_magic", 400, None),
            letter(2, 0, "oversize", 500, Some("bo")),
        ];
        let s = summary(letters, &topics, 2);
        assert_eq!((s.total, s.waiting, s.redriven), (5, 3, 2));
        assert_eq!(s.oldest_waiting_ms, Some(200));
        let by: Vec<(&str, usize, Option<i64>)> =
            s.by_class.iter().map(|c| (c.class.as_str(), c.count, c.oldest_ms)).collect();
        assert_eq!(by, vec![("bad_magic", 2, Some(300)), ("null_value", 1, Some(200))]);
        let samples: Vec<(i32, i64)> = s.samples.iter().map(|d| (d.partition, d.offset)).collect();
        assert_eq!(samples, vec![(1, 0), (0, 1)], "the oldest waiting first, at most 2");
        let audit: Vec<&str> = s.audit.iter().map(|a| a.actor.as_str()).collect();
        assert_eq!(audit, vec!["bo", "ana"], "the latest re-drive first");
        assert_eq!(s.audit_topic.as_deref(), Some("dlq.audit"), "the audit topic follows the DLQ's name");
    }

    /// `--class oversized` must not read as "no dead letters".
    #[test]
    fn unknown_class_is_refused_with_the_known_ones() {
        let f = DlqFilter { class: Some("oversized".into()), ..Default::default() };
        let e = f.check().unwrap_err().to_string();
        assert!(e.contains("\"oversized\"") && e.contains("oversize, bad_magic"), "{e}");
        assert!(DlqFilter { class: Some("oversize".into()), ..Default::default() }.check().is_ok());
        assert!(DlqFilter::default().check().is_ok());
    }

    /// A signed control event that was dead-lettered (say, over the size
    /// limit) keeps its signature when re-driven: its own headers stay,
    /// the reconciler's provenance headers go.
    #[test]
    fn a_redriven_record_keeps_its_signature_and_loses_the_provenance() {
        let original = Record {
            topic: "in".into(),
            partition: 2,
            offset: 9,
            timestamp: None,
            key: Some(b"e".to_vec()),
            value: Some(b"v".to_vec()),
            headers: vec![
                ("trace".into(), Some(b"t-1".to_vec())),
                (crate::signature::HEADER.into(), Some(b"ab12".to_vec())),
            ],
        };
        let err = crate::codec::DecodeError::NullValue;
        let out = crate::records::dead_letter("dlq", &original, &err);
        let dlq = Record {
            topic: "dlq".into(),
            partition: 0,
            offset: 4,
            timestamp: None,
            key: out.key,
            value: out.value,
            headers: out.headers,
        };
        let (rec, partition) = redrive_record(&dead_letter(dlq), "in").unwrap();
        let names: Vec<&str> = rec.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, vec!["trace", crate::signature::HEADER, REDRIVEN_FROM]);
        assert_eq!(rec.headers[1].1.as_deref(), Some(&b"ab12"[..]));
        assert_eq!(partition, Some(2));
    }
    /// Audit records written before re-drives recorded their state carry
    /// none: they were written after the broker's acknowledgement, so they
    /// read as `sent`.
    #[test]
    fn an_audit_record_without_a_state_reads_as_sent() {
        let old = r#"{"dead_letter":"dlq/0/4","class":"oversize","key":"e","actor":"ana","note":"","at_ms":1,"to_topic":"in","to_partition":null}"#;
        let a: RedriveAudit = serde_json::from_str(old).unwrap();
        assert_eq!(a.state, RedriveState::Sent);
        let sending = RedriveAudit { state: RedriveState::Sending, ..a };
        let text = serde_json::to_string(&sending).unwrap();
        assert!(text.contains(r#""state":"sending""#), "{text}");
    }
}
