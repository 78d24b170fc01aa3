#![deny(missing_docs)]
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
//! Imports only go down this list: a module never imports one above it.
//!
//! - [`core`]: the pure, deterministic state machine (no IO, no clock);
//!   where a verdict is decided.
//!   - `core/detect.rs`: duplicates, order, conflicts, the reorder buffer; [`core::apply`].
//!   - `core/operation.rs`: per-operation state and transitions.
//!   - `core/verdict.rs`: verdicts, anomalies, repair commands, deterministic ids.
//!   - `core/deadline.rs`: timers (deadlines, follow-ups, reorder windows, retention).
//!   - `core/trust.rs`: which events only the reconciler may write, and the
//!     anomaly of one that does not prove it.
//! - [`clock`]: the wall clock, injected (depends on nothing); [`retry`]:
//!   exponential back-off with jitter (pure); [`crash`]: the crash points
//!   of the reliability suites, every program's steps named in one place
//!   (depends on nothing; off in release builds).
//! - [`codec`]: Avro against the schemas in `schemas/`, single-object
//!   encoded or in the Confluent schema-registry framing (`codec/framing.rs`).
//! - [`config`]: the configuration file, its defaults and checks.
//! - [`process`]: process-wide settings the binary applies first
//!   (transparent huge pages off).
//! - [`records`]: the shapes every layer passes (a consumed record, a record
//!   to publish); where an input record is decoded (or dead-lettered) and
//!   outputs become records.
//! - [`signature`]: the HMAC signatures of the control events the
//!   reconciler writes to its input (pure; the core gets their verdict).
//! - [`store`]: RocksDB; where state is written (state, timer index, offsets,
//!   outbox and the timeline, in one atomic write per batch lane).
//! - [`kafka`]: the Kafka adapters: consumer-group member (reports facts),
//!   acknowledged publisher (where outputs are published), topic admin,
//!   watermarks, reader.
//! - [`registry`]: the schema registry of the Confluent framing: the
//!   reconciler's schemas registered at start-up, the input's fetched by id.
//! - [`metrics`]: the typed Prometheus registry.
//! - [`pipeline`]: the run loop; it decides. `pipeline/apply.rs` (a batch's
//!   work), `pipeline/restore.rs` (where a moved partition is restored, and
//!   the zombie fence), `pipeline/timers.rs` (where timers fire),
//!   `pipeline/sampler.rs` (the state gauges).
//! - [`fleet`]: which instance owns which partitions and where its API
//!   answers (the fleet topic), and asking the members.
//! - [`operator`]: explain, review, resolve, replay, DLQ re-drive (the
//!   operator's tools), and [`http`]: metrics, health, operator API and the
//!   exception panel over HTTP (for the whole fleet with `?scope=fleet`).
//! - [`probe`]: `reconciler probe`, the worker that answers PROBE commands
//!   by querying the destinations (HTTP, PostgreSQL) and publishes what it
//!   found to the input topic.
//! - [`outbox`]: the producing side: the PostgreSQL outbox
//!   services write in their own transactions, and `reconciler relay`,
//!   which publishes it to the input topic in each entity's commit order.
//! - [`demo`], [`report`]: the demo workload and its summary;
//!   [`loadgen`]: seeded fault-injecting workload, ground truth, checker,
//!   benchmark baseline.
//! - [`cli`]: the command line (every clap type lives there).

pub mod clock;
pub mod crash;

#[cfg(feature = "io")]
pub mod cli;
pub mod codec;
#[cfg(feature = "io")]
pub mod config;
pub mod core;
#[cfg(feature = "io")]
pub mod demo;
#[cfg(feature = "io")]
pub mod fleet;
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
pub mod outbox;
#[cfg(feature = "io")]
pub(crate) mod parallel;
#[cfg(feature = "io")]
pub mod pipeline;
#[cfg(feature = "io")]
pub mod probe;
#[cfg(feature = "io")]
pub mod process;
#[cfg(feature = "io")]
pub mod records;
#[cfg(feature = "io")]
pub mod registry;
#[cfg(feature = "io")]
pub mod report;
pub mod retry;
pub mod signature;
#[cfg(feature = "io")]
pub mod store;
