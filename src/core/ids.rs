//! Deterministic ids: RFC 4122 version 5 UUIDs (SHA-1 of a namespace and a
//! name) of the facts that caused an output, written in the hyphenated
//! lower-case form.
//!
//! The same construction as `uuid::Uuid::new_v5` over the parts joined by
//! U+001F, so every id is the one earlier versions derived (a replay after
//! an upgrade still publishes byte-identical records; a test compares the
//! two). It is on the hot path (a verdict id per verdict, an anomaly id
//! per anomaly): the `sha1` crate uses the CPU's SHA instructions where it
//! has them, and the parts are hashed in place, without a joined copy or
//! the formatting machinery. Measured in BENCHMARKS.md.

use sha1::{Digest, Sha1};
use uuid::{Builder, Uuid};

/// The separator between the parts of a name.
const SEPARATOR: &[u8] = "\u{1f}".as_bytes();

/// The version 5 UUID in `namespace` of `parts` joined by U+001F.
pub fn v5(namespace: &Uuid, parts: &[&str]) -> String {
    let mut sha = Sha1::new();
    sha.update(namespace.as_bytes());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            sha.update(SEPARATOR);
        }
        sha.update(part.as_bytes());
    }
    let digest = sha.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    Builder::from_sha1_bytes(bytes).into_uuid().hyphenated().encode_lower(&mut text).to_owned()
}

/// The bytes of `id` when it is a UUID written as [`Uuid::hyphenated`]
/// writes one (so the bytes give back exactly this text): the form in
/// which the store keeps such ids in 16 bytes.
pub(crate) fn canonical_uuid(id: &str) -> Option<[u8; 16]> {
    if id.len() != uuid::fmt::Hyphenated::LENGTH {
        return None;
    }
    let uuid = Uuid::try_parse(id).ok()?;
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    (uuid.hyphenated().encode_lower(&mut text).as_bytes() == id.as_bytes()).then(|| *uuid.as_bytes())
}

/// The text of the UUID `bytes` as [`canonical_uuid`] took it: its
/// inverse, for ids the store kept in 16 bytes.
pub(crate) fn uuid_text(bytes: [u8; 16]) -> String {
    Uuid::from_bytes(bytes).hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An id as earlier versions published it, in the reconciler's own
    /// namespace (also Python's `uuid.uuid5(UUID(int=0x6f1c…c4a9),
    /// "verdict\x1fop-1\x1fev-1\x1f0")`): a change of construction or of
    /// namespace would change every id a replay publishes.
    #[test]
    fn a_known_id_stays_the_same() {
        assert_eq!(
            crate::core::verdict::derive_id(&["verdict", "op-1", "ev-1", "0"]),
            "d42f3cdc-ffa4-521e-83b5-cb0a26102976"
        );
    }

    proptest! {
        /// Any parts (empty, non-ASCII, longer than a SHA-1 block) give
        /// the id `uuid`'s own version 5 gives their joined name.
        #[test]
        fn agrees_with_uuid_new_v5(parts in proptest::collection::vec(".{0,80}", 0..6)) {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let reference = Uuid::new_v5(&Uuid::NAMESPACE_OID, parts.join("\u{1f}").as_bytes()).to_string();
            prop_assert_eq!(v5(&Uuid::NAMESPACE_OID, &refs), reference);
        }
    }
}
