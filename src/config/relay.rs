//! `[relay]`: the transactional outbox relay (`reconciler relay`),
//! which publishes the rows services commit to the PostgreSQL outbox
//! (`sql/outbox.sql`) to `[topics] events`.
//!
//! The connection string never sits in the file: `connection_env` names the
//! environment variable that holds it, read when the relay starts, so a
//! missing variable fails at start-up with the field named.

use serde::{Deserialize, Serialize};

use super::{bind_addr, invalid, ConfigError};

/// What the relay does with a row once the broker acknowledged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnPublished {
    /// `status = 'published'` with `published_at` (the default): the table
    /// is the history of what was sent; prune it as you see fit.
    Mark,
    /// Delete the row: the table holds only what is still to be sent (and
    /// the dead letters).
    Delete,
}

/// The outbox relay (`[relay]`).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// The environment variable that holds the PostgreSQL connection string
    /// (`host=... user=... dbname=...` or `postgresql://...`).
    pub connection_env: String,
    /// Most rows one claim takes (one transaction, one producer flush).
    pub batch_size: usize,
    /// How often the relay looks for rows when no notification woke it, in
    /// ms (a fallback: the outbox's trigger notifies on every commit).
    pub poll_interval_ms: u64,
    /// Failed publishes of a row, refused for that row (too large,
    /// invalid), before it becomes `dead_letter`. Outages do not count.
    pub max_attempts: u32,
    /// Back-off after the first failure, in ms; doubled for each further
    /// one (with jitter), up to `backoff_max_ms`. Both a row's next attempt
    /// and the relay's pause during an outage follow it.
    pub backoff_initial_ms: u64,
    /// Longest back-off, in ms.
    pub backoff_max_ms: u64,
    /// How long the broker may take to acknowledge a row before the publish
    /// counts as failed (an outage), in ms (librdkafka's `message.timeout.ms`).
    pub delivery_timeout_ms: u64,
    /// How long every row may keep being refused for a reason that is not
    /// the row's (no permission, no such topic) before the relay stops with
    /// a non-zero exit, in ms; readiness is red from the first such
    /// refusal. Outages (broker down, timeouts) are waited out however long
    /// they last, and a row refused for its own sake is retried and
    /// dead-lettered as `max_attempts` says.
    pub give_up_after_ms: u64,
    /// `mark` (the default) or `delete` published rows.
    pub on_published: OnPublished,
    /// How often the outbox's backlog and dead letters are counted for the
    /// gauges, in ms.
    pub count_interval_ms: u64,
    /// Where the relay serves `/metrics`, `/healthz` and `/readyz`; "off" (or "")
    /// serves nothing.
    pub bind: String,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            connection_env: "OUTBOX_DATABASE_URL".into(),
            batch_size: 1000,
            poll_interval_ms: 1000,
            max_attempts: 10,
            backoff_initial_ms: 500,
            backoff_max_ms: 10_000,
            delivery_timeout_ms: 30_000,
            give_up_after_ms: 60_000,
            on_published: OnPublished::Mark,
            count_interval_ms: 5000,
            bind: "127.0.0.1:9466".into(),
        }
    }
}

impl RelayConfig {
    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.connection_env.trim().is_empty() {
            return Err(invalid("relay.connection_env", "must name an environment variable"));
        }
        if self.batch_size == 0 {
            return Err(invalid("relay.batch_size", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(invalid("relay.max_attempts", "must be at least 1"));
        }
        for (field, v) in [
            ("relay.poll_interval_ms", self.poll_interval_ms),
            ("relay.backoff_initial_ms", self.backoff_initial_ms),
            ("relay.delivery_timeout_ms", self.delivery_timeout_ms),
            ("relay.count_interval_ms", self.count_interval_ms),
            ("relay.give_up_after_ms", self.give_up_after_ms),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return Err(invalid("relay.backoff_max_ms", "must be at least relay.backoff_initial_ms"));
        }
        self.bind_addr()?;
        Ok(())
    }

    /// `give_up_after_ms` as a duration.
    pub fn give_up_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.give_up_after_ms)
    }

    /// `delivery_timeout_ms` as a duration.
    pub fn delivery_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.delivery_timeout_ms)
    }

    /// The wait after failure number `attempt` (a row's, or the relay's
    /// during an outage), with the jitter `draw` in [0, 1) picks.
    pub fn backoff(&self, attempt: u32, draw: f64) -> std::time::Duration {
        let ms = std::time::Duration::from_millis;
        crate::retry::backoff(attempt, ms(self.backoff_initial_ms), ms(self.backoff_max_ms), None, draw)
    }

    /// The address of the relay's metrics server, or `None` when it is off.
    pub fn bind_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        bind_addr("relay.bind", &self.bind)
    }

    /// The connection string, read from `connection_env` now; an error
    /// naming the field when the variable is unset or does not parse.
    pub fn connection(&self) -> Result<String, ConfigError> {
        let var = &self.connection_env;
        let s = std::env::var(var)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| invalid("relay.connection_env", format!("environment variable {var} is not set")))?;
        s.parse::<tokio_postgres::Config>().map_err(|e| {
            invalid("relay.connection_env", format!("{var} is not a PostgreSQL connection string: {e}"))
        })?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_field() {
        let bad = [
            (RelayConfig { batch_size: 0, ..Default::default() }, "relay.batch_size"),
            (RelayConfig { max_attempts: 0, ..Default::default() }, "relay.max_attempts"),
            (RelayConfig { poll_interval_ms: 0, ..Default::default() }, "relay.poll_interval_ms"),
            (RelayConfig { backoff_max_ms: 1, ..Default::default() }, "relay.backoff_max_ms"),
            (RelayConfig { give_up_after_ms: 0, ..Default::default() }, "relay.give_up_after_ms"),
            (RelayConfig { bind: "nowhere".into(), ..Default::default() }, "relay.bind"),
            (RelayConfig { connection_env: " ".into(), ..Default::default() }, "relay.connection_env"),
        ];
        for (cfg, field) in bad {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        RelayConfig::default().validate().unwrap();
    }

    #[test]
    fn a_missing_or_malformed_connection_variable_names_the_field() {
        let cfg = RelayConfig { connection_env: "RELAY_TEST_UNSET_VARIABLE".into(), ..Default::default() };
        let e = cfg.connection().unwrap_err().to_string();
        assert!(e.contains("relay.connection_env") && e.contains("RELAY_TEST_UNSET_VARIABLE is not set"), "{e}");
        // SAFETY-free: a variable only this test reads.
        std::env::set_var("RELAY_TEST_MALFORMED_VARIABLE", "host=");
        let cfg = RelayConfig { connection_env: "RELAY_TEST_MALFORMED_VARIABLE".into(), ..Default::default() };
        let e = cfg.connection().unwrap_err().to_string();
        assert!(e.contains("not a PostgreSQL connection string"), "{e}");
    }
}
