//! `reconciler relay`: publishes the outbox's committed rows to the input
//! topic (see [`super::claim`] for the guarantees of one round).
//!
//! The loop: claim a batch, hand every row to the producer, await each
//! acknowledgement, mark the acknowledged prefix of each entity published
//! and record the failures, commit. A full batch is followed at once by
//! the next; otherwise the relay waits for the outbox trigger's
//! notification (`LISTEN reconciler_outbox`) or `poll_interval_ms`,
//! whichever comes first, so a lost notification costs latency, not rows.
//!
//! Failures, by whose fault they are:
//! - the broker unreachable or slow (an outage): no row is charged an
//!   attempt, the relay pauses with a growing, jittered back-off and
//!   tries again; rows wait however long the outage lasts;
//! - a row the broker refuses (too large, invalid): the row's attempts
//!   grow, it is retried after its own back-off, and after
//!   `max_attempts` it becomes `dead_letter` with the error;
//! - every row refused for a reason that is not its own (no permission, no
//!   such topic): no row is charged, readiness turns red, the relay pauses
//!   like in an outage, and after `give_up_after_ms` of nothing else it
//!   stops with [`RelayError::PublishRefused`] (a non-zero exit), the rows
//!   still pending, instead of retrying forever what only a person can fix;
//! - PostgreSQL unreachable: the relay reconnects with the same back-off;
//!   a claim cut short by it is rolled back by the server, so its rows are
//!   pending again (and published again if they already were).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Registry;
use rdkafka::error::RDKafkaErrorCode;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tracing::{info, warn};

use super::claim::{self, Claimed};
use super::{OutboxError, CHANNEL};
use crate::config::{Config, ConfigError, OnPublished, RelayConfig};
use crate::crash::{self, CrashPoint};
use crate::kafka::keyed::{KeyedProducer, Sent};
use crate::kafka::watermarks::Watermarks;
use crate::kafka::KafkaError;
use crate::metrics::{RelayFailure, RelayMetrics};

/// The header that names the outbox row a record was published from (the
/// same on a re-publication, so duplicates stay byte-identical).
pub const OUTBOX_ID_HEADER: &str = "reconciler.outbox.id";

/// Why the relay could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// `[relay]` or `[kafka]` is misconfigured.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker refused the relay at start-up (credentials, no topic).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The outbox failed in a way retrying does not cure (no table).
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The relay's runtime could not start.
    #[error("starting the relay's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The broker refused every row for a reason that is not the row's (no
    /// permission, no such topic) for `[relay] give_up_after_ms`: the relay
    /// stops instead of retrying forever; the rows stay pending.
    #[error("publishing the outbox was refused for {seconds} s for a reason retrying does not cure: {error}")]
    PublishRefused {
        /// How long it kept trying.
        seconds: u64,
        /// The last refusal.
        error: String,
    },
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows acknowledged and marked published (or deleted).
    pub published: usize,
    /// Rows refused by the broker and charged an attempt.
    pub failed: usize,
    /// Of those, rows that became dead letters.
    pub dead_lettered: usize,
    /// An outage or refusal for every row that cut the round short: the
    /// loop pauses before the next one.
    pub stalled: Option<(RelayFailure, RDKafkaErrorCode)>,
}

/// How a publish failure counts (see the module's documentation).
fn classify(code: RDKafkaErrorCode) -> RelayFailure {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::InvalidRecord
        | C::InvalidMessage
        | C::UnsupportedForMessageFormat
        | C::BadMessage => RelayFailure::Row,
        c if crate::kafka::fatal_code(c) => RelayFailure::Refused,
        _ => RelayFailure::Outage,
    }
}

/// The relay's connections to PostgreSQL: one for the claims, one that
/// listens for the outbox trigger's notifications.
struct Db {
    client: Client,
    listener: tokio::task::JoinHandle<()>,
    _listening: Client,
}

impl Db {
    async fn connect(connection: &str, delivery_timeout: Duration, wake: Arc<Notify>) -> Result<Db, OutboxError> {
        let client = super::connect(connection).await?;
        client
            .batch_execute(&claim::session_settings(delivery_timeout))
            .await
            .map_err(OutboxError::db("setting up the session"))?;
        super::check_sequence(&client).await?;
        let (listening, mut conn) =
            tokio_postgres::connect(connection, NoTls).await.map_err(OutboxError::db("connecting to PostgreSQL"))?;
        let listener = tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "relay: the LISTEN connection closed (polling goes on)");
                        break;
                    }
                }
            }
        });
        listening
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(OutboxError::db("listening for outbox notifications"))?;
        Ok(Db { client, listener, _listening: listening })
    }

    fn broken(&self) -> bool {
        self.client.is_closed() || self.listener.is_finished()
    }
}

