//! Command-line interface (clap derive).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Proves whether asynchronous work really happened: consumes operation
/// lifecycle events from Kafka and publishes verdicts, anomalies and dead
/// letters.
#[derive(Debug, Parser)]
#[command(name = "reconciler", version, about, long_about = None)]
pub struct Cli {
    /// TOML configuration file (RECONCILER_* variables and flags override it).
    #[arg(long, short, global = true, env = "RECONCILER_CONFIG_FILE")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers (overrides kafka."bootstrap.servers").
    #[arg(long, global = true)]
    pub brokers: Option<String>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the pipeline: consume ops.events, publish verdicts, anomalies and
    /// dead letters, until SIGTERM or SIGINT.
    ///
    /// Example: reconciler run --config reconciler.toml --brokers kafka:9092
    Run {
        /// Directory of the RocksDB state (overrides state_dir).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Consumer group id (overrides consumer.group_id).
        #[arg(long)]
        group_id: Option<String>,
    },
    /// Publish a workload with every kind of fault to a local broker, run the
    /// pipeline until the verdicts settle, print a summary.
    ///
    /// Example: reconciler demo --brokers 127.0.0.1:9092
    Demo {
        /// Copies of each story in the workload.
        #[arg(long, default_value_t = 2)]
        copies: usize,
        /// Give up waiting for the verdicts after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
    },
    /// Publish a seeded workload of N operations with every kind of fault and
    /// write its ground truth; `loadgen verify` compares a run's outputs with it.
    ///
    /// Example: reconciler loadgen --operations 100000 --truth truth.json
    #[command(args_conflicts_with_subcommands = true)]
    Loadgen {
        #[command(subcommand)]
        action: Option<LoadgenAction>,
        #[command(flatten)]
        args: crate::loadgen::LoadgenArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum LoadgenAction {
    /// Read the verdict, anomaly and dead-letter topics and compare them with
    /// the ground truth; exits non-zero on any disagreement.
    ///
    /// Example: reconciler loadgen verify --truth truth.json
    Verify {
        /// The ground-truth file written by `reconciler loadgen --truth`.
        #[arg(long)]
        truth: PathBuf,
        /// Give up waiting for the outputs after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// Benchmark baseline: copy COUNT records of the input topic to another
    /// topic with a bare librdkafka consumer and producer (no decode, no state).
    Passthrough {
        /// Destination topic (created if missing).
        #[arg(long)]
        to: String,
        /// Records to copy.
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
}
