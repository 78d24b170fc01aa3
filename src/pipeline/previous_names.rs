//! Deployments that kept their state under the changelog's previous
//! default name.
//!
//! The changelog defaults to `<group_id>.state`, named after the consumer
//! group, so that two deployments over one input never restore each
//! other's state. It once defaulted to one name for every deployment,
//! [`PREVIOUS_DEFAULT_CHANGELOG`]. A deployment that ran on that default
//! and starts with the name left unset would otherwise create an empty
//! changelog under the new name and go on: the changelog would then hold
//! only what changed from then on, and a partition restored from it on
//! another machine would lack every operation left untouched since. So the
//! start stops and says which name to set.

use super::PipelineError;
use crate::config::{Config, ConfigError, PREVIOUS_DEFAULT_CHANGELOG};
use crate::kafka::consumer::group_offsets;
use crate::kafka::watermarks::Watermarks;

/// Fails when the changelog's name was left unset, no topic of that name
/// exists, and this group has processed the input while a topic of the
/// previous default name exists. A changelog named in the settings (or
/// turned off) is never second-guessed.
pub fn check(cfg: &Config, watermarks: &Watermarks) -> Result<(), PipelineError> {
    check_against(cfg, watermarks, PREVIOUS_DEFAULT_CHANGELOG)
}

/// [`check`] with the previous default name `previous`.
pub fn check_against(cfg: &Config, watermarks: &Watermarks, previous: &str) -> Result<(), PipelineError> {
    let t = &cfg.topics;
    let Some(changelog) = t.changelog().filter(|_| t.named_after_group.changelog) else { return Ok(()) };
    if changelog == previous || watermarks.exists(changelog)? {
        return Ok(());
    }
    // A topic this principal may not describe is not its changelog.
    if !watermarks.exists(previous).unwrap_or(false) {
        return Ok(());
    }
    let partitions = watermarks.partition_count(&t.events)?;
    let group = &cfg.consumer.group_id;
    if group_offsets(&cfg.kafka, group, &t.events, partitions)?.is_empty() {
        return Ok(());
    }
    let fleet = if t.named_after_group.fleet { " (and fleet = \"ops.fleet\")" } else { "" };
    Err(PipelineError::Config(ConfigError::Invalid {
        field: "topics.changelog".into(),
        reason: format!(
            "group {group} has processed {events} before, and a changelog under the previous default name {previous} exists, \
             while the changelog is now named after the group ({changelog}) and no such topic exists. \
             Set [topics] changelog = \"{previous}\"{fleet} to go on with it, \
             or name a new changelog to start one (a partition restored from it would hold only the changes made from then on)",
            events = t.events
        ),
    }))
}
