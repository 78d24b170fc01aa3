//! The `reconciler` binary: parse the command line, load the configuration,
//! set up logging, run the command. Errors become a message and exit code 1.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use reconciler::cli::{Cli, Command, DlqCommand, LogFormat, OutboxCommand, ReferencePage};
use reconciler::clock::system_clock;
use reconciler::config::Config;
use reconciler::operator::{commands, dlq::DlqFilter, replay::ReplayOptions, ResolveRequest, ReviewFilter};
use reconciler::outbox::relay::Relay;
use reconciler::pipeline::{Pipeline, PipelineError};
use reconciler::probe::ProbeWorker;
use reconciler::{demo, http, loadgen, operator, report};

/// mimalloc rather than the system allocator: the pipeline allocates and
/// frees many small strings and states per record (Cargo.toml says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Logs go to stderr; RECONCILER_LOG (an EnvFilter) overrides `default`.
/// Colours only on a terminal (and not under `NO_COLOR`): a file or a log
/// collector would keep the escape codes as text.
fn init_logging(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RECONCILER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours);
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

/// What `reconciler demo` says while it keeps running after its summary:
/// where the panel, an operation's explanation and the metrics are.
fn demo_still_running(report: &demo::DemoReport, panel: std::net::SocketAddr, state_dir: &std::path::Path) -> String {
    // An interesting case to explain: one still waiting for a person (its
    // latest verdict ambiguous), else one whose evidence disagrees, else any.
    use reconciler::core::{Outcome, Verdict};
    let mut latest: std::collections::BTreeMap<&str, &Verdict> = Default::default();
    for v in &report.verdicts {
        latest.insert(&v.operation_id, v);
    }
    let pick = |outcome: Outcome| latest.values().copied().find(|v| v.outcome == outcome);
    let example = pick(Outcome::Ambiguous).or_else(|| pick(Outcome::Divergent)).or(report.verdicts.first());
    let binary = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "reconciler".into());
    let mut out = format!(
        "The pipeline is still running with the demo's state:\n  exception panel  http://{panel}/\n  metrics          http://{panel}/metrics\n"
    );
    if let Some(v) = example {
        out.push_str(&format!(
            "  explain a case   {binary} explain {} --state-dir {}\n                   (in the panel: http://{panel}/?op={})\n",
            v.operation_id,
            state_dir.display(),
            v.operation_id
        ));
    }
    out.push_str("Press Ctrl-C to stop it.");
    out
}

