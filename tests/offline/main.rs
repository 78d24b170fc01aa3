//! The offline tests: nothing but the crate (no broker, no other program),
//! so a plain `cargo test` runs them anywhere. Golden scenarios, property
//! tests of the core, the codec against the schemas, loadgen's ground truth
//! against the in-memory core, the fuzz corpus, the binary's command
//! line, and the pipeline's batch step on several lanes against RocksDB.
//! The rest is in `tests/integration` (feature `kafka-integration-tests`).

mod changelog;
mod cli;
mod codec;
mod docs;
mod fuzz_corpus;
mod golden;
mod lanes;
mod loadgen;
mod properties;
