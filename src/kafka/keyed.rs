//! A producer that reports on each record on its own (a delivery future
//! per record), for the outbox relay: a row is marked published only when
//! its own record was acknowledged, and a row the broker refuses fails
//! alone. ([`super::producer::Publisher`] reports per batch, which is what
//! the pipeline's outputs need.)
//!
//! Idempotent, with the Java client's partitioner, like every producer of
//! the reconciler ([`super::producer::PRODUCER_REQUIRED`]): an entity's
//! records go to one partition in the order sent, and the client's own
//! retries neither duplicate nor reorder them.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use super::producer::producer_config;
use super::KafkaError;

/// Publishes keyed records, each with its own acknowledgement.
pub struct KeyedProducer {
    producer: FutureProducer,
}

/// A record handed to the client: its acknowledgement, to await.
pub struct Sent(DeliveryFuture);

impl KeyedProducer {
    /// A producer with the `[kafka]` settings `kafka`, records of up to
    /// `max_message_bytes`, each acknowledged within `delivery_timeout` or
    /// failed (`message.timeout.ms`).
    pub fn new(
        kafka: &BTreeMap<String, String>,
        max_message_bytes: usize,
        delivery_timeout: Duration,
    ) -> Result<KeyedProducer, KafkaError> {
        let timeout = delivery_timeout.as_millis().to_string();
        let producer = producer_config(kafka, max_message_bytes, &[("message.timeout.ms", timeout.as_str())], &[])
            .create()
            .map_err(KafkaError::client("creating the relay's producer"))?;
        Ok(KeyedProducer { producer })
    }

    /// Hands one record to the client (it is sent in the background); an
    /// error when the client refuses it at once (too large, queue full,
    /// a fatal producer state).
    pub fn send(
        &self,
        topic: &str,
        key: &str,
        value: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<Sent, RDKafkaErrorCode> {
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            h = h.insert(Header { key: k, value: Some(*v) });
        }
        let record = FutureRecord::to(topic).key(key).payload(value).headers(h);
        self.producer.send_result(record).map(Sent).map_err(|(e, _)| code(&e))
    }

    /// Waits for every record handed over to be sent or failed, up to
    /// `timeout` (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

impl Sent {
    /// Waits for the broker's acknowledgement of the record; the error code
    /// when it failed (after the client's own retries, within the delivery
    /// timeout).
    pub async fn acknowledged(self) -> Result<(), RDKafkaErrorCode> {
        match self.0.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(code(&e)),
            // The producer dropped the record's report: it was not delivered.
            Err(_) => Err(RDKafkaErrorCode::Fail),
        }
    }
}

fn code(e: &RdError) -> RDKafkaErrorCode {
    e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)
}
