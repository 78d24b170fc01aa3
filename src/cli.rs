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
    /// Print the effective configuration (defaults, then the file, then
    /// RECONCILER_* variables, then flags) as TOML and exit; fails naming the
    /// field when a value is invalid. Checks a deployment's settings without
    /// connecting to anything.
    ///
    /// Example: RECONCILER_CONSUMER__GROUP_ID=recon-eu reconciler config --config reconciler.toml
    Config,
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
}