/// The first SIGTERM/SIGINT finishes the work in hand and exits 0; a
/// second one exits at once (state stays consistent: the stores are
/// written atomically).
fn install_shutdown() -> anyhow::Result<Arc<AtomicBool>> {
    let shutdown = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, shutdown.clone())
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, shutdown.clone()).context("installing signal handlers")?;
    }
    Ok(shutdown)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // The reference pages describe the binary, not a deployment: they need
    // no configuration.
    if let Command::Reference { page } = cli.command {
        match page {
            ReferencePage::Config => print!("{}", reconciler::config::reference::markdown()),
            ReferencePage::Metrics => print!("{}", reconciler::metrics::reference::markdown()),
        }
        return Ok(());
    }
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
            let shutdown = install_shutdown()?;
            let bind = cfg.http.bind_addr()?;
            let mut pipeline = Pipeline::new(cfg.clone(), system_clock()).context("starting the pipeline")?;
            let _dlq_gauges = operator::dlq::watch(cfg.clone(), pipeline.metrics(), shutdown.clone());
            // The probe worker inside `run`: its own thread and consumer
            // group, its metrics on the pipeline's /metrics.
            let probe = if cfg.probe.enabled {
                let mut worker = ProbeWorker::new(cfg.clone(), pipeline.metrics().registry())
                    .context("starting the probe worker")?;
                let stop = shutdown.clone();
                Some(
                    std::thread::Builder::new()
                        .name("probe".into())
                        .spawn(move || {
                            let ran = worker.run(&stop);
                            // Said at once: the pipeline goes on without its
                            // probes, and PROBE cases escalate at follow-up.
                            if let Err(e) = &ran {
                                tracing::error!(error = %e, "The probe worker stopped; PROBE commands wait for the next start");
                            }
                            ran
                        })
                        .context("starting the probe worker")?,
                )
            } else {
                None
            };
            let (_server, fleet) = match bind {
                Some(addr) => {
                    let state = http::AppState::of(&pipeline, cfg.clone(), system_clock());
                    let server = http::Server::start(addr, state.clone())?;
                    // The fleet view: announced at the URL others reach.
                    let fleet = match (cfg.topics.fleet(), cfg.http.advertised(server.addr())) {
                        (Some(_), Some(url)) => {
                            Some(http::Fleet::start(&state, url, shutdown.clone()).context("joining the fleet")?)
                        }
                        (Some(_), None) => {
                            tracing::warn!(bind = %server.addr(), "Not announced to the fleet: the server listens on a wildcard address and [http] advertised_url is not set");
                            None
                        }
                        (None, _) => None,
                    };
                    (Some(server), fleet)
                }
                None => (None, None),
            };
            let ran = pipeline.run(&shutdown);
            if let (Err(PipelineError::LostPosition(lost)), Some(_)) = (&ran, &_server) {
                hold_after_lost_position(pipeline, lost, &shutdown);
            }
            shutdown.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(f) = fleet {
                f.join();
            }
            if let Some(p) = probe {
                p.join().map_err(|_| anyhow::anyhow!("the probe worker panicked"))?.context("probe worker")?;
            }
            ran?;
            Ok(())
        }
        Command::Probe { state_dir } => {
            if let Some(d) = state_dir {
                cfg.probe.state_dir = d;
            }
            let shutdown = install_shutdown()?;
            let registry = prometheus::Registry::new();
            let mut worker = ProbeWorker::new(cfg.clone(), &registry).context("starting the probe worker")?;
            let _server = match cfg.probe.bind_addr()? {
                Some(addr) => Some(http::Server::metrics_only(addr, registry)?),
                None => None,
            };
            worker.run(&shutdown)?;
            Ok(())
        }
        Command::Outbox { command: OutboxCommand::DeadLetters { limit, json } } => {
            print!("{}", commands::outbox_dead_letters_cmd(&cfg, limit, json)?);
            Ok(())
        }
        Command::Outbox { command: OutboxCommand::Redrive { ids, class, by, dry_run, json } } => {
            let sel = reconciler::outbox::dead_letter::OutboxSelection { ids, class };
            print!("{}", commands::outbox_redrive_cmd(&cfg, &sel, &by.actor, &by.note, dry_run, json)?);
            Ok(())
        }
        Command::Relay { install } => {
            let shutdown = install_shutdown()?;
            let registry = prometheus::Registry::new();
            let mut relay = Relay::new(&cfg, &registry).context("starting the outbox relay")?;
            if install {
                relay.install().context("installing the outbox schema")?;
            }
            let _server = match cfg.relay.bind_addr()? {
                Some(addr) => Some(http::Server::relay(addr, registry, relay.readiness())?),
                None => None,
            };
            relay.run(&shutdown)?;
            Ok(())
        }
        Command::Reference { .. } => unreachable!("answered before the configuration is loaded"),
        Command::Config => {
            print!("{}", toml::to_string(&cfg.redacted()).context("printing the configuration")?);
            Ok(())
        }
        Command::Demo { copies, timeout_secs, exit } => {
            demo::configure(&mut cfg);
            let dir = std::env::temp_dir().join(format!("reconciler-demo-{}", std::process::id()));
            cfg.state_dir = dir.clone();
            cfg.topics.partitions = 3;
            let shutdown = install_shutdown()?;
            let linger = |report: &demo::DemoReport, panel: Option<std::net::SocketAddr>| {
                println!("{}", report::render(report));
                if let (false, true, Some(addr)) = (exit, report.settled, panel) {
                    println!("{}", demo_still_running(report, addr, &dir));
                    // Ctrl-C (or SIGTERM) sets the flag; the demo then stops.
                    wait_for_shutdown(&shutdown);
                    println!("Stopping the demo.");
                }
            };
            let report = demo::run(&cfg, copies, Duration::from_secs(timeout_secs), linger);
            let _ = std::fs::remove_dir_all(&dir);
            let report = report?;
            anyhow::ensure!(
                report.settled,
                "only {} of the {} predicted verdicts arrived within {timeout_secs} s",
                report.verdicts.len(),
                report.expected_verdicts
            );
            Ok(())
        }
        Command::Explain { operation_id, fleet, view } => {
            set_state_dir(&mut cfg, view.state_dir);
            print!(
                "{}",
                if fleet {
                    operator::fleet::explain_fleet_cmd(&cfg, &operation_id, view.json)?
                } else {
                    commands::explain_cmd(&cfg, &operation_id, view.json)?
                }
            );
            Ok(())
        }
        Command::Review { fleet, operation_type, outcome, older_than, waiting, view } => {
            set_state_dir(&mut cfg, view.state_dir);
            let filter = ReviewFilter { operation_type, outcome, older_than_ms: older_than, waiting };
            print!(
                "{}",
                if fleet {
                    operator::fleet::review_fleet_cmd(&cfg, &filter, view.json)?
                } else {
                    commands::review_cmd(&cfg, &filter, view.json)?
                }
            );
            Ok(())
        }
        Command::Resolve { operation_id, decision, actor, note, evidence_checked, view } => {
            set_state_dir(&mut cfg, view.state_dir);
            let req = ResolveRequest { operation_id, decision, actor, note, evidence_checked };
            print!("{}", commands::resolve_cmd(&cfg, &req, view.json)?);
            Ok(())
        }
        Command::Replay { state_dir, output_prefix, diff, json } => {
            let state_dir = state_dir.unwrap_or_else(|| commands::default_replay_dir(&cfg.state_dir));
            let interrupt = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                signal_hook::flag::register(sig, interrupt.clone()).context("installing signal handlers")?;
            }
            let opts = ReplayOptions { state_dir, output_prefix, diff };
            print!("{}", commands::replay_cmd(&cfg, &opts, &interrupt, json)?);
            Ok(())
        }
        Command::Dlq { command: DlqCommand::Inspect { limit, class, all, json } } => {
            let filter = DlqFilter { class, positions: Vec::new(), limit: Some(limit), include_redriven: all };
            print!("{}", commands::dlq_inspect_cmd(&cfg, &filter, json)?);
            Ok(())
        }
        Command::Dlq { command: DlqCommand::Redrive { class, offsets, by, dry_run, json } } => {
            let filter = DlqFilter { class, positions: offsets, limit: None, include_redriven: false };
            let who = operator::dlq::Redriver { actor: by.actor, note: by.note, at_ms: reconciler::clock::now_ms() };
            print!("{}", commands::dlq_redrive_cmd(&cfg, &filter, &who, dry_run, json)?);
            Ok(())
        }
        Command::Loadgen { action, args } => Ok(loadgen::command(&cfg, action.map(Into::into), &args.into())?),
    }
}

