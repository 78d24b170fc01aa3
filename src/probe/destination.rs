//! What a query of a destination returns, whatever the destination is, and
//! the adapter that asks it: one per `[destinations.<name>]`.

use std::time::Duration;

use crate::config::{ConfigError, DestinationConfig, DestinationKind};
use crate::core::event::ProbeErrorClass;
use crate::core::RepairCommand;

use super::http::HttpDestination;
use super::postgres::PgDestination;

/// What the destination holds for the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The effect is there, carrying these values (`None`: the destination
    /// has no such field for it).
    Present {
        /// The destination's id of the effect.
        remote_id: Option<String>,
        /// The version it carries.
        version: Option<i64>,
        /// The fingerprint it carries.
        fingerprint: Option<String>,
    },
    /// The destination has no such effect.
    Absent,
}

/// An answer and which query gave it (a sentence for `evidence_ref`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// What was found.
    pub finding: Finding,
    /// The query that found it, e.g. `GET http://crm/api/syncs/k-1 -> 200`.
    pub query: String,
}

/// A query that gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeError {
    /// Why.
    pub class: ProbeErrorClass,
    /// What happened, for a person.
    pub detail: String,
    /// How long the destination asked to be left alone (HTTP Retry-After).
    pub retry_after: Option<Duration>,
}

impl ProbeError {
    /// An error of `class`.
    pub fn new(class: ProbeErrorClass, detail: impl Into<String>) -> ProbeError {
        ProbeError { class, detail: detail.into(), retry_after: None }
    }

    /// Whether asking again may give an answer. A refused query or a
    /// malformed answer will be refused or malformed again: retrying those
    /// would only delay the case's review.
    pub fn retriable(&self) -> bool {
        matches!(
            self.class,
            ProbeErrorClass::Timeout
                | ProbeErrorClass::Unavailable
                | ProbeErrorClass::Throttled
                | ProbeErrorClass::CircuitOpen
        )
    }

    /// Whether the failure says the destination is unwell (it counts
    /// towards opening its circuit breaker). A refusal or a malformed
    /// answer came from a destination that is up.
    pub fn counts_against_destination(&self) -> bool {
        matches!(self.class, ProbeErrorClass::Timeout | ProbeErrorClass::Unavailable | ProbeErrorClass::Throttled)
    }
}

/// A field of the command a URL template or a query uses.
pub fn param(cmd: &RepairCommand, name: &str) -> Option<String> {
    match name {
        "idempotency_key" => cmd.idempotency_key.clone(),
        "operation_id" => Some(cmd.operation_id.clone()),
        "entity_id" => Some(cmd.entity_id.clone()),
        "expected_version" => cmd.expected_version.map(|v| v.to_string()),
        _ => None,
    }
}

/// Checks that an answer carries what the command needs to be judged: a
/// version when it expects one, a fingerprint when it expects one (a
/// missing field and a null are the same here). An answer without it is
/// malformed, never a guess.
pub fn check_judgeable(cmd: &RepairCommand, has_version: bool, has_fingerprint: bool) -> Result<(), ProbeError> {
    if cmd.expected_version.is_some() && !has_version {
        return Err(ProbeError::new(
            ProbeErrorClass::MalformedAnswer,
            format!(
                "the answer has no version, and the operation expects version {}",
                cmd.expected_version.unwrap_or_default()
            ),
        ));
    }
    if cmd.expected_fingerprint.is_some() && !has_fingerprint {
        return Err(ProbeError::new(
            ProbeErrorClass::MalformedAnswer,
            "the answer has no fingerprint, and the operation expects one",
        ));
    }
    Ok(())
}

/// The adapter of one destination.
pub enum Adapter {
    /// `kind = "http"`.
    Http(HttpDestination),
    /// `kind = "postgres"`.
    Postgres(PgDestination),
}

impl Adapter {
    /// The adapter of destination `name`; secrets are read from the
    /// environment here, so a missing one fails at start-up.
    pub fn build(name: &str, cfg: &DestinationConfig) -> Result<Adapter, ConfigError> {
        Ok(match cfg.kind {
            DestinationKind::Http => Adapter::Http(HttpDestination::new(name, cfg)?),
            DestinationKind::Postgres => Adapter::Postgres(PgDestination::new(name, cfg)?),
        })
    }

    /// Asks the destination about `cmd`'s operation (no timeout here: the
    /// caller bounds the whole query).
    pub async fn query(&self, cmd: &RepairCommand) -> Result<Answer, ProbeError> {
        match self {
            Adapter::Http(h) => h.query(cmd).await,
            Adapter::Postgres(p) => p.query(cmd).await,
        }
    }
}
