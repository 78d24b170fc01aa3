//! # reconciler
//!
//! A Kafka stream processor that proves whether asynchronous work really
//! happened. Services publish the lifecycle of each operation; the
//! reconciler keeps each operation's state in RocksDB, detects duplicate,
//! out-of-order, conflicting and overdue events, and publishes verdicts,
//! anomalies and dead letters.
//!
//! # Layout
//!
//! - [`core`]: the pure, deterministic state machine (no IO, no clock).
//!   - `core/detect.rs`: duplicates, order, conflicts, the reorder buffer; [`core::apply`].
//!   - `core/operation.rs`: per-operation state and transitions.
//!   - `core/verdict.rs`: verdicts, anomalies, repair commands, deterministic ids.
//!   - `core/deadline.rs`: timers (confirmation deadlines, reorder windows, retention).
//! - [`codec`]: Avro single-object encoding against the schemas in `schemas/`.
//! - [`store`]: RocksDB state, timer index, offsets and outbox, written atomically.
//! - [`kafka`]: consumer-group member, acknowledged publisher, topic admin, reader.
//! - [`pipeline`]: the run loop wiring them together, and the timer wheel.
//! - [`operator`]: explain, review, resolve, replay, DLQ re-drive (the operator's tools).
//! - [`metrics`]: Prometheus metrics; [`http`]: metrics, health, operator API
//!   and the exception panel over HTTP.
//! - [`config`], [`cli`]: configuration and command line.
//! - [`restore`]: restoring a moved partition's state; the zombie fence.
//! - [`faults`]: crash points for the reliability suites (off in release builds).
//! - [`demo`], [`report`]: the demo workload and its summary.
//! - [`loadgen`]: seeded fault-injecting workload, ground truth, checker, benchmark baseline.

pub mod faults;

#[cfg(feature = "io")]
pub mod cli;
pub mod codec;
#[cfg(feature = "io")]
pub mod config;
pub mod core;
#[cfg(feature = "io")]
pub mod demo;
#[cfg(feature = "io")]
pub mod http;
#[cfg(feature = "io")]
pub mod kafka;
#[cfg(feature = "io")]
pub mod loadgen;
#[cfg(feature = "io")]
pub mod metrics;
#[cfg(feature = "io")]
pub mod operator;
#[cfg(feature = "io")]
pub(crate) mod parallel;
#[cfg(feature = "io")]
pub mod pipeline;
#[cfg(feature = "io")]
pub mod report;
pub mod restore;
#[cfg(feature = "io")]
pub mod store;
