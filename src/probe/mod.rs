//! `reconciler probe`: the worker that asks destinations whether an effect
//! exists, so that an AMBIGUOUS/PROBE verdict is settled without a person
//! (query by the idempotency key; the same version confirms, nothing found
//! schedules a new send, another version goes to review).
//!
//! It consumes the PROBE commands the pipeline publishes, queries the
//! operation's destination (`[destinations.<name>]`: HTTP or PostgreSQL),
//! and publishes the answer to the input topic as an `EffectObserved` or
//! `EffectAbsent` of source DESTINATION_QUERY, or a `ProbeFailed` once its
//! retry budget is spent. The pipeline judges the answer when it consumes
//! it, like any event, so a replay needs no destination.
//!
//! - [`destination`]: what a query returns, and the adapter enum;
//! - [`http`], [`postgres`]: the two adapters;
//! - [`guard`]: concurrency and rate limits, timeout, circuit breaker,
//!   back-off;
//! - [`answer`]: the answer event (pure, deterministic id);
//! - [`ledger`]: the worker's store (answers given, offsets);
//! - [`worker`]: the loop.

pub mod answer;
pub mod destination;
pub mod guard;
pub mod http;
pub mod ledger;
pub mod postgres;
pub mod worker;

pub use worker::{ProbeWorker, WorkerError};
