//! Tailing the fleet topic into a [`Roster`] (see [`super`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::warn;

use super::Roster;
use crate::kafka::reader::{read_to_end, reader_client};
use crate::kafka::KafkaError;

fn tail_client(kafka: &BTreeMap<String, String>, topic: &str) -> Result<BaseConsumer, KafkaError> {
    let consumer = reader_client(kafka)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning).map_err(KafkaError::client("assigning"))?;
    consumer.assign(&tpl).map_err(KafkaError::client("assigning"))?;
    Ok(consumer)
}

/// Starts tailing `topic` from its beginning into `roster` until
/// `shutdown`.
pub fn spawn(
    kafka: &BTreeMap<String, String>,
    topic: &str,
    roster: Roster,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KafkaError> {
    let consumer = tail_client(kafka, topic)?;
    std::thread::Builder::new()
        .name("fleet-watch".into())
        .spawn(move || {
            while !shutdown.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => roster.apply(m.key().unwrap_or_default(), m.payload()),
                    Some(Err(e)) => warn!(error = %e, "Reading the fleet topic failed; retrying"),
                    None => {}
                }
            }
        })
        .map_err(|e| KafkaError::Timeout(format!("starting the fleet reader: {e}")))
}

/// The roster as the fleet topic holds it now (for the CLI).
pub fn read_once(kafka: &BTreeMap<String, String>, topic: &str) -> Result<Roster, KafkaError> {
    let roster = Roster::default();
    for r in read_to_end(kafka, topic, Duration::from_secs(30))? {
        roster.apply(r.key.as_deref().unwrap_or_default(), r.value.as_deref());
    }
    Ok(roster)
}
