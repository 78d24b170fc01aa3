//! Kafka adapters: client configuration, the consumer-group member, the
//! acknowledged publisher and topic administration. Everything here speaks
//! the Kafka protocol through librdkafka and nothing else.

pub mod admin;
pub mod consumer;
pub mod producer;
pub mod reader;

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

/// An error from the Kafka client, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("{context}: {source}")]
    Client {
        context: String,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("{0}")]
    Other(String),
}

impl KafkaError {
    pub(crate) fn client(context: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
        let context = context.into();
        move |source| KafkaError::Client { context, source }
    }
}

/// A client configuration: `defaults` first, then the `[kafka]`
/// passthrough map (the operator's word), then `required` (settings the
/// reconciler's correctness depends on, which nothing may override).
pub fn client_config(
    defaults: &[(&str, &str)],
    passthrough: &BTreeMap<String, String>,
    required: &[(&str, &str)],
) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in defaults {
        cfg.set(*k, *v);
    }
    for (k, v) in passthrough {
        cfg.set(k, v);
    }
    for (k, v) in required {
        cfg.set(*k, *v);
    }
    cfg
}

/// Consumer defaults: a short fetch wait, so an event (or a timer written
/// into the log) is seen within milliseconds on a quiet topic.
pub const CONSUMER_DEFAULTS: [(&str, &str); 1] = [("fetch.wait.max.ms", "50")];

/// An owned copy of a consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// Copies a borrowed message.
    pub fn from_message<M: rdkafka::Message>(m: &M) -> Record {
        use rdkafka::message::Headers;
        let headers = m
            .headers()
            .map(|hs| hs.iter().map(|h| (h.key.to_owned(), h.value.map(|v| v.to_vec()))).collect())
            .unwrap_or_default();
        Record {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key: m.key().map(|k| k.to_vec()),
            value: m.payload().map(|v| v.to_vec()),
            headers,
        }
    }

    /// Bytes of key, value and headers (for the size limit).
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self.headers.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len)).sum::<usize>()
    }
}
