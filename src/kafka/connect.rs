//! The start-up check of the broker connection: credentials and TLS that
//! the broker refuses fail at once, with the reason, instead of a timeout.
//!
//! librdkafka treats a refused SASL login or a failed TLS handshake like a
//! broker that is down: it reports it once through the client's error
//! callback and then reconnects for ever, so the first call that needs the
//! broker only times out (creating topics: 30 s, "Local: Timed out"), and
//! the reason is a log line among others. Here a client asks for metadata
//! until it gets an answer, sees such a refusal, or 10 s pass; only
//! a refusal is an error. A broker that is merely unreachable is left to the
//! calls that follow (which wait, retry or fail as before).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;

use super::{client_config, KafkaError};

/// Remembers the first refusal the client reports.
#[derive(Default)]
struct Watch {
    refused: Mutex<Option<String>>,
}

impl ClientContext for Watch {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        // By code, or by the phrases of a refusal: not "SASL" alone, which
        // librdkafka's guess at any early disconnect contains ("broker
        // might require SASL authentication"), nor a bare TLS handshake
        // failure, which a reset mid-handshake gives too.
        let refused =
            matches!(code, Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed))
                || reason.contains("SASL authentication error")
                || reason.contains("certificate verify failed");
        if refused {
            self.refused.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| reason.to_owned());
        } else {
            tracing::debug!(%error, reason, "librdkafka (connection check)");
        }
    }
}

impl ConsumerContext for Watch {}

/// How long [`check_credentials`] waits for an answer or a refusal.
const PATIENCE: Duration = Duration::from_secs(10);

/// Connects with the `[kafka]` settings `kafka` and fails with
/// [`KafkaError::Authentication`] if the broker refuses the credentials or
/// the TLS handshake within [`PATIENCE`]; `Ok` once it answers, or when
/// that passes without an answer or a refusal.
pub fn check_credentials(kafka: &BTreeMap<String, String>) -> Result<(), KafkaError> {
    let client: BaseConsumer<Watch> = client_config(&[], kafka, &[("group.id", "reconciler-connection-check")])
        .create_with_context(Watch::default())
        .map_err(KafkaError::client("creating the connection check's client"))?;
    let until = Instant::now() + PATIENCE;
    let checked = loop {
        let answered = client.fetch_metadata(None, Duration::from_millis(250)).is_ok();
        // Error callbacks are served by polling (nothing is assigned: no
        // record can come).
        let _ = client.poll(Duration::ZERO);
        let refused = client.context().refused.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(reason) = refused {
            let brokers = kafka.get("bootstrap.servers").cloned().unwrap_or_default();
            break Err(KafkaError::Authentication { brokers, reason });
        }
        if answered || Instant::now() >= until {
            break Ok(());
        }
    };
    super::drop_in_background(client);
    checked
}
