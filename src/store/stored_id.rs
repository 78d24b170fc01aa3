//! An id as a timeline entry stores it: a UUID in its canonical text form
//! (lowercase hex, hyphenated: every verdict id, and the event ids of most
//! services) as its 16 bytes, any other id as its text. 17 bytes instead
//! of 37 for a UUID, one byte more than its text for any other id; read
//! back, the text is the same byte for byte.
//!
//! A timeline entry's own event id has a third form, [`Claimer`]:
//! "the event that claimed the entry's revision", when it did. The
//! operation's state already names that event in its revision's record
//! (`OperationState::applied_seqs`, never changed once written), so the
//! entry of nearly every applied event need not name it again (see
//! `timeline`).

use crate::core::ids::{canonical_uuid, uuid_text};
use serde::{Deserialize, Serialize, Serializer};

/// The name serde gives the stored enum (postcard writes only the variant's
/// number: 0 the text, 1 the 16 bytes).
const NAME: &str = "StoredId";

/// An id as written.
pub(super) struct IdRef<'a>(pub &'a str);

impl Serialize for IdRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match canonical_uuid(self.0) {
            Some(bytes) => s.serialize_newtype_variant(NAME, 1, "Uuid", &bytes),
            None => s.serialize_newtype_variant(NAME, 0, "Text", self.0),
        }
    }
}

/// A timeline entry's own event id written as "the claimer of the entry's
/// revision" (one byte); any other is written as [`IdRef`].
pub(super) struct Claimer;

impl Serialize for Claimer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit_variant(NAME, 2, "Claimer")
    }
}

/// A timeline entry's own event id read back: [`IdRef`] or [`Claimer`].
#[derive(Debug, Deserialize)]
#[serde(rename = "StoredId")]
pub(super) enum StoredOwnId<S> {
    Text(S),
    Uuid([u8; 16]),
    Claimer,
}

impl<S: Into<String>> StoredOwnId<S> {
    /// The id's text; `claimer` gives the claimer's (`None` when the state
    /// names no claimer of the entry's revision: a damaged store).
    pub fn into_string(self, claimer: impl FnOnce() -> Option<String>) -> Option<String> {
        match self {
            StoredOwnId::Text(text) => Some(StoredId::Text(text).into_string()),
            StoredOwnId::Uuid(bytes) => Some(StoredId::<S>::Uuid(bytes).into_string()),
            StoredOwnId::Claimer => claimer(),
        }
    }
}

/// [`IdRef`] read back; `S` is `String` or a `&str` borrowed from the value.
#[derive(Debug, Deserialize)]
#[serde(rename = "StoredId")]
pub(super) enum StoredId<S> {
    Text(S),
    Uuid([u8; 16]),
}

impl<S: Into<String>> StoredId<S> {
    /// The id's text, as it was before it was written.
    pub fn into_string(self) -> String {
        match self {
            StoredId::Text(text) => text.into(),
            StoredId::Uuid(bytes) => uuid_text(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(id: &str) -> (usize, String) {
        let bytes = postcard::to_allocvec(&IdRef(id)).unwrap();
        let back: StoredId<&str> = postcard::from_bytes(&bytes).unwrap();
        (bytes.len(), back.into_string())
    }

    #[test]
    fn an_id_reads_back_as_its_text() {
        let uuid = "6f1c9a52-3c0e-4f7e-9d8b-0b7a52e1c4a9";
        assert_eq!(round_trip(uuid), (17, uuid.to_owned()));
        // Not the canonical text of a UUID: kept as text, whatever it is.
        for id in ["op-1.req", "6F1C9A52-3C0E-4F7E-9D8B-0B7A52E1C4A9", "6f1c9a523c0e4f7e9d8b0b7a52e1c4a9", ""] {
            assert_eq!(round_trip(id), (2 + id.len(), id.to_owned()));
        }
        let curly = "{6f1c9a52-3c0e-4f7e-9d8b-0b7a52e1c4a}";
        assert_eq!(round_trip(curly).1, curly);
    }

    #[test]
    fn an_own_id_reads_back_as_its_text_or_its_claimers() {
        let own = |bytes: Vec<u8>| {
            let back: StoredOwnId<&str> = postcard::from_bytes(&bytes).unwrap();
            (bytes.len(), back.into_string(|| Some("the claimer".to_owned())))
        };
        let uuid = "6f1c9a52-3c0e-4f7e-9d8b-0b7a52e1c4a9";
        let written = |id: &str| postcard::to_allocvec(&IdRef(id)).unwrap();
        assert_eq!(own(written(uuid)), (17, Some(uuid.to_owned())));
        assert_eq!(own(written("op-1.req")), (10, Some("op-1.req".to_owned())));
        let claimer = postcard::to_allocvec(&Claimer).unwrap();
        assert_eq!(own(claimer.clone()), (1, Some("the claimer".to_owned())));
        // Unnamed where the state names no claimer.
        assert_eq!(postcard::from_bytes::<StoredOwnId<&str>>(&claimer).unwrap().into_string(|| None), None);
    }
}
