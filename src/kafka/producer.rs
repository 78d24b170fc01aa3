//! The acknowledged publisher: sends records and waits until the broker
//! acknowledged every one of them (or reports that some failed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;

use super::{client_config, KafkaError};
use crate::store::OutboxRecord;

/// Counts failed deliveries between two flushes.
#[derive(Default)]
pub struct AckContext {
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::SeqCst);
            *self.last_error.lock().expect("not poisoned") = Some(e.to_string());
        }
    }
}

/// Producer defaults: lz4 (snappy is not readable everywhere) and a short
/// linger (outputs are flushed per batch anyway).
pub const PRODUCER_DEFAULTS: [(&str, &str); 2] = [("compression.type", "lz4"), ("linger.ms", "5")];

/// Settings every producer of the reconciler needs: the Java client's
/// partitioner (so Java and Rust agree on an entity's partition) and
/// idempotence (broker retries neither duplicate nor reorder).
pub const PRODUCER_REQUIRED: [(&str, &str); 2] = [("partitioner", "murmur2_random"), ("enable.idempotence", "true")];

/// Publishes batches of records and waits for their acknowledgements.
pub struct Publisher {
    producer: BaseProducer<AckContext>,
    flush_timeout: Duration,
}

impl Publisher {
    /// A publisher for records of up to `max_message_bytes` (key, value
    /// and headers). librdkafka refuses larger ones before they are sent.
    pub fn new(kafka: &BTreeMap<String, String>, max_message_bytes: usize) -> Result<Publisher, KafkaError> {
        let max = max_message_bytes.to_string();
        let mut defaults = PRODUCER_DEFAULTS.to_vec();
        defaults.push(("message.max.bytes", max.as_str()));
        let producer = client_config(&defaults, kafka, &PRODUCER_REQUIRED)
            .create_with_context(AckContext::default())
            .map_err(KafkaError::client("creating the producer"))?;
        Ok(Publisher { producer, flush_timeout: Duration::from_secs(30) })
    }

    /// Drops whatever is still queued or in flight, so that a retry sends
    /// each record once more, not once per failed attempt.
    fn purge(&self) {
        self.producer.purge(PurgeConfig::default().queue().inflight());
        // Serve the purged records' delivery reports.
        self.producer.poll(Duration::ZERO);
    }

    /// Waits until no record is in flight. (rdkafka's `flush` sleeps in
    /// 100 ms polls; measured, that alone capped a batch at 100 ms.)
    fn await_acks(&self) -> Result<(), KafkaError> {
        let deadline = std::time::Instant::now() + self.flush_timeout;
        while self.producer.in_flight_count() > 0 {
            if std::time::Instant::now() >= deadline {
                return Err(KafkaError::Other(format!(
                    "{} records not acknowledged within {:?}",
                    self.producer.in_flight_count(),
                    self.flush_timeout
                )));
            }
            self.producer.poll(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Sends every record (to `partition` when given, else by key) and
    /// returns once all are acknowledged; an error if any was not.
    pub fn publish_all<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a OutboxRecord, Option<i32>)>,
    ) -> Result<usize, KafkaError> {
        let ctx = self.producer.context();
        ctx.failed.store(0, Ordering::SeqCst);
        let mut sent = 0;
        for (rec, partition) in records {
            let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
            for (k, v) in &rec.headers {
                headers = headers.insert(Header { key: k, value: v.as_deref() });
            }
            let mut br: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&rec.topic).headers(headers);
            if let Some(k) = &rec.key {
                br = br.key(k.as_slice());
            }
            if let Some(v) = &rec.value {
                br = br.payload(v.as_slice());
            }
            if let Some(p) = partition {
                br = br.partition(p);
            }
            let queue_deadline = std::time::Instant::now() + self.flush_timeout;
            loop {
                match self.producer.send(br) {
                    Ok(()) => break,
                    Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if std::time::Instant::now() < queue_deadline =>
                    {
                        br = back;
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => {
                        self.purge();
                        return Err(KafkaError::Client { context: format!("sending to {}", rec.topic), source: e });
                    }
                }
            }
            sent += 1;
        }
        if let Err(e) = self.await_acks() {
            self.purge();
            return Err(e);
        }
        let failed = ctx.failed.load(Ordering::SeqCst);
        if failed > 0 {
            let last = ctx.last_error.lock().expect("not poisoned").take().unwrap_or_default();
            return Err(KafkaError::Other(format!("{failed} of {sent} records were not acknowledged: {last}")));
        }
        Ok(sent)
    }
}
