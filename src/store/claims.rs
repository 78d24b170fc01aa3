//! Which partitions of the store the pipeline writes: those it owns and
//! those it is being assigned. A standby replica ([`crate::fleet::standby`])
//! writes only the others, each write under the same lock, so that a
//! partition the pipeline takes over is never written by both.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// The partitions the pipeline claims (cheap to clone: shared).
#[derive(Debug, Clone, Default)]
pub struct Claims(Arc<Mutex<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    claimed: BTreeSet<i32>,
    /// Per standby partition, the changelog position after the last record
    /// the standby wrote (its writes are the partition's latest).
    standby_at: BTreeMap<i32, i64>,
}

impl Claims {
    /// The pipeline takes `partition` (at assignment, before it reads the
    /// partition's offset): waits for a standby write in progress. Returns
    /// the changelog position a standby of it here had written up to, if
    /// it was one: the state to catch up from there.
    pub fn claim(&self, partition: i32) -> Option<i64> {
        let mut inner = self.lock();
        inner.claimed.insert(partition);
        inner.standby_at.remove(&partition)
    }

    /// The pipeline owns only `owned` now.
    pub fn keep_only(&self, owned: &[i32]) {
        self.lock().claimed.retain(|p| owned.contains(p));
    }

    /// The partitions claimed now.
    pub fn claimed(&self) -> BTreeSet<i32> {
        self.lock().claimed.clone()
    }

    /// Runs `write` unless `partition` is claimed, holding the lock
    /// throughout; when it succeeds, the standby's writes of the partition
    /// reach changelog position `to` (`None`: its state is not the
    /// standby's any more). `None` when the partition is claimed.
    pub fn unless_claimed<T, E>(
        &self,
        partition: i32,
        to: Option<i64>,
        write: impl FnOnce() -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        let mut inner = self.lock();
        if inner.claimed.contains(&partition) {
            return None;
        }
        let written = write();
        match (&written, to) {
            (Ok(_), Some(at)) => inner.standby_at.insert(partition, at),
            _ => inner.standby_at.remove(&partition),
        };
        Some(written)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
