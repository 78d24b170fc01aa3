//! A plain reader of whole topics (no group): assigns every partition from
//! the beginning. Used by the demo and the tests to read outputs back as any
//! downstream service would.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::{client_config, KafkaError, CONSUMER_DEFAULTS};
use crate::records::Record;

/// Reads whole topics from the beginning, outside any consumer group, and keeps
/// every record read.
pub struct TopicReader {
    consumer: BaseConsumer,
    /// Every record read so far, in arrival order (partitions interleaved).
    pub records: Vec<Record>,
    names: super::TopicNames,
}

/// A consumer that only reads assigned partitions (no group membership,
/// no commits).
pub(crate) fn reader_client(kafka: &BTreeMap<String, String>) -> Result<BaseConsumer, KafkaError> {
    reader_client_with(kafka, Isolation::ReadCommitted)
}

/// Which records of transactions a reader sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only committed ones (what downstream services of an `exactly_once`
    /// reconciler should use).
    ReadCommitted,
    /// Aborted and open ones too.
    ReadUncommitted,
}

impl Isolation {
    /// librdkafka's `isolation.level` for it.
    pub fn level(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

fn reader_client_with(kafka: &BTreeMap<String, String>, isolation: Isolation) -> Result<BaseConsumer, KafkaError> {
    let group = format!("reconciler-reader-{}", std::process::id());
    let level = isolation.level();
    client_config(
        &CONSUMER_DEFAULTS,
        kafka,
        &[
            ("group.id", group.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
            ("isolation.level", level),
        ],
    )
    .create()
    .map_err(KafkaError::client("creating a reader"))
}

impl TopicReader {
    /// Reads `topics` (each with `partitions` partitions) from offset 0.
    pub fn new(kafka: &BTreeMap<String, String>, topics: &[&str], partitions: i32) -> Result<Self, KafkaError> {
        TopicReader::with_isolation(kafka, topics, partitions, Isolation::ReadCommitted)
    }

    /// Reads `topics` from offset 0, seeing transactions as `isolation` says.
    pub fn with_isolation(
        kafka: &BTreeMap<String, String>,
        topics: &[&str],
        partitions: i32,
        isolation: Isolation,
    ) -> Result<Self, KafkaError> {
        let consumer = reader_client_with(kafka, isolation)?;
        let mut tpl = TopicPartitionList::new();
        for t in topics {
            for p in 0..partitions {
                tpl.add_partition_offset(t, p, Offset::Beginning).map_err(KafkaError::client("assigning"))?;
            }
        }
        consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
        Ok(TopicReader { consumer, records: Vec::new(), names: Default::default() })
    }

    /// Reads until `done(records so far)` holds or `timeout` passes; returns
    /// whether `done` held.
    pub fn read_until(&mut self, timeout: Duration, mut done: impl FnMut(&[Record]) -> bool) -> bool {
        let until = Instant::now() + timeout;
        while !done(&self.records) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if let Some(Ok(m)) = self.consumer.poll(left.min(Duration::from_millis(200))) {
                self.records.push(Record::from_message(&m, &mut self.names));
            }
        }
        true
    }

    /// Reads until every partition of `ends` ((topic, partition) → high
    /// watermark) is read to its mark, or `timeout` passes; returns
    /// whether it got there. Offsets of transaction markers and of
    /// records a `read_committed` reader skips count as read once the
    /// consumer's position is past them.
    pub fn read_to(&mut self, ends: &BTreeMap<(String, i32), i64>, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            let done = self.consumer.position().is_ok_and(|pos| {
                ends.iter().all(|((t, p), end)| *end <= 0 || offset_in(&pos, t, *p).is_some_and(|o| o >= *end))
            });
            if done {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if let Some(Ok(m)) = self.consumer.poll(left.min(Duration::from_millis(100))) {
                self.records.push(Record::from_message(&m, &mut self.names));
            }
        }
    }

    /// Records of one topic read so far.
    pub fn of<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(move |r| *r.topic == *topic)
    }
}

/// The offset `list` (a consumer's positions) holds for `partition` of
/// `topic`, if a real one: past transaction markers, which is how the
/// readers tell a partition read to its mark when only markers are left.
fn offset_in(list: &TopicPartitionList, topic: &str, partition: i32) -> Option<i64> {
    match list.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// The partitions of `topic` and the (low, high) watermarks of each.
pub fn watermarks(kafka: &BTreeMap<String, String>, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
    super::watermarks::Watermarks::new(kafka)?.of_topic(topic)
}

/// Every record of `topic` up to the high watermarks at the time of the
/// call, in (partition, offset) order. Fails if they cannot all be read
/// within `timeout`.
pub fn read_to_end(
    kafka: &BTreeMap<String, String>,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<Record>, KafkaError> {
    let consumer = reader_client(kafka)?;
    let marks = super::watermarks::topic_watermarks(&consumer, topic)?;
    let mut tpl = TopicPartitionList::new();
    let mut left: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, (low, high)) in &marks {
        if high > low {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*low)).map_err(KafkaError::client("assigning"))?;
            left.insert(*p, *high);
        }
    }
    let mut out = Vec::new();
    if left.is_empty() {
        return Ok(out);
    }
    let mut names = super::TopicNames::default();
    consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
    let until = Instant::now() + timeout;
    while !left.is_empty() {
        let rest = until.saturating_duration_since(Instant::now());
        if rest.is_zero() {
            return Err(KafkaError::Timeout(format!(
                "reading {topic}: partitions {:?} not read to their end within {timeout:?}",
                left.keys().collect::<Vec<_>>()
            )));
        }
        match consumer.poll(rest.min(Duration::from_millis(200))) {
            Some(Ok(m)) => {
                let r = Record::from_message(&m, &mut names);
                if left.get(&r.partition).is_some_and(|high| r.offset + 1 >= *high) {
                    left.remove(&r.partition);
                }
                if marks.get(&r.partition).is_some_and(|(_, high)| r.offset < *high) {
                    out.push(r);
                }
            }
            Some(Err(e)) => return Err(KafkaError::Client { context: format!("reading {topic}"), source: e }),
            None => {
                // Only transaction markers may be left before the mark.
                if let Ok(pos) = consumer.position() {
                    left.retain(|p, high| offset_in(&pos, topic, *p).is_none_or(|o| o < *high));
                }
            }
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// What [`stream_partition`] stopped on.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<E: std::error::Error + 'static> {
    /// Reading failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The visitor refused a record.
    #[error(transparent)]
    Visit(E),
}

/// Reads `partition` of `topic` over `(low, high)` (its watermarks, asked
/// by the caller; committed records only), handing each record's key and
/// value to `visit` with the offsets left to read, without copying them.
/// Fails when the partition stops making progress for `stall` (a broker
/// gone away), not for taking long. Returns the records read.
pub fn stream_partition<E: std::error::Error + 'static>(
    kafka: &BTreeMap<String, String>,
    topic: &str,
    partition: i32,
    (low, high): (i64, i64),
    stall: Duration,
    mut visit: impl FnMut(Option<&[u8]>, Option<&[u8]>, i64) -> Result<(), E>,
) -> Result<u64, StreamError<E>> {
    use rdkafka::Message;
    if high <= low {
        return Ok(0);
    }
    let consumer = reader_client(kafka)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low)).map_err(KafkaError::client("assigning"))?;
    consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
    let mut read = 0;
    let mut progress_at = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                progress_at = Instant::now();
                if m.offset() < high {
                    read += 1;
                    visit(m.key(), m.payload(), high - m.offset() - 1).map_err(StreamError::Visit)?;
                }
                if m.offset() + 1 >= high {
                    return Ok(read);
                }
            }
            Some(Err(e)) => {
                return Err(KafkaError::Client { context: format!("reading {topic}/{partition}"), source: e }.into())
            }
            None => {
                // Only transaction markers (or aborted records) may be left.
                let pos = consumer.position().ok().and_then(|pos| offset_in(&pos, topic, partition));
                if pos.is_some_and(|o| o >= high) {
                    return Ok(read);
                }
                if progress_at.elapsed() >= stall {
                    return Err(KafkaError::Timeout(format!(
                        "reading {topic}/{partition}: no progress for {stall:?} at position {pos:?} of {high}"
                    ))
                    .into());
                }
            }
        }
    }
}
