//! The schema set: every `.avsc` in `schemas/`, parsed and fingerprinted
//! once at start, looked up by fingerprint for each record.

use std::sync::{Arc, Once};

use apache_avro::types::Value;
use apache_avro::Schema;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{DecodeError, EncodeError};
use super::{HEADER_LEN, MAGIC};

/// The record types of the product's topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaKind {
    /// The input topic's events (`operation_event.avsc`).
    OperationEvent,
    /// The verdicts topic (`verdict.avsc`).
    Verdict,
    /// The anomalies topic (`anomaly.avsc`).
    Anomaly,
    /// The commands topic (`repair_command.avsc`).
    RepairCommand,
}

impl SchemaKind {
    /// The schema's full name.
    pub fn full_name(self) -> &'static str {
        match self {
            SchemaKind::OperationEvent => "reconciler.v1.OperationEvent",
            SchemaKind::Verdict => "reconciler.v1.Verdict",
            SchemaKind::Anomaly => "reconciler.v1.Anomaly",
            SchemaKind::RepairCommand => "reconciler.v1.RepairCommand",
        }
    }
}

/// One shipped schema file: (path under `schemas/`, text, kind, is current).
type SchemaFile = (&'static str, &'static str, SchemaKind, bool);

/// The files of `schemas/`, embedded so the binary carries its contract.
/// Older versions stay listed so records written with them still decode.
pub const SCHEMA_FILES: [SchemaFile; 8] = [
    ("operation_event.avsc", include_str!("../../schemas/operation_event.avsc"), SchemaKind::OperationEvent, true),
    (
        "history/operation_event.v2.avsc",
        include_str!("../../schemas/history/operation_event.v2.avsc"),
        SchemaKind::OperationEvent,
        false,
    ),
    (
        "history/operation_event.v1.avsc",
        include_str!("../../schemas/history/operation_event.v1.avsc"),
        SchemaKind::OperationEvent,
        false,
    ),
    ("verdict.avsc", include_str!("../../schemas/verdict.avsc"), SchemaKind::Verdict, true),
    ("history/verdict.v1.avsc", include_str!("../../schemas/history/verdict.v1.avsc"), SchemaKind::Verdict, false),
    ("anomaly.avsc", include_str!("../../schemas/anomaly.avsc"), SchemaKind::Anomaly, true),
    ("history/anomaly.v1.avsc", include_str!("../../schemas/history/anomaly.v1.avsc"), SchemaKind::Anomaly, false),
    ("repair_command.avsc", include_str!("../../schemas/repair_command.avsc"), SchemaKind::RepairCommand, true),
];

/// Largest allocation a decoded field may ask for. Random bytes can claim a
/// string of gigabytes; the Avro library refuses anything above this.
const MAX_ALLOCATION_BYTES: usize = 16 * 1024 * 1024;

/// A parsed writer schema.
#[derive(Debug)]
pub struct WriterSchema {
    /// Path under `schemas/`, named in decode errors.
    pub file: &'static str,
    /// The record type it describes.
    pub kind: SchemaKind,
    /// CRC-64-AVRO of its Parsing Canonical Form: the key records name it by.
    pub fingerprint: u64,
    /// The parsed schema.
    pub schema: Schema,
    /// The current version (no resolution needed to read it).
    pub current: bool,
}

impl WriterSchema {
    /// A buffer holding the single-object header of this schema, ready for
    /// the body to be appended.
    pub fn header(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&self.fingerprint.to_le_bytes());
        buf
    }
}

/// All known schemas, by fingerprint.
#[derive(Debug, Clone)]
pub struct SchemaSet {
    by_fingerprint: rustc_hash::FxHashMap<u64, Arc<WriterSchema>>,
    /// Looked up for every output encoded: FxHash, not SipHash (a few
    /// fixed kinds, nothing an input chooses).
    current: rustc_hash::FxHashMap<SchemaKind, Arc<WriterSchema>>,
}

