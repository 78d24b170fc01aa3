//! `reconciler review --fleet` and `explain --fleet`: the members of the
//! fleet (read once from the fleet topic) asked over their HTTP APIs, as
//! the API's `?scope=fleet` does (see [`crate::fleet`]).

use super::explain::Explanation;
use super::review::{ReviewFilter, ReviewItem, Waiting};
use super::{render, OperatorError};
use crate::clock::system_clock;
use crate::config::Config;
use crate::fleet::{client, watch, Member};

/// The live members of `cfg`'s fleet.
fn live_members(cfg: &Config) -> Result<Vec<Member>, OperatorError> {
    let topic = cfg
        .topics
        .fleet()
        .ok_or_else(|| OperatorError::Invalid("--fleet: [topics] fleet is off (empty) in this configuration".into()))?;
    let members = watch::read_once(&cfg.kafka, topic)?.live(system_clock()());
    if members.is_empty() {
        return Err(OperatorError::Invalid(format!(
            "--fleet: no live member announced on {topic} (is a `reconciler run` with an HTTP server up?)"
        )));
    }
    Ok(members)
}

fn runtime() -> Result<tokio::runtime::Runtime, OperatorError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| OperatorError::Invalid(format!("starting the HTTP client: {e}")))
}

/// The query string of `/api/review` for `filter`.
fn query(filter: &ReviewFilter) -> String {
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string();
    let mut q = vec![format!("waiting={}", if filter.waiting == Waiting::Machine { "machine" } else { "person" })];
    if let Some(t) = &filter.operation_type {
        q.push(format!("type={}", enc(t)));
    }
    if let Some(o) = filter.outcome {
        q.push(format!("outcome={}", o.as_str()));
    }
    if let Some(ms) = filter.older_than_ms {
        q.push(format!("older_than={ms}ms"));
    }
    q.join("&")
}

/// The client that asks the members, with this configuration's read
/// credentials.
fn member_client(cfg: &Config) -> reqwest::Client {
    client::http_client(cfg.http.read_authorization().as_deref())
}

/// `reconciler review --fleet`.
pub fn review_fleet_cmd(cfg: &Config, filter: &ReviewFilter, as_json: bool) -> Result<String, OperatorError> {
    let members = live_members(cfg)?;
    let fleet = runtime()?.block_on(client::review(&member_client(cfg), &members, &query(filter)));
    if as_json {
        return Ok(format!("{}\n", serde_json::to_string_pretty(&fleet).expect("JSON serializes")));
    }
    let mut out = format!("Fleet: {} live member(s)\n", fleet.members.len());
    for m in &fleet.members {
        let owned: Vec<String> = m.owned.iter().map(i32::to_string).collect();
        match (&m.cases, &m.error) {
            (Some(n), _) => out.push_str(&format!("  {}  partitions {}: {n} case(s)\n", m.url, owned.join(","))),
            (None, e) => out.push_str(&format!(
                "  {}  partitions {}: NOT ANSWERED ({}): its cases are missing below\n",
                m.url,
                owned.join(","),
                e.as_deref().unwrap_or("?")
            )),
        }
    }
    let items: Vec<ReviewItem> = fleet.cases.iter().filter_map(|c| serde_json::from_value(c.clone()).ok()).collect();
    out.push('\n');
    out.push_str(&render::review(&items, filter.waiting));
    Ok(out)
}

/// `reconciler explain --fleet OP`.
pub fn explain_fleet_cmd(cfg: &Config, operation_id: &str, as_json: bool) -> Result<String, OperatorError> {
    let members = live_members(cfg)?;
    let (owner, body) = runtime()?
        .block_on(client::find(&member_client(cfg), &members, operation_id))
        .ok_or_else(|| OperatorError::NotFound(operation_id.to_owned()))?;
    if as_json {
        return Ok(format!("{}\n", serde_json::to_string_pretty(&body).expect("JSON serializes")));
    }
    let x: Explanation = serde_json::from_value(body).map_err(|e| {
        OperatorError::Invalid(format!("{owner} answered with an explanation this version cannot read: {e}"))
    })?;
    Ok(format!("Owned by {owner}\n\n{}", render::explanation(&x)))
}
