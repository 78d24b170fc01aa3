//! The outbox's dead letters: rows that failed `[relay] max_attempts` times
//! (the relay's dead-letter place, beside the reconciler's DLQ topic).
//!
//! [`summary`] is what the dead-letter monitor shows (`/api/dlq`, the
//! panel, `reconciler outbox dead-letters`); [`redrive`] makes chosen dead
//! letters pending again (attempts back to 0) and writes one row per dead
//! letter to `reconciler_outbox_redrive` in the same transaction: who,
//! when, why, and the error it had. A re-driven row is pending, so it is
//! not offered again; if it fails again it is a new dead letter. Audit and
//! status change commit together: a re-drive cut short leaves neither.

use serde::Serialize;
use tokio_postgres::{Client, GenericClient};

use super::{missing_table, OutboxError, CHANNEL};
use crate::codec::Codec;

/// One dead letter of the outbox.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxDeadLetter {
    /// The row's id.
    pub id: i64,
    /// The entity (the record's key).
    pub entity_id: String,
    /// The event's id and operation, when its bytes decode.
    pub event_id: Option<String>,
    /// The operation the event is about, when its bytes decode.
    pub operation_id: Option<String>,
    /// When the row was written, ms.
    pub created_at_ms: i64,
    /// Failed publishes.
    pub attempts: i32,
    /// The error class: the broker's error code name (`MessageSizeTooLarge`).
    pub class: String,
    /// The last error in full.
    pub last_error: String,
    /// Size of the event, bytes.
    pub event_bytes: usize,
}

/// Outbox dead letters of one class.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxClassCount {
    /// The error class.
    pub class: String,
    /// How many.
    pub count: i64,
    /// When the oldest was written, ms.
    pub oldest_ms: i64,
}

/// One re-drive of an outbox dead letter (a `reconciler_outbox_redrive` row).
#[derive(Debug, Clone, Serialize)]
pub struct OutboxRedrive {
    /// The row re-driven.
    pub outbox_id: i64,
    /// Who.
    pub actor: String,
    /// Why.
    pub note: String,
    /// The error it had.
    pub last_error: Option<String>,
    /// When, ms.
    pub at_ms: i64,
}

/// What the dead-letter monitor shows of the outbox.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxSummary {
    /// Dead letters waiting.
    pub dead_letters: i64,
    /// Rows pending (the backlog).
    pub pending: i64,
    /// When the oldest dead letter was written, ms.
    pub oldest_dead_letter_ms: Option<i64>,
    /// Dead letters by class, the largest first.
    pub by_class: Vec<OutboxClassCount>,
    /// Dead letters, the oldest first.
    pub samples: Vec<OutboxDeadLetter>,
    /// The latest re-drives, the latest first.
    pub audit: Vec<OutboxRedrive>,
}

/// A timestamp column as ms since the epoch.
fn ms(column: &str) -> String {
    format!("(EXTRACT(EPOCH FROM {column}) * 1000)::int8")
}

/// A dead letter's class: its `last_error` up to the first `:`, which the
/// relay writes as the broker's error code name (`MessageSizeTooLarge: ...`).
const CLASS: &str = "split_part(COALESCE(last_error, ''), ':', 1)";

/// The outbox's dead letters: counts by class, up to `samples` of them
/// (oldest first) and of the latest re-drives.
pub async fn summary(client: &impl GenericClient, samples: usize) -> Result<OutboxSummary, OutboxError> {
    let limit = i64::try_from(samples).unwrap_or(i64::MAX);
    let waiting = super::claim::waiting(client).await?;
    let of = |status: &str| waiting.iter().find(|w| w.status == status).cloned();
    let (dead, pending) = (of("dead_letter"), of("pending"));
    let by_class = client
        .query(
            &format!(
                "SELECT {CLASS} AS class, count(*), {}
                 FROM reconciler_outbox WHERE status = 'dead_letter' GROUP BY class ORDER BY count(*) DESC, class",
                ms("min(created_at)")
            ),
            &[],
        )
        .await
        .map_err(OutboxError::db("counting dead letters by class"))?
        .iter()
        .map(|r| OutboxClassCount { class: r.get(0), count: r.get(1), oldest_ms: r.get(2) })
        .collect();
    let codec = Codec::new();
    let rows = client
        .query(
            &format!(
                "SELECT id, entity_id, event, {}, attempts, COALESCE(last_error, ''), {CLASS}
                 FROM reconciler_outbox WHERE status = 'dead_letter' ORDER BY created_at, id LIMIT $1",
                ms("created_at")
            ),
            &[&limit],
        )
        .await
        .map_err(OutboxError::db("reading dead letters"))?;
    let samples = rows
        .iter()
        .map(|r| {
            let event: Vec<u8> = r.get(2);
            let decoded = codec.decode_event(&event).ok();
            OutboxDeadLetter {
                id: r.get(0),
                entity_id: r.get(1),
                event_id: decoded.as_ref().map(|e| e.event_id.clone()),
                operation_id: decoded.map(|e| e.operation_id),
                created_at_ms: r.get(3),
                attempts: r.get(4),
                class: r.get(6),
                last_error: r.get(5),
                event_bytes: event.len(),
            }
        })
        .collect();
    let audit = client
        .query(
            &format!(
                "SELECT outbox_id, actor, note, last_error, {} FROM reconciler_outbox_redrive
                 ORDER BY redriven_at DESC, id DESC LIMIT $1",
                ms("redriven_at")
            ),
            &[&limit],
        )
        .await
        .map_err(|e| missing_table(e, "reading the re-drive audit"))?
        .iter()
        .map(|r| OutboxRedrive {
            outbox_id: r.get(0),
            actor: r.get(1),
            note: r.get(2),
            last_error: r.get(3),
            at_ms: r.get(4),
        })
        .collect();
    Ok(OutboxSummary {
        dead_letters: dead.as_ref().map_or(0, |w| w.rows),
        pending: pending.map_or(0, |w| w.rows),
        oldest_dead_letter_ms: dead.and_then(|w| w.oldest_ms),
        by_class,
        samples,
        audit,
    })
}

