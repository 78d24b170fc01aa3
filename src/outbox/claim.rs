//! The SQL of one relay round, and why it neither loses, duplicates in
//! normal operation, nor reorders an entity's events.
//!
//! - **Who may publish what.** Only an entity's *oldest pending* row (its
//!   head) can be claimed, with `FOR UPDATE SKIP LOCKED`. The lock on the
//!   head is the lock on the entity: another relay skips the locked head,
//!   and every later row of the entity is not a head while the head is
//!   pending, so no second relay touches the entity until the first one
//!   commits. The claiming relay then reads the entity's later pending
//!   rows (unlocked: nobody else can claim them) and publishes them all in
//!   id order, one partition per entity, with the idempotent producer.
//! - **Id order is commit order.** The outbox's trigger takes a
//!   per-entity advisory lock held to commit before it draws the row's id
//!   (`sql/outbox.sql`), so of two transactions writing one entity's
//!   events the later one draws larger ids, and a relay never sees a row
//!   whose predecessor is still uncommitted.
//! - **Published means acknowledged.** Rows are marked published (or
//!   deleted) in the claim's transaction, after the broker acknowledged
//!   them. A relay killed in between leaves them pending and unlocked (the
//!   server aborts its transaction), and they are published again, the
//!   same bytes: the reconciler's layer-1 dedup (event_id) absorbs them.
//! - **A failed row stops its entity for the round.** Rows after it are
//!   not marked, so they go out again after it: what a consumer first sees
//!   of an entity stays in order.

use std::time::Duration;

use tokio_postgres::{GenericClient, Transaction};

use super::{missing_table, OutboxError};

/// An outbox row claimed for publishing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The row's id (commit order within the entity).
    pub id: i64,
    /// The Kafka key.
    pub entity_id: String,
    /// The record's value: the event's Avro single-object bytes.
    pub event: Vec<u8>,
    /// Failed attempts so far.
    pub attempts: i32,
}

/// An entity's head is the row whose id is the smallest pending id of its
/// entity: one probe of the (entity_id, id) index per candidate, in id
/// order, stopping at the limit (about 5 ms for 1,000 heads of 100,000
/// pending rows, given the plan [`session_settings`] makes sure of).
const CLAIM_HEADS: &str = "\
SELECT o.entity_id, o.id FROM reconciler_outbox o
WHERE o.status = 'pending' AND o.next_attempt_at <= now()
  AND o.id = (SELECT min(p.id) FROM reconciler_outbox p
              WHERE p.status = 'pending' AND p.entity_id = o.entity_id)
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED";

/// Set on the relay's claiming connection (`delivery_timeout`: how long a
/// claim may wait for the broker inside its transaction).
///
/// - READ COMMITTED whatever the database's default: the claim's `FOR
///   UPDATE SKIP LOCKED` re-checks a row another relay just changed rather
///   than failing the transaction (as it would under REPEATABLE READ).
/// - A claim idle in its transaction for longer than it can legitimately
///   wait for the broker is ended by the server, so a relay frozen or cut
///   off (not killed: a kill closes the socket) does not keep its entities
///   locked until TCP gives up.
/// - The claim's plan must be the ordered index scan that stops at the
///   limit whatever the table's statistics say. Measured with `EXPLAIN
///   ANALYZE` on PostgreSQL 15 with 100,000 pending rows, 1,000 heads
///   claimed: without statistics (a new table, or one that grew since
///   autovacuum last analyzed it) the planner chose a bitmap scan of every
///   pending row, 212 ms against 5 ms with bitmap scans off; with
///   statistics the plan was right but its estimated cost high enough for
///   the JIT, which took ~180 ms to compile a 5 ms query. Every query of
///   the relay is meant to walk an index, so neither setting costs it
///   anything elsewhere.
pub fn session_settings(delivery_timeout: Duration) -> String {
    let idle_ms = delivery_timeout.as_millis() + 30_000;
    format!(
        "SET default_transaction_isolation = 'read committed'; \
         SET idle_in_transaction_session_timeout = {idle_ms}; SET jit = off; SET enable_bitmapscan = off"
    )
}

