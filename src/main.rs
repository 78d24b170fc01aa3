//! The `reconciler` binary: parse the command line, load the configuration,
//! set up logging, run the command. Errors become a message and exit code 1.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use reconciler::cli::{Cli, Command, LogFormat};
use reconciler::config::Config;
use reconciler::pipeline::{system_clock, Pipeline};
use reconciler::{demo, loadgen, report};

/// Logs go to stderr; RECONCILER_LOG (an EnvFilter) overrides `default`.
fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RECONCILER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Pretty => builder.init(),
    }
}

fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut cfg = Config::load(cli.config.as_deref())?;
    if let Some(b) = &cli.brokers {
        cfg.kafka.insert("bootstrap.servers".into(), b.clone());
    }
    Ok(cfg)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut cfg = load_config(&cli)?;
    match cli.command {
        Command::Run { state_dir, group_id } => {
            if let Some(d) = state_dir {
                cfg.state_dir = d;
            }
            if let Some(g) = group_id {
                cfg.consumer.group_id = g;
            }
            cfg.validate()?;
            let shutdown = Arc::new(AtomicBool::new(false));
            // The first SIGTERM/SIGINT finishes the batch in hand and exits
            // 0; a second one exits at once (state stays consistent: the
            // store is written atomically).
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                signal_hook::flag::register_conditional_shutdown(sig, 1, shutdown.clone())
                    .context("installing signal handlers")?;
                signal_hook::flag::register(sig, shutdown.clone()).context("installing signal handlers")?;
            }
            let mut pipeline = Pipeline::new(cfg, system_clock()).context("starting the pipeline")?;
            pipeline.run(&shutdown)?;
            Ok(())
        }
        Command::Demo { copies, timeout_secs } => {
            demo::configure(&mut cfg);
            let dir = std::env::temp_dir().join(format!("reconciler-demo-{}", std::process::id()));
            cfg.state_dir = dir.clone();
            cfg.topics.partitions = 3;
            let report = demo::run(&cfg, copies, Duration::from_secs(timeout_secs));
            let _ = std::fs::remove_dir_all(&dir);
            let report = report?;
            println!("{}", report::render(&report));
            anyhow::ensure!(
                report.settled,
                "only {} of the {} predicted verdicts arrived within {timeout_secs} s",
                report.verdicts.len(),
                report.expected_verdicts
            );
            Ok(())
        }
        Command::Loadgen { action, args } => Ok(loadgen::command(&cfg, action, &args)?),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's output is its summary; the pipeline's own lines would bury it.
    let default = if matches!(cli.command, Command::Demo { .. }) { "warn" } else { "info" };
    init_logging(cli.log_format, default);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
