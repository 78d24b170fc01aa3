//! Typed codec errors. Each decode error names what was wrong; the pipeline
//! routes them to the DLQ with [`DecodeError::class`] as the error class.

/// Why a record could not be turned into a valid event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record has no value (null)")]
    NullValue,
    #[error("record of {size} bytes exceeds the limit of {limit} bytes")]
    Oversize { size: usize, limit: usize },
    #[error("bad magic: expected C3 01 (Avro single-object encoding), found {found}")]
    BadMagic { found: String },
    #[error("truncated header: {len} bytes, single-object encoding needs at least 10")]
    TruncatedHeader { len: usize },
    #[error("unknown writer schema fingerprint {fingerprint:016x}")]
    UnknownFingerprint { fingerprint: u64 },
    #[error("writer schema {found} is not a {expected}")]
    WrongSchema { expected: &'static str, found: String },
    #[error("truncated body: the record ends before {schema} is complete ({detail})")]
    TruncatedBody { schema: String, detail: String },
    #[error("malformed body for {schema}: {detail}")]
    Malformed { schema: String, detail: String },
    #[error("{trailing} trailing bytes after the {schema} body")]
    TrailingBytes { schema: String, trailing: usize },
    #[error("invalid field {field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error("record key {} does not equal entity_id {entity_id:?}: producers must key by entity_id", key.as_ref().map_or_else(|| "(none)".to_owned(), |k| format!("{k:?}")))]
    KeyMismatch { key: Option<String>, entity_id: String },
}

impl DecodeError {
    /// A short, stable class for metrics and the `reconciler.error.class` header.
    pub fn class(&self) -> &'static str {
        match self {
            DecodeError::NullValue => "null_value",
            DecodeError::Oversize { .. } => "oversize",
            DecodeError::BadMagic { .. } => "bad_magic",
            DecodeError::TruncatedHeader { .. } | DecodeError::TruncatedBody { .. } => "truncated",
            DecodeError::UnknownFingerprint { .. } => "unknown_fingerprint",
            DecodeError::WrongSchema { .. } => "wrong_schema",
            DecodeError::Malformed { .. } | DecodeError::TrailingBytes { .. } => "malformed",
            DecodeError::InvalidField { .. } => "invalid_field",
            DecodeError::KeyMismatch { .. } => "key_mismatch",
        }
    }

    /// Every class, for metrics initialisation.
    pub const CLASSES: [&'static str; 9] = [
        "null_value",
        "oversize",
        "bad_magic",
        "truncated",
        "unknown_fingerprint",
        "wrong_schema",
        "malformed",
        "invalid_field",
        "key_mismatch",
    ];
}

/// A value the schema does not accept: a bug in the producer of the value,
/// reported with the schema it was checked against.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode a {schema}: {detail}")]
pub struct EncodeError {
    pub schema: &'static str,
    pub detail: String,
}
