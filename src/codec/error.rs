//! Typed codec errors. Each decode error names what was wrong; the pipeline
//! routes them to the DLQ with [`DecodeError::class`] as the error class.

/// Why a record could not be turned into a valid event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record has no value (a tombstone): nothing to decode.
    #[error("record has no value (null)")]
    NullValue,
    /// The record (key, value and headers together) exceeds
    /// `consumer.max_record_bytes`; not decoded.
    #[error("record of {size} bytes exceeds the limit of {limit} bytes")]
    Oversize {
        /// Size of the record in bytes: key, value and headers.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The value does not start with a framing this topic is read in (e.g.
    /// plain JSON, or a Confluent-framed record where only single-object
    /// encoding is read).
    #[error("bad magic: expected {expected}, found {found}")]
    BadMagic {
        /// What the topic is read in: `C3 01 (Avro single-object encoding)`,
        /// `00 (Confluent framing)` or both.
        expected: &'static str,
        /// The first bytes (up to two), in hex.
        found: String,
    },
    /// The value is shorter than its framing's header.
    #[error("truncated header: {len} bytes, {framing} needs at least {needs}")]
    TruncatedHeader {
        /// Length of the value in bytes.
        len: usize,
        /// The framing its first byte names.
        framing: &'static str,
        /// The header's length in that framing.
        needs: usize,
    },
    /// A Confluent-framed record names a schema id the registry does not
    /// have (or that was not fetched).
    #[error("unknown schema id {id}: {reason}")]
    UnknownSchemaId {
        /// The id read from the header.
        id: u32,
        /// What the registry said.
        reason: String,
    },
    /// A Confluent-framed record names a schema the reconciler cannot read
    /// it with: not a schema of this topic's record type, or one whose
    /// records do not resolve to the reconciler's by Avro's rules (an
    /// incompatible change).
    #[error("schema id {id} cannot be read as {expected}: {reason}")]
    IncompatibleSchema {
        /// The id read from the header.
        id: u32,
        /// Full name of the record type the topic carries.
        expected: &'static str,
        /// Why, as the compatibility check reports it.
        reason: String,
    },
    /// No shipped schema has this fingerprint: a writer with a schema that is
    /// not (yet) in `schemas/`.
    #[error("unknown writer schema fingerprint {fingerprint:016x}")]
    UnknownFingerprint {
        /// The fingerprint read from the header.
        fingerprint: u64,
    },
    /// The writer schema is known but of another record type (e.g. a
    /// verdict written to the input topic).
    #[error("writer schema {found} is not a {expected}")]
    WrongSchema {
        /// Full name of the schema the topic carries.
        expected: &'static str,
        /// Full name of the record's writer schema.
        found: String,
    },
    /// The body ends before the writer schema's last field.
    #[error("truncated body: the record ends before {schema} is complete ({detail})")]
    TruncatedBody {
        /// The writer schema (full name, and file where known).
        schema: String,
        /// Where it ended, as the decoder reports it.
        detail: String,
    },
    /// The body does not follow the writer schema (bad varint, union index
    /// or UTF-8), or does not resolve or convert to the product's type.
    #[error("malformed body for {schema}: {detail}")]
    Malformed {
        /// The writer schema (full name, and file where known).
        schema: String,
        /// What was wrong, as the decoder reports it.
        detail: String,
    },
    /// Bytes left after a complete body: typically a writer whose schema is
    /// not the one its fingerprint names.
    #[error("{trailing} trailing bytes after the {schema} body")]
    TrailingBytes {
        /// The writer schema.
        schema: String,
        /// How many bytes were left.
        trailing: usize,
    },
    /// A field is missing or of the wrong type, or breaks input validation
    /// (an empty id, seq below 1, a non-positive window).
    #[error("invalid field {field}: {reason}")]
    InvalidField {
        /// The schema field at fault.
        field: &'static str,
        /// What its value breaks.
        reason: String,
    },
    /// The record key is not the event's entity_id: the entity's
    /// events could land on another partition and lose their order.
    #[error("record key {} does not equal entity_id {entity_id:?}: producers must key by entity_id", key.as_ref().map_or_else(|| "(none)".to_owned(), |k| format!("{k:?}")))]
    KeyMismatch {
        /// The record key (lossy UTF-8), `None` when the record had none.
        key: Option<String>,
        /// The event's entity_id.
        entity_id: String,
    },
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
            DecodeError::UnknownSchemaId { .. } => "unknown_schema_id",
            DecodeError::IncompatibleSchema { .. } => "incompatible_schema",
            DecodeError::WrongSchema { .. } => "wrong_schema",
            DecodeError::Malformed { .. } | DecodeError::TrailingBytes { .. } => "malformed",
            DecodeError::InvalidField { .. } => "invalid_field",
            DecodeError::KeyMismatch { .. } => "key_mismatch",
        }
    }

    /// Every class, for metrics initialisation.
    pub const CLASSES: [&'static str; 11] = [
        "null_value",
        "oversize",
        "bad_magic",
        "truncated",
        "unknown_fingerprint",
        "unknown_schema_id",
        "incompatible_schema",
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
    /// Full name of the schema the value was checked against.
    pub schema: &'static str,
    /// What the Avro writer rejected.
    pub detail: String,
}
