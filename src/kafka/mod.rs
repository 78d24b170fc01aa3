//! Kafka adapters: client configuration, the consumer-group member, the
//! acknowledged publisher and topic administration. Everything here speaks
//! the Kafka protocol through librdkafka and nothing else.

pub mod admin;
pub mod batch_queue;
pub mod connect;
pub mod consumer;
pub mod keyed;
pub mod permissions;
pub mod producer;
pub mod reader;
pub mod report_pump;
pub mod transaction;
pub mod watermarks;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use crate::records::Record;

/// An error from the Kafka side, with what was being done. [`retriable`]
/// tells the errors that go away by themselves (a broker restarting, a
/// leader moving, a timeout) from those that need a person (no
/// permission, no such topic, a record the broker will never take).
///
/// [`retriable`]: KafkaError::retriable
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The client failed a call.
    #[error("{context}: {source}")]
    Client {
        /// What was being done.
        context: String,
        /// librdkafka's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The broker (or librdkafka for it) refused a request with `code`.
    #[error("{context}: {code}")]
    Refused {
        /// What was being done.
        context: String,
        /// The refusal.
        code: RDKafkaErrorCode,
    },
    /// Records were sent but some were not acknowledged.
    #[error("{failed} records were not acknowledged: {code}")]
    NotAcknowledged {
        /// How many failed.
        failed: u64,
        /// The error of the last one that failed.
        code: RDKafkaErrorCode,
    },
    /// Delivery reports were still missing when the flush timeout passed.
    #[error("{missing} records not acknowledged within {timeout:?}")]
    AckTimeout {
        /// How many were not reported on.
        missing: usize,
        /// How long it waited.
        timeout: Duration,
    },
    /// A topic the configuration names does not exist.
    #[error("topic {0} does not exist (check [topics] in the configuration)")]
    UnknownTopic(String),
    /// The broker's authorizer does not allow this client's principal an
    /// operation the reconciler needs on a topic.
    #[error("the broker does not allow this client's principal to {operation} topic {topic}, which the reconciler needs to {purpose}: grant it with an ACL (docs/operations.md, \"Kafka permissions\")")]
    NotAuthorized {
        /// The topic.
        topic: String,
        /// The Kafka ACL operation, as `kafka-acls --operation` names it
        /// (Describe, Read, Write, Create).
        operation: &'static str,
        /// What the reconciler needs it for.
        purpose: String,
    },
    /// The changelog topic has fewer partitions than the input topic.
    #[error("changelog topic {changelog} has {has} partitions but the input topic has {input}: it needs at least as many (`topics.changelog`)")]
    ChangelogPartitions {
        /// The changelog topic.
        changelog: String,
        /// Its partitions.
        has: usize,
        /// The input's partitions.
        input: usize,
    },
    /// Something did not finish within its time budget.
    #[error("{0}")]
    Timeout(String),
    /// The operating system refused what the client needed beside
    /// librdkafka (a thread, a socket).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A step of the group's rebalance failed: the member stops rather than
    /// run with an assignment it does not really have.
    #[error("rebalance failed: {0}")]
    Rebalance(String),
    /// The broker answered that a partition's fetch position is outside its
    /// log (the consumer runs with `auto.offset.reset = error`): the topic
    /// was created again or truncated, or retention passed the position.
    #[error("partition {partition} of {topic}: the fetch position {offset} is outside the log: {reason}")]
    PositionOutOfRange {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The position the fetch was at.
        offset: i64,
        /// librdkafka's account.
        reason: String,
    },
    /// The broker refused this client's credentials or its TLS handshake.
    #[error("the broker at {brokers} refused this client's credentials or TLS handshake (check security.protocol, sasl.* and ssl.* under [kafka]): {reason}")]
    Authentication {
        /// `bootstrap.servers`.
        brokers: String,
        /// librdkafka's account of the refusal.
        reason: String,
    },
}

impl KafkaError {
    pub(crate) fn client(context: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
        let context = context.into();
        move |source| KafkaError::Client { context, source }
    }