/// A lost position (`on_lost_position`) stops the pipeline, and a person
/// must choose: the process stays up with its HTTP server, `/readyz` red
/// with the facts and `reconciler_lost_positions_total` on `/metrics` (an
/// instance that exited would be restarted into the same stop before any
/// scrape saw it), out of the consumer group, until it is told to stop;
/// it then exits non-zero.
fn hold_after_lost_position(
    pipeline: Pipeline,
    lost: &reconciler::pipeline::lost_position::LostPosition,
    shutdown: &AtomicBool,
) {
    let metrics = pipeline.metrics();
    drop(pipeline);
    metrics.set_stopped(lost.to_string());
    tracing::error!(error = %lost, "Stopped: nothing is processed until the instance is started again with a choice; /readyz is red; waiting for SIGTERM");
    wait_for_shutdown(shutdown);
}

/// Returns once Ctrl-C or SIGTERM set `shutdown`.
fn wait_for_shutdown(shutdown: &AtomicBool) {
    while !shutdown.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200)); // the signal flag's polling interval
    }
}

fn set_state_dir(cfg: &mut Config, dir: Option<std::path::PathBuf>) {
    if let Some(d) = dir {
        cfg.state_dir = d;
    }
}

fn main() -> ExitCode {
    // Crash points armed by FAILPOINTS (test builds only; see src/crash.rs).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    // Before the work allocates: huge pages cost a short run a fifth of its
    // CPU in page zeroing (src/process.rs says why).
    let huge_pages = reconciler::process::disable_transparent_huge_pages();
    let cli = Cli::parse();
    // The demo's output is its summary; the pipeline's own lines would bury it.
    // Operator tools print their result on stdout; their logs would clutter it.
    let default = match cli.command {
        Command::Run { .. } | Command::Probe { .. } | Command::Relay { .. } => "info",
        Command::Resolve { .. }
        | Command::Dlq { command: DlqCommand::Redrive { .. } }
        | Command::Outbox { command: OutboxCommand::Redrive { .. } } => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, default);
    if let Err(e) = huge_pages {
        tracing::debug!("transparent huge pages stay as the kernel set them: {e}");
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", reconciler::report::error_causes(&e));
            ExitCode::FAILURE
        }
    }
}
