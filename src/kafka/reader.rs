//! A plain reader of whole topics (no group): assigns every partition from
//! the beginning. Used by the demo and the tests to read outputs back as any
//! downstream service would.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

use super::{client_config, KafkaError, Record, CONSUMER_DEFAULTS};

pub struct TopicReader {
    consumer: BaseConsumer,
    pub records: Vec<Record>,
}

impl TopicReader {
    /// Reads `topics` (each with `partitions` partitions) from offset 0.
    pub fn new(kafka: &BTreeMap<String, String>, topics: &[&str], partitions: i32) -> Result<Self, KafkaError> {
        let group = format!("reconciler-reader-{}", std::process::id());
        let consumer: BaseConsumer = client_config(
            &CONSUMER_DEFAULTS,
            kafka,
            &[("group.id", group.as_str()), ("enable.auto.commit", "false"), ("enable.partition.eof", "false")],
        )
        .create()
        .map_err(KafkaError::client("creating a reader"))?;
        let mut tpl = TopicPartitionList::new();
        for t in topics {
            for p in 0..partitions {
                tpl.add_partition_offset(t, p, Offset::Beginning).map_err(KafkaError::client("assigning"))?;
            }
        }
        consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
        Ok(TopicReader { consumer, records: Vec::new() })
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
                self.records.push(Record::from_message(&m));
            }
        }
        true
    }

    /// Records of one topic read so far.
    pub fn of<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(move |r| r.topic == topic)
    }
}