/// The Parsing Canonical Form as the Avro specification defines it.
///
/// apache-avro 0.21 keeps a primitive with a stripped logical type as
/// `{"type":"long"}`, where the specification's [PRIMITIVES] rule (and the
/// Java library, fastavro, ...) write `"long"`. The fingerprints then differ
/// and other clients' records look like an unknown schema; the interop test
/// against fastavro caught it. The degenerate form can only come from that
/// case, so it is rewritten here.
pub fn canonical_form(schema: &Schema) -> String {
    let mut pcf = schema.canonical_form();
    for p in ["null", "boolean", "int", "long", "float", "double", "bytes", "string"] {
        pcf = pcf.replace(&format!("{{\"type\":\"{p}\"}}"), &format!("\"{p}\""));
    }
    pcf
}

/// CRC-64-AVRO of a schema's Parsing Canonical Form.
pub fn fingerprint(schema: &Schema) -> u64 {
    use apache_avro::rabin::Rabin;
    use digest::Digest;
    let mut d = Rabin::new();
    d.update(canonical_form(schema).as_bytes());
    u64::from_le_bytes(d.finalize()[..8].try_into().expect("Rabin fingerprints are 8 bytes"))
}

impl SchemaSet {
    /// Parses the embedded schema files. They are part of the build, so a
    /// file that does not parse is a build defect caught by the test suite.
    pub fn builtin() -> Self {
        static LIMIT: Once = Once::new();
        LIMIT.call_once(|| {
            apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        });
        let mut set = SchemaSet { by_fingerprint: Default::default(), current: Default::default() };
        for (file, text, kind, current) in SCHEMA_FILES {
            let schema = Schema::parse_str(text).unwrap_or_else(|e| panic!("schemas/{file} does not parse: {e}"));
            let w = Arc::new(WriterSchema { file, kind, fingerprint: fingerprint(&schema), schema, current });
            if current {
                set.current.insert(kind, w.clone());
            }
            set.by_fingerprint.insert(w.fingerprint, w);
        }
        set
    }

    /// The current (reader) schema of a kind.
    pub fn reader(&self, kind: SchemaKind) -> &Schema {
        &self.current[&kind].schema
    }

    /// The current version of a kind.
    pub fn current(&self, kind: SchemaKind) -> &WriterSchema {
        &self.current[&kind]
    }

    /// Every known writer schema.
    pub fn all(&self) -> impl Iterator<Item = &WriterSchema> {
        self.by_fingerprint.values().map(|w| w.as_ref())
    }

    /// Reads the single-object header and finds the writer schema.
    pub fn writer_for<'b>(
        &self,
        bytes: &'b [u8],
        expected: SchemaKind,
    ) -> Result<(&WriterSchema, &'b [u8]), DecodeError> {
        if bytes.len() >= 2 && bytes[..2] != MAGIC {
            return Err(DecodeError::BadMagic { found: format!("{:02X} {:02X}", bytes[0], bytes[1]) });
        }
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::TruncatedHeader { len: bytes.len() });
        }
        let fp = u64::from_le_bytes(bytes[2..HEADER_LEN].try_into().expect("8 bytes"));
        let writer = self.by_fingerprint.get(&fp).ok_or(DecodeError::UnknownFingerprint { fingerprint: fp })?;
        if writer.kind != expected {
            return Err(DecodeError::WrongSchema {
                expected: expected.full_name(),
                found: writer.kind.full_name().to_owned(),
            });
        }
        Ok((writer, &bytes[HEADER_LEN..]))
    }

    /// Encodes `value` with the current schema of `kind`, header included.
    pub fn encode<T: Serialize>(&self, kind: SchemaKind, value: &T) -> Result<Vec<u8>, EncodeError> {
        let w = self.current(kind);
        let mut buf = w.header();
        apache_avro::write_avro_datum_ref(&w.schema, value, &mut buf)
            .map_err(|e| EncodeError { schema: kind.full_name(), detail: e.to_string() })?;
        Ok(buf)
    }

    /// Encodes an Avro value with the current schema of `kind`, header included.
    pub fn encode_value(&self, kind: SchemaKind, value: Value) -> Result<Vec<u8>, EncodeError> {
        let w = self.current(kind);
        let mut buf = w.header();
        let body = apache_avro::to_avro_datum(&w.schema, value)
            .map_err(|e| EncodeError { schema: kind.full_name(), detail: e.to_string() })?;
        buf.extend(body);
        Ok(buf)
    }

    /// Decodes a record of `kind` into a serde type (for the output topics).
    pub fn decode_serde<T: DeserializeOwned>(&self, kind: SchemaKind, bytes: &[u8]) -> Result<T, DecodeError> {
        let (writer, body) = self.writer_for(bytes, kind)?;
        let value = decode_value(writer, body, Some(self.reader(kind)))?;
        apache_avro::from_value(&value)
            .map_err(|e| DecodeError::Malformed { schema: kind.full_name().to_owned(), detail: e.to_string() })
    }
}

