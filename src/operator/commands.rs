//! The operator subcommands as the binary runs them: open what they need
//! from the configuration, call the library functions, return the text to
//! print (human or `--json`). `main.rs` only dispatches here.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use super::dlq::{self, DlqFilter};
use super::progress::ReplayBars;
use super::replay::{self, ReplayOptions};
use super::resolve::{self, ResolveRequest};
use super::review::ReviewFilter;
use super::{explain, render, review, OperatorError};
use crate::clock::system_clock;
use crate::config::Config;
use crate::kafka::producer::Publisher;
use crate::store::Store;

/// A read view of a state directory, also while `reconciler run` holds it
/// (a RocksDB secondary instance, whose scratch directory is removed on drop).
pub struct StoreView {
    /// The secondary instance, caught up with its writer when opened.
    pub store: Store,
    scratch: PathBuf,
}

impl Drop for StoreView {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Opens `cfg.state_dir` for reading, caught up with its writer.
pub fn open_view(cfg: &Config) -> Result<StoreView, OperatorError> {
    let dir = &cfg.state_dir;
    if !dir.join("CURRENT").exists() {
        return Err(OperatorError::Invalid(format!(
            "no state store in {} (set state_dir in the config, RECONCILER_STATE_DIR or --state-dir)",
            dir.display()
        )));
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let scratch = std::env::temp_dir().join(format!("reconciler-view-{}-{stamp}", std::process::id()));
    let store = Store::open_secondary(dir, &scratch, &cfg.topics.events)?;
    let view = StoreView { store, scratch };
    view.store.catch_up()?;
    Ok(view)
}

fn json<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("operator results serialize");
    s.push('\n');
    s
}

/// `reconciler explain OP`.
pub fn explain_cmd(cfg: &Config, operation_id: &str, as_json: bool) -> Result<String, OperatorError> {
    let view = open_view(cfg)?;
    let x = explain::explain(&view.store, operation_id)?.ok_or_else(|| OperatorError::NotFound(operation_id.into()))?;
    Ok(if as_json { json(&x) } else { render::explanation(&x) })
}

/// `reconciler review`.
pub fn review_cmd(cfg: &Config, filter: &ReviewFilter, as_json: bool) -> Result<String, OperatorError> {
    let view = open_view(cfg)?;
    let now = system_clock()();
    let items = review::review(&view.store, filter, now)?;
    if as_json {
        return Ok(json(&items));
    }
    let filtered = filter.operation_type.is_some() || filter.outcome.is_some() || filter.older_than_ms.is_some();
    if items.is_empty() && filtered {
        let unfiltered = ReviewFilter { waiting: filter.waiting, ..ReviewFilter::default() };
        let all = review::review(&view.store, &unfiltered, now)?.len();
        let what = match filter.waiting {
            review::Waiting::Person => "in review",
            review::Waiting::Machine => "waiting for a machine action",
        };
        return Ok(format!("No case matches these filters ({all} operation(s) {what} in all).\n"));
    }
    Ok(render::review(&items, filter.waiting))
}

/// `reconciler resolve OP --decision D --actor A --note N`.
pub fn resolve_cmd(cfg: &Config, req: &ResolveRequest, as_json: bool) -> Result<String, OperatorError> {
    let view = open_view(cfg)?;
    let prepared = resolve::prepare(&view.store, req, system_clock()())?;
    drop(view);
    let keys = cfg.security.keys()?;
    let publisher = Publisher::new(&cfg.kafka, cfg.consumer.max_record_bytes)?;
    // Written in the framing the input is read in.
    let (codec, _, _) = crate::registry::codec(cfg)?;
    resolve::publish(&publisher, &codec, &keys, &cfg.topics.events, &prepared)?;
    Ok(if as_json {
        json(&prepared)
    } else {
        format!(
            "Published {} for {} (event {}) to {}/{}; the pipeline applies it when it consumes it.\nCheck with: reconciler explain {}\n",
            req.decision.as_str(),
            prepared.event.operation_id,
            prepared.event.event_id,
            cfg.topics.events,
            prepared.partition,
            prepared.event.operation_id
        )
    })
}

/// A fresh directory beside the configured state directory.
pub fn default_replay_dir(state_dir: &Path) -> PathBuf {
    let stamp = crate::clock::now_ms() / 1000;
    let name = state_dir.file_name().map_or_else(|| "reconciler-state".into(), |n| n.to_string_lossy().into_owned());
    state_dir.with_file_name(format!("{name}.replay-{stamp}"))
}

/// `reconciler replay`.
pub fn replay_cmd(
    cfg: &Config,
    opts: &ReplayOptions,
    interrupt: &AtomicBool,
    as_json: bool,
) -> Result<String, OperatorError> {
    let mut bars = ReplayBars::default();
    let summary = replay::replay(cfg, opts, interrupt, |p| bars.update(p));
    bars.finish();
    let summary = summary?;
    Ok(if as_json { json(&summary) } else { render::replay(&summary) })
}

/// `reconciler dlq inspect`.
pub fn dlq_inspect_cmd(cfg: &Config, filter: &DlqFilter, as_json: bool) -> Result<String, OperatorError> {
    let items = dlq::inspect(&cfg.kafka, &cfg.topics, filter)?;
    Ok(if as_json { json(&items) } else { render::dead_letters(&items) })
}

/// `reconciler dlq redrive`.
pub fn dlq_redrive_cmd(
    cfg: &Config,
    filter: &DlqFilter,
    who: &dlq::Redriver,
    dry_run: bool,
    as_json: bool,
) -> Result<String, OperatorError> {
    if filter.class.is_none() && filter.positions.is_empty() {
        return Err(OperatorError::Invalid(
            "choose what to re-drive: --class CLASS or --offset PARTITION:OFFSET (see `reconciler dlq inspect`)".into(),
        ));
    }
    if !dry_run && who.actor.trim().is_empty() {
        return Err(OperatorError::Invalid("say who re-drives: --actor NAME (recorded in the audit)".into()));
    }
    let report = dlq::redrive(&cfg.kafka, &cfg.topics, filter, cfg.consumer.max_record_bytes, who, dry_run)?;
    Ok(if as_json { json(&report) } else { render::redrive(&report) })
}

/// Runs `f` against the outbox's database (`[relay] connection_env`).
fn with_outbox<T>(
    cfg: &Config,
    f: impl AsyncFnOnce(&mut tokio_postgres::Client) -> Result<T, crate::outbox::OutboxError>,
) -> Result<T, OperatorError> {
    let connection = cfg.relay.connection()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| OperatorError::Invalid(format!("starting a runtime: {e}")))?;
    Ok(rt.block_on(async {
        let mut client = crate::outbox::connect(&connection).await?;
        f(&mut client).await
    })?)
}