    /// Whether trying again may succeed without anyone changing anything.
    /// False for authorization and authentication failures, unknown topics,
    /// invalid or oversized records and librdkafka's fatal errors: retrying
    /// those forever would hide them, so the pipeline gives up on them
    /// after `[consumer] give_up_after_ms` and exits non-zero.
    pub fn retriable(&self) -> bool {
        let code = match self {
            KafkaError::Client { source, .. } => source.rdkafka_error_code(),
            KafkaError::Refused { code, .. } | KafkaError::NotAcknowledged { code, .. } => Some(*code),
            KafkaError::AckTimeout { .. } | KafkaError::Timeout(_) | KafkaError::Io { .. } => None,
            KafkaError::UnknownTopic(_)
            | KafkaError::NotAuthorized { .. }
            | KafkaError::Rebalance(_)
            | KafkaError::PositionOutOfRange { .. }
            | KafkaError::ChangelogPartitions { .. }
            | KafkaError::Authentication { .. } => return false,
        };
        code.is_none_or(|c| !fatal_code(c))
    }
}

/// Codes that no retry can cure.
pub(crate) fn fatal_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::DelegationTokenAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::UnknownTopic
            | C::UnknownPartition
            | C::UnknownTopicOrPartition
            | C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidRecord
            | C::UnsupportedForMessageFormat
            | C::Fatal
            | C::InvalidArgument
    )
}

/// Drops a client that is done with on a thread of its own. librdkafka's
/// destroy waits for the client's threads to stop, about 100 ms each time:
/// start-up made three short-lived clients (the credentials check and two
/// topic creations), and waiting for their ends was a third of the time to
/// the first verdict.
pub(crate) fn drop_in_background<T: Send + 'static>(client: T) {
    if std::thread::Builder::new().name("kafka-client-drop".into()).spawn(move || drop(client)).is_err() {
        // No thread to be had: the client was dropped with the closure.
    }
}

/// Defaults of every client. `reconnect.backoff.ms` also paces a new
/// client's first connections (librdkafka waits half of it between them,
/// 50 ms at its default of 100): each client made at start-up waited that
/// long for its first answer. Reconnections still back off exponentially
/// up to `reconnect.backoff.max.ms` (10 s).
const CLIENT_DEFAULTS: [(&str, &str); 1] = [("reconnect.backoff.ms", "20")];

/// A client configuration: `defaults` first, then the `[kafka]`
/// passthrough map (the operator's word), then `required` (settings the
/// reconciler's correctness depends on, which nothing may override).
pub fn client_config(
    defaults: &[(&str, &str)],
    passthrough: &BTreeMap<String, String>,
    required: &[(&str, &str)],
) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in CLIENT_DEFAULTS.iter().chain(defaults) {
        cfg.set(*k, *v);
    }
    for (k, v) in passthrough {
        cfg.set(k, v);
    }
    if defaults.iter().any(|(k, _)| *k == FETCH_MAX_BYTES.0) && !passthrough.contains_key(FETCH_MAX_BYTES.0) {
        cfg.set(FETCH_MAX_BYTES.0, fetch_max_bytes(passthrough).to_string());
    }
    for (k, v) in required {
        cfg.set(*k, *v);
    }
    cfg
}

/// The default [`FETCH_MAX_BYTES`] fitted to the operator's settings, which
/// librdkafka checks it against: at most `receive.message.max.bytes` less
/// 512 (a response's framing), and at least `message.max.bytes` (its
/// default, 1,000,000, when not set).
fn fetch_max_bytes(passthrough: &BTreeMap<String, String>) -> u64 {
    let set = |key: &str| passthrough.get(key).and_then(|v| v.trim().parse::<u64>().ok());
    let mut fetch = FETCH_MAX_BYTES.1.parse::<u64>().expect("FETCH_MAX_BYTES is a number of bytes");
    if let Some(received) = set("receive.message.max.bytes") {
        fetch = fetch.min(received.saturating_sub(512));
    }
    fetch.max(set("message.max.bytes").unwrap_or(1_000_000))
}

