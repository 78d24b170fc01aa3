//! The acknowledged publisher: sends records and learns when the broker
//! acknowledged every one of them (or that some failed).
//!
//! Records are sent under a [`Ticket`]; [`Publisher::wait`] blocks until
//! every record of a ticket is acknowledged, without spinning: the
//! producer's [`ReportPump`] thread serves the delivery reports and wakes
//! the waiter. So the run loop can send a batch's outputs, go on applying the
//! next batch, and only then wait for the acknowledgements.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;

use super::report_pump::ReportPump;
use super::{client_config, KafkaError};
use crate::records::ProducerRecord;

/// The records sent by one [`Publisher::send_all`] call. Not `Copy`:
/// [`Publisher::wait`] takes it, so a ticket is waited for at most once.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Ticket(usize);

/// Per ticket: records not yet reported on, failures and the last error.
/// `unreported` is signed: [`Publisher::send_all`] adds its count once,
/// after the last send, and reports may come in before that.
#[derive(Default)]
struct Outstanding {
    unreported: i64,
    failed: u64,
    last_error: Option<RDKafkaErrorCode>,
}

/// Counts delivery reports per ticket and wakes whoever waits for one.
#[derive(Default)]
pub struct AckContext {
    tickets: Mutex<HashMap<usize, Outstanding>>,
    reported: Condvar,
}

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, ticket: usize) {
        let mut tickets = self.tickets.lock().expect("not poisoned");
        // A ticket given up (timed out) is no longer tracked.
        let Some(t) = tickets.get_mut(&ticket) else { return };
        t.unreported -= 1;
        if let Err((e, _)) = result {
            t.failed += 1;
            t.last_error = Some(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail));
        }
        if t.unreported == 0 {
            self.reported.notify_all();
        }
    }
}

/// Producer defaults: lz4 (snappy is not readable everywhere), a short
/// linger (outputs are flushed per batch anyway), and connections to the
/// brokers at once rather than on first use: with sparse connections the
/// idempotent producer found no broker up when it asked for its producer
/// id at creation and asked again only on its 500 ms timer, so the first
/// batch's outputs waited 850 ms for their acknowledgement.
pub const PRODUCER_DEFAULTS: [(&str, &str); 3] =
    [("compression.type", "lz4"), ("linger.ms", "5"), ("enable.sparse.connections", "false")];

/// The pipeline's own producer lingers 1 ms, not 5. It already batches:
/// each batch's outputs are handed over in one go, so the linger is
/// waited once per batch, on the critical path. (Measured when each
/// batch's outputs still waited for the previous batch's
/// acknowledgements.) At half rate (60,000 records/s on the
/// test broker) the loop spent 8–10 ms of an 11 ms cycle waiting for the
/// previous batch's acknowledgements; at 1 ms event→verdict p50 fell from
/// 37–41 to 27–31 ms, for 1–3 % more CPU at full rate (smaller produce
/// requests; BENCHMARKS.md). `[kafka] "linger.ms"` still overrides it.
pub const PIPELINE_LINGER: (&str, &str) = ("linger.ms", "1");

/// Settings every producer of the reconciler needs: the Java client's
/// partitioner (so Java and Rust agree on an entity's partition) and
/// idempotence (broker retries neither duplicate nor reorder).
pub const PRODUCER_REQUIRED: [(&str, &str); 2] = [("partitioner", "murmur2_random"), ("enable.idempotence", "true")];

/// Publishes records and waits for their acknowledgements.
pub struct Publisher {
    /// Serves `producer`'s delivery reports; holds a reference to it.
    _reports: ReportPump,
    producer: Arc<BaseProducer<AckContext>>,
    next_ticket: AtomicUsize,
    flush_timeout: Duration,
}

/// A producer's configuration: [`PRODUCER_DEFAULTS`], then `defaults`,
/// then the `[kafka]` map `kafka` (the operator's word), then
/// [`PRODUCER_REQUIRED`] and `required`.
pub(super) fn producer_config(
    kafka: &BTreeMap<String, String>,
    max_message_bytes: usize,
    defaults: &[(&str, &str)],
    required: &[(&str, &str)],
) -> rdkafka::ClientConfig {
    let max = max_message_bytes.to_string();
    let mut all_defaults = PRODUCER_DEFAULTS.to_vec();
    all_defaults.extend_from_slice(defaults);
    all_defaults.push(("message.max.bytes", max.as_str()));
    let mut all_required = PRODUCER_REQUIRED.to_vec();
    all_required.extend_from_slice(required);
    client_config(&all_defaults, kafka, &all_required)
}

