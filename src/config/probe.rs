//! `[probe]` and `[destinations.<name>]`: the probe worker that answers
//! PROBE commands by querying the destinations (`reconciler probe`).
//!
//! A destination is declared once, by the name services put in
//! `Requested.destination`. Secrets never sit in the file: HTTP header
//! values may name environment variables (`${CRM_TOKEN}`), and a
//! PostgreSQL destination names the variable that holds its connection
//! string. Both are resolved when the worker starts, so a missing variable
//! fails at start-up with the field named.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

/// The probe worker (`[probe]`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// Also run the worker inside `reconciler run` (same process, its own
    /// consumer group); `reconciler probe` runs it alone.
    pub enabled: bool,
    /// Consumer group of the workers on the commands topic.
    pub group_id: String,
    /// Directory of the worker's small RocksDB store: the answer given to
    /// each command in flight and the next command offset per partition, so
    /// that a restarted worker re-publishes the same answer rather than
    /// asking again.
    pub state_dir: PathBuf,
    /// Queries per probe request before it is recorded as `ProbeFailed`.
    pub max_attempts: u32,
    /// Back-off before the second query, in ms; doubled for each further
    /// one (with jitter), up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    /// Longest back-off between two queries, in ms (a longer Retry-After is
    /// capped to it).
    pub backoff_max_ms: u64,
    /// Probe requests in flight at once, over all destinations.
    pub max_in_flight: usize,
    /// How long an answer is kept after it was given, in ms: a command the
    /// pipeline re-publishes within that time (after its own crash) gets
    /// the same answer again instead of a new query.
    pub answer_retention_ms: i64,
    /// Where the standalone worker serves `/metrics` and `/healthz`; "off"
    /// (or "") serves nothing. Inside `run` the worker's metrics join the
    /// pipeline's `/metrics`.
    pub bind: String,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            enabled: false,
            group_id: "reconciler-probe".into(),
            state_dir: PathBuf::from("./reconciler-probe-state"),
            max_attempts: 4,
            backoff_initial_ms: 200,
            backoff_max_ms: 10_000,
            max_in_flight: 256,
            answer_retention_ms: 7 * 24 * 3600 * 1000,
            bind: "127.0.0.1:9465".into(),
        }
    }
}

/// How a destination is queried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DestinationKind {
    /// An HTTP endpoint that answers with JSON.
    Http,
    /// A SQL query against a PostgreSQL database.
    Postgres,
}

/// One destination (`[destinations.<name>]`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    /// `http` or `postgres`.
    pub kind: DestinationKind,
    /// HTTP: the URL, a template over `{idempotency_key}`, `{operation_id}`,
    /// `{entity_id}` and `{expected_version}` (values are percent-encoded).
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP: the method (default GET).
    #[serde(default = "default_method")]
    pub method: String,
    /// HTTP: request headers; `${VAR}` in a value is replaced by the
    /// environment variable VAR at start-up.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// HTTP: the statuses that mean "no such effect" (default 404).
    #[serde(default = "default_absent_status")]
    pub absent_status: Vec<u16>,
    /// HTTP: JSON pointer (RFC 6901) of the remote id in the answer.
    #[serde(default)]
    pub remote_id_pointer: Option<String>,
    /// HTTP: JSON pointer of the version (an integer) in the answer.
    #[serde(default)]
    pub version_pointer: Option<String>,
    /// HTTP: JSON pointer of the fingerprint (a string) in the answer.
    #[serde(default)]
    pub fingerprint_pointer: Option<String>,
    /// PostgreSQL: the environment variable that holds the connection
    /// string (`host=... user=... dbname=...` or a `postgresql://` URL).
    #[serde(default)]
    pub connection_env: Option<String>,
    /// PostgreSQL: the query. It returns at most one row, with any of the
    /// columns `remote_id` (text or bigint), `version` (bigint or integer)
    /// and `fingerprint` (text); no row means "no such effect".
    #[serde(default)]
    pub query: Option<String>,
    /// PostgreSQL: the values bound to `$1`, `$2`, ... in order, among
    /// `idempotency_key`, `operation_id`, `entity_id` (text) and
    /// `expected_version` (bigint).
    #[serde(default)]
    pub params: Vec<String>,
    /// Longest wait for one answer, in ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Queries in flight at once to this destination.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Most queries per second to this destination (none: unlimited).
    #[serde(default)]
    pub rate_per_second: Option<u32>,
    /// Consecutive failed queries that open the circuit breaker.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    /// How long an open circuit fails queries at once before one trial
    /// query is let through, in ms.
    #[serde(default = "default_open_for_ms")]
    pub open_for_ms: u64,
}

