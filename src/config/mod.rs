//! Configuration: a TOML file, overridden by `RECONCILER_*` environment
//! variables (nested keys with `__`, e.g. `RECONCILER_TOPICS__EVENTS`), then
//! by command-line flags. Unknown keys and bad values fail at start with the
//! field named. Every key under `[kafka]` goes to librdkafka verbatim.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::core::redact::{Redactor, DEFAULT_PATTERNS};
use crate::core::{Policy, TypePolicy};
use crate::signature::ControlKeys;

mod probe;
pub mod reference;
mod registry;
mod relay;
pub use probe::{expand_env, placeholders, DestinationConfig, DestinationKind, ProbeConfig, PROBE_PARAMS};
pub use registry::{CodecConfig, Framing, InputFraming, RegistryAuth, SchemaRegistryConfig, SubjectNaming};
pub use relay::{OnPublished, RelayConfig};

/// A configuration that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file, a `RECONCILER_*` variable or a flag does not parse (bad TOML,
    /// wrong type, unknown key).
    #[error("configuration: {0}")]
    Parse(String),
    /// A value parses but is not allowed (out of range, not a topic name, ...).
    #[error("configuration field `{field}`: {reason}")]
    Invalid {
        /// The field, as its path in the file (`consumer.batch_size`) or the
        /// flag.
        field: String,
        /// What is wrong with its value.
        reason: String,
    },
}

/// `observe` publishes verdicts and read-only PROBE commands; `act` also
/// publishes REQUEUE commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Verdicts, anomalies and dead letters (the default); on the commands
    /// topic only PROBE commands, which read the destination and change
    /// nothing (`reconciler probe` answers them).
    Observe,
    /// Also a REQUEUE command for each REQUEUE verdict, for a worker to carry
    /// out.
    Act,
}

/// Delivery guarantee of the outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// Outputs acknowledged by the broker before their batch is forgotten;
    /// after a crash the last batch may be re-published byte-identical.
    AtLeastOnce,
    /// A batch's outputs and its consumed offsets commit in one Kafka
    /// transaction (the producer's `transactional.id` is
    /// `consumer.transactional_id`);
    /// a `read_committed` reader sees each output once. Needs a broker with
    /// transactions.
    ExactlyOnce,
}

/// Topic names and layout.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Topics {
    /// Input: lifecycle events (the reconciler also writes its timers here).
    pub events: String,
    /// Verdicts: one per decision on an operation.
    pub verdicts: String,
    /// Anomalies: the forensic trail of duplicate, out-of-order, conflicting
    /// and invalid events.
    pub anomalies: String,
    /// Dead letters: input that cannot be decoded or validated, byte-identical.
    pub dlq: String,
    /// The re-drive audit: one record per dead letter re-driven (who, when,
    /// why, where to), JSON keyed by the dead letter's position. A dead
    /// letter it names is not offered for re-drive again. Created
    /// compacted, with one partition, when missing. Unset: the DLQ's name and `.audit`
    /// (`ops.events.dlq.audit`). Empty: no audit (re-driven dead letters
    /// are offered again).
    pub dlq_audit: Option<String>,
    /// Commands: PROBE requests for the probe worker (both modes) and, in
    /// `act` mode, REQUEUE commands for a worker to carry out.
    pub commands: String,
    /// The state changelog: a compacted topic with one partition per input
    /// partition, carrying every state change of a batch after its outputs.
    /// A partition without local state is restored from it rather than by
    /// replaying the input. Unset: `<group_id>.state`, named after the
    /// consumer group like the group's offsets, so that two deployments
    /// over one input (blue/green, a rebuild into new topics) never
    /// restore each other's state. Empty: no changelog (a moved partition
    /// then replays the input from its start, which needs the input's
    /// whole history).
    pub changelog: Option<String>,
    /// The fleet: a compacted topic of one partition where each running
    /// instance announces its HTTP address (`[http] advertised_url`) and
    /// the partitions it owns, so that the API and panel of any instance
    /// answer for the whole fleet. Unset: `<group_id>.fleet` (one fleet per
    /// deployment). Empty: no fleet view (each instance answers for the
    /// partitions it owns).
    pub fleet: Option<String>,
    /// Partitions for topics the reconciler creates when missing.
    pub partitions: i32,
    /// Replication factor for topics the reconciler creates.
    pub replication_factor: i32,
    /// Which of the names above were left unset and named after the group
    /// (see [`Topics::name_after_group`]); not a setting.
    #[serde(skip)]
    pub named_after_group: NamedAfterGroup,
}

/// The topics [`Topics::name_after_group`] named (they were unset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamedAfterGroup {
    /// `changelog` is `<group_id>.state`.
    pub changelog: bool,
    /// `fleet` is `<group_id>.fleet`.
    pub fleet: bool,
}

/// The changelog's name when it did not follow the consumer group: an
/// instance with this group's offsets and no changelog of its own name
/// finds its state there (see [`Topics::changelog`]).
pub const PREVIOUS_DEFAULT_CHANGELOG: &str = "ops.state";

impl Default for Topics {
    fn default() -> Self {
        Topics {
            events: "ops.events".into(),
            verdicts: "ops.verdicts".into(),
            anomalies: "ops.anomalies".into(),
            dlq: "ops.events.dlq".into(),
            dlq_audit: None,
            commands: "ops.commands".into(),
            changelog: None,
            fleet: None,
            partitions: 6,
            replication_factor: 1,
            named_after_group: NamedAfterGroup::default(),
        }
    }
}