impl Publisher {
    /// A publisher for records of up to `max_message_bytes` (key, value
    /// and headers). librdkafka refuses larger ones before they are sent.
    pub fn new(kafka: &BTreeMap<String, String>, max_message_bytes: usize) -> Result<Publisher, KafkaError> {
        Publisher::with_settings(kafka, max_message_bytes, &[], &[])
    }

    /// The pipeline's publisher: [`Publisher::new`] with
    /// [`PIPELINE_LINGER`].
    pub fn for_pipeline(kafka: &BTreeMap<String, String>, max_message_bytes: usize) -> Result<Publisher, KafkaError> {
        Publisher::with_settings(kafka, max_message_bytes, &[PIPELINE_LINGER], &[])
    }

    /// A publisher whose producer also has the defaults `defaults` (which
    /// `kafka` may override) and the settings `required` (the
    /// transactional id of [`super::transaction::Transactions`]).
    pub(super) fn with_settings(
        kafka: &BTreeMap<String, String>,
        max_message_bytes: usize,
        defaults: &[(&str, &str)],
        required: &[(&str, &str)],
    ) -> Result<Publisher, KafkaError> {
        let producer: Arc<BaseProducer<AckContext>> = Arc::new(
            producer_config(kafka, max_message_bytes, defaults, required)
                .create_with_context(AckContext::default())
                .map_err(KafkaError::client("creating the producer"))?,
        );
        let reports = ReportPump::start(Arc::clone(&producer), "delivery reports")
            .map_err(|source| KafkaError::Io { context: "starting the delivery reports' thread".into(), source })?;
        Ok(Publisher {
            _reports: reports,
            producer,
            next_ticket: AtomicUsize::new(0),
            flush_timeout: Duration::from_secs(30),
        })
    }

    /// The producer itself (for the transaction calls).
    pub(super) fn producer(&self) -> &BaseProducer<AckContext> {
        &self.producer
    }

    /// Drops whatever is still queued or in flight, so that a retry sends
    /// each record once more, not once per failed attempt. The purged
    /// records are reported (as failed) to their tickets.
    fn purge(&self) {
        self.producer.purge(PurgeConfig::default().queue().inflight());
    }

