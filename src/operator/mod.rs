//! The operator's tools: what a person uses to investigate and decide the
//! cases the machine cannot. Library functions behind the CLI subcommands
//! (`explain`, `review`, `resolve`, `replay`, `dlq`) and the HTTP API.
//!
//! Readers take a `&Store`: the running pipeline's own handle (HTTP) or a
//! secondary instance opened beside a running `reconciler run`
//! ([`Store::open_secondary`](crate::store::Store::open_secondary), CLI).
//! Nothing here edits state: decisions and re-driven records go through the
//! input log and the pipeline applies them.

pub mod audit;
pub mod commands;
pub mod digest;
pub mod dlq;
pub mod explain;
pub mod fleet;
pub mod progress;
pub mod render;
pub mod replay;
pub mod resolve;
pub mod review;

pub use digest::{state_digest, StateDigest};
pub use explain::{explain, Explanation};
pub use resolve::{PreparedDecision, ResolveRequest};
pub use review::{review, ReviewFilter, ReviewItem};

use crate::codec::EncodeError;
use crate::core::event::Decision;
use crate::core::DecisionRefusal;
use crate::kafka::KafkaError;
use crate::pipeline::PipelineError;
use crate::store::StoreError;

/// Why an operator request failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The state store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading from or publishing to Kafka failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A decision event could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The replay's pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The schema registry could not be asked for a schema a record names.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    /// The outbox (PostgreSQL) failed or refused the request.
    #[error(transparent)]
    Outbox(#[from] crate::outbox::OutboxError),
    /// The configuration does not allow it (no control keys to sign a
    /// decision with, ...).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// No operation with this id in the store (never seen here, or removed
    /// after retention).
    #[error("operation {0} is not in the state store (never seen, or removed after retention)")]
    NotFound(String),
    /// The core refuses the decision in the operation's present state.
    #[error("refused: {decision} for operation {operation_id}: {refusal}; {}", accepted(.allowed))]
    Refused {
        /// The operation decided on.
        operation_id: String,
        /// The decision refused (`CONFIRM`, ...).
        decision: &'static str,
        /// Why the core refuses it.
        refusal: DecisionRefusal,
        /// The decisions the operation accepts now (possibly none).
        allowed: Vec<Decision>,
    },
    /// A request that cannot be carried out as given (empty actor, unknown
    /// error class, a used state directory, ...); the message says why.
    #[error("{0}")]
    Invalid(String),
}

/// What a refused person may do instead.
fn accepted(allowed: &[Decision]) -> String {
    if allowed.is_empty() {
        "it accepts no decision now (see `reconciler explain`)".to_owned()
    } else {
        format!("it accepts {} now", render::decisions(allowed))
    }
}

#[cfg(test)]
mod tests;