/// `reconciler outbox dead-letters`.
pub fn outbox_dead_letters_cmd(cfg: &Config, limit: usize, as_json: bool) -> Result<String, OperatorError> {
    let summary = with_outbox(cfg, async |c| crate::outbox::dead_letter::summary(c, limit).await)?;
    Ok(if as_json { json(&summary) } else { render::outbox_dead_letters(&summary) })
}

/// `reconciler outbox redrive`.
pub fn outbox_redrive_cmd(
    cfg: &Config,
    sel: &crate::outbox::dead_letter::OutboxSelection,
    actor: &str,
    note: &str,
    dry_run: bool,
    as_json: bool,
) -> Result<String, OperatorError> {
    let report = with_outbox(cfg, async |c| crate::outbox::dead_letter::redrive(c, sel, actor, note, dry_run).await)?;
    Ok(if as_json { json(&report) } else { render::outbox_redrive(&report) })
}

/// Parses `P:O` (a dead letter's DLQ partition and offset).
pub fn parse_position(text: &str) -> Result<(i32, i64), String> {
    let (p, o) = text.split_once(':').ok_or_else(|| format!("{text:?} is not PARTITION:OFFSET (e.g. 0:17)"))?;
    let p = p.trim().parse().map_err(|_| format!("bad partition in {text:?}"))?;
    let o = o.trim().parse().map_err(|_| format!("bad offset in {text:?}"))?;
    Ok((p, o))
}