/// The outbox relay.
pub struct Relay {
    cfg: RelayConfig,
    kafka: BTreeMap<String, String>,
    max_message_bytes: usize,
    topic: String,
    connection: String,
    producer: KeyedProducer,
    metrics: RelayMetrics,
}

impl Relay {
    /// A relay for `cfg`, its metrics registered in `registry`. Checks what
    /// can be checked before the first row: `[relay]`, the connection
    /// string's variable, the broker's answer to the credentials and that
    /// `[topics] events` exists.
    pub fn new(cfg: &Config, registry: &Registry) -> Result<Relay, RelayError> {
        cfg.relay.validate()?;
        let connection = cfg.relay.connection()?;
        crate::kafka::connect::check_credentials(&cfg.kafka)?;
        Watermarks::partition_count_once(&cfg.kafka, &cfg.topics.events)?;
        let max_message_bytes = cfg.consumer.max_record_bytes;
        Ok(Relay {
            producer: KeyedProducer::new(&cfg.kafka, max_message_bytes, cfg.relay.delivery_timeout())?,
            cfg: cfg.relay.clone(),
            kafka: cfg.kafka.clone(),
            max_message_bytes,
            topic: cfg.topics.events.clone(),
            connection,
            metrics: RelayMetrics::new(registry),
        })
    }

    fn runtime() -> Result<tokio::runtime::Runtime, RelayError> {
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(RelayError::Runtime)
    }

    /// Its readiness, for the `/readyz` of its server.
    pub fn readiness(&self) -> crate::metrics::RelayReadiness {
        self.metrics.readiness()
    }

    /// Applies `sql/outbox.sql` (idempotent).
    pub fn install(&self) -> Result<(), RelayError> {
        Relay::runtime()?.block_on(async {
            super::install(&super::connect(&self.connection).await?).await?;
            info!("relay: outbox schema installed");
            Ok(())
        })
    }

    /// Runs until `shutdown` is set (the round in hand is finished first).
    pub fn run(&mut self, shutdown: &AtomicBool) -> Result<(), RelayError> {
        Relay::runtime()?.block_on(self.serve(shutdown))
    }

    async fn serve(&mut self, shutdown: &AtomicBool) -> Result<(), RelayError> {
        let wake = Arc::new(Notify::new());
        let mut db: Option<Db> = None;
        // Consecutive rounds that failed for the broker's or the database's
        // sake: the exponent of the pause.
        let mut stalls = 0u32;
        let mut counted: Option<Instant> = None;
        let count_every = Duration::from_millis(self.cfg.count_interval_ms);
        // Since when every round has been refused for a reason that is not
        // the rows' (see [`Relay::refusal`]).
        let mut refused_since: Option<Instant> = None;
        info!(topic = %self.topic, batch_size = self.cfg.batch_size, "relay: started");
        while !shutdown.load(Ordering::Relaxed) {
            if db.as_ref().is_none_or(Db::broken) {
                db = match Db::connect(&self.connection, self.cfg.delivery_timeout(), wake.clone()).await {
                    Ok(d) => Some(d),
                    Err(e @ (OutboxError::NoTable | OutboxError::Invalid(_))) => return Err(e.into()),
                    Err(e) => {
                        stalls += 1;
                        warn!(error = %e, "relay: PostgreSQL unreachable; retrying");
                        self.pause(stalls, shutdown).await;
                        continue;
                    }
                };
            }
            let d = db.as_mut().expect("connected above");
            if counted.is_none_or(|t| t.elapsed() >= count_every) {
                counted = Some(Instant::now());
                match claim::waiting(&d.client).await {
                    Ok(all) => all.iter().for_each(|w| self.metrics.set_outbox(w.status, w.rows, w.oldest_age_secs)),
                    Err(OutboxError::NoTable) => return Err(OutboxError::NoTable.into()),
                    Err(e) => warn!(error = %e, "relay: counting the outbox failed"),
                }
            }
            match self.round(&mut d.client).await {
                Ok(r) => {
                    self.judge_refusal(&r, &mut refused_since).await?;
                    if let Some((class, code)) = r.stalled {
                        stalls += 1;
                        warn!(class = class.label(), error = %code, published = r.published, "relay: publishing failed; pausing");
                        self.pause(stalls, shutdown).await;
                        continue;
                    }
                    stalls = 0;
                    if r.claimed < self.cfg.batch_size {
                        self.idle(&wake, shutdown).await;
                    }
                }
                Err(OutboxError::NoTable) => return Err(OutboxError::NoTable.into()),
                Err(e) => {
                    stalls += 1;
                    warn!(error = %e, "relay: a round failed; reconnecting");
                    db = None;
                    self.pause(stalls, shutdown).await;
                }
            }
        }
        self.producer.flush(Duration::from_secs(5));
        info!("relay: stopped");
        Ok(())
    }

