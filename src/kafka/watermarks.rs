//! Watermark queries: how far a partition's log reaches. One client type
//! for every reader of them (the timer wheel's catch-up rule, the lag
//! gauges, the replay's progress), on a connection of its own: on the
//! group member's connection a ListOffsets waits behind its long polls.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;

use super::{client_config, KafkaError, CONSUMER_DEFAULTS};

/// A client for watermark and metadata queries (it joins no group).
pub struct Watermarks {
    client: BaseConsumer,
}

impl Watermarks {
    /// A client of its own, for `[kafka]` settings `kafka`.
    pub fn new(kafka: &BTreeMap<String, String>) -> Result<Watermarks, KafkaError> {
        let client = client_config(&CONSUMER_DEFAULTS, kafka, &[("group.id", "reconciler-watermarks")])
            .create()
            .map_err(KafkaError::client("creating the watermark client"))?;
        Ok(Watermarks { client })
    }

    /// The high watermark of `partition` of `topic` (the next offset to be written).
    pub fn high(&self, topic: &str, partition: i32, timeout: Duration) -> Result<i64, KafkaError> {
        self.range(topic, partition, timeout).map(|(_, high)| high)
    }

    /// The (low, high) watermarks of `partition` of `topic`: the offsets it holds.
    pub fn range(&self, topic: &str, partition: i32, timeout: Duration) -> Result<(i64, i64), KafkaError> {
        self.client
            .fetch_watermarks(topic, partition, timeout)
            .map_err(KafkaError::client(format!("watermarks of {topic}/{partition}")))
    }

    /// Asks the broker for `topic`'s metadata: `Ok` when it answered within
    /// `timeout` (whatever the answer), the client's error otherwise. Every
    /// call is a request on the wire, never an answer from a cache.
    pub fn ask(&self, topic: &str, timeout: Duration) -> Result<(), KafkaError> {
        self.client
            .fetch_metadata(Some(topic), timeout)
            .map(drop)
            .map_err(KafkaError::client(format!("metadata of {topic}")))
    }

    /// How many partitions `topic` has.
    pub fn partition_count(&self, topic: &str) -> Result<usize, KafkaError> {
        let md = self
            .client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(KafkaError::client(format!("metadata of {topic}")))?;
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() => Ok(t.partitions().len()),
            _ => Err(KafkaError::UnknownTopic(topic.to_owned())),
        }
    }

    /// Whether `topic` exists. A topic this client's principal may not
    /// describe is [`KafkaError::NotAuthorized`]: it may exist, and
    /// creating it would be refused too.
    pub fn exists(&self, topic: &str) -> Result<bool, KafkaError> {
        let md = self
            .client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(KafkaError::client(format!("metadata of {topic}")))?;
        match md.topics().iter().find(|t| t.name() == topic).map(|t| t.error().map(RDKafkaErrorCode::from)) {
            Some(None) => Ok(true),
            Some(Some(RDKafkaErrorCode::TopicAuthorizationFailed)) => Err(KafkaError::NotAuthorized {
                topic: topic.to_owned(),
                operation: "Describe",
                purpose: "find it and its partitions".into(),
            }),
            _ => Ok(false),
        }
    }

    /// Every partition of `topic` with its (low, high) watermarks.
    pub fn of_topic(&self, topic: &str) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
        topic_watermarks(&self.client, topic)
    }

    /// The partition count of `topic`, asked by a client made for that one
    /// question at start-up and dropped without waiting for its threads
    /// (see [`super::drop_in_background`]).
    pub fn partition_count_once(kafka: &BTreeMap<String, String>, topic: &str) -> Result<usize, KafkaError> {
        let marks = Watermarks::new(kafka)?;
        let count = marks.partition_count(topic);
        super::drop_in_background(marks);
        count
    }
}

/// The partitions of `topic` and the (low, high) watermarks of each, asked
/// on `client`'s connection.
pub fn topic_watermarks<C: ConsumerContext>(
    client: &BaseConsumer<C>,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
    let timeout = Duration::from_secs(10);
    let md = client.fetch_metadata(Some(topic), timeout).map_err(KafkaError::client(format!("metadata of {topic}")))?;
    let t = md.topics().iter().find(|t| t.name() == topic).ok_or_else(|| KafkaError::UnknownTopic(topic.to_owned()))?;
    if let Some(e) = t.error() {
        return Err(match RDKafkaErrorCode::from(e) {
            RDKafkaErrorCode::UnknownTopicOrPartition => KafkaError::UnknownTopic(topic.to_owned()),
            code => KafkaError::Refused { context: format!("metadata of {topic}"), code },
        });
    }
    let mut out = BTreeMap::new();
    for p in t.partitions() {
        let marks = client
            .fetch_watermarks(topic, p.id(), timeout)
            .map_err(KafkaError::client(format!("watermarks of {topic}/{}", p.id())))?;
        out.insert(p.id(), marks);
    }
    Ok(out)
}
