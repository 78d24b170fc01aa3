//! Command-line interface (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::core::event::Decision;
use crate::core::Outcome;
use crate::loadgen::{Action, EventTime, Faults, Workload};
use crate::operator::commands::parse_position;
use crate::operator::render::{parse_decision, parse_duration, parse_outcome, parse_waiting};
use crate::operator::review::Waiting;

/// Proves whether asynchronous work really happened: consumes operation
/// lifecycle events from Kafka and publishes verdicts, anomalies and dead
/// letters.
#[derive(Debug, Parser)]
#[command(name = "reconciler", version, about, long_about = None, after_help = EXAMPLES)]
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
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

const EXAMPLES: &str = "Examples:
  reconciler run --config reconciler.toml
  reconciler review --older-than 1h              # the manual-review queue, oldest first
  reconciler explain op-452                      # why: evidence and timeline of one operation
  reconciler resolve op-452 --decision confirm --actor ana --note \"CRM shows v7\"
  reconciler dlq inspect --limit 20

Every subcommand has its own --help with an example.";

/// The reference pages `reconciler reference` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReferencePage {
    /// Every configuration key (docs/configuration.md).
    Config,
    /// Every metric of the pipeline, the probe worker and the relay
    /// (docs/metrics.md).
    Metrics,
}

/// How log lines are written to stderr (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for a terminal.
    Pretty,
    /// One JSON object per line, for a log collector.
    Json,
}

