//! Standby replicas (`[consumer] standby_replicas`): this instance tails
//! the changelog of partitions other members own into its own store, so
//! that when one of them moves here the pipeline finds its state current
//! (its stored offset at or past the group's committed one: the changelog
//! of a batch is published before its offset is committed) and goes on at
//! once instead of restoring.
//!
//! Which partitions: for each partition, the [`StandbyConfig::replicas`] live
//! members after its owner in the order of their advertised URLs
//! ([`assigned`]), from the fleet's roster; never one the pipeline claims
//! ([`crate::store::Claims`]). The roster is wall-clock facts at the edge;
//! a wrong guess only tails a partition for nothing, or not at all.
//!
//! How: a partition becoming a standby here is forgotten first (no offset,
//! so the pipeline restores it if it takes it over before the standby has
//! caught up), then read from the beginning of its changelog. Records are
//! kept until their batch's offsets record arrives and written with it in
//! one atomic write, so the stored offset always describes the stored
//! state; a large run without an offsets record (a compacted changelog's
//! prefix) is written in chunks with the offset deleted. A batch cut short
//! is held until its undo and the batch re-published after it arrive (see
//! [`crate::store::Restored`]). Every write runs under the claims lock and
//! only if the pipeline has not claimed the partition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{info, warn};

use super::{Member, Roster};
use crate::kafka::reader::reader_client;
use crate::kafka::KafkaError;
use crate::metrics::Metrics;
use crate::store::{changelog, Claims, Store};

/// The partitions `me` keeps a standby of: for each partition with a live
/// owner, the `replicas` members after the owner in URL order.
pub fn assigned(me: &str, members: &[Member], partitions: i32, replicas: usize) -> BTreeSet<i32> {
    let mut urls: Vec<&str> = members.iter().map(|m| m.url.as_str()).collect();
    urls.sort_unstable();
    urls.dedup();
    let n = urls.len();
    let Some(mine) = urls.iter().position(|u| *u == me) else { return BTreeSet::new() };
    let mut out = BTreeSet::new();
    for p in 0..partitions {
        let Some(owner) = members.iter().find(|m| m.owned.contains(&p)) else { continue };
        let Some(at) = urls.iter().position(|u| *u == owner.url) else { continue };
        if at != mine && (1..=replicas.min(n.saturating_sub(1))).any(|k| (at + k) % n == mine) {
            out.insert(p);
        }
    }
    out
}

/// What the standby tailer needs to know.
pub struct StandbyConfig {
    /// The `[kafka]` settings.
    pub kafka: BTreeMap<String, String>,
    /// The changelog topic.
    pub topic: String,
    /// The input's (and changelog's) partition count.
    pub partitions: i32,
    /// `[consumer] standby_replicas`.
    pub replicas: usize,
    /// This instance's advertised URL.
    pub me: String,
}

/// Bytes of a standby partition's records held without an offsets record
/// before they are written without one.
const CHUNK_BYTES: usize = 8 << 20;

/// One standby partition being tailed.
#[derive(Default)]
struct Tailed {
    /// The next changelog position to read.
    next: i64,
    /// Records read since the last offsets record.
    held: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    held_bytes: usize,
}

/// Starts the tailer: every second it works out the standby partitions
/// from `roster`, and applies their changelog to `store` until `shutdown`.
pub fn spawn(
    cfg: StandbyConfig,
    store: Arc<Store>,
    claims: Claims,
    roster: Roster,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KafkaError> {
    let consumer = reader_client(&cfg.kafka)?;
    std::thread::Builder::new()
        .name("standby".into())
        .spawn(move || {
            let mut tailer = Tailer { cfg, store, claims, metrics, consumer, tailed: BTreeMap::new() };
            let mut planned = Instant::now() - Duration::from_secs(60);
            while !shutdown.load(Ordering::Relaxed) {
                if planned.elapsed() >= Duration::from_secs(1) {
                    planned = Instant::now();
                    tailer.plan(&roster.live(crate::clock::now_ms()));
                }
                if tailer.tailed.is_empty() {
                    std::thread::sleep(Duration::from_millis(100)); // nothing to tail until the next plan
                    continue;
                }
                let polled = match tailer.consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        Some((m.partition(), m.offset(), m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)))
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "Reading the changelog for a standby failed; retrying");
                        None
                    }
                    None => None,
                };
                if let Some((p, offset, key, value)) = polled {
                    tailer.take(p, offset, key.unwrap_or_default(), value);
                }
            }
        })
        .map_err(|e| KafkaError::Timeout(format!("starting the standby tailer: {e}")))
}

struct Tailer {
    cfg: StandbyConfig,
    store: Arc<Store>,
    claims: Claims,
    metrics: Arc<Metrics>,
    consumer: BaseConsumer,
    tailed: BTreeMap<i32, Tailed>,
}

