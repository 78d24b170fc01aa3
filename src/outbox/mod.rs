//! The producing side: a transactional outbox in PostgreSQL and the relay
//! that publishes it to the input topic.
//!
//! A service writes each lifecycle event into the outbox table in the same
//! transaction that changes its own data ([`enqueue`]; any language can do
//! the same with one INSERT, see `sql/outbox.sql`), so an event exists if
//! and only if the change committed. `reconciler relay`
//! ([`relay::Relay`]) claims committed rows with `FOR UPDATE SKIP
//! LOCKED`, publishes them keyed by entity with the idempotent producer
//! and marks them published: at least once, each entity's events in
//! commit order, however many relays run (see [`claim`] for why).
//!
//! - `claim`: the SQL of one relay round (one claimed batch): claim, mark,
//!   fail, count.
//! - `relay`: the loop: LISTEN/NOTIFY and polling, publishing, back-off.
//! - `dead_letter`: the rows that failed `max_attempts` times: list,
//!   re-drive (with a dry run and an audit record).

pub mod claim;
pub mod dead_letter;
pub mod relay;

use tokio_postgres::{Client, GenericClient, NoTls};

use crate::codec::{Codec, EncodeError};
use crate::core::event::Event;

/// The DDL of the outbox (`sql/outbox.sql`): idempotent, applied by
/// [`install`] and `reconciler relay --install`.
pub const SCHEMA: &str = include_str!("../../sql/outbox.sql");

/// The channel the outbox's trigger notifies on each commit.
pub const CHANNEL: &str = "reconciler_outbox";

/// An outbox operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// PostgreSQL failed or refused a statement.
    #[error("{context}: {source}")]
    Db {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The event could not be encoded.
    #[error("encoding the event: {0}")]
    Encode(#[from] EncodeError),
    /// A request that cannot be carried out as asked (nothing was done).
    #[error("{0}")]
    Invalid(String),
    /// The outbox table does not exist in the database.
    #[error("the database has no reconciler_outbox table: apply sql/outbox.sql (or run `reconciler relay --install`)")]
    NoTable,
    /// No connection could be taken from the pool (see [`pool`]).
    #[error("a connection to the outbox's database: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

impl OutboxError {
    pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> OutboxError {
        let context = context.into();
        move |source| OutboxError::Db { context, source }
    }
}

/// Creates the outbox table, its indexes and triggers when missing (every
/// statement of [`SCHEMA`] is idempotent).
///
/// Several relays starting with `--install` at once take turns (an
/// advisory lock over the whole script, which runs as one transaction),
/// and none waits more than 10 s for a lock on the table (writers' open
/// transactions): then the install fails and says so.
pub async fn install(client: &impl GenericClient) -> Result<(), OutboxError> {
    let script = format!(
        "BEGIN; SET LOCAL lock_timeout = '10s'; SELECT pg_advisory_xact_lock(hashtextextended('reconciler_outbox install', 0));\n{SCHEMA}\nCOMMIT;"
    );
    client.batch_execute(&script).await.map_err(OutboxError::db("installing the outbox schema"))
}

/// Refuses an id sequence with a cache (see `sql/outbox.sql`): ids would
/// no longer follow each entity's commit order.
pub async fn check_sequence(client: &impl GenericClient) -> Result<(), OutboxError> {
    let row = client
        .query_opt(
            "SELECT s.cache_size FROM pg_sequences s
             WHERE format('%I.%I', s.schemaname, s.sequencename)::regclass
                   = pg_get_serial_sequence('reconciler_outbox', 'id')::regclass",
            &[],
        )
        .await
        .map_err(|e| missing_table(e, "checking the outbox's id sequence"))?;
    match row.map(|r| r.get::<_, i64>(0)) {
        Some(1) => Ok(()),
        Some(n) => Err(OutboxError::Invalid(format!(
            "the outbox's id sequence has CACHE {n}: ids would not follow each entity's commit order; \
             ALTER SEQUENCE ... CACHE 1 (sql/outbox.sql says why)"
        ))),
        None => Err(OutboxError::NoTable),
    }
}

/// Writes `event` into the outbox within the caller's transaction
/// (`client` is a `tokio_postgres::Transaction`, or a client inside a
/// transaction it opened): it is published if and only if that
/// transaction commits. Returns the row's id.
///
/// Two transactions writing events of one entity wait for each other here
/// (the outbox's per-entity lock, held to commit), so the entity's events
/// are published in commit order. Write several entities' events in a
/// fixed order (say, sorted by entity) to keep two such transactions from
/// deadlocking.
///
/// Control events (`DeadlineReached`, `ManualDecision`, `ProbeFailed`) are
/// not for services: the relay does not sign them, so the reconciler
/// refuses them as forged.
pub async fn enqueue(client: &impl GenericClient, codec: &Codec, event: &Event) -> Result<i64, OutboxError> {
    let bytes = codec.encode_event(event)?;
    enqueue_bytes(client, &event.entity_id, &bytes).await
}

/// [`enqueue`] for an event already encoded (the Avro single-object bytes
/// of an OperationEvent whose `entity_id` is `entity_id`).
pub async fn enqueue_bytes(client: &impl GenericClient, entity_id: &str, event: &[u8]) -> Result<i64, OutboxError> {
    let row = client
        .query_one(
            "INSERT INTO reconciler_outbox (entity_id, event) VALUES ($1, $2) RETURNING id",
            &[&entity_id, &event],
        )
        .await
        .map_err(|e| missing_table(e, "writing to the outbox"))?;
    Ok(row.get(0))
}

/// `e`, or [`OutboxError::NoTable`] when it says the table is missing.
pub(crate) fn missing_table(e: tokio_postgres::Error, context: &str) -> OutboxError {
    if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
        OutboxError::NoTable
    } else {
        OutboxError::db(context)(e)
    }
}

/// Most connections the HTTP API of one instance holds to the outbox's
/// database. It is the services' database, not the reconciler's: a panel
/// left open, or many, must not take its connection slots.
pub const POOL_SIZE: usize = 2;

/// A pool of at most `size` connections to the outbox's database
/// (`connection`: a connection string), opened on demand on the current
/// tokio runtime and reused; a connection found closed is replaced.
pub fn pool(connection: &str, size: usize) -> Result<deadpool_postgres::Pool, OutboxError> {
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
    let config: tokio_postgres::Config =
        connection.parse().map_err(OutboxError::db("parsing the connection string"))?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| OutboxError::Invalid(format!("building the outbox's connection pool: {e}")))
}

/// A connection to the outbox's database, its driver task spawned on the
/// current runtime.
pub async fn connect(connection: &str) -> Result<Client, OutboxError> {
    let (client, conn) =
        tokio_postgres::connect(connection, NoTls).await.map_err(OutboxError::db("connecting to PostgreSQL"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "outbox connection closed");
        }
    });
    Ok(client)
}
