//! `kind = "postgres"`: a parameterised query on the destination's own
//! database, through tokio-postgres. One connection per destination
//! (tokio-postgres pipelines concurrent queries on it), opened on first use
//! and again after it breaks.

use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use crate::config::{ConfigError, DestinationConfig};
use crate::core::event::ProbeErrorClass;
use crate::core::RepairCommand;

use super::destination::{check_judgeable, param, Answer, Finding, ProbeError};

/// A PostgreSQL destination.
pub struct PgDestination {
    name: String,
    connection: String,
    query: String,
    params: Vec<String>,
    client: Mutex<Option<(Arc<Client>, Statement)>>,
}

impl PgDestination {
    /// The destination `name` of `cfg` (validated); its connection string
    /// is read from the environment variable `connection_env` now.
    pub fn new(name: &str, cfg: &DestinationConfig) -> Result<PgDestination, ConfigError> {
        let var = cfg.connection_env.clone().unwrap_or_default();
        let connection = std::env::var(&var).map_err(|_| ConfigError::Invalid {
            field: format!("destinations.{name}.connection_env"),
            reason: format!("environment variable {var} is not set"),
        })?;
        connection.parse::<tokio_postgres::Config>().map_err(|e| ConfigError::Invalid {
            field: format!("destinations.{name}.connection_env"),
            reason: format!("{var} is not a PostgreSQL connection string: {e}"),
        })?;
        Ok(PgDestination {
            name: name.to_owned(),
            connection,
            query: cfg.query.clone().unwrap_or_default(),
            params: cfg.params.clone(),
            client: Mutex::new(None),
        })
    }

    /// The open connection and the prepared query, connecting first if
    /// there is none or the last one broke.
    async fn client(&self) -> Result<(Arc<Client>, Statement), ProbeError> {
        let mut slot = self.client.lock().await;
        if let Some((c, s)) = slot.as_ref() {
            if !c.is_closed() {
                return Ok((c.clone(), s.clone()));
            }
        }
        *slot = None;
        let (client, connection) = tokio_postgres::connect(&self.connection, NoTls).await.map_err(classify)?;
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(destination = %name, error = %e, "PostgreSQL connection closed");
            }
        });
        let statement = client.prepare(&self.query).await.map_err(classify)?;
        let client = Arc::new(client);
        *slot = Some((client.clone(), statement.clone()));
        Ok((client, statement))
    }

    /// Asks the database about `cmd`'s operation.
    pub async fn query(&self, cmd: &RepairCommand) -> Result<Answer, ProbeError> {
        let (client, statement) = self.client().await?;
        let texts: Vec<Option<String>> = self.params.iter().map(|p| param(cmd, p)).collect();
        // A missing value is refused, never bound as NULL: `= NULL` finds
        // nothing, and "nothing" would read as "no such effect".
        if let Some((p, _)) = self.params.iter().zip(&texts).find(|(_, t)| t.is_none()) {
            return Err(ProbeError::new(ProbeErrorClass::Rejected, format!("the command has no {p} for the query")));
        }
        let mut values: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(self.params.len());
        for (p, text) in self.params.iter().zip(&texts) {
            if p == "expected_version" {
                values.push(&cmd.expected_version);
            } else {
                values.push(text);
            }
        }
        let keys: Vec<String> =
            self.params.iter().zip(&texts).map(|(p, t)| format!("{p}={}", t.as_deref().unwrap_or("null"))).collect();
        let query = format!("postgres query of {} ({})", self.name, keys.join(", "));
        let rows = client.query(&statement, &values).await.map_err(|e| {
            let mut e = classify(e);
            e.detail = format!("{query}: {}", e.detail);
            e
        })?;
        let finding = match rows.as_slice() {
            [] => Finding::Absent,
            [row] => read(cmd, row).map_err(|mut e| {
                e.detail = format!("{query}: {}", e.detail);
                e
            })?,
            more => {
                return Err(ProbeError::new(
                    ProbeErrorClass::MalformedAnswer,
                    format!("{query}: {} rows, where at most one identifies the effect", more.len()),
                ))
            }
        };
        Ok(Answer { finding, query: format!("{query} -> {}", if rows.is_empty() { "no row" } else { "1 row" }) })
    }
}

/// The effect's values from the row's `remote_id`, `version` and
/// `fingerprint` columns (those it has).
fn read(cmd: &RepairCommand, row: &Row) -> Result<Finding, ProbeError> {
    let has = |c: &str| row.columns().iter().any(|col| col.name() == c);
    let malformed = |c: &str, e: tokio_postgres::Error| {
        ProbeError::new(ProbeErrorClass::MalformedAnswer, format!("column {c}: {e}"))
    };
    let remote_id = if has("remote_id") {
        match row.try_get::<_, Option<String>>("remote_id") {
            Ok(v) => v,
            Err(_) => row
                .try_get::<_, Option<i64>>("remote_id")
                .map_err(|e| malformed("remote_id", e))?
                .map(|n| n.to_string()),
        }
    } else {
        None
    };
    let version = if has("version") {
        match row.try_get::<_, Option<i64>>("version") {
            Ok(v) => v,
            Err(_) => row.try_get::<_, Option<i32>>("version").map_err(|e| malformed("version", e))?.map(i64::from),
        }
    } else {
        None
    };
    let fingerprint =
        if has("fingerprint") { row.try_get("fingerprint").map_err(|e| malformed("fingerprint", e))? } else { None };
    check_judgeable(cmd, version.is_some(), fingerprint.is_some())?;
    Ok(Finding::Present { remote_id, version, fingerprint })
}

/// A driver error as a probe failure: the server refusing the query (bad
/// SQL, a type mismatch, permissions) is a refusal; a connection that
/// cannot be made or broke, or a server out of resources or shutting
/// down, is unavailability.
fn classify(e: tokio_postgres::Error) -> ProbeError {
    let class = match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            // 08 connection, 53 resources, 57 operator intervention
            // (shutdown, statement timeout), 40 serialization failure and
            // deadlock, 55P03 lock not available: asking again may work.
            if ["08", "53", "57", "40"].iter().any(|c| code.starts_with(c)) || code == "55P03" {
                ProbeErrorClass::Unavailable
            } else {
                ProbeErrorClass::Rejected
            }
        }
        None if e.is_closed() => ProbeErrorClass::Unavailable,
        // No server error: either the connection failed (IO) or a value
        // could not be converted (a parameter of the wrong type).
        None => {
            if std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
                ProbeErrorClass::Unavailable
            } else {
                ProbeErrorClass::Rejected
            }
        }
    };
    let mut detail = e.to_string();
    if let Some(db) = e.as_db_error() {
        detail = format!("{} ({}): {}", db.severity(), db.code().code(), db.message());
    } else if let Some(s) = std::error::Error::source(&e) {
        detail = format!("{detail}: {s}");
    }
    ProbeError::new(class, detail)
}