impl Topics {
    /// Topics `{prefix}.events`, `{prefix}.verdicts`, ... (tests, benches,
    /// side-by-side runs on one cluster).
    pub fn named(prefix: &str, partitions: i32) -> Topics {
        Topics {
            events: format!("{prefix}.events"),
            verdicts: format!("{prefix}.verdicts"),
            anomalies: format!("{prefix}.anomalies"),
            dlq: format!("{prefix}.dlq"),
            dlq_audit: None,
            commands: format!("{prefix}.commands"),
            changelog: Some(format!("{prefix}.state")),
            fleet: Some(format!("{prefix}.fleet")),
            partitions,
            replication_factor: 1,
            named_after_group: NamedAfterGroup::default(),
        }
    }

    /// The input topic and every output topic (not the changelog, which is
    /// created compacted: see [`Topics::changelog`]).
    pub fn all(&self) -> [&str; 5] {
        [&self.events, &self.verdicts, &self.anomalies, &self.dlq, &self.commands]
    }

    /// The changelog topic, unless it is turned off (empty name).
    pub fn changelog(&self) -> Option<&str> {
        self.changelog.as_deref().filter(|n| !n.is_empty())
    }

    /// Names the changelog and fleet topics left unset after consumer
    /// group `group_id` (`<group_id>.state`, `<group_id>.fleet`); names
    /// already set, empty ones too, are kept. [`Config::load`] does it, and
    /// so does [`Config::default`] for the default group.
    pub fn name_after_group(&mut self, group_id: &str) {
        if self.changelog.is_none() {
            self.changelog = Some(format!("{group_id}.state"));
            self.named_after_group.changelog = true;
        }
        if self.fleet.is_none() {
            self.fleet = Some(format!("{group_id}.fleet"));
            self.named_after_group.fleet = true;
        }
    }

    /// Turns the changelog off (a rebuild never writes the live one).
    pub fn no_changelog(&mut self) {
        self.changelog = Some(String::new());
        self.named_after_group.changelog = false;
    }

    /// The re-drive audit topic (see [`Topics::dlq_audit`]), unless it is
    /// turned off (empty name).
    pub fn dlq_audit(&self) -> Option<String> {
        match &self.dlq_audit {
            None => Some(format!("{}.audit", self.dlq)),
            Some(t) if t.is_empty() => None,
            Some(t) => Some(t.clone()),
        }
    }

    /// The fleet topic, unless it is turned off (empty name).
    pub fn fleet(&self) -> Option<&str> {
        self.fleet.as_deref().filter(|n| !n.is_empty())
    }
}

/// Consumption and batching.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Consumer {
    /// Consumer group id.
    pub group_id: String,
    /// Most records per batch (one RocksDB write and one producer flush each).
    /// Larger batches share those costs among more records, but each of the
    /// batch's passes (decode, load, apply, encode, write) then walks more
    /// memory than the core's cache holds: at 5,000 a batch cost more CPU
    /// per record end to end than at 2,000 (BENCHMARKS.md, "Defaults
    /// chosen by measurement").
    /// Under a backlog that keeps the loop waiting for acknowledgements,
    /// batches stretch up to four times this size; they halve back to it
    /// once that wait is a small share of each cycle, and an idle poll
    /// starts from a small batch again.
    pub batch_size: usize,
    /// Longest wait to fill a batch, in ms.
    pub batch_wait_ms: u64,
    /// Records larger than this (key + value + headers) go to the DLQ.
    pub max_record_bytes: usize,
    /// Threads that apply a batch, each taking whole partitions (their
    /// state is disjoint, so the result does not depend on it); 0: one per
    /// core. 1 applies every batch on the run loop's thread.
    pub apply_threads: usize,
    /// How long publishing outputs may keep failing with an error that
    /// retrying does not cure (no permission, no such topic, a record the
    /// broker refuses) before the run stops with a non-zero exit; readiness
    /// is red from the first such failure. Outages (brokers down, leaders
    /// moving, timeouts) are waited out however long they last.
    pub give_up_after_ms: u64,
    /// Under `guarantee = "exactly_once"`: the producer's `transactional.id`.
    /// It must be unique among running instances and the same across
    /// restarts of one instance: a restarted instance then fences its
    /// predecessor (the broker bumps the producer epoch) and aborts the
    /// transaction a crash left open, which otherwise holds back every
    /// `read_committed` reader of the partitions it wrote until the broker's
    /// transaction timeout. Unset: `<group_id>@<hostname>:<state_dir>`
    /// (stable on a machine with a fixed name; set it on platforms that
    /// rename instances, e.g. to a StatefulSet pod name).
    pub transactional_id: Option<String>,
    /// Standby replicas: how many other members of the fleet tail the
    /// changelog of each partition into their own store, so that when the
    /// partition moves to one of them it goes on at once instead of being
    /// restored. The standbys of a partition are the members after its
    /// owner in the order of their advertised URLs. Needs `[topics]
    /// changelog` and `[topics] fleet`. 0: none.
    pub standby_replicas: usize,
    /// What an assigned partition does when the position stored for it is
    /// outside the input's log: past its end (the topic was deleted and
    /// created again, or truncated) or before its start (retention deleted
    /// records never applied). `"fail"` stops the instance with the
    /// partition, the stored position and the log's range, and leaves the
    /// choice to a person; `"restore"` restores the partition's state from
    /// the changelog and goes on from there if that position is in the log
    /// (stops otherwise); `"reset"` forgets the partition's state, clears
    /// it from the changelog and reads the log from its start, publishing
    /// what it decides. Either way `reconciler_lost_positions_total` counts
    /// it. Found while running (the broker answers that a fetch position is
    /// out of range), the instance stops, and the choice applies when it
    /// starts again.
    pub on_lost_position: OnLostPosition,
}

/// See [`Consumer::on_lost_position`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnLostPosition {
    /// Stop with the facts; a person chooses.
    #[default]
    Fail,
    /// Restore the partition's state from the changelog.
    Restore,
    /// Forget the partition's state and read the log from its start.
    Reset,
}

