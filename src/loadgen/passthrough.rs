//! The benchmark baseline: a bare librdkafka consume→produce of a topic
//! (no decode, no state, no acknowledgement per batch), with the same
//! client settings as the pipeline. Whatever the pipeline does on top of
//! moving bytes shows up as the ratio between the two.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::{Message, Offset};

use crate::kafka::producer::{PRODUCER_DEFAULTS, PRODUCER_REQUIRED};
use crate::kafka::{client_config, KafkaError, CONSUMER_DEFAULTS};

/// What the passthrough moved.
#[derive(Debug, Clone)]
pub struct Moved {
    /// Records copied.
    pub records: u64,
    /// From the first record consumed to the last one acknowledged.
    pub elapsed: Duration,
}

/// Copies `count` records from `from` (partitions `0..partitions`, from
/// the beginning) to `to`, key and value, and waits for the broker's acks.
pub fn run(
    kafka: &BTreeMap<String, String>,
    from: &str,
    partitions: i32,
    to: &str,
    count: u64,
    timeout: Duration,
) -> Result<Moved, KafkaError> {
    let group = format!("reconciler-passthrough-{}", std::process::id());
    let consumer: BaseConsumer = client_config(
        &CONSUMER_DEFAULTS,
        kafka,
        &[("group.id", group.as_str()), ("enable.auto.commit", "false"), ("enable.partition.eof", "false")],
    )
    .create()
    .map_err(KafkaError::client("creating the passthrough consumer"))?;
    let producer: BaseProducer = client_config(&PRODUCER_DEFAULTS, kafka, &PRODUCER_REQUIRED)
        .create()
        .map_err(KafkaError::client("creating the passthrough producer"))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(from, p, Offset::Beginning).map_err(KafkaError::client("assigning"))?;
    }
    consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
    let deadline = Instant::now() + timeout;
    let mut first: Option<Instant> = None;
    let mut moved = 0u64;
    while moved < count {
        if Instant::now() >= deadline {
            return Err(KafkaError::Timeout(format!(
                "passthrough moved {moved} of {count} records before the timeout"
            )));
        }
        let Some(m) = consumer.poll(Duration::from_millis(100)) else { continue };
        let m = m.map_err(KafkaError::client("consuming"))?;
        first.get_or_insert_with(Instant::now);
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(to);
        if let Some(k) = m.key() {
            rec = rec.key(k);
        }
        if let Some(v) = m.payload() {
            rec = rec.payload(v);
        }
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(KafkaError::Client { context: format!("sending to {to}"), source: e }),
            }
        }
        producer.poll(Duration::ZERO);
        moved += 1;
    }
    // Not `flush`: it sleeps in 100 ms polls, which would show in the figure.
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(KafkaError::Timeout("passthrough records not acknowledged before the timeout".into()));
        }
        producer.poll(Duration::from_millis(1));
    }
    Ok(Moved { records: moved, elapsed: first.map_or(Duration::ZERO, |f| f.elapsed()) })
}
