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
pub mod progress;
pub mod render;
pub mod replay;
pub mod resolve;
pub mod review;
pub mod timeline;

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
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("operation {0} is not in the state store (never seen, or removed after retention)")]
    NotFound(String),
    #[error("refused: {decision} for operation {operation_id}: {refusal}; {}", accepted(.allowed))]
    Refused { operation_id: String, decision: &'static str, refusal: DecisionRefusal, allowed: Vec<Decision> },
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