impl OnLostPosition {
    /// The setting's value, as in the configuration and the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLostPosition::Fail => "fail",
            OnLostPosition::Restore => "restore",
            OnLostPosition::Reset => "reset",
        }
    }
}

impl Consumer {
    /// The number of apply threads to use: `apply_threads`, or one per
    /// core when it is 0.
    pub fn apply_lanes(&self) -> usize {
        match self.apply_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for Consumer {
    fn default() -> Self {
        // 900 kB: under Kafka's default 1 MB message limit with room for the
        // dead-letter headers.
        Consumer {
            group_id: "reconciler".into(),
            batch_size: 2000,
            batch_wait_ms: 50,
            max_record_bytes: 900_000,
            apply_threads: 0,
            give_up_after_ms: 60_000,
            transactional_id: None,
            standby_replicas: 0,
            on_lost_position: OnLostPosition::Fail,
        }
    }
}

/// Time rules, all in milliseconds of event time (the `occurred_at` of the events).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Time {
    /// Confirmation window when neither the event nor its type names one.
    pub default_confirm_within_ms: i64,
    /// Attempts allowed when neither the event nor its type names a limit.
    pub default_max_attempts: i32,
    /// How long an event ahead of its turn waits for the gap to fill.
    pub reorder_window_ms: i64,
    /// How many events one operation may hold in its reorder buffer.
    pub reorder_max_held: usize,
    /// How long terminal operations are kept.
    pub retention_ms: i64,
    /// How often the wall clock is compared with the timers (at most 1000).
    pub timer_interval_ms: u64,
    /// How long after a PROBE or REQUEUE verdict an operation with no new
    /// evidence is followed up (an unanswered probe goes to review, a
    /// requeue nobody picked up is requeued again). Unset: one confirmation
    /// window of the operation.
    pub follow_up_ms: Option<i64>,
    /// Automatic requeues allowed per operation in all; then the operation
    /// goes to review (MISSING / MANUAL_REVIEW). 0 never requeues.
    pub max_requeues: u32,
}

impl Default for Time {
    fn default() -> Self {
        let p = Policy::default();
        Time {
            default_confirm_within_ms: p.default_confirm_within_ms,
            default_max_attempts: p.default_max_attempts,
            reorder_window_ms: p.reorder_window_ms,
            reorder_max_held: p.reorder_max_held,
            retention_ms: p.retention_ms,
            timer_interval_ms: 250,
            follow_up_ms: p.follow_up_ms,
            max_requeues: p.max_requeues,
        }
    }
}

/// Per-operation-type policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeConfig {
    /// Overrides `[time] default_confirm_within_ms` for this type; a
    /// `Requested` that names its own window wins over both.
    pub confirm_within_ms: Option<i64>,
    /// Overrides `[time] default_max_attempts` for this type; a `Requested`
    /// that names its own limit wins over both.
    pub max_attempts: Option<i32>,
    /// Overrides `[time] follow_up_ms` for this type.
    pub follow_up_ms: Option<i64>,
    /// Overrides `[time] max_requeues` for this type.
    pub max_requeues: Option<u32>,
}

/// Redaction of free-text evidence.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Redaction {
    /// Regular expressions; every match in `detail`, `evidence_ref` and `note`
    /// is replaced by `[REDACTED]` before it is stored or published.
    pub patterns: Vec<String>,
}

impl Default for Redaction {
    fn default() -> Self {
        Redaction { patterns: DEFAULT_PATTERNS.iter().map(|s| s.to_string()).collect() }
    }
}

/// The HTTP server inside `run`: metrics, health, the operator API and the
/// exception panel.
#[derive(Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    /// Address to listen on; "off" (or "") runs no server.
    pub bind: String,
    /// Bearer token the endpoints that change state (resolve, redrive)
    /// require; without one they are disabled. When set, the endpoints that
    /// read (the review queue, operations, dead letters, the fleet) require
    /// it too (or `read_token`). Prefer the environment variable
    /// RECONCILER_HTTP__TOKEN to writing it in a file.
    pub token: Option<String>,
    /// A bearer token that grants the reads only (review queue, operations,
    /// dead letters, fleet), for people and dashboards that must not
    /// decide or re-drive; `token` grants both. When either is set, reads
    /// require one of them. `/healthz`, `/readyz` and `/metrics` stay open
    /// (probes and scrapers). RECONCILER_HTTP__READ_TOKEN.
    pub read_token: Option<String>,
    /// The URL other instances and operators reach this instance's API at
    /// (announced on `[topics] fleet`), e.g. `http://10.0.3.7:9464`.
    /// Default: `http://` and the bind address, unless that is a wildcard
    /// (0.0.0.0, ::), which no one else can reach: then this instance is
    /// not announced, and says so at start-up. A loopback bind (the
    /// default `127.0.0.1:9464`) is announced as it is, which only other
    /// instances on the same host can reach: a fleet over several hosts
    /// sets this on each instance.
    pub advertised_url: Option<String>,
    /// The request header an authenticating proxy in front of the API sets
    /// to the caller's identity (e.g. `X-Forwarded-User`). When set, a
    /// decision's actor is that caller: a resolve without the header is
    /// refused, and one whose body names someone else too. Without it the
    /// actor is whatever the request says (the token proves the caller may
    /// decide, not who they are). Only set it behind such a proxy: anyone
    /// reaching the API directly could send the header.
    pub actor_header: Option<String>,
}

impl Default for Http {
    fn default() -> Self {
        Http { bind: "127.0.0.1:9464".into(), token: None, read_token: None, advertised_url: None, actor_header: None }
    }
}