impl Tailer {
    /// Works out the standby partitions and (re)assigns the reader.
    fn plan(&mut self, members: &[Member]) {
        let claimed = self.claims.claimed();
        let want: BTreeSet<i32> = assigned(&self.cfg.me, members, self.cfg.partitions, self.cfg.replicas)
            .into_iter()
            .filter(|p| !claimed.contains(p))
            .collect();
        let have: BTreeSet<i32> = self.tailed.keys().copied().collect();
        if want != have {
            for p in have.difference(&want) {
                self.tailed.remove(p);
            }
            for p in want.difference(&have) {
                // Forgotten first: until caught up it has no offset.
                match self.claims.unless_claimed(*p, Some(0), || self.store.forget_partition(*p)) {
                    Some(Ok(())) => {
                        self.tailed.insert(*p, Tailed::default());
                    }
                    Some(Err(e)) => warn!(partition = p, error = %e, "Cannot start a standby of the partition"),
                    None => {}
                }
            }
            let mut tpl = TopicPartitionList::new();
            for (p, t) in &self.tailed {
                let at = if t.next == 0 { Offset::Beginning } else { Offset::Offset(t.next) };
                let _ = tpl.add_partition_offset(&self.cfg.topic, *p, at);
            }
            if let Err(e) = self.consumer.assign(&tpl) {
                warn!(error = %e, "Assigning the standby partitions failed");
            }
            let now: BTreeSet<i32> = self.tailed.keys().copied().collect();
            info!(partitions = ?now, "Standby partitions");
        }
        // Every plan, not only on a change of plan: a partition the
        // pipeline claims leaves the tailed set as it takes it over.
        self.metrics.restore.standby(self.tailed.len());
        let mut lag = 0;
        for (p, t) in &self.tailed {
            if let Ok((_, high)) = self.consumer.fetch_watermarks(&self.cfg.topic, *p, Duration::from_secs(1)) {
                lag += (high - t.next).max(0);
            }
        }
        self.metrics.restore.standby_lag(lag);
    }

    /// One changelog record of standby partition `p`.
    fn take(&mut self, p: i32, offset: i64, key: Vec<u8>, value: Option<Vec<u8>>) {
        let Some(t) = self.tailed.get_mut(&p) else { return };
        if offset < t.next {
            return;
        }
        t.next = offset + 1;
        let boundary = changelog::is_offsets_key(&key) && changelog::partition_of(&key) == Some(p);
        t.held_bytes += key.len() + value.as_ref().map_or(0, Vec::len);
        t.held.push((key, value));
        if !boundary && t.held_bytes < CHUNK_BYTES {
            return;
        }
        let (held, to) = (std::mem::take(&mut t.held), t.next);
        t.held_bytes = 0;
        match self.claims.unless_claimed(p, Some(to), || self.store.apply_changelog(p, &held)) {
            Some(Ok(_)) => self.metrics.restore.standby_applied(held.len()),
            Some(Err(e)) => {
                warn!(partition = p, error = %e, "A standby write failed; the partition is no longer a standby here");
                self.tailed.remove(&p);
                let _ = self.claims.unless_claimed(p, None, || self.store.forget_partition(p));
            }
            // The pipeline took it over: its own state from now on.
            None => {
                self.tailed.remove(&p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(url: &str, owned: &[i32]) -> Member {
        Member { url: url.into(), owned: owned.to_vec(), at_ms: 0, every_ms: 1 }
    }

    #[test]
    fn the_standbys_of_a_partition_are_the_members_after_its_owner() {
        let fleet = [m("http://b", &[2, 3]), m("http://a", &[0, 1]), m("http://c", &[4, 5])];
        assert_eq!(assigned("http://b", &fleet, 6, 1), BTreeSet::from([0, 1]));
        assert_eq!(assigned("http://c", &fleet, 6, 1), BTreeSet::from([2, 3]));
        assert_eq!(assigned("http://a", &fleet, 6, 1), BTreeSet::from([4, 5]));
        // Two replicas: everything a member does not own.
        assert_eq!(assigned("http://a", &fleet, 6, 2), BTreeSet::from([2, 3, 4, 5]));
        // More replicas than other members: still only the others' partitions.
        assert_eq!(assigned("http://a", &fleet, 6, 5), BTreeSet::from([2, 3, 4, 5]));
        // Not in the roster, or alone: nothing.
        assert!(assigned("http://z", &fleet, 6, 1).is_empty());
        assert!(assigned("http://a", &fleet[1..2], 6, 1).is_empty());
        // A partition nobody owns has no standby.
        assert_eq!(assigned("http://b", &[m("http://a", &[0]), m("http://b", &[])], 2, 1), BTreeSet::from([0]));
    }
}
