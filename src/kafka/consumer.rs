//! The consumer-group member. Offsets live in the state store, not in the
//! group: on assignment each partition starts at the offset stored beside
//! its state (or at the beginning, which rebuilds the state by replay), and
//! group offsets are committed only so that lag is visible to tools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset};
use tracing::{info, warn};

use super::{client_config, KafkaError, Record, CONSUMER_DEFAULTS};
use crate::store::Store;

/// What the rebalance callback tells the run loop.
#[derive(Debug, Default)]
pub struct Assignment {
    /// Owned partitions and the next offset to apply in each.
    pub owned: BTreeMap<i32, i64>,
    /// Partitions revoked since the loop last looked.
    pub revoked: BTreeSet<i32>,
    /// Partitions assigned since the loop last looked.
    pub assigned: BTreeSet<i32>,
    /// A rebalance step failed: the instance must stop rather than run
    /// with an assignment it does not really have.
    pub fatal: Option<String>,
    /// The group has handed this member an assignment (possibly empty) at
    /// least once: before that it cannot be ready.
    pub received: bool,
}

/// Seeks assigned partitions to the offsets in the store.
pub struct GroupContext {
    store: Arc<Store>,
    topic: String,
    pub assignment: Arc<Mutex<Assignment>>,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let mut a = self.assignment.lock().expect("not poisoned");
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                a.received = true;
                let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                for p in partitions {
                    let next = match self.store.next_offset(p) {
                        Ok(n) => n,
                        Err(e) => {
                            a.fatal = Some(format!("reading the stored offset of partition {p}: {e}"));
                            return;
                        }
                    };
                    let offset = next.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = tpl.set_partition_offset(&self.topic, p, offset) {
                        warn!(partition = p, error = %e, "Cannot set the start offset");
                    }
                    a.owned.insert(p, next.unwrap_or(0));
                    a.revoked.remove(&p);
                    a.assigned.insert(p);
                    info!(partition = p, next_offset = ?next, "Partition assigned; resuming from the stored offset");
                }
                if let Err(e) = consumer.assign(tpl) {
                    a.fatal = Some(format!("assigning partitions: {e}"));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                for e in tpl.elements() {
                    a.owned.remove(&e.partition());
                    a.revoked.insert(e.partition());
                    info!(partition = e.partition(), "Partition revoked; no more writes for it");
                }
                if let Err(e) = consumer.unassign() {
                    a.fatal = Some(format!("releasing revoked partitions: {e}"));
                }
            }
            other => warn!(error = ?other, "Rebalance error"),
        }
    }
}

/// A subscribed consumer that hands out batches of owned records.
pub struct GroupConsumer {
    consumer: BaseConsumer<GroupContext>,
    /// A second client for watermark queries: on the consumer's own
    /// connection a ListOffsets waits behind the long-polling fetches.
    watermarks: BaseConsumer,
    topic: String,
    pub assignment: Arc<Mutex<Assignment>>,
}

impl GroupConsumer {
    pub fn new(
        kafka: &BTreeMap<String, String>,
        group_id: &str,
        topic: &str,
        store: Arc<Store>,
    ) -> Result<Self, KafkaError> {
        let assignment = Arc::new(Mutex::new(Assignment::default()));
        let ctx = GroupContext { store, topic: topic.to_owned(), assignment: assignment.clone() };
        let consumer: BaseConsumer<GroupContext> = client_config(
            &CONSUMER_DEFAULTS,
            kafka,
            &[
                ("group.id", group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", "earliest"),
                ("enable.partition.eof", "false"),
                // Eager rebalancing: the callback assigns whole sets.
                ("partition.assignment.strategy", "range,roundrobin"),
            ],
        )
        .create_with_context(ctx)
        .map_err(KafkaError::client("creating the consumer"))?;
        consumer.subscribe(&[topic]).map_err(KafkaError::client(format!("subscribing to {topic}")))?;
        let watermarks: BaseConsumer = client_config(&CONSUMER_DEFAULTS, kafka, &[("group.id", group_id)])
            .create()
            .map_err(KafkaError::client("creating the watermark client"))?;
        Ok(GroupConsumer { consumer, watermarks, topic: topic.to_owned(), assignment })
    }

    /// Up to `max` records, waiting at most `wait` for the first and then
    /// taking what is already fetched. Records of partitions revoked during
    /// the wait are left out (the new owner consumes them).
    pub fn poll_batch(&self, max: usize, wait: Duration) -> Result<Vec<Record>, KafkaError> {
        let mut out = Vec::new();
        let until = Instant::now() + wait;
        while out.len() < max {
            // Read the clock only while waiting for the first record: clock
            // reads showed up in profiles at one per record.
            let left = if out.is_empty() { until.saturating_duration_since(Instant::now()) } else { Duration::ZERO };
            match self.consumer.poll(left) {
                Some(Ok(m)) => out.push(Record::from_message(&m)),
                Some(Err(e)) => warn!(error = %e, "Consumer error"),
                None => {
                    if !out.is_empty() || left.is_zero() {
                        break;
                    }
                }
            }
        }
        let mut a = self.assignment.lock().expect("not poisoned");
        if let Some(why) = a.fatal.take() {
            return Err(KafkaError::Other(format!("rebalance failed: {why}")));
        }
        if !a.revoked.is_empty() {
            let owned = &a.owned;
            out.retain(|r| owned.contains_key(&r.partition));
            a.revoked.clear();
        }
        Ok(out)
    }

    /// Commits group offsets (for lag visibility only).
    pub fn commit_for_visibility(&self, offsets: &BTreeMap<i32, i64>) {
        let mut tpl = TopicPartitionList::new();
        for (p, next) in offsets {
            if tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*next)).is_err() {
                return;
            }
        }
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            warn!(error = %e, "Committing group offsets failed (lag display only)");
        }
    }

    /// The consumer's position in `partition` (next offset it will hand
    /// out, past transaction markers), if known.
    pub fn position(&self, partition: i32) -> Option<i64> {
        let tpl = self.consumer.position().ok()?;
        match tpl.find_partition(&self.topic, partition)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        }
    }

    /// The broker's high watermark of `partition` (one round trip on an
    /// idle connection).
    pub fn high_watermark(&self, partition: i32) -> KafkaResult<i64> {
        self.watermarks.fetch_watermarks(&self.topic, partition, Duration::from_secs(1)).map(|(_, high)| high)
    }
}