/// The trust boundary on the input topic (`[security]`): the
/// keys that sign and verify the control events the reconciler writes to
/// its own input (see `core::trust` and `signature`).
#[derive(Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Security {
    /// HMAC keys, at least 16 bytes each: the first signs, all verify (add
    /// a new key second, move it first, drop the old one once the input's
    /// retention holds nothing it signed). Every instance and every
    /// operator tool that writes decisions needs the same list. Give them
    /// in the environment, not in a file:
    /// `RECONCILER_SECURITY__CONTROL_KEYS='["<secret>", "<older secret>"]'`.
    pub control_keys: Vec<String>,
    /// Apply control events without checking their signature: any
    /// producer with write access to the
    /// input can then force overdue verdicts and decide review cases. For
    /// trials only.
    pub allow_unsigned_control: bool,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("control_keys", &format_args!("{} key(s), {REDACTED}", self.control_keys.len()))
            .field("allow_unsigned_control", &self.allow_unsigned_control)
            .finish()
    }
}

impl Security {
    /// The control keys, for the commands that write or apply control
    /// events (`run`, `replay`, `resolve`, `probe`). An error naming
    /// `security.control_keys` when there are none and unsigned control
    /// events are not allowed: such an instance could not sign its own
    /// timers, and would refuse every decision.
    pub fn keys(&self) -> Result<ControlKeys, ConfigError> {
        if self.control_keys.is_empty() && !self.allow_unsigned_control {
            return Err(invalid(
                "security.control_keys",
                "no key configured: control events (DeadlineReached, ManualDecision, ProbeFailed) are applied only when signed. \
                 Set RECONCILER_SECURITY__CONTROL_KEYS='[\"<secret of 16 bytes or more>\"]' (the same on every instance and operator tool), \
                 or security.allow_unsigned_control = true for a trial",
            ));
        }
        Ok(self.loaded())
    }