    /// Keeps readiness and `refused_since` up to date with round `r`: red
    /// from the first round whose rows were all refused for a reason that
    /// is not theirs, green again at the first round that claimed rows and
    /// was not; an error once that has lasted `give_up_after_ms` (the rows
    /// stay pending, so nothing is lost by stopping). Empty rounds say
    /// nothing either way.
    async fn judge_refusal(&self, r: &Round, refused_since: &mut Option<Instant>) -> Result<(), RelayError> {
        let readiness = self.metrics.readiness();
        let refusal = match r.stalled {
            Some((RelayFailure::Refused, code)) if r.published == 0 => Some(format!("{code:?}: {code}")),
            Some((RelayFailure::Outage, _)) if r.published == 0 => self.topic_refused().await,
            _ => None,
        };
        let Some(error) = refusal else {
            if r.claimed > 0 && refused_since.take().is_some() {
                info!("relay: publishing accepted again; ready");
                readiness.set_refused(None);
            }
            return Ok(());
        };
        let since = *refused_since.get_or_insert_with(Instant::now);
        readiness.set_refused(Some(error.clone()));
        let seconds = since.elapsed().as_secs();
        if since.elapsed() >= self.cfg.give_up_after() {
            tracing::error!(
                error,
                seconds,
                "relay: every row keeps being refused for a reason retrying does not cure; stopping"
            );
            return Err(RelayError::PublishRefused { seconds, error });
        }
        tracing::error!(
            error,
            seconds,
            "relay: every row refused: this needs a person (permissions, topics); retrying until give_up_after_ms"
        );
        Ok(())
    }

    /// After a round that failed like an outage: whether the real cause is
    /// the topic, gone or not this client's to describe. librdkafka
    /// reports a topic missing from the metadata as a delivery timeout when
    /// `message.timeout.ms` ends before `topic.metadata.propagation.max.ms`
    /// does, which would otherwise be waited out forever.
    async fn topic_refused(&self) -> Option<String> {
        let (kafka, topic) = (self.kafka.clone(), self.topic.clone());
        let answer = tokio::task::spawn_blocking(move || {
            let marks = Watermarks::new(&kafka)?;
            let exists = marks.exists(&topic).map(|e| (e, topic));
            crate::kafka::drop_in_background(marks);
            exists
        })
        .await
        .ok()?;
        match answer {
            Ok((false, topic)) => Some(KafkaError::UnknownTopic(topic).to_string()),
            Err(e @ KafkaError::NotAuthorized { .. }) => Some(e.to_string()),
            _ => None,
        }
    }

