//! A stable digest of a store's operation and entity state: two stores
//! that hold the same state (a live instance and its replay) give the same
//! digest, whatever order they were written in.

use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

use crate::store::{Store, StoreError};

/// The digest with what it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateDigest {
    /// Operations in the store.
    pub operations: u64,
    /// Entities in the store.
    pub entities: u64,
    /// 128-bit XXH3 over every (family, key, value) in key order, hex.
    pub digest: String,
}

/// Digest of `store`'s operations and entities (not timers, offsets, the
/// outbox or timelines: those follow from the state and the log position).
/// An operation's latest verdict is covered whole, its id and reason
/// included, though the store keeps them in a timeline entry
/// ([`Store::scan_state`]).
pub fn state_digest(store: &Store) -> Result<StateDigest, StoreError> {
    let mut h = Xxh3::new();
    let (mut operations, mut entities) = (0, 0);
    store.scan_state(|family, k, v, verdict| {
        if family == "ops" {
            operations += 1;
        } else {
            entities += 1;
        }
        let verdict = verdict.iter().flat_map(|(id, reason)| [id.as_bytes(), reason.as_bytes()]);
        for part in [family.as_bytes(), k, v].into_iter().chain(verdict) {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    })?;
    Ok(StateDigest { operations, entities, digest: format!("{:032x}", h.digest128()) })
}