    /// The control keys configured (possibly none), for tools that sign
    /// when they can (loadgen, the demo).
    pub fn loaded(&self) -> ControlKeys {
        ControlKeys::new(self.control_keys.iter().map(|k| k.as_bytes().to_vec()))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for (i, k) in self.control_keys.iter().enumerate() {
            if k.len() < crate::signature::MIN_KEY_BYTES {
                return Err(invalid(
                    &format!("security.control_keys[{i}]"),
                    format!(
                        "is {} bytes long; a control key needs at least {}",
                        k.len(),
                        crate::signature::MIN_KEY_BYTES
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Http {
    /// The `Authorization` header value that reads from a member of the
    /// fleet with this configuration's credentials (the read token, else
    /// the token); `None` when neither is set and reads are open.
    pub fn read_authorization(&self) -> Option<String> {
        self.read_token.as_ref().or(self.token.as_ref()).map(|t| format!("Bearer {t}"))
    }
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.token.as_ref().map(|_| REDACTED);
        let read_token = self.read_token.as_ref().map(|_| REDACTED);
        f.debug_struct("Http")
            .field("bind", &self.bind)
            .field("token", &token)
            .field("read_token", &read_token)
            .field("advertised_url", &self.advertised_url)
            .field("actor_header", &self.actor_header)
            .finish()
    }
}

impl Http {
    /// The address to listen on, or `None` when the server is off.
    pub fn bind_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        bind_addr("http.bind", &self.bind)
    }

    /// The URL this instance announces, given the address it listens on
    /// (see [`Http::advertised_url`]); `None`: not reachable by others.
    pub fn advertised(&self, listening: std::net::SocketAddr) -> Option<String> {
        match &self.advertised_url {
            Some(url) => Some(url.trim_end_matches('/').to_owned()),
            None if listening.ip().is_unspecified() => None,
            None => Some(format!("http://{listening}")),
        }
    }
}

/// The address a server listens on (`field` holds `value`), or `None` when
/// it is "off" or empty.
fn bind_addr(field: &str, value: &str) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    match value.trim() {
        "" | "off" => Ok(None),
        b => b.parse().map(Some).map_err(|e| invalid(field, format!("{b:?} is not an address: {e}"))),
    }
}

/// The Prometheus metrics.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Operation types beyond those under `[types]` that get a label of
    /// their own; later ones share the label `other` (bounded cardinality).
    pub max_operation_types: usize,
    /// How often the state gauges and the lag are refreshed, in ms: the
    /// rest between two passes (three times a pass's length when that is
    /// longer, on a large store).
    pub refresh_ms: u64,
    /// Most operations per second a refresh reads from the state store
    /// (bounds its CPU cost on a large store).
    pub scan_ops_per_sec: u64,
    /// How often `run` reads the DLQ and its audit topic for the
    /// dead-letter gauges, in ms (each refresh reads both whole: dead
    /// letters should be few). 0: never.
    pub dlq_refresh_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { max_operation_types: 32, refresh_ms: 5000, scan_ops_per_sec: 100_000, dlq_refresh_ms: 60_000 }
    }
}

/// RocksDB memory budget (`[store]` in the config). Index and filter
/// blocks live in the block cache, and memtables share one budget, so the
/// store's memory is bounded by these two numbers whatever it holds on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StoreTuning {
    /// Block cache (data, index and filter blocks), in MiB. Too small a
    /// cache evicts index and filter blocks and every read then goes to
    /// disk: with 64 MiB and 1M operations stored the pipeline spent 25.9
    /// CPU s per 1M records, with 1 GiB 14.5 (BENCHMARKS.md).
    pub block_cache_mb: usize,
    /// All memtables of all column families together, in MiB.
    pub write_buffer_mb: usize,
}

impl Default for StoreTuning {
    fn default() -> Self {
        StoreTuning { block_cache_mb: 512, write_buffer_mb: 64 }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `observe` (the default) or `act`: whether REQUEUE commands are
    /// published (PROBE commands are published in both).
    pub mode: Mode,
    /// Delivery guarantee of the outputs.
    pub guarantee: Guarantee,
    /// Directory of the RocksDB state.
    pub state_dir: PathBuf,
    /// Fsync every state write (survives power loss, not only process crashes).
    pub sync_writes: bool,
    /// Topic names, and the layout of the topics the reconciler creates
    /// when they are missing.
    pub topics: Topics,
    /// Consumption, batching, and what happens when a partition moves or
    /// its position is lost.
    pub consumer: Consumer,
    /// Deadlines, the reorder window, retention and follow-ups, in
    /// milliseconds of event time (the `occurred_at` of the events).
    pub time: Time,
    /// Policy per operation type: a table `[types.<name>]` for the events
    /// whose `operation_type` is `<name>`; a key left out takes the
    /// `[time]` default.
    pub types: BTreeMap<String, TypeConfig>,
    /// Redaction of free-text evidence before it is stored or published.
    pub redaction: Redaction,
    /// RocksDB memory budget. Index and filter blocks live in the block
    /// cache and the memtables share one budget, so the store's memory is
    /// bounded by these two numbers whatever it holds on disk.
    pub store: StoreTuning,
    /// librdkafka properties, passed to every Kafka client verbatim
    /// (`bootstrap.servers`, `security.protocol`, `sasl.*`, `ssl.*`, ...;
    /// the names of librdkafka's CONFIGURATION.md). Where the reconciler's
    /// defaults differ from librdkafka's (`fetch.wait.max.ms`, `linger.ms`,
    /// `compression.type` = lz4, ...: see `reconciler.example.toml`), a key
    /// here wins. From the environment, give a TOML inline table, merged key
    /// by key over the file's:
    /// `RECONCILER_KAFKA='{ "sasl.password" = "<secret>" }'` (a variable
    /// name cannot hold the dots of a property name).
    pub kafka: BTreeMap<String, String>,
    /// The HTTP server inside `reconciler run`: `/metrics`, `/healthz`,
    /// `/readyz`, the operator API (`/api/...`) and the exception panel.
    pub http: Http,
    /// Label bounds and refresh rates of the Prometheus metrics.
    pub metrics: MetricsConfig,
    /// The probe worker, which answers PROBE commands by asking the
    /// destination (`reconciler probe`, or inside `run` when enabled).
    pub probe: ProbeConfig,
    /// The destinations the probe worker can query: a table
    /// `[destinations.<name>]` for the name services put in
    /// `Requested.destination`.
    pub destinations: BTreeMap<String, DestinationConfig>,
    /// The keys that sign and verify the control events the reconciler
    /// writes to its own input (timer firings, decisions, probe answers).
    pub security: Security,
    /// The outbox relay (`reconciler relay`), which publishes the rows
    /// services commit to a PostgreSQL outbox table to `topics.events`.
    pub relay: RelayConfig,
    /// How the Avro records are framed on the topics: Avro single-object
    /// encoding, or the Confluent schema-registry framing.
    pub codec: CodecConfig,
    /// The schema registry that the Confluent framing names schemas in
    /// (the Confluent REST API). Needed when `[codec]` reads or writes that
    /// framing: `input` is `confluent` or `both`, or `output` is
    /// `confluent`.
    pub schema_registry: SchemaRegistryConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Observe,
            guarantee: Guarantee::AtLeastOnce,
            state_dir: PathBuf::from("./reconciler-state"),
            sync_writes: false,
            topics: {
                let mut t = Topics::default();
                t.name_after_group(&Consumer::default().group_id);
                t
            },
            consumer: Consumer::default(),
            time: Time::default(),
            types: BTreeMap::new(),
            redaction: Redaction::default(),
            store: StoreTuning::default(),
            kafka: BTreeMap::from([("bootstrap.servers".to_owned(), "127.0.0.1:9092".to_owned())]),
            http: Http::default(),
            metrics: MetricsConfig::default(),
            probe: ProbeConfig::default(),
            destinations: BTreeMap::new(),
            security: Security::default(),
            relay: RelayConfig::default(),
            codec: CodecConfig::default(),
            schema_registry: SchemaRegistryConfig::default(),
        }
    }
}

/// What [`Config::redacted`] shows instead of a secret.
pub const REDACTED: &str = "[REDACTED]";

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.to_owned(), reason: reason.into() }
}

