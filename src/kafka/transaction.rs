//! Kafka transactions for `guarantee = "exactly_once"`: a batch's outputs
//! and its consumed offsets become visible together to `read_committed`
//! readers, or not at all.
//!
//! One transactional producer per instance, its `transactional.id` stable
//! across restarts ([`crate::config::Consumer::transactional_id`]). Its
//! `init_transactions` at start-up does two things the guarantee rests on:
//! the broker aborts whatever transaction the previous run of this instance
//! left open (a crash between producing and committing), and bumps the
//! producer epoch, so that a zombie of that previous run (a process stalled,
//! not dead) is fenced: every later write of its old epoch is refused and
//! its transactions never commit. A member that lost its partitions to
//! *another* instance is fenced through the consumer group metadata sent
//! with the offsets: Kafka refuses a `TxnOffsetCommit` from a stale
//! generation (KIP-447), which makes the transaction abort. (Some other
//! Kafka-protocol brokers do not check the generation; RELIABILITY.md
//! names them.)
//!
//! Errors come in two kinds the caller must tell apart: [`TxnError::Aborted`]
//! (nothing of the transaction is visible; do the work again) and
//! [`TxnError::Fatal`] (the producer is fenced or unusable; stop).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError as RdError;
use rdkafka::producer::Producer;
use tracing::warn;

use super::consumer::offsets_list;
use super::producer::{Publisher, PIPELINE_LINGER};
use super::KafkaError;
use crate::records::ProducerRecord;

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// The transaction was aborted: none of its records and offsets are
    /// visible to `read_committed` readers. The work can be done again.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// The producer cannot go on: fenced by a newer producer with the same
    /// transactional id (this process is a zombie), or a fatal client error.
    /// Nothing of the open transaction becomes visible; the instance stops.
    #[error("transactional producer {id} cannot go on (fenced or fatal): {source}")]
    Fatal {
        /// The transactional id.
        id: String,
        /// librdkafka's error.
        #[source]
        source: RdError,
    },
}

/// The offsets a transaction commits for the consumer group.
pub struct TxnOffsets<'a> {
    /// The input topic.
    pub topic: &'a str,
    /// Partition → next offset to consume.
    pub next: &'a BTreeMap<i32, i64>,
    /// The consumer's group metadata (generation and member id, by which
    /// the broker fences a member that lost its partitions).
    pub group: &'a ConsumerGroupMetadata,
}

/// How librdkafka classifies a transaction error.
enum Class {
    Fatal,
    Abort,
    Retry,
}

fn class(e: &RdError) -> Class {
    match e {
        RdError::Transaction(t) if t.is_fatal() => Class::Fatal,
        RdError::Transaction(t) if t.txn_requires_abort() => Class::Abort,
        RdError::Transaction(t) if t.is_retriable() => Class::Retry,
        _ => Class::Abort,
    }
}

/// The transactional producer of an instance.
pub struct Transactions {
    publisher: Arc<Publisher>,
    id: String,
    /// Budget of one protocol call (init, offsets, commit, abort).
    call_timeout: Duration,
    /// How long a retriable commit or init keeps being retried (a broker
    /// outage) before the instance gives up.
    retry_for: Duration,
}

impl Transactions {
    /// Creates the producer with `transactional_id` and initialises it:
    /// aborts what a previous run left open and fences its zombies.
    pub fn new(
        kafka: &BTreeMap<String, String>,
        max_message_bytes: usize,
        transactional_id: &str,
        retry_for: Duration,
    ) -> Result<Transactions, KafkaError> {
        let publisher = Arc::new(Publisher::with_settings(
            kafka,
            max_message_bytes,
            &[PIPELINE_LINGER],
            &[("transactional.id", transactional_id)],
        )?);
        let t = Transactions {
            publisher,
            id: transactional_id.to_owned(),
            call_timeout: Duration::from_secs(30),
            retry_for,
        };
        let started = Instant::now();
        loop {
            match t.publisher.producer().init_transactions(t.call_timeout) {
                Ok(()) => return Ok(t),
                Err(e) if matches!(class(&e), Class::Retry) && started.elapsed() < t.retry_for => {
                    warn!(transactional_id = %t.id, error = %e, "Initialising transactions failed; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(source) => {
                    return Err(KafkaError::Client {
                        context: format!("initialising transactions of {transactional_id}"),
                        source,
                    })
                }
            }
        }
    }

    /// The transactional id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The producer (for callers that keep a [`Publisher`] handle; sending
    /// outside a transaction fails).
    pub fn publisher(&self) -> Arc<Publisher> {
        self.publisher.clone()
    }

    /// One transaction: sends `records` (to `partition` when given, else
    /// by key) and `offsets`, then asks `may_commit` (the caller's last
    /// chance to abort: its zombie check, its crash point) and commits.
    /// Returns the number of records committed.
    pub fn run<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a ProducerRecord, Option<i32>)>,
        offsets: Option<TxnOffsets<'_>>,
        may_commit: impl FnOnce() -> bool,
    ) -> Result<usize, TxnError> {
        let producer = self.publisher.producer();
        producer.begin_transaction().map_err(|e| self.abort_on(e))?;
        let (ticket, sent) = match self.publisher.send_all(records) {
            Ok(t) => t,
            Err(e) => return Err(self.abort(e.to_string())),
        };
        if let Some(o) = offsets {
            let tpl = offsets_list(o.topic, o.next);
            if let Err(e) = producer.send_offsets_to_transaction(&tpl, o.group, self.call_timeout) {
                // Purged by the abort, so the ticket is reported at once.
                let err = self.abort_on(e);
                let _ = self.publisher.wait(ticket);
                return Err(err);
            }
        }
        // Every record in the log (the commit would wait for them anyway):
        // from here on only the commit marker is missing.
        if let Err(e) = self.publisher.wait(ticket) {
            return Err(self.abort(e.to_string()));
        }
        if !may_commit() {
            return Err(self.abort("the caller withdrew the transaction".into()));
        }
        self.commit().map(|()| sent)
    }

    /// Commits, retrying what librdkafka says may be retried.
    fn commit(&self) -> Result<(), TxnError> {
        let started = Instant::now();
        loop {
            match self.publisher.producer().commit_transaction(self.call_timeout) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(class(&e), Class::Retry) && started.elapsed() < self.retry_for => {
                    warn!(transactional_id = %self.id, error = %e, "Committing the transaction failed; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(self.abort_on(e)),
            }
        }
    }

    fn fatal(&self, source: RdError) -> TxnError {
        TxnError::Fatal { id: self.id.clone(), source }
    }

    /// A fatal error as such; any other means the transaction must go.
    fn abort_on(&self, e: RdError) -> TxnError {
        match class(&e) {
            Class::Fatal => self.fatal(e),
            _ => self.abort(e.to_string()),
        }
    }

    /// Aborts the open transaction because of `why`.
    fn abort(&self, why: String) -> TxnError {
        match self.publisher.producer().abort_transaction(self.call_timeout) {
            Ok(()) => TxnError::Aborted(why),
            // Fatal, or the abort itself failed (broker unreachable for the
            // whole budget): the producer is in no state to begin another
            // transaction. The broker aborts the open one when this id
            // initialises again.
            Err(e) => self.fatal(e),
        }
    }
}