    /// One claim, publish and commit (see [`claim`]).
    pub async fn round(&mut self, client: &mut Client) -> Result<Round, OutboxError> {
        let began = Instant::now();
        let tx = client.transaction().await.map_err(OutboxError::db("starting a claim"))?;
        let rows = claim::claim(&tx, self.cfg.batch_size).await?;
        let claimed = began.elapsed();
        self.metrics.round();
        let mut round = Round { claimed: rows.len(), ..Round::default() };
        if rows.is_empty() {
            tx.commit().await.map_err(OutboxError::db("ending an empty claim"))?;
            return Ok(round);
        }
        let results = self.publish(&rows).await;
        let acknowledged = began.elapsed();
        crash::point(CrashPoint::RelayPublished);

        // Each entity's acknowledged prefix is published; its first failure
        // is charged (if it is the row's fault) and stops the entity.
        let mut stopped: HashSet<&str> = HashSet::new();
        let mut done = Vec::with_capacity(rows.len());
        let mut charged: Vec<(&Claimed, RDKafkaErrorCode)> = Vec::new();
        for (row, result) in rows.iter().zip(&results) {
            if stopped.contains(row.entity_id.as_str()) {
                continue;
            }
            match result {
                Some(Ok(())) => done.push(row.id),
                Some(Err(code)) => {
                    stopped.insert(&row.entity_id);
                    match classify(*code) {
                        RelayFailure::Row => charged.push((row, *code)),
                        class => {
                            self.metrics.failed(class, 1);
                            round.stalled.get_or_insert((class, *code));
                        }
                    }
                }
                None => {
                    stopped.insert(&row.entity_id);
                }
            }
        }
        claim::published(&tx, &done, self.cfg.on_published == OnPublished::Delete).await?;
        for (row, code) in &charged {
            let attempt = u32::try_from(row.attempts).unwrap_or(0) + 1;
            let retry_in = self.cfg.backoff(attempt, fastrand::f64());
            let error = format!("{code:?}: {code}");
            if claim::failed(&tx, row.id, &error, self.cfg.max_attempts, retry_in).await? {
                round.dead_lettered += 1;
                warn!(id = row.id, entity = %row.entity_id, error, "relay: outbox row moved to dead_letter");
            }
        }
        tx.commit().await.map_err(OutboxError::db("committing a claim"))?;
        tracing::debug!(
            rows = rows.len(),
            claim_ms = claimed.as_millis() as u64,
            publish_ms = (acknowledged - claimed).as_millis() as u64,
            mark_ms = (began.elapsed() - acknowledged).as_millis() as u64,
            "relay: round"
        );
        round.published = done.len();
        round.failed = charged.len();
        self.metrics.published(round.published);
        self.metrics.failed(RelayFailure::Row, round.failed);
        self.metrics.dead_lettered(round.dead_lettered);
        if let Some((_, code)) = round.stalled {
            // Every record of the round was reported on, so none is in
            // flight: a new producer (new producer id, sequences from 0)
            // cannot reorder or lose anything. The old one may be what the
            // broker now refuses: a fatal idempotence state, or (tansu
            // 0.6) every produce of a producer that lived through the
            // broker's restart answered with UNKNOWN_SERVER_ERROR.
            tracing::debug!(error = %code, "relay: replacing the producer after a failed round");
            match KeyedProducer::new(&self.kafka, self.max_message_bytes, self.cfg.delivery_timeout()) {
                Ok(p) => self.producer = p,
                Err(e) => warn!(error = %e, "relay: creating a new producer failed"),
            }
        }
        Ok(round)
    }

    /// Hands every row to the producer in id order and awaits each
    /// acknowledgement: per row, `Some` result, or `None` when the row was
    /// not sent because an earlier row of its entity was refused at once.
    async fn publish(&self, rows: &[Claimed]) -> Vec<Option<Result<(), RDKafkaErrorCode>>> {
        let mut results = vec![None; rows.len()];
        let mut refused: HashSet<&str> = HashSet::new();
        let mut sent: Vec<(usize, Sent)> = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            if refused.contains(row.entity_id.as_str()) {
                continue;
            }
            let id = row.id.to_string();
            match self.producer.send(&self.topic, &row.entity_id, &row.event, &[(OUTBOX_ID_HEADER, id.as_bytes())]) {
                Ok(s) => sent.push((i, s)),
                Err(code) => {
                    refused.insert(&row.entity_id);
                    results[i] = Some(Err(code));
                }
            }
        }
        for (i, s) in sent {
            results[i] = Some(s.acknowledged().await);
        }
        results
    }

    /// Waits out the back-off of the `stalls`-th failure in a row.
    async fn pause(&self, stalls: u32, shutdown: &AtomicBool) {
        let until = Instant::now() + self.cfg.backoff(stalls, fastrand::f64());
        while !shutdown.load(Ordering::Relaxed) && Instant::now() < until {
            tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(SLICE)).await;
        }
    }

    /// Waits for a notification or `poll_interval_ms`, whichever is first.
    async fn idle(&self, wake: &Notify, shutdown: &AtomicBool) {
        let until = Instant::now() + Duration::from_millis(self.cfg.poll_interval_ms);
        while !shutdown.load(Ordering::Relaxed) && Instant::now() < until {
            let slice = until.saturating_duration_since(Instant::now()).min(SLICE);
            if tokio::time::timeout(slice, wake.notified()).await.is_ok() {
                return;
            }
        }
    }
}

/// How often a wait looks at the shutdown flag.
const SLICE: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_of_the_row_itself_are_charged_to_it() {
        use RDKafkaErrorCode as C;
        assert_eq!(classify(C::MessageSizeTooLarge), RelayFailure::Row);
        assert_eq!(classify(C::InvalidRecord), RelayFailure::Row);
        for outage in
            [C::MessageTimedOut, C::AllBrokersDown, C::BrokerTransportFailure, C::QueueFull, C::NotLeaderForPartition]
        {
            assert_eq!(classify(outage), RelayFailure::Outage, "{outage:?}");
        }
        for refused in [C::TopicAuthorizationFailed, C::UnknownTopicOrPartition, C::Fatal] {
            assert_eq!(classify(refused), RelayFailure::Refused, "{refused:?}");
        }
    }
}