impl Config {
    /// Defaults, then the file (if any), then `RECONCILER_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Config::defaults();
        if let Some(path) = file {
            if !path.exists() {
                return Err(invalid("--config", format!("file {} does not exist", path.display())));
            }
            fig = fig.merge(Toml::file(path));
        }
        // RECONCILER_LOG (log filter) and RECONCILER_CONFIG_FILE (--config)
        // are read elsewhere and are not configuration keys.
        fig = fig.merge(Env::prefixed("RECONCILER_").ignore(&["log", "config_file"]).split("__"));
        Config::extract(fig)
    }

    /// The defaults, for settings to be merged over. The changelog and
    /// fleet default to names of the group, which the settings may set:
    /// they are named after the merge ([`Config::extract`]).
    fn defaults() -> Figment {
        Figment::from(Serialized::defaults(Config { topics: Topics::default(), ..Config::default() }))
    }

    /// The configuration `fig` holds, its unset topics named after its
    /// group, checked.
    fn extract(fig: Figment) -> Result<Config, ConfigError> {
        let mut cfg: Config = fig.extract().map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.topics.name_after_group(&cfg.consumer.group_id);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.topics;
        let named = [
            ("topics.events", t.events.as_str()),
            ("topics.verdicts", &t.verdicts),
            ("topics.anomalies", &t.anomalies),
            ("topics.dlq", &t.dlq),
            ("topics.commands", &t.commands),
        ];
        // An empty changelog (fleet) name turns the changelog (fleet) off.
        let audit = t.dlq_audit();
        let optional =
            [("topics.changelog", t.changelog()), ("topics.fleet", t.fleet()), ("topics.dlq_audit", audit.as_deref())];
        for (field, name) in named.into_iter().chain(optional.into_iter().filter_map(|(f, n)| Some((f, n?)))) {
            if name.is_empty()
                || name.len() > 249
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
            {
                return Err(invalid(field, format!("{name:?} is not a valid Kafka topic name")));
            }
        }
        if let Some(c) = t.changelog().filter(|c| t.all().contains(c)) {
            return Err(invalid("topics.changelog", format!("{c:?} is also an input or output topic")));
        }
        if let Some(a) =
            audit.as_deref().filter(|a| t.all().contains(a) || Some(*a) == t.changelog() || Some(*a) == t.fleet())
        {
            return Err(invalid("topics.dlq_audit", format!("{a:?} is also another topic of the reconciler")));
        }
        if let Some(f) = t.fleet().filter(|f| t.all().contains(f) || Some(*f) == t.changelog()) {
            return Err(invalid("topics.fleet", format!("{f:?} is also another topic of the reconciler")));
        }
        if self.consumer.standby_replicas > 0 && (t.changelog().is_none() || t.fleet().is_none()) {
            return Err(invalid(
                "consumer.standby_replicas",
                "standby replicas tail the changelog of partitions the fleet says others own: they need topics.changelog and topics.fleet",
            ));
        }
        if let Some(url) = &self.http.advertised_url {
            let ok = ["http://", "https://"].iter().any(|s| url.strip_prefix(s).is_some_and(|rest| !rest.is_empty()));
            if !ok {
                return Err(invalid("http.advertised_url", format!("{url:?} is not an http:// or https:// URL")));
            }
        }
        if t.partitions < 1 {
            return Err(invalid("topics.partitions", "must be at least 1"));
        }
        if t.replication_factor < 1 {
            return Err(invalid("topics.replication_factor", "must be at least 1"));
        }
        if self.consumer.group_id.is_empty() {
            return Err(invalid("consumer.group_id", "must not be empty"));
        }
        if self.consumer.give_up_after_ms == 0 {
            return Err(invalid("consumer.give_up_after_ms", "must be positive"));
        }
        if self.consumer.batch_size == 0 {
            return Err(invalid("consumer.batch_size", "must be at least 1"));
        }
        let tm = &self.time;
        for (field, v) in [
            ("time.default_confirm_within_ms", tm.default_confirm_within_ms),
            ("time.reorder_window_ms", tm.reorder_window_ms),
            ("time.retention_ms", tm.retention_ms),
        ] {
            if v <= 0 {
                return Err(invalid(field, format!("must be positive, got {v}")));
            }
        }
        if let Some(v) = tm.follow_up_ms.filter(|v| *v <= 0) {
            return Err(invalid("time.follow_up_ms", format!("must be positive, got {v}")));
        }
        if tm.default_max_attempts < 1 {
            return Err(invalid("time.default_max_attempts", "must be at least 1"));
        }
        if tm.timer_interval_ms == 0 || tm.timer_interval_ms > 1000 {
            return Err(invalid(
                "time.timer_interval_ms",
                "must be between 1 and 1000 (due timers are looked for at least every second)",
            ));
        }
        for (name, ty) in &self.types {
            if ty.confirm_within_ms.is_some_and(|v| v <= 0) {
                return Err(invalid(&format!("types.{name}.confirm_within_ms"), "must be positive"));
            }
            if ty.max_attempts.is_some_and(|v| v < 1) {
                return Err(invalid(&format!("types.{name}.max_attempts"), "must be at least 1"));
            }
            if ty.follow_up_ms.is_some_and(|v| v <= 0) {
                return Err(invalid(&format!("types.{name}.follow_up_ms"), "must be positive"));
            }
        }
        Redactor::new(&self.redaction.patterns).map_err(|e| invalid("redaction.patterns", e.to_string()))?;
        self.http.bind_addr()?;
        self.security.validate()?;
        if self.http.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(invalid("http.token", "must not be empty (leave it out to disable resolve and redrive)"));
        }
        if self.http.read_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(invalid("http.read_token", "must not be empty (leave it out: http.token grants reads too)"));
        }
        for (field, v) in [
            ("metrics.refresh_ms", self.metrics.refresh_ms),
            ("metrics.scan_ops_per_sec", self.metrics.scan_ops_per_sec),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if !self.kafka.contains_key("bootstrap.servers") {
            return Err(invalid("kafka.bootstrap.servers", "is required"));
        }
        self.validate_guarantee()?;
        self.probe.validate()?;
        self.relay.validate()?;
        self.schema_registry.validate(&self.codec)?;
        if self.probe.group_id == self.consumer.group_id {
            // One group for both would rebalance the worker with every
            // pipeline instance and hand it the pipeline's input partitions.
            return Err(invalid("probe.group_id", "must differ from consumer.group_id"));
        }
        for (name, d) in &self.destinations {
            d.validate(name)?;
        }
        Ok(())
    }

    /// The settings `exactly_once` depends on: the transactional id is the
    /// reconciler's to set, and the input must be read committed (aborted
    /// timers in the log would otherwise be applied).
    fn validate_guarantee(&self) -> Result<(), ConfigError> {
        if self.kafka.contains_key("transactional.id") {
            return Err(invalid(
                "kafka.transactional.id",
                "is set by the reconciler (guarantee = \"exactly_once\"): use consumer.transactional_id",
            ));
        }
        if self.guarantee != Guarantee::ExactlyOnce {
            return Ok(());
        }
        if self.consumer.transactional_id.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(invalid("consumer.transactional_id", "must not be empty (leave it out for the default)"));
        }
        if self.kafka.get("isolation.level").is_some_and(|v| v != "read_committed") {
            return Err(invalid(
                "kafka.isolation.level",
                "must be read_committed under guarantee = \"exactly_once\" (aborted records must not be applied)",
            ));
        }
        Ok(())
    }

    /// The producer's `transactional.id` under `exactly_once` (see
    /// [`Consumer::transactional_id`]).
    pub fn transactional_id(&self) -> String {
        if let Some(id) = &self.consumer.transactional_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let dir = std::fs::canonicalize(&self.state_dir).unwrap_or_else(|_| self.state_dir.clone());
        format!("{}@{host}:{}", self.consumer.group_id, dir.display())
    }

    /// A copy safe to print: the HTTP token and librdkafka settings that
    /// carry credentials (passwords, secrets, private keys, JAAS configs)
    /// are masked.
    pub fn redacted(&self) -> Config {
        const SECRET: [&str; 4] = ["password", "secret", "key.pem", "jaas"];
        let mut cfg = self.clone();
        for (k, v) in cfg.kafka.iter_mut() {
            if SECRET.iter().any(|s| k.contains(s)) {
                *v = REDACTED.to_owned();
            }
        }
        for t in [cfg.http.token.as_mut(), cfg.http.read_token.as_mut()].into_iter().flatten() {
            *t = REDACTED.to_owned();
        }
        for k in cfg.security.control_keys.iter_mut() {
            *k = REDACTED.to_owned();
        }
        cfg
    }

    /// The core's policy.
    pub fn policy(&self) -> Policy {
        Policy {
            default_confirm_within_ms: self.time.default_confirm_within_ms,
            default_max_attempts: self.time.default_max_attempts,
            types: self
                .types
                .iter()
                .map(|(k, v)| {
                    let t = TypePolicy {
                        confirm_within_ms: v.confirm_within_ms,
                        max_attempts: v.max_attempts,
                        follow_up_ms: v.follow_up_ms,
                        max_requeues: v.max_requeues,
                    };
                    (k.clone(), t)
                })
                .collect(),
            reorder_window_ms: self.time.reorder_window_ms,
            reorder_max_held: self.time.reorder_max_held,
            retention_ms: self.time.retention_ms,
            follow_up_ms: self.time.follow_up_ms,
            max_requeues: self.time.max_requeues,
            act: self.mode == Mode::Act,
            redactor: Redactor::new(&self.redaction.patterns).expect("validated"),
            signed_control: !self.security.allow_unsigned_control,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::extract(Config::defaults().merge(Toml::string(text)))
    }

    /// The changelog and the fleet are named after the group unless named:
    /// two deployments over one input never share state by default.
    #[test]
    fn the_changelog_and_fleet_follow_the_group() {
        let cfg = from_toml("").unwrap();
        assert_eq!((cfg.topics.changelog(), cfg.topics.fleet()), (Some("reconciler.state"), Some("reconciler.fleet")));
        assert_eq!(cfg.topics.named_after_group, NamedAfterGroup { changelog: true, fleet: true });
        assert_eq!(Config::default().topics.changelog(), Some("reconciler.state"));
        let cfg = from_toml("[consumer]\ngroup_id = \"orders-blue\"\n").unwrap();
        assert_eq!(
            (cfg.topics.changelog(), cfg.topics.fleet()),
            (Some("orders-blue.state"), Some("orders-blue.fleet"))
        );
        let cfg =
            from_toml("[consumer]\ngroup_id = \"g\"\n[topics]\nchangelog = \"ops.state\"\nfleet = \"\"\n").unwrap();
        assert_eq!((cfg.topics.changelog(), cfg.topics.fleet()), (Some("ops.state"), None));
        assert_eq!(cfg.topics.named_after_group, NamedAfterGroup::default());
        // The names are printed as they are used.
        let printed = toml::to_string(&from_toml("[consumer]\ngroup_id = \"g\"\n").unwrap()).unwrap();
        assert!(printed.contains("changelog = \"g.state\""), "{printed}");
    }

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    /// The default demands signed control events; the keys are
    /// checked, never printed, and the trial switch turns the check off.
    #[test]
    fn control_keys_are_required_checked_and_redacted() {
        let err = Config::default().security.keys().unwrap_err().to_string();
        assert!(err.contains("security.control_keys") && err.contains("allow_unsigned_control"), "{err}");
        assert!(Config::default().policy().signed_control);
        let err = from_toml("[security]\ncontrol_keys = [\"0123456789abcdef\", \"short\"]\n").unwrap_err().to_string();
        assert!(err.contains("security.control_keys[1]"), "{err}");
        let cfg = from_toml("[security]\ncontrol_keys = [\"0123456789abcdef-hush-hush\"]\n").unwrap();
        assert!(!cfg.security.keys().unwrap().is_empty());
        assert!(!format!("{cfg:?}").contains("hush"), "never in a debug print");
        assert_eq!(cfg.redacted().security.control_keys, vec![REDACTED.to_owned()]);
        let trial = from_toml("[security]\nallow_unsigned_control = true\n").unwrap();
        assert!(trial.security.keys().unwrap().is_empty());
        assert!(!trial.policy().signed_control);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = from_toml("[consumer]\nbatch_sise = 10\n").unwrap_err().to_string();
        assert!(err.contains("batch_sise"), "{err}");
    }

    #[test]
    fn wrong_type_is_named() {
        let err = from_toml("[topics]\npartitions = \"six\"\n").unwrap_err().to_string();
        assert!(err.contains("partitions"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = from_toml("[time]\nreorder_window_ms = 0\n").unwrap_err().to_string();
        assert!(err.contains("time.reorder_window_ms"), "{err}");
        let err = from_toml("[time]\nfollow_up_ms = -5\n").unwrap_err().to_string();
        assert!(err.contains("time.follow_up_ms"), "{err}");
        let err = from_toml("[types.sync]\nfollow_up_ms = 0\n").unwrap_err().to_string();
        assert!(err.contains("types.sync.follow_up_ms"), "{err}");
        let err = from_toml("[redaction]\npatterns = [\"(\"]\n").unwrap_err().to_string();
        assert!(err.contains("redaction.patterns"), "{err}");
        let err = from_toml("mode = \"fix\"\n").unwrap_err().to_string();
        assert!(err.contains("mode") || err.contains("fix"), "{err}");
    }

    #[test]
    fn http_bind_and_token_are_checked() {
        assert_eq!(from_toml("[http]\nbind = \"off\"\n").unwrap().http.bind_addr().unwrap(), None);
        let err = from_toml("[http]\nbind = \"localhost\"\n").unwrap_err().to_string();
        assert!(err.contains("http.bind"), "{err}");
        let err = from_toml("[http]\ntoken = \" \"\n").unwrap_err().to_string();
        assert!(err.contains("http.token"), "{err}");
        let err = from_toml("[http]\nread_token = \"\"\n").unwrap_err().to_string();
        assert!(err.contains("http.read_token"), "{err}");
        let cfg = from_toml("[http]\ntoken = \"s3cret\"\nread_token = \"r3ad\"\n").unwrap();
        assert!(!format!("{cfg:?}").contains("s3cret"), "the token never shows in a debug print");
        assert!(!format!("{cfg:?}").contains("r3ad"), "nor the read token");
    }

    #[test]
    fn the_fleet_topic_and_advertised_url_are_checked() {
        let url = |bind: &str, adv: Option<&str>| {
            let http = Http { bind: bind.into(), advertised_url: adv.map(str::to_owned), ..Http::default() };
            http.advertised(bind.parse().unwrap())
        };
        assert_eq!(url("127.0.0.1:9464", None).as_deref(), Some("http://127.0.0.1:9464"));
        assert_eq!(url("0.0.0.0:9464", None), None, "a wildcard address reaches no one");
        assert_eq!(url("0.0.0.0:9464", Some("http://10.0.3.7:9464/")).as_deref(), Some("http://10.0.3.7:9464"));
        let err = from_toml("[http]\nadvertised_url = \"10.0.3.7:9464\"\n").unwrap_err().to_string();
        assert!(err.contains("http.advertised_url"), "{err}");
        let err = from_toml("[topics]\nfleet = \"reconciler.state\"\n").unwrap_err().to_string();
        assert!(err.contains("topics.fleet"), "{err}");
        let err = from_toml("[topics]\nfleet = \"no spaces\"\n").unwrap_err().to_string();
        assert!(err.contains("topics.fleet"), "{err}");
        assert_eq!(from_toml("[topics]\nfleet = \"\"\n").unwrap().topics.fleet(), None);
    }

    #[test]
    fn kafka_keys_pass_through_and_types_apply() {
        let cfg = from_toml(
            "[kafka]\n\"bootstrap.servers\" = \"k:9093\"\n\"security.protocol\" = \"SASL_SSL\"\n[types.sync_customer]\nconfirm_within_ms = 1000\n",
        )
        .unwrap();
        assert_eq!(cfg.kafka["security.protocol"], "SASL_SSL");
        assert_eq!(cfg.policy().confirm_within("sync_customer", None), 1000);
    }

    #[test]
    fn redacted_masks_credentials_only() {
        let cfg = from_toml(
            "[kafka]\n\"bootstrap.servers\" = \"k:9093\"\n\"sasl.password\" = \"hunter2\"\n\"ssl.key.pem\" = \"PEM\"\n",
        )
        .unwrap();
        let http = Http { token: Some("t0k3n".into()), read_token: Some("r3ad".into()), ..Http::default() };
        let cfg = Config { http, ..cfg }.redacted();
        assert_eq!(cfg.http.token.as_deref(), Some("[REDACTED]"));
        assert_eq!(cfg.http.read_token.as_deref(), Some("[REDACTED]"));
        assert_eq!(cfg.kafka["sasl.password"], "[REDACTED]");
        assert_eq!(cfg.kafka["ssl.key.pem"], "[REDACTED]");
        assert_eq!(cfg.kafka["bootstrap.servers"], "k:9093");
    }

    #[test]
    fn exactly_once_settings_are_checked() {
        let cfg = from_toml("guarantee = \"exactly_once\"\nstate_dir = \"/var/lib/r\"\n").unwrap();
        assert_eq!(cfg.guarantee, Guarantee::ExactlyOnce);
        let id = cfg.transactional_id();
        assert!(id.starts_with("reconciler@") && id.ends_with(":/var/lib/r"), "{id}");
        let cfg = from_toml("guarantee = \"exactly_once\"\n[consumer]\ntransactional_id = \"rec-0\"\n").unwrap();
        assert_eq!(cfg.transactional_id(), "rec-0");
        let err = from_toml("guarantee = \"exactly_once\"\n[consumer]\ntransactional_id = \"\"\n").unwrap_err();
        assert!(err.to_string().contains("consumer.transactional_id"), "{err}");
        let err = from_toml("guarantee = \"exactly_once\"\n[kafka]\n\"bootstrap.servers\" = \"k:9\"\n\"isolation.level\" = \"read_uncommitted\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("kafka.isolation.level"), "{err}");
        let err = from_toml("[kafka]\n\"bootstrap.servers\" = \"k:9\"\n\"transactional.id\" = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("kafka.transactional.id"), "{err}");
    }
}