/// The subcommands of `reconciler`.
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
    /// Run the outbox relay: publish the rows services commit to the
    /// PostgreSQL outbox (sql/outbox.sql) to the input topic, keyed by
    /// entity and in each entity's commit order, until SIGTERM or SIGINT.
    /// Several relays may run at once. The connection string is read from
    /// the variable [relay] connection_env names (OUTBOX_DATABASE_URL).
    ///
    /// Example: OUTBOX_DATABASE_URL='host=db user=app dbname=app' reconciler relay --install
    Relay {
        /// Create the outbox table, indexes and triggers first when missing
        /// (sql/outbox.sql; idempotent).
        #[arg(long)]
        install: bool,
    },
    /// Run the probe worker alone: answer PROBE commands by querying each
    /// operation's destination ([destinations.<name>]: HTTP or PostgreSQL)
    /// and publish the answers to the input topic, until SIGTERM or SIGINT.
    /// (`[probe] enabled = true` runs it inside `run` instead.)
    ///
    /// Example: CRM_TOKEN=... reconciler probe --config reconciler.toml
    Probe {
        /// Directory of the worker's store (overrides probe.state_dir).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Print the effective configuration (defaults, then the file, then
    /// RECONCILER_* variables, then flags) as TOML and exit; fails naming the
    /// field when a value is invalid. Checks a deployment's settings without
    /// connecting to anything.
    ///
    /// Example: RECONCILER_CONSUMER__GROUP_ID=recon-eu reconciler config --config reconciler.toml
    Config,
    /// Print a reference page of this binary as Markdown: every
    /// configuration key with its type, default, environment variable and
    /// meaning, or every metric with its type, labels and meaning.
    ///
    /// Example: reconciler reference config > configuration.md
    Reference {
        /// Which reference to print.
        #[arg(value_enum)]
        page: ReferencePage,
    },
    /// Publish a workload with every kind of fault to a local broker, run the
    /// pipeline until the verdicts settle, print a summary, then keep the
    /// pipeline and its exception panel (`[http] bind`) up until Ctrl-C.
    ///
    /// Example: reconciler demo --brokers 127.0.0.1:9092 --exit
    Demo {
        /// Copies of each story in the workload.
        #[arg(long, default_value_t = 2)]
        copies: usize,
        /// Give up waiting for the verdicts after this many seconds.
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        /// Exit right after the summary (scripts, CI) instead of keeping
        /// the pipeline and its panel up until Ctrl-C.
        #[arg(long)]
        exit: bool,
    },
    /// Publish a seeded workload of N operations with every kind of fault and
    /// write its ground truth; `loadgen verify` compares a run's outputs with it.
    ///
    /// Example: reconciler loadgen --operations 100000 --truth truth.json
    #[command(args_conflicts_with_subcommands = true)]
    Loadgen {
        /// `verify` or `passthrough`; without one, generate and publish a
        /// workload.
        #[command(subcommand)]
        action: Option<LoadgenAction>,
        /// The generator's and the publisher's options.
        #[command(flatten)]
        args: LoadgenArgs,
    },
    /// Explain one operation: state, expected vs observed evidence, timeline.
    ///
    /// The timeline lists every record received for the operation in arrival
    /// order, with partition/offset, deliveries, what was held or flagged and
    /// each verdict. Works beside a running `reconciler run`.
    ///
    /// Example: reconciler explain op-452 --state-dir /var/lib/reconciler
    Explain {
        /// The operation_id.
        operation_id: String,
        /// Ask the fleet (the members announced on `[topics] fleet`, over
        /// their HTTP APIs) instead of the local state directory: the
        /// operation as its owner explains it.
        #[arg(long)]
        fleet: bool,
        /// The state directory to read and the output format.
        #[command(flatten)]
        view: ViewArgs,
    },
    /// The manual-review queue, oldest first (or, with `--waiting machine`,
    /// the cases waiting for a PROBE or REQUEUE to be answered).
    ///
    /// Shows age, entity, type, outcome, recommended action and reason;
    /// machine cases also their follow-up time.
    ///
    /// Example: reconciler review --type sync_customer --older-than 2h
    Review {
        /// Ask the fleet (the members announced on `[topics] fleet`, over
        /// their HTTP APIs) instead of the local state directory: every
        /// member's queue, merged.
        #[arg(long)]
        fleet: bool,
        /// Only this operation type.
        #[arg(long = "type")]
        operation_type: Option<String>,
        /// Only this verdict outcome (MISSING, DIVERGENT, AMBIGUOUS,
        /// DUPLICATE_EFFECT, ...; any case).
        #[arg(long, value_parser = parse_outcome)]
        outcome: Option<Outcome>,
        /// Only cases waiting at least this long (500ms, 30s, 10m, 2h, 3d).
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<i64>,
        /// `person`: the manual-review queue; `machine`: cases waiting for
        /// a machine action (PROBE, REQUEUE) until their follow-up.
        #[arg(long, value_parser = parse_waiting, default_value = "person")]
        waiting: Waiting,
        /// The state directory to read and the output format.
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Decide a review case by publishing a ManualDecision event.
    ///
    /// The state changes only when the pipeline consumes the event. Refused
    /// when the decision is not allowed in the operation's state.
    ///
    /// Example: reconciler resolve op-452 --decision confirm --actor ana --note "CRM shows v7" --evidence-checked "crm record"
    Resolve {
        /// The operation_id.
        operation_id: String,
        /// confirm, requeue, compensate or close (any case; `explain` lists
        /// the ones the operation accepts now).
        #[arg(long, value_parser = parse_decision)]
        decision: Decision,
        /// Who decides (recorded in the log and the verdict).
        #[arg(long)]
        actor: String,
        /// Why (redacted like other free text before it is stored).
        #[arg(long)]
        note: String,
        /// What was checked (repeatable).
        #[arg(long = "evidence-checked")]
        evidence_checked: Vec<String>,
        /// The state directory to read and the output format.
        #[command(flatten)]
        view: ViewArgs,
    },
    /// Rebuild the state from the input topic into a fresh state directory.
    ///
    /// Uses the pipeline's own code, shows progress, prints a summary
    /// (events, verdicts, anomalies, dead letters, state digest, duration).
    /// Writes nothing to live topics. Use the live run's configuration: the
    /// policy (windows, limits) decides the state.
    ///
    /// Example: reconciler replay --state-dir /tmp/rebuilt --output-prefix replay1 --diff
    Replay {
        /// Fresh directory for the rebuilt state (default: beside state_dir).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Publish outputs to PREFIX.verdicts, PREFIX.anomalies, ... (else discarded).
        #[arg(long)]
        output_prefix: Option<String>,
        /// Compare the replayed verdicts with the live verdict topic (needs --output-prefix).
        #[arg(long)]
        diff: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Dead letters: inspect them, re-drive them after a fix.
    ///
    /// Example: reconciler dlq inspect --class bad_magic --limit 20
    Dlq {
        /// `inspect` or `redrive`.
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// The PostgreSQL outbox's dead letters (rows the relay gave up on):
    /// list them, re-drive them after a fix.
    ///
    /// Example: OUTBOX_DATABASE_URL=... reconciler outbox dead-letters
    Outbox {
        /// `dead-letters` or `redrive`.
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

/// Who re-drives and why: what the re-drive audit records.
#[derive(Debug, Clone, Args)]
pub struct RedriveBy {
    /// Who re-drives (recorded in the audit; default: $USER).
    #[arg(long, env = "USER", default_value = "")]
    pub actor: String,
    /// What was fixed (recorded in the audit).
    #[arg(long, default_value = "")]
    pub note: String,
}

/// `reconciler outbox ...`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Show the outbox's dead letters by class, the oldest first, and the
    /// latest re-drives.
    ///
    /// Example: reconciler outbox dead-letters --limit 50
    DeadLetters {
        /// At most this many dead letters (and audit records).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make dead letters pending again (attempts from 0) so the relay
    /// publishes them; each is recorded in reconciler_outbox_redrive.
    ///
    /// Example: reconciler outbox redrive --class MessageSizeTooLarge --actor ana --note "broker limit raised"
    Redrive {
        /// These rows (repeatable); all must be dead letters.
        #[arg(long = "id")]
        ids: Vec<i64>,
        /// Every dead letter of this class (the error code name).
        #[arg(long)]
        class: Option<String>,
        /// Who re-drives and why.
        #[command(flatten)]
        by: RedriveBy,
        /// List what would be re-driven; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Where a reading subcommand finds the state, and how it prints.
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// State directory to read (overrides state_dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `reconciler dlq` does with the dead letters.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Show dead letters with their provenance, oldest first.
    ///
    /// Example: reconciler dlq inspect --class oversize --limit 20
    Inspect {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only this error class (bad_magic, oversize, key_mismatch, ...).
        #[arg(long)]
        class: Option<String>,
        /// Also dead letters already re-driven (with who re-drove them).
        #[arg(long)]
        all: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-publish dead letters to the input topic after a fix.
    ///
    /// Key, value and headers go unchanged (the reconciler.* provenance
    /// headers stripped), marked with a reconciler.redriven.from header.
    ///
    /// Each re-driven dead letter is recorded on [topics] dlq_audit (who,
    /// when, why) and is not offered again.
    ///
    /// Example: reconciler dlq redrive --class unknown_fingerprint --actor ana --note "upgraded to read the new event schema"
    Redrive {
        /// Only this error class.
        #[arg(long)]
        class: Option<String>,
        /// Only these dead letters, as DLQ PARTITION:OFFSET (repeatable).
        #[arg(long = "offset", value_parser = parse_position)]
        offsets: Vec<(i32, i64)>,
        /// Who re-drives and why.
        #[command(flatten)]
        by: RedriveBy,
        /// List what would be sent; send nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Options of `reconciler loadgen` (the generator and the publisher).
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Operations to create.
    #[arg(long, default_value_t = 10_000)]
    pub operations: u64,
    /// Entities they are spread over (default: operations / 4, at least 64).
    #[arg(long)]
    pub entities: Option<u64>,
    /// Seed: the same seed and options give the same records.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Target rate in records per second; 0 sends as fast as possible.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Event time of the workload: past (hours ago: every deadline is due
    /// at once) or now (the time each unit is sent: paced runs, latency).
    #[arg(long, value_parser = parse_event_time, default_value = "past")]
    pub event_time: EventTime,
    /// confirm_within_ms written into every request.
    #[arg(long, default_value_t = 300_000)]
    pub confirm_within_ms: i64,
    /// Where to write the ground truth (JSON).
    #[arg(long)]
    pub truth: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The rate of each fault (`--duplicate-delivery 0.03`, ...).
    #[command(flatten)]
    pub faults: FaultArgs,
}

impl From<LoadgenArgs> for Workload {
    fn from(a: LoadgenArgs) -> Workload {
        Workload {
            operations: a.operations,
            entities: a.entities,
            seed: a.seed,
            rate: a.rate,
            event_time: a.event_time,
            confirm_within_ms: a.confirm_within_ms,
            truth: a.truth,
            quiet: a.quiet,
            faults: a.faults.0,
        }
    }
}

fn parse_event_time(text: &str) -> Result<EventTime, String> {
    match text {
        "past" => Ok(EventTime::Past),
        "now" => Ok(EventTime::Now),
        _ => Err(format!("{text:?} is not past or now")),
    }
}

/// A flag per fault of [`Faults::ALL`] (`--garbage 0.01`, ...), built from
/// that table so that adding a fault adds its flag.
#[derive(Debug, Clone)]
pub struct FaultArgs(pub Faults);

impl clap::FromArgMatches for FaultArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut f = FaultArgs(Faults::default());
        f.update_from_arg_matches(m)?;
        Ok(f)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        for fault in Faults::ALL {
            if let (Some(rate), Some(slot)) = (m.get_one::<f64>(fault.name), self.0.rate_mut(fault.name)) {
                *slot = *rate;
            }
        }
        Ok(())
    }
}

impl clap::Args for FaultArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Faults::ALL.iter().fold(cmd, |cmd, fault| {
            cmd.arg(
                clap::Arg::new(fault.name)
                    .long(fault.flag)
                    .value_name("RATE")
                    .value_parser(clap::value_parser!(f64))
                    .default_value(fault.default)
                    .help(fault.help.trim()),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// What `reconciler loadgen` does besides generating.
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
        /// Also check the state directory of the `reconciler run` that
        /// processed the workload (running or stopped): no operation may be
        /// open without a timer.
        #[arg(long)]
        state_dir: Option<PathBuf>,
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
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// Serve the destination of the workload's `probed` story (what the
    /// ground truth says it holds) for the probe worker, until interrupted:
    /// `GET /effects/{idempotency_key}` answers 200 with `{"id", "version"}`
    /// or 404. Declare it as `[destinations.records]` with that URL.
    ///
    /// Example: reconciler loadgen destination --truth truth.json --bind 127.0.0.1:9467
    Destination {
        /// The ground-truth file written by `reconciler loadgen --truth`.
        #[arg(long)]
        truth: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9467")]
        bind: std::net::SocketAddr,
    },
}

impl From<LoadgenAction> for Action {
    fn from(a: LoadgenAction) -> Action {
        match a {
            LoadgenAction::Verify { truth, timeout_secs, state_dir } => {
                Action::Verify { truth, timeout_secs, state_dir }
            }
            LoadgenAction::Passthrough { to, count, timeout_secs } => Action::Passthrough { to, count, timeout_secs },
            LoadgenAction::Destination { truth, bind } => Action::Destination { truth, bind },
        }
    }
}