/// Consumer defaults.
///
/// A short fetch wait, so an event (or a timer written into the log) is
/// seen within milliseconds on a quiet topic. 10 ms, not 50: a broker that
/// holds a fetch for its whole wait even once records arrive (tansu 0.6.0
/// here) adds up to that wait to every record's latency; at 10 ms the
/// event→verdict p50 at half rate fell from 114 to 62 ms (BENCHMARKS.md).
/// Apache Kafka answers as soon as records arrive, so there the wait only
/// paces the fetches of an idle consumer (100 per second per broker); raise
/// it in `[kafka]` where that matters more.
///
/// And fetches of at most 1 MiB (librdkafka's default is 50 MB): see
/// [`FETCH_MAX_BYTES`].
///
/// And a prefetch that resumes within 10 ms once the application has taken
/// records from a full queue: see [`FETCH_QUEUE_BACKOFF`].
pub const CONSUMER_DEFAULTS: [(&str, &str); 3] = [("fetch.wait.max.ms", "10"), FETCH_MAX_BYTES, FETCH_QUEUE_BACKOFF];

/// How long librdkafka waits before it fetches again for a partition whose
/// prefetch found the local queue full (`queued.max.messages.kbytes`, 64 MiB
/// in all by default, or `queued.min.messages` per partition). Its default,
/// 1,000 ms, starved every consumer that reads a backlog faster than that
/// queue lasts: the pipeline worked through the 64 MiB in about half a
/// second, then waited about 0.6 s for the next fetch, once per pass over
/// the partitions, half of its wall time on a preloaded topic (its batch log:
/// 5.07 s of 10.2 s between batches, in 14 pauses of 0.35–0.59 s). At 10
/// ms, the pace of the fetch wait above, the queue is refilled as it
/// drains. The queue's limits, and so the most memory it may take, are
/// unchanged; a consumer that keeps its queue full now holds nearer that
/// limit (the passthrough's peak RSS 97–109 → 112–124 MB, the pipeline's
/// the same) (BENCHMARKS.md, "Defaults chosen by
/// measurement").
pub const FETCH_QUEUE_BACKOFF: (&str, &str) = ("fetch.queue.backoff.ms", "10");

/// The most a fetch response carries (a soft limit: a larger record still
/// comes whole). librdkafka hands none of a response's records to the
/// application before it has read them all, so on a preloaded topic the
/// first fetch decided when the first verdict came: at 50 MB it carried
/// about 27,000 records (1 MB per partition), which took the client's
/// broker thread about 120 ms to decompress and queue, and the first
/// verdict came 0.32–0.51 s after start (`scripts/bench-e2e.sh`, 300k
/// operations); at 1 MiB, 0.22–0.24 s. Throughput did not change in the
/// same runs, since the client fetches again while the application works
/// through the last response. It is fitted to the record sizes set in
/// `[kafka]` (see [`fetch_max_bytes`]); a `fetch.max.bytes` there wins.
pub const FETCH_MAX_BYTES: (&str, &str) = ("fetch.max.bytes", "1048576");

/// The topic names of consumed records: each record refers to its name
/// rather than owning a copy (an allocation per record on the hot path).
/// Keeps the last name seen: a consumer reads one topic, or a few in runs.
#[derive(Debug, Default)]
pub struct TopicNames(Option<Arc<str>>);

impl TopicNames {
    /// `name`, shared with the records before it of the same topic.
    pub fn of(&mut self, name: &str) -> Arc<str> {
        match &self.0 {
            Some(last) if **last == *name => last.clone(),
            _ => self.0.insert(Arc::from(name)).clone(),
        }
    }
}

impl Record {
    /// Copies a borrowed message (its topic's name through `names`).
    pub fn from_message<M: rdkafka::Message>(m: &M, names: &mut TopicNames) -> Record {
        Record::of_topic(m, names.of(m.topic()))
    }