/// Decodes a body written with `writer`, resolving it to `reader` when the
/// writer is an older version. The whole body must be consumed.
pub(super) fn decode_value(writer: &WriterSchema, body: &[u8], reader: Option<&Schema>) -> Result<Value, DecodeError> {
    let schema_name = || format!("{} ({})", writer.kind.full_name(), writer.file);
    let mut cursor = body;
    let value = apache_avro::from_avro_datum(&writer.schema, &mut cursor, None).map_err(|e| {
        let detail = e.to_string();
        let source = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
        if detail.contains("fill whole buffer")
            || source.contains("fill whole buffer")
            || detail.contains("UnexpectedEof")
        {
            DecodeError::TruncatedBody { schema: schema_name(), detail }
        } else {
            DecodeError::Malformed { schema: schema_name(), detail }
        }
    })?;
    if !cursor.is_empty() {
        return Err(DecodeError::TrailingBytes { schema: schema_name(), trailing: cursor.len() });
    }
    match reader {
        Some(r) if !writer.current => value.resolve(r).map_err(|e| DecodeError::Malformed {
            schema: schema_name(),
            detail: format!("schema resolution failed: {e}"),
        }),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::{Decision, ErrorClass, EvidenceSource};
    use crate::core::output::{Action, AnomalyKind, Escalation, Outcome, RepairAction, Status};

    /// The symbols of enum `name` in the current schema of `kind`.
    fn symbols(kind: SchemaKind, name: &str) -> Vec<String> {
        fn find(v: &serde_json::Value, name: &str) -> Option<Vec<String>> {
            match v {
                serde_json::Value::Object(m)
                    if m.get("type") == Some(&"enum".into()) && m.get("name") == Some(&name.into()) =>
                {
                    serde_json::from_value(m["symbols"].clone()).ok()
                }
                serde_json::Value::Object(m) => m.values().find_map(|v| find(v, name)),
                serde_json::Value::Array(a) => a.iter().find_map(|v| find(v, name)),
                _ => None,
            }
        }
        let (file, text, ..) = SCHEMA_FILES.iter().find(|f| f.2 == kind && f.3).expect("a current schema");
        let json: serde_json::Value = serde_json::from_str(text).expect("schema is JSON");
        find(&json, name).unwrap_or_else(|| panic!("enum {name} not in {file}"))
    }

    fn names<T: Copy>(all: &[T], as_str: fn(T) -> &'static str) -> Vec<String> {
        all.iter().map(|v| as_str(*v).to_owned()).collect()
    }

    /// The codec writes a variant's declaration index as its symbol index:
    /// every enum must list the schema's symbols, in the schema's order.
    #[test]
    fn every_schema_enum_matches_its_rust_type() {
        use SchemaKind::*;
        let cases = [
            (OperationEvent, "ErrorClass", names(&ErrorClass::ALL, ErrorClass::as_str)),
            (OperationEvent, "EvidenceSource", names(&EvidenceSource::ALL, EvidenceSource::as_str)),
            (OperationEvent, "Decision", names(&Decision::ALL, Decision::as_str)),
            (Verdict, "Outcome", names(&Outcome::ALL, Outcome::as_str)),
            (Verdict, "Action", names(&Action::ALL, Action::as_str)),
            (Verdict, "OperationState", names(&Status::ALL, Status::as_str)),
            (Verdict, "Decision", names(&Decision::ALL, Decision::as_str)),
            (Verdict, "Escalation", names(&Escalation::ALL, Escalation::as_str)),
            (Anomaly, "AnomalyKind", names(&AnomalyKind::ALL, AnomalyKind::as_str)),
            (RepairCommand, "RepairAction", names(&RepairAction::ALL, RepairAction::as_str)),
        ];
        for (kind, name, rust) in cases {
            assert_eq!(symbols(kind, name), rust, "{name} in {}", kind.full_name());
        }
    }
}
