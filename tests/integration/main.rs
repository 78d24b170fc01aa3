//! The integration tests: everything that needs something outside the
//! crate. The broker (`KAFKA_BROKERS`; the pipeline, the HTTP server, the
//! operator tools, the reliability suites, loadgen verify), and the
//! programs `scripts/setup.sh --tests` installs: Python's fastavro
//! (interop), promtool (the alert rules), Node.js and Chromium (the
//! deployment files, the exception panel).
//!
//! Built only with the `kafka-integration-tests` feature, which also
//! compiles in the crash points the reliability suites arm:
//! `cargo test --release --features kafka-integration-tests --test integration`
//! (`scripts/test.sh` starts the broker and runs it after the offline tests).

mod common;

mod changelog;
mod consumer;
mod demo;
mod deploy;
mod disk;
mod exactly_once;
mod fleet;
mod group_and_transactions;
mod http;
mod interop;
mod loadgen;
mod lost_position;
mod network;
mod operator;
mod pipeline;
mod probe;
mod prometheus;
mod registry;
mod relay;
mod reliability;
mod scale;
mod security;

// The tests link the library with its crash points.
const _: () = assert!(reconciler::crash::ARMED, "the crash points are compiled in");

/// The body of the child processes the crash, rebalance and zombie suites
/// start (`tests/integration/common/child.rs`); ignored, so it runs only
/// when re-executed by them.
#[test]
#[ignore = "the child process of the suites (tests/integration/common/child.rs)"]
fn child_instance() {
    common::child::child_main();
}

/// The body of the probe worker child processes the kill -9 suite starts.
#[test]
#[ignore = "the child process of the probe suite (tests/integration/common/child.rs)"]
fn probe_child_instance() {
    common::child::probe_child_main();
}

/// The body of the outbox relay child processes the kill -9 suite starts.
#[test]
#[ignore = "the child process of the relay suite (tests/integration/common/child.rs)"]
fn relay_child_instance() {
    common::child::relay_child_main();
}