    /// Sends every record (to `partition` when given, else by key) under a
    /// new ticket and returns at once. On an error nothing more is sent and
    /// what was sent is purged.
    pub fn send_all<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a ProducerRecord, Option<i32>)>,
    ) -> Result<(Ticket, usize), KafkaError> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let ctx = self.producer.context();
        ctx.tickets.lock().expect("not poisoned").insert(ticket, Outstanding::default());
        let mut sent = 0;
        for (rec, partition) in records {
            let mut br: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(&rec.topic, ticket);
            // No header list for a record without headers (a changelog
            // record): librdkafka would allocate and free an empty one.
            if !rec.headers.is_empty() {
                let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
                for (k, v) in &rec.headers {
                    headers = headers.insert(Header { key: k, value: v.as_deref() });
                }
                br = br.headers(headers);
            }
            if let Some(k) = &rec.key {
                br = br.key(k.as_slice());
            }
            if let Some(v) = &rec.value {
                br = br.payload(v.as_slice());
            }
            if let Some(p) = partition {
                br = br.partition(p);
            }
            let mut queue_deadline = None;
            loop {
                match self.producer.send(br) {
                    Ok(()) => break,
                    Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if *queue_deadline.get_or_insert_with(|| Instant::now() + self.flush_timeout)
                            > Instant::now() =>
                    {
                        // The reports' thread makes room as reports come in.
                        br = back;
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => {
                        ctx.tickets.lock().expect("not poisoned").remove(&ticket);
                        self.purge();
                        return Err(KafkaError::Client { context: format!("sending to {}", rec.topic), source: e });
                    }
                }
            }
            sent += 1;
        }
        // One lock for the batch, not one per record.
        ctx.tickets.lock().expect("not poisoned").get_mut(&ticket).expect("registered above").unreported += sent as i64;
        Ok((Ticket(ticket), sent))
    }

    /// Whether every record of `ticket` has been reported on (acknowledged
    /// or failed), so that [`Publisher::wait`] would return at once: the
    /// run loop moves a batch on without waiting when it is.
    pub fn reported(&self, ticket: &Ticket) -> bool {
        let tickets = self.producer.context().tickets.lock().expect("not poisoned");
        tickets.get(&ticket.0).is_none_or(|t| t.unreported == 0)
    }

    /// Waits until every record of `ticket` is acknowledged; an error if
    /// one was not, or if reports are missing after the flush timeout (the
    /// rest is then purged). Either way the ticket is finished.
    pub fn wait(&self, ticket: Ticket) -> Result<(), KafkaError> {
        let ctx = self.producer.context();
        let deadline = Instant::now() + self.flush_timeout;
        let mut tickets = ctx.tickets.lock().expect("not poisoned");
        loop {
            // Present: only `send_all` hands out tickets, once registered,
            // and only this call (which takes it) removes it.
            let t = tickets.get(&ticket.0).expect("a ticket handed out and not yet waited for");
            if t.unreported == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing = t.unreported.max(0) as usize;
                tickets.remove(&ticket.0);
                drop(tickets);
                self.purge();
                return Err(KafkaError::AckTimeout { missing, timeout: self.flush_timeout });
            }
            tickets = ctx.reported.wait_timeout(tickets, left).expect("not poisoned").0;
        }
        let t = tickets.remove(&ticket.0).expect("present above");
        if t.failed > 0 {
            drop(tickets);
            // Later records may still be queued behind the failed ones: a
            // retry must not find them sent out of order.
            self.purge();
            return Err(KafkaError::NotAcknowledged {
                failed: t.failed,
                code: t.last_error.unwrap_or(RDKafkaErrorCode::Fail),
            });
        }
        Ok(())
    }

    /// Sends every record (to `partition` when given, else by key) and
    /// returns once all are acknowledged; an error if any was not.
    pub fn publish_all<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a ProducerRecord, Option<i32>)>,
    ) -> Result<usize, KafkaError> {
        let (ticket, sent) = self.send_all(records)?;
        self.wait(ticket)?;
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{producer_config, Publisher, PIPELINE_LINGER};
    use crate::kafka::KafkaError;
    use crate::records::ProducerRecord;

    /// Delivery reports reach the waiter through the reports' thread, with
    /// no broker at all: a record librdkafka gives up on (nothing listens
    /// on port 1; it stops trying after `message.timeout.ms`) is reported
    /// failed. Were the reports not served, the wait would end only at the
    /// 30 s flush timeout, as an `AckTimeout`.
    #[test]
    fn a_record_no_broker_takes_is_reported_failed() {
        let kafka: BTreeMap<String, String> = [("bootstrap.servers", "127.0.0.1:1"), ("message.timeout.ms", "200")]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into();
        let publisher = Publisher::new(&kafka, 1000).unwrap();
        let rec = ProducerRecord {
            topic: "nowhere".into(),
            key: Some(b"k".to_vec()),
            value: Some(b"v".to_vec()),
            headers: vec![],
        };
        match publisher.publish_all([(&rec, None)]) {
            Err(KafkaError::NotAcknowledged { failed: 1, .. }) => {}
            other => panic!("expected one failed record, got {other:?}"),
        }
    }

    /// The pipeline's producer lingers 1 ms, every other 5 (librdkafka's
    /// default), and `[kafka]` overrides either; idempotence cannot be
    /// turned off.
    #[test]
    fn the_pipeline_lingers_less_and_the_operator_has_the_last_word() {
        let none = BTreeMap::new();
        let linger = |kafka: &BTreeMap<String, String>, defaults: &[(&str, &str)]| {
            producer_config(kafka, 1000, defaults, &[]).get("linger.ms").map(str::to_owned)
        };
        assert_eq!(linger(&none, &[]).as_deref(), Some("5"));
        assert_eq!(linger(&none, &[PIPELINE_LINGER]).as_deref(), Some("1"));
        let operator: BTreeMap<String, String> =
            [("linger.ms".to_owned(), "20".to_owned()), ("enable.idempotence".to_owned(), "false".to_owned())].into();
        assert_eq!(linger(&operator, &[PIPELINE_LINGER]).as_deref(), Some("20"));
        let cfg = producer_config(&operator, 1000, &[PIPELINE_LINGER], &[]);
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
        assert_eq!(cfg.get("message.max.bytes"), Some("1000"));
    }
}
