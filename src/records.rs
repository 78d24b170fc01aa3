//! The shapes every layer passes around: a record as consumed
//! ([`Record`]), a record as it will be published ([`ProducerRecord`]), and
//! the conversions between them and the core's events and outputs: decoding
//! an input record (or why it is a dead letter), the dead letter itself
//! with its provenance headers, and the records of events and
//! outputs. Kafka, the store, the pipeline, the operator tools and loadgen
//! all meet here rather than in each other.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::codec::{validate_key, Codec, DecodeError, EncodeError};
use crate::config::Topics;
use crate::core::{Authenticity, Event, Output};
use crate::signature::ControlKeys;

/// An owned copy of a consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The topic it was read from (shared by the records of a poll: see
    /// `kafka::TopicNames`).
    pub topic: Arc<str>,
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// The broker's timestamp (ms), if any.
    pub timestamp: Option<i64>,
    /// The key, byte for byte.
    pub key: Option<Vec<u8>>,
    /// The value, byte for byte (`None`: a null value).
    pub value: Option<Vec<u8>>,
    /// The headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// Bytes of key, value and headers (for the size limit).
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self.headers.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len)).sum::<usize>()
    }

    /// The value of header `name`, if present and not null: the last one,
    /// as the reconciler appends its headers after the original ones (a
    /// re-driven record dead-lettered again carries two sets).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().rev().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
    }
}

/// A record to publish, exactly as it will go to the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerRecord {
    /// The destination topic.
    pub topic: String,
    /// The key (the entity, for the core's outputs).
    #[serde(with = "serde_bytes")]
    pub key: Option<Vec<u8>>,
    /// The value (`None`: a null value, kept for dead letters).
    #[serde(with = "serde_bytes")]
    pub value: Option<Vec<u8>>,
    /// The headers, in order.
    #[serde(with = "header_bytes")]
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl ProducerRecord {
    /// At least the bytes it takes stored (postcard: each field's bytes
    /// plus at most 10 bytes of length and tag), for sizing buffers.
    pub fn stored_size(&self) -> usize {
        let field = |b: &Option<Vec<u8>>| 10 + b.as_ref().map_or(0, Vec::len);
        10 + self.topic.len()
            + field(&self.key)
            + field(&self.value)
            + 10
            + self.headers.iter().map(|(k, v)| 10 + k.len() + field(v)).sum::<usize>()
    }
}

