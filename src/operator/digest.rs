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
pub fn state_digest(store: &Store) -> Result<StateDigest, StoreError> {
    let mut h = Xxh3::new();
    let (mut operations, mut entities) = (0, 0);
    store.scan_state(|family, k, v| {
        if family == "ops" {
            operations += 1;
        } else {
            entities += 1;
        }
        for part in [family.as_bytes(), k, v] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    })?;
    Ok(StateDigest { operations, entities, digest: format!("{:032x}", h.digest128()) })
}