/// The rows of the claimed entities from their heads on: never a row
/// older than the head this claim locked (a dead letter re-driven since
/// the heads were read is the next claim's head, not this one's).
const ENTITY_ROWS: &str = "\
SELECT o.id, o.entity_id, o.event, o.attempts
FROM reconciler_outbox o JOIN unnest($1::text[], $2::int8[]) AS h(entity_id, head)
  ON o.entity_id = h.entity_id AND o.id >= h.head
WHERE o.status = 'pending'
ORDER BY o.id
LIMIT $3";

/// Claims up to `limit` rows in `tx`: the heads of up to `limit` entities no
/// other relay holds, and their entities' later pending rows, in id order.
/// Each entity's rows come as a prefix of its pending rows (an entity's
/// head has its smallest id).
pub async fn claim(tx: &Transaction<'_>, limit: usize) -> Result<Vec<Claimed>, OutboxError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let heads = tx.query(CLAIM_HEADS, &[&limit]).await.map_err(|e| missing_table(e, "claiming outbox rows"))?;
    if heads.is_empty() {
        return Ok(Vec::new());
    }
    let entities: Vec<String> = heads.iter().map(|r| r.get(0)).collect();
    let ids: Vec<i64> = heads.iter().map(|r| r.get(1)).collect();
    let rows =
        tx.query(ENTITY_ROWS, &[&entities, &ids, &limit]).await.map_err(OutboxError::db("reading claimed rows"))?;
    Ok(rows
        .iter()
        .map(|r| Claimed { id: r.get(0), entity_id: r.get(1), event: r.get(2), attempts: r.get(3) })
        .collect())
}

/// Marks rows `ids` published, or deletes them (`delete`).
pub async fn published(tx: &Transaction<'_>, ids: &[i64], delete: bool) -> Result<(), OutboxError> {
    if ids.is_empty() {
        return Ok(());
    }
    let sql = if delete {
        "DELETE FROM reconciler_outbox WHERE id = ANY($1)"
    } else {
        "UPDATE reconciler_outbox SET status = 'published', published_at = now(), last_error = NULL WHERE id = ANY($1)"
    };
    tx.execute(sql, &[&ids]).await.map_err(OutboxError::db("marking rows published"))?;
    Ok(())
}

/// Records a failed attempt of row `id` with `error`: it is tried again
/// after `retry_in`, or becomes `dead_letter` once it has failed
/// `max_attempts` times. Returns whether it became a dead letter.
pub async fn failed(
    tx: &Transaction<'_>,
    id: i64,
    error: &str,
    max_attempts: u32,
    retry_in: Duration,
) -> Result<bool, OutboxError> {
    let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    let ms = retry_in.as_secs_f64() * 1000.0;
    let row = tx
        .query_one(
            "UPDATE reconciler_outbox SET attempts = attempts + 1, last_error = $2,
                 status = CASE WHEN attempts + 1 >= $3 THEN 'dead_letter' ELSE 'pending' END,
                 next_attempt_at = now() + $4 * interval '1 millisecond'
             WHERE id = $1 RETURNING status",
            &[&id, &error, &max, &ms],
        )
        .await
        .map_err(OutboxError::db("recording a failed publish"))?;
    Ok(row.get::<_, &str>(0) == "dead_letter")
}

/// The rows of one status waiting in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// `pending` or `dead_letter`.
    pub status: &'static str,
    /// How many.
    pub rows: i64,
    /// When the oldest was written, ms since the epoch (`None`: none).
    pub oldest_ms: Option<i64>,
    /// Its age in seconds by the database's clock (0 when none).
    pub oldest_age_secs: f64,
}

/// The rows waiting in the outbox, by status (`pending`, then
/// `dead_letter`). One query per status, each with its status as a
/// constant, so that it reads that status's partial index and not the
/// table's published history.
pub async fn waiting(client: &impl GenericClient) -> Result<Vec<Waiting>, OutboxError> {
    let mut out = Vec::new();
    for status in ["pending", "dead_letter"] {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), (EXTRACT(EPOCH FROM min(created_at)) * 1000)::int8,
                            COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
                     FROM reconciler_outbox WHERE status = '{status}'"
                ),
                &[],
            )
            .await
            .map_err(|e| missing_table(e, "counting the outbox"))?;
        out.push(Waiting { status, rows: row.get(0), oldest_ms: row.get(1), oldest_age_secs: row.get(2) });
    }
    Ok(out)
}