/// Headers with their values as byte strings (see `serde_bytes` on
/// [`ProducerRecord`]); the same bytes in postcard as the derived form.
mod header_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    type Headers = Vec<(String, Option<Vec<u8>>)>;

    pub fn serialize<S: Serializer>(headers: &[(String, Option<Vec<u8>>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(headers.iter().map(|(k, v)| (k, v.as_deref().map(Bytes::new))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Headers, D::Error> {
        let headers: Vec<(String, Option<ByteBuf>)> = Vec::deserialize(d)?;
        Ok(headers.into_iter().map(|(k, v)| (k, v.map(ByteBuf::into_vec))).collect())
    }
}

/// A record for the input topic, as the workloads (the demo, loadgen)
/// publish it: a valid event keyed by its entity, or raw bytes the
/// reconciler must dead-letter.
#[derive(Debug, Clone, PartialEq)]
pub enum InputRecord {
    /// A valid event, keyed by its entity.
    Event(Event),
    /// Raw bytes under a key (garbage, a null value, a valid event under
    /// the wrong key), and the dead-letter class they must get.
    Raw {
        /// The key.
        key: Vec<u8>,
        /// The value (`None`: null).
        value: Option<Vec<u8>>,
        /// The error class of its dead letter.
        class: &'static str,
    },
}

impl InputRecord {
    /// The record as it goes to input topic `topic`; the control events
    /// the workload simulates (an operator's decision, a timer) signed
    /// with `keys`, as the reconciler's own tools sign them.
    pub fn to_outbox(&self, codec: &Codec, keys: &ControlKeys, topic: &str) -> Result<ProducerRecord, EncodeError> {
        match self {
            InputRecord::Event(e) => event_record_signing_control(codec, keys, topic, e),
            InputRecord::Raw { key, value, .. } => Ok(ProducerRecord {
                topic: topic.to_owned(),
                key: Some(key.clone()),
                value: value.clone(),
                headers: Vec::new(),
            }),
        }
    }

    /// The event, if the record is one.
    pub fn event(&self) -> Option<&Event> {
        match self {
            InputRecord::Event(e) => Some(e),
            InputRecord::Raw { .. } => None,
        }
    }
}

/// The headers a dead letter carries besides the original ones: the error
/// and the record's provenance.
pub mod headers {
    /// The error class (`bad_magic`, `truncated`, `key_mismatch`, ...).
    pub const ERROR_CLASS: &str = "reconciler.error.class";
    /// The error, as a sentence.
    pub const ERROR_MESSAGE: &str = "reconciler.error.message";
    /// The input topic of the original record.
    pub const SOURCE_TOPIC: &str = "reconciler.source.topic";
    /// The input partition of the original record.
    pub const SOURCE_PARTITION: &str = "reconciler.source.partition";
    /// The input offset of the original record.
    pub const SOURCE_OFFSET: &str = "reconciler.source.offset";
    /// The broker timestamp of the original record (empty if none).
    pub const SOURCE_TIMESTAMP: &str = "reconciler.source.timestamp";
    /// For an oversize record: its value's original length (the dead
    /// letter keeps the first [`super::OVERSIZE_KEPT_BYTES`]).
    pub const VALUE_TRUNCATED: &str = "reconciler.value.truncated";
    /// On a re-driven record: `topic/partition/offset` of its dead letter.
    pub const REDRIVEN_FROM: &str = "reconciler.redriven.from";
}

/// Room for the provenance headers on top of the largest accepted record.
pub const DLQ_HEADER_ROOM: usize = 64 * 1024;

/// How much of an oversize record's value its dead letter keeps.
pub const OVERSIZE_KEPT_BYTES: usize = 64 * 1024;

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

/// What the signature of input record `r`, decoded to `ev`, proves under
/// `keys` (the core's input, see [`crate::core::trust`]). Only control
/// events are checked: the core looks at nothing else, and an HMAC per
/// lifecycle event would be work for nothing.
pub fn authenticity(keys: &ControlKeys, r: &Record, ev: &Event) -> Authenticity {
    if !crate::core::trust::is_control(&ev.body) {
        return Authenticity::Unsigned;
    }
    let value = r.value.as_deref().unwrap_or_default();
    keys.check(&r.topic, r.key.as_deref(), value, r.header(crate::signature::HEADER))
}

/// The dead letter of `r` for dead-letter topic `topic`: the provenance
/// headers of [`headers`] added to the original key, value and headers.
///
/// Byte-identical, except for records over the size limit: no producer
/// could publish those whole, so their dead letter keeps the key, the
/// headers and the first 64 KiB of the value, with
/// [`headers::VALUE_TRUNCATED`] giving the original length.
pub fn dead_letter(topic: &str, r: &Record, err: &DecodeError) -> ProducerRecord {
    let mut hs = r.headers.clone();
    let mut value = r.value.clone();
    if let (DecodeError::Oversize { .. }, Some(v)) = (err, value.as_mut()) {
        if v.len() > OVERSIZE_KEPT_BYTES {
            hs.push((headers::VALUE_TRUNCATED.to_owned(), Some(v.len().to_string().into_bytes())));
            v.truncate(OVERSIZE_KEPT_BYTES);
        }
    }
    let mut add = |k: &str, v: String| hs.push((k.to_owned(), Some(v.into_bytes())));
    add(headers::ERROR_CLASS, err.class().to_owned());
    add(headers::ERROR_MESSAGE, err.to_string());
    add(headers::SOURCE_TOPIC, r.topic.to_string());
    add(headers::SOURCE_PARTITION, r.partition.to_string());
    add(headers::SOURCE_OFFSET, r.offset.to_string());
    add(headers::SOURCE_TIMESTAMP, r.timestamp.map_or_else(String::new, |t| t.to_string()));
    ProducerRecord { topic: topic.to_owned(), key: r.key.clone(), value, headers: hs }
}

/// An event as it goes to the input topic `topic`: keyed by its entity
/// (timer firings, manual decisions and generated workloads all use it).
pub fn event_record(codec: &Codec, topic: &str, ev: &Event) -> Result<ProducerRecord, EncodeError> {
    Ok(ProducerRecord {
        topic: topic.to_owned(),
        key: Some(ev.entity_id.as_bytes().to_vec()),
        value: Some(codec.encode_event(ev)?),
        headers: Vec::new(),
    })
}

/// `record` signed with `keys` (see [`crate::signature`]): the signature
/// header added, unless no key is configured (then it goes unsigned, which
/// only an instance with `security.allow_unsigned_control` applies).
pub fn signed(mut record: ProducerRecord, keys: &ControlKeys) -> ProducerRecord {
    let value = record.value.as_deref().unwrap_or_default();
    if let Some(sig) = keys.sign(&record.topic, record.key.as_deref(), value) {
        record.headers.push((crate::signature::HEADER.to_owned(), Some(sig)));
    }
    record
}

/// [`event_record`], signed with `keys` when `ev` is a control event
/// ([`crate::core::trust::is_control`]): how loadgen and the demo write
/// the decisions and timers they simulate.
pub fn event_record_signing_control(
    codec: &Codec,
    keys: &ControlKeys,
    topic: &str,
    ev: &Event,
) -> Result<ProducerRecord, EncodeError> {
    let record = event_record(codec, topic, ev)?;
    Ok(if crate::core::trust::is_control(&ev.body) { signed(record, keys) } else { record })
}

/// An output of the core as it is published: to its topic, keyed by entity.
pub fn output_record(codec: &Codec, t: &Topics, o: &Output) -> Result<ProducerRecord, EncodeError> {
    let (topic, value) = match o {
        Output::Verdict(v) => (&t.verdicts, codec.encode_verdict(v)?),
        Output::Anomaly(a) => (&t.anomalies, codec.encode_anomaly(a)?),
        Output::Command(c) => (&t.commands, codec.encode_command(c)?),
    };
    Ok(ProducerRecord {
        topic: topic.clone(),
        key: Some(o.entity_id().as_bytes().to_vec()),
        value: Some(value),
        headers: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The form stored before the byte fields were `serde_bytes`.
    #[derive(Serialize)]
    struct Derived {
        topic: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(String, Option<Vec<u8>>)>,
    }

    fn sample() -> ProducerRecord {
        ProducerRecord {
            topic: "ops.verdicts".into(),
            key: Some(b"cust-1".to_vec()),
            value: Some((0..=255).collect()),
            headers: vec![("a".into(), Some(vec![0, 1, 2])), ("null".into(), None), ("empty".into(), Some(vec![]))],
        }
    }

    #[test]
    fn stored_outboxes_keep_their_bytes_and_read_back() {
        let mut records = vec![sample(), ProducerRecord { key: None, value: None, headers: vec![], ..sample() }];
        records[1].topic = "ops.events.dlq".into();
        let derived: Vec<Derived> = records
            .iter()
            .map(|r| Derived {
                topic: r.topic.clone(),
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r.headers.clone(),
            })
            .collect();
        let bytes = postcard::to_allocvec(&records).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&derived).unwrap(), "the same bytes as the derived form");
        assert!(records.iter().map(ProducerRecord::stored_size).sum::<usize>() >= bytes.len());
        let back: Vec<ProducerRecord> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, records);
    }
}