fn default_method() -> String {
    "GET".into()
}
fn default_absent_status() -> Vec<u16> {
    vec![404]
}
fn default_timeout_ms() -> u64 {
    2000
}
fn default_concurrency() -> usize {
    16
}
fn default_failure_threshold() -> u32 {
    5
}
fn default_open_for_ms() -> u64 {
    30_000
}

/// The command fields a URL template or a query may use.
pub const PROBE_PARAMS: [&str; 4] = ["idempotency_key", "operation_id", "entity_id", "expected_version"];

impl ProbeConfig {
    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.group_id.is_empty() {
            return Err(invalid("probe.group_id", "must not be empty"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("probe.max_attempts", "must be at least 1"));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("probe.max_in_flight", "must be at least 1"));
        }
        if self.answer_retention_ms <= 0 {
            return Err(invalid("probe.answer_retention_ms", "must be positive"));
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return Err(invalid("probe.backoff_max_ms", "must not be below probe.backoff_initial_ms"));
        }
        self.bind_addr()?;
        Ok(())
    }

    /// The standalone worker's metrics address, or `None` when off.
    pub fn bind_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        super::bind_addr("probe.bind", &self.bind)
    }
}

impl DestinationConfig {
    /// An HTTP destination at URL template `url`, every other field at its
    /// default (no JSON pointers: name the answer's fields before use).
    pub fn http(url: impl Into<String>) -> DestinationConfig {
        DestinationConfig {
            kind: DestinationKind::Http,
            url: Some(url.into()),
            method: default_method(),
            headers: BTreeMap::new(),
            absent_status: default_absent_status(),
            remote_id_pointer: None,
            version_pointer: None,
            fingerprint_pointer: None,
            connection_env: None,
            query: None,
            params: Vec::new(),
            timeout_ms: default_timeout_ms(),
            concurrency: default_concurrency(),
            rate_per_second: None,
            failure_threshold: default_failure_threshold(),
            open_for_ms: default_open_for_ms(),
        }
    }

    /// A PostgreSQL destination: `query` with `params` bound in order, on
    /// the connection string in environment variable `connection_env`;
    /// every other field at its default.
    pub fn postgres(connection_env: &str, query: &str, params: &[&str]) -> DestinationConfig {
        DestinationConfig {
            kind: DestinationKind::Postgres,
            url: None,
            connection_env: Some(connection_env.to_owned()),
            query: Some(query.to_owned()),
            params: params.iter().map(|p| (*p).to_owned()).collect(),
            ..DestinationConfig::http("")
        }
    }

    /// Checks destination `name`'s fields for its kind.
    pub fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("destinations.{name}.{f}");
        let required = |f: &str, v: &Option<String>| match v.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err(invalid(&field(f), format!("is required for kind = \"{}\"", self.kind_name()))),
        };
        match self.kind {
            DestinationKind::Http => {
                required("url", &self.url)?;
                let url = self.url.as_deref().unwrap_or_default();
                let mut sample = url.to_owned();
                for placeholder in placeholders(url) {
                    if !PROBE_PARAMS.contains(&placeholder) {
                        return Err(invalid(
                            &field("url"),
                            format!("unknown placeholder {{{placeholder}}} (known: {})", PROBE_PARAMS.join(", ")),
                        ));
                    }
                    sample = sample.replace(&format!("{{{placeholder}}}"), "x");
                }
                match reqwest::Url::parse(&sample) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                    Ok(u) => {
                        return Err(invalid(&field("url"), format!("scheme {:?}: only http and https", u.scheme())))
                    }
                    Err(e) => return Err(invalid(&field("url"), format!("not a URL: {e}"))),
                }
                if self.version_pointer.is_none() && self.fingerprint_pointer.is_none() {
                    return Err(invalid(
                        &field("version_pointer"),
                        "a version_pointer or a fingerprint_pointer is required: without one an answer cannot be judged",
                    ));
                }
                for (f, p) in [
                    ("remote_id_pointer", &self.remote_id_pointer),
                    ("version_pointer", &self.version_pointer),
                    ("fingerprint_pointer", &self.fingerprint_pointer),
                ] {
                    if p.as_deref().is_some_and(|p| !p.starts_with('/')) {
                        return Err(invalid(&field(f), "a JSON pointer starts with '/' (RFC 6901)"));
                    }
                }
                if self.absent_status.iter().any(|s| !(100..=599).contains(s)) {
                    return Err(invalid(&field("absent_status"), "HTTP statuses are between 100 and 599"));
                }
            }
            DestinationKind::Postgres => {
                required("connection_env", &self.connection_env)?;
                required("query", &self.query)?;
                for p in &self.params {
                    if !PROBE_PARAMS.contains(&p.as_str()) {
                        return Err(invalid(
                            &field("params"),
                            format!("unknown parameter {p:?} (known: {})", PROBE_PARAMS.join(", ")),
                        ));
                    }
                }
            }
        }
        if self.timeout_ms == 0 {
            return Err(invalid(&field("timeout_ms"), "must be positive"));
        }
        if self.concurrency == 0 {
            return Err(invalid(&field("concurrency"), "must be at least 1"));
        }
        if self.rate_per_second == Some(0) {
            return Err(invalid(&field("rate_per_second"), "must be positive (leave it out for no limit)"));
        }
        if self.failure_threshold == 0 {
            return Err(invalid(&field("failure_threshold"), "must be at least 1"));
        }
        Ok(())
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            DestinationKind::Http => "http",
            DestinationKind::Postgres => "postgres",
        }
    }
}