    /// Copies a borrowed message of `topic`, known beforehand: a subscribed
    /// consumer's records all come from its one topic, and reading each
    /// message's name (a C string checked as UTF-8, then compared with the
    /// last) was about half a percent of the process's samples.
    pub fn of_topic<M: rdkafka::Message>(m: &M, topic: Arc<str>) -> Record {
        use rdkafka::message::Headers;
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(|v| v.to_vec()))).collect())
            .unwrap_or_default();
        Record {
            topic,
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key: m.key().map(|k| k.to_vec()),
            value: m.payload().map(|v| v.to_vec()),
            headers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fetch size default yields to a larger `message.max.bytes` (which
    /// librdkafka would refuse it against), and to the operator's own; every
    /// consumer default yields to the operator's, and librdkafka accepts
    /// them.
    #[test]
    fn the_fetch_size_default_yields_to_a_larger_record_size() {
        let kafka = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let fetch = |m: &BTreeMap<String, String>| {
            client_config(&CONSUMER_DEFAULTS, m, &[]).get("fetch.max.bytes").map(str::to_owned)
        };
        assert_eq!(fetch(&kafka(&[])).as_deref(), Some("1048576"));
        assert_eq!(fetch(&kafka(&[("message.max.bytes", "1000")])).as_deref(), Some("1048576"));
        assert_eq!(fetch(&kafka(&[("message.max.bytes", "8388608")])).as_deref(), Some("8388608"));
        assert_eq!(fetch(&kafka(&[("receive.message.max.bytes", "1000600")])).as_deref(), Some("1000088"));
        let own = kafka(&[("message.max.bytes", "8388608"), ("fetch.max.bytes", "52428800")]);
        assert_eq!(fetch(&own).as_deref(), Some("52428800"));
        // The other defaults are set, and yield to the operator's.
        let backoff = |m: &BTreeMap<String, String>| {
            client_config(&CONSUMER_DEFAULTS, m, &[]).get(FETCH_QUEUE_BACKOFF.0).map(str::to_owned)
        };
        assert_eq!(backoff(&kafka(&[])).as_deref(), Some("10"));
        assert_eq!(backoff(&kafka(&[("fetch.queue.backoff.ms", "500")])).as_deref(), Some("500"));
        // Clients without the default (producers) are left alone.
        let producer = client_config(&[], &kafka(&[("message.max.bytes", "8388608")]), &[]);
        assert_eq!(producer.get("fetch.max.bytes"), None);
        // librdkafka accepts what comes out.
        for (k, v) in
            [("message.max.bytes", "1000"), ("message.max.bytes", "8388608"), ("receive.message.max.bytes", "1000600")]
        {
            let consumer: Result<rdkafka::consumer::BaseConsumer, _> =
                client_config(&CONSUMER_DEFAULTS, &kafka(&[(k, v)]), &[("group.id", "t")]).create();
            assert!(consumer.is_ok(), "{k} = {v}: {:?}", consumer.err());
        }
    }

    /// Records of one topic share its name; another topic gets its own.
    #[test]
    fn topic_names_are_shared_until_the_topic_changes() {
        let mut names = TopicNames::default();
        let (a, b) = (names.of("ops.events"), names.of("ops.events"));
        assert!(Arc::ptr_eq(&a, &b));
        let c = names.of("ops.verdicts");
        assert_eq!(&*c, "ops.verdicts");
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(&*names.of("ops.events"), "ops.events");
    }

    /// What waits out a broker outage and what stops the instance.
    #[test]
    fn refusals_no_retry_can_cure_are_not_retriable() {
        let refused = |code| KafkaError::Refused { context: "producing".into(), code };
        let failed = |code| KafkaError::NotAcknowledged { failed: 3, code };
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::MessageSizeTooLarge,
        ] {
            assert!(!refused(code).retriable(), "{code:?}");
            assert!(!failed(code).retriable(), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert!(failed(code).retriable(), "{code:?}");
        }
        let produce = rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(!KafkaError::client("sending")(produce).retriable());
        let produce = rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull);
        assert!(KafkaError::client("sending")(produce).retriable());
        assert!(KafkaError::AckTimeout { missing: 1, timeout: Duration::from_secs(30) }.retriable());
        assert!(!KafkaError::UnknownTopic("t".into()).retriable());
        assert!(
            !KafkaError::NotAuthorized { topic: "t".into(), operation: "Write", purpose: "publish".into() }.retriable()
        );
    }
}
