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

use serde::Serialize;

use super::OperatorError;
use crate::codec::DecodeError;
use crate::kafka::producer::Publisher;
use crate::kafka::reader::read_to_end;
use crate::records::Record;
use crate::records::{headers, OutboxRecord};

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
    /// SPEC §8).
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
        self.class.as_ref().is_none_or(|c| *c == d.class)
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
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| !provenance(k))
            .map(|(k, v)| (k.clone(), v.as_deref().map(|v| String::from_utf8_lossy(v).into_owned())))
            .collect(),
        record: r,
    }
}

/// The dead letters of `dlq_topic` that `filter` selects, oldest first
/// (by DLQ partition and offset).
pub fn inspect(
    kafka: &BTreeMap<String, String>,
    dlq_topic: &str,
    filter: &DlqFilter,
) -> Result<Vec<DeadLetter>, OperatorError> {
    filter.check()?;
    let mut out: Vec<DeadLetter> = read_to_end(kafka, dlq_topic, READ_TIMEOUT)?
        .into_iter()
        .map(dead_letter)
        .filter(|d| filter.selects(d))
        .collect();
    if let Some(n) = filter.limit {
        out.truncate(n);
    }
    Ok(out)
}

/// The input record that re-drives `d`, and its partition.
pub fn redrive_record(d: &DeadLetter, input_topic: &str) -> Result<(OutboxRecord, Option<i32>), String> {
    if let Some(len) = d.truncated_from {
        return Err(format!(
            "its value was truncated from {len} bytes in the DLQ; the original is not there to re-drive"
        ));
    }
    let r = &d.record;
    let mut headers: Vec<(String, Option<Vec<u8>>)> =
        r.headers.iter().filter(|(k, _)| !provenance(k)).cloned().collect();
    headers.push((REDRIVEN_FROM.to_owned(), Some(format!("{}/{}/{}", r.topic, r.partition, r.offset).into_bytes())));
    let rec = OutboxRecord { topic: input_topic.to_owned(), key: r.key.clone(), value: r.value.clone(), headers };
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
    /// Every dead letter selected, sent or not, oldest first.
    pub items: Vec<RedriveItem>,
}

/// Re-publishes the dead letters `filter` selects to `input_topic`
/// (nothing in a dry run). The filter must select something explicitly:
/// a class or positions.
pub fn redrive(
    kafka: &BTreeMap<String, String>,
    dlq_topic: &str,
    input_topic: &str,
    filter: &DlqFilter,
    max_record_bytes: usize,
    dry_run: bool,
) -> Result<RedriveReport, OperatorError> {
    if filter.class.is_none() && filter.positions.is_empty() {
        return Err(OperatorError::Invalid(
            "choose what to re-drive: an error class or dead-letter positions (partition:offset)".into(),
        ));
    }
    let letters = inspect(kafka, dlq_topic, filter)?;
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
        let (to_partition, skipped) = match redrive_record(d, input_topic) {
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
        let publisher = Publisher::new(kafka, max_record_bytes + crate::records::DLQ_HEADER_ROOM)?;
        publisher.publish_all(records.iter().map(|(r, p, _)| (r, *p)))?;
        for (_, p, d) in &records {
            tracing::info!(
                dlq_partition = d.partition,
                dlq_offset = d.offset,
                class = %d.class,
                key = d.key.as_deref().unwrap_or(""),
                to_topic = input_topic,
                to_partition = p.map_or_else(|| "by key".to_owned(), |p| p.to_string()),
                "Dead letter re-driven"
            );
        }
    }
    let sent = records.len();
    Ok(RedriveReport { dry_run, sent, skipped: items.len() - sent, items })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