/// The `{name}` placeholders of a URL template, in order.
pub fn placeholders(template: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open + 1..].find('}') else { break };
        out.push(&rest[open + 1..open + 1 + len]);
        rest = &rest[open + 1 + len + 1..];
    }
    out
}

/// `text` with every `${VAR}` replaced by the environment variable VAR;
/// `field` is named when one is not set.
pub fn expand_env(text: &str, field: &str) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start + 2..].find('}') else {
            return Err(invalid(field, "an unclosed ${ in the value"));
        };
        let var = &rest[start + 2..start + 2 + len];
        let value = std::env::var(var).map_err(|_| invalid(field, format!("environment variable {var} is not set")))?;
        out.push_str(&value);
        rest = &rest[start + 2 + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http() -> DestinationConfig {
        DestinationConfig {
            remote_id_pointer: Some("/id".into()),
            version_pointer: Some("/version".into()),
            ..DestinationConfig::http("http://crm/api/syncs/{idempotency_key}")
        }
    }

    #[test]
    fn http_destination_fields_are_checked_by_name() {
        http().validate("crm").unwrap();
        let mut d = http();
        d.url = Some("http://crm/{idempotency}".into());
        assert!(d.validate("crm").unwrap_err().to_string().contains("destinations.crm.url"));
        let mut d = http();
        d.version_pointer = None;
        assert!(d.validate("crm").unwrap_err().to_string().contains("destinations.crm.version_pointer"));
        let mut d = http();
        d.remote_id_pointer = Some("id".into());
        assert!(d.validate("crm").unwrap_err().to_string().contains("destinations.crm.remote_id_pointer"));
        let mut d = http();
        d.url = Some("crm/api/{idempotency_key}".into());
        assert!(d.validate("crm").unwrap_err().to_string().contains("destinations.crm.url"));
    }

    #[test]
    fn postgres_destination_needs_a_query_and_known_params() {
        let mut d = http();
        d.kind = DestinationKind::Postgres;
        assert!(d.validate("db").unwrap_err().to_string().contains("destinations.db.connection_env"));
        let d = DestinationConfig::postgres("DB_URL", "SELECT 1", &["idempotency"]);
        assert!(d.validate("db").unwrap_err().to_string().contains("destinations.db.params"));
        DestinationConfig::postgres("DB_URL", "SELECT 1", &["idempotency_key"]).validate("db").unwrap();
    }

    #[test]
    fn env_references_are_expanded_or_named() {
        std::env::set_var("RECONCILER_TEST_PROBE_TOKEN", "s3cret");
        assert_eq!(expand_env("Bearer ${RECONCILER_TEST_PROBE_TOKEN}", "f").unwrap(), "Bearer s3cret");
        let err = expand_env("${RECONCILER_TEST_UNSET_VAR}", "destinations.crm.headers.Authorization").unwrap_err();
        assert!(err.to_string().contains("destinations.crm.headers.Authorization"), "{err}");
        assert!(err.to_string().contains("RECONCILER_TEST_UNSET_VAR"), "{err}");
    }

    #[test]
    fn placeholders_are_listed() {
        assert_eq!(placeholders("http://x/{entity_id}/v/{expected_version}"), vec!["entity_id", "expected_version"]);
    }
}
