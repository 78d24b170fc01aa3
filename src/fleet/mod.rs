//! The fleet view: which instance owns which partitions, and
//! where its API answers, so that the API, the panel and the CLI of any
//! instance answer for the whole fleet.
//!
//! Each `reconciler run` with an HTTP server announces itself on the fleet
//! topic (`[topics] fleet`, compacted, one partition): key = its advertised
//! URL, value = a [`Member`] (the partitions it owns now, when it said so,
//! and how often it says it). It announces on every change of its
//! assignment and every [`ANNOUNCE_EVERY`], and leaves a tombstone when it
//! stops ([`announce`]). Every instance tails the topic into a [`Roster`]
//! ([`watch`]); a member not heard of for three announcement periods
//! (killed, partitioned away) is no longer listed as live. The fan-out to
//! the members' APIs is [`client`].
//!
//! The announcements are wall-clock facts at the edge: nothing here feeds
//! the core, and nothing decides state. An instance answers for the
//! partitions it owns *now* (its own consumer's assignment), never from
//! the roster, so a stale roster can only send a question to the wrong
//! member, which then answers that it does not own the case.

pub mod announce;
pub mod client;
pub mod standby;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a member announces itself while nothing changes.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);

/// One instance, as it announced itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Where its API answers (`[http] advertised_url`).
    pub url: String,
    /// The input partitions it owned when it announced.
    pub owned: Vec<i32>,
    /// Wall time of the announcement (ms since the Unix epoch).
    pub at_ms: i64,
    /// Its announcement period (ms).
    pub every_ms: i64,
}

impl Member {
    /// Whether it announced within three of its periods before `now_ms`.
    pub fn live(&self, now_ms: i64) -> bool {
        now_ms - self.at_ms <= 3 * self.every_ms.max(1)
    }
}

/// The members last heard of on the fleet topic, by URL. Cheap to clone
/// (shared).
#[derive(Debug, Clone, Default)]
pub struct Roster(Arc<RwLock<BTreeMap<String, Member>>>);

impl Roster {
    /// Takes in one record of the fleet topic (`value` `None`: the member
    /// left). A value that does not parse is ignored (another version's).
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) {
        let url = String::from_utf8_lossy(key).into_owned();
        let mut members = self.0.write().unwrap_or_else(|e| e.into_inner());
        match value.map(serde_json::from_slice::<Member>) {
            None => {
                members.remove(&url);
            }
            Some(Ok(m)) if m.url == url => {
                members.insert(url, m);
            }
            Some(_) => {}
        }
    }

    /// Every member heard of, live or not.
    pub fn all(&self) -> Vec<Member> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// The live members at `now_ms`.
    pub fn live(&self, now_ms: i64) -> Vec<Member> {
        self.all().into_iter().filter(|m| m.live(now_ms)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(url: &str, owned: Vec<i32>, at_ms: i64) -> Vec<u8> {
        serde_json::to_vec(&Member { url: url.into(), owned, at_ms, every_ms: 2_000 }).unwrap()
    }

    #[test]
    fn the_roster_keeps_the_latest_announcement_and_forgets_who_left_or_went_quiet() {
        let r = Roster::default();
        r.apply(b"http://a", Some(&member("http://a", vec![0, 1], 1_000)));
        r.apply(b"http://b", Some(&member("http://b", vec![2], 1_000)));
        r.apply(b"http://a", Some(&member("http://a", vec![0], 9_000)));
        // Not its own key: ignored; nor is a value that does not parse.
        r.apply(b"http://c", Some(&member("http://x", vec![5], 9_000)));
        r.apply(b"http://d", Some(b"{not json"));
        let live: Vec<_> = r.live(9_500).into_iter().map(|m| (m.url, m.owned)).collect();
        assert_eq!(live, vec![("http://a".to_owned(), vec![0])]);
        assert_eq!(r.all().len(), 2, "b is heard of but quiet for more than three periods");
        r.apply(b"http://a", None);
        assert!(r.live(9_500).is_empty());
    }
}