/// Which outbox dead letters to re-drive: those with these ids and/or of
/// this class (both given: the ids, each of which must have the class).
#[derive(Debug, Clone, Default)]
pub struct OutboxSelection {
    /// These rows (each must be a dead letter, or nothing is re-driven).
    pub ids: Vec<i64>,
    /// Dead letters of this class.
    pub class: Option<String>,
}

/// What an outbox re-drive did (or would do).
#[derive(Debug, Clone, Serialize)]
pub struct OutboxRedriveReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// The dead letters re-driven (in a dry run: that would be), by id.
    pub ids: Vec<i64>,
    /// Who re-drove them.
    pub actor: String,
}

/// Makes the dead letters `sel` names pending again and audits each, in one
/// transaction (nothing in a dry run), and wakes the relays.
pub async fn redrive(
    client: &mut Client,
    sel: &OutboxSelection,
    actor: &str,
    note: &str,
    dry_run: bool,
) -> Result<OutboxRedriveReport, OutboxError> {
    let invalid = |m: String| OutboxError::Invalid(m);
    if sel.ids.is_empty() && sel.class.is_none() {
        return Err(invalid("choose what to re-drive: row ids or an error class".into()));
    }
    if !dry_run && actor.trim().is_empty() {
        return Err(invalid("say who re-drives: an actor is required (it goes to the audit)".into()));
    }
    let tx = client.transaction().await.map_err(OutboxError::db("starting a re-drive"))?;
    let chosen: Vec<(i64, String)> = tx
        .query(
            &format!(
                "SELECT id, entity_id FROM reconciler_outbox WHERE status = 'dead_letter'
                   AND (cardinality($1::int8[]) = 0 OR id = ANY($1))
                   AND ($2::text IS NULL OR {CLASS} = $2)
                 ORDER BY id FOR UPDATE"
            ),
            &[&sel.ids, &sel.class],
        )
        .await
        .map_err(|e| missing_table(e, "choosing dead letters"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let (chosen, entities): (Vec<i64>, Vec<String>) = chosen.into_iter().unzip();
    let absent: Vec<String> = sel.ids.iter().filter(|id| !chosen.contains(id)).map(i64::to_string).collect();
    if !absent.is_empty() {
        return Err(invalid(format!(
            "rows {} are not dead letters of the outbox{}; nothing was re-driven",
            absent.join(", "),
            if sel.class.is_some() { " of that class" } else { "" }
        )));
    }
    if !dry_run && !chosen.is_empty() {
        // Wait for any relay publishing these entities: a re-driven row
        // becomes its entity's head, and must not be claimed by a second
        // relay while the first still holds the entity. Rows are locked in
        // id order, so the head (an entity's smallest pending id) is waited
        // for before any row behind it is taken.
        tx.execute(
            "SELECT 1 FROM reconciler_outbox WHERE status = 'pending' AND entity_id = ANY($1) ORDER BY id FOR UPDATE",
            &[&entities],
        )
        .await
        .map_err(OutboxError::db("waiting for the relays of the re-driven entities"))?;
        tx.execute(
            "INSERT INTO reconciler_outbox_redrive (outbox_id, actor, note, last_error)
             SELECT id, $2, $3, last_error FROM reconciler_outbox WHERE id = ANY($1)",
            &[&chosen, &actor, &note],
        )
        .await
        .map_err(OutboxError::db("auditing a re-drive"))?;
        tx.execute(
            "UPDATE reconciler_outbox SET status = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL
             WHERE id = ANY($1)",
            &[&chosen],
        )
        .await
        .map_err(OutboxError::db("re-driving dead letters"))?;
        // Killed here, the transaction is rolled back: neither the audit
        // nor the new status exists, so the rows are still dead letters
        // and a re-drive after it is the first.
        crate::crash::point(crate::crash::CrashPoint::OutboxRedriven);
        tx.execute(&format!("NOTIFY {CHANNEL}"), &[]).await.map_err(OutboxError::db("waking the relays"))?;
        for id in &chosen {
            tracing::info!(id, actor, "Outbox dead letter re-driven");
        }
    }
    tx.commit().await.map_err(OutboxError::db("committing a re-drive"))?;
    Ok(OutboxRedriveReport { dry_run, ids: chosen, actor: actor.to_owned() })
}
