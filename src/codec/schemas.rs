//! The schema set: every `.avsc` in `schemas/`, parsed and fingerprinted
//! once at start, looked up by fingerprint for each record.

use std::borrow::Cow;
use std::sync::{Arc, Once, RwLock};

use apache_avro::types::Value;
use apache_avro::Schema;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{DecodeError, EncodeError};
use super::framing::{Framing, InputFraming, CONFLUENT_HEADER_LEN, CONFLUENT_MAGIC};
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

    /// Every kind.
    pub const ALL: [SchemaKind; 4] =
        [SchemaKind::OperationEvent, SchemaKind::Verdict, SchemaKind::Anomaly, SchemaKind::RepairCommand];

    /// The text of its current schema file (what is registered in a
    /// schema registry).
    pub fn current_text(self) -> &'static str {
        SCHEMA_FILES.iter().find(|f| f.2 == self && f.3).map(|f| f.1).expect("every kind has a current schema")
    }

    /// The kind whose record has full name `name`.
    pub fn of_full_name(name: &str) -> Option<SchemaKind> {
        SchemaKind::ALL.into_iter().find(|k| k.full_name() == name)
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
    /// Path under `schemas/`, or `registry id N` for a schema fetched from
    /// a schema registry; named in decode errors.
    pub file: Cow<'static, str>,
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

/// A writer schema found for a record: one of `schemas/` (borrowed, the
/// hot path) or one fetched from a registry.
#[derive(Debug)]
pub enum WriterRef<'a> {
    /// A shipped schema.
    Shipped(&'a WriterSchema),
    /// A schema the registry holds that is none of the shipped ones.
    Registered(Arc<WriterSchema>),
}

impl std::ops::Deref for WriterRef<'_> {
    type Target = WriterSchema;
    fn deref(&self) -> &WriterSchema {
        match self {
            WriterRef::Shipped(w) => w,
            WriterRef::Registered(w) => w,
        }
    }
}

/// What a schema id of the registry was found to be.
#[derive(Debug, Clone)]
pub enum Learned {
    /// The same schema (Parsing Canonical Form) as a shipped one, by its
    /// fingerprint: read exactly as a single-object record of it.
    Shipped(u64),
    /// Another version of one of the product's records that resolves to
    /// the current one by Avro's rules.
    Resolvable(Arc<WriterSchema>),
    /// Not readable: the registry has no such id, the schema does not
    /// parse, is not one of the product's records, or does not resolve.
    Unusable(Unusable),
}

/// Why a registry schema cannot be read.
#[derive(Debug, Clone)]
pub enum Unusable {
    /// The registry answered that it has no schema with this id.
    Missing(String),
    /// A schema, but not one the reconciler can read as the record type
    /// `kind` (`None`: none of the product's record types).
    Incompatible {
        /// The record type it names, if one of the product's.
        kind: Option<SchemaKind>,
        /// Why.
        reason: String,
    },
}

/// All known schemas, by fingerprint, and those learnt from a registry, by
/// id.
#[derive(Debug, Clone)]
pub struct SchemaSet {
    by_fingerprint: rustc_hash::FxHashMap<u64, Arc<WriterSchema>>,
    /// Looked up for every output encoded: FxHash, not SipHash (a few
    /// fixed kinds, nothing an input chooses).
    current: rustc_hash::FxHashMap<SchemaKind, Arc<WriterSchema>>,
    /// Registry schema ids seen so far and what they are. Shared by clones:
    /// an id is fetched once per process, and schemas under an id never
    /// change (the registry's contract).
    registered: Arc<RwLock<rustc_hash::FxHashMap<u32, Learned>>>,
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
        let mut set = SchemaSet {
            by_fingerprint: Default::default(),
            current: Default::default(),
            registered: Default::default(),
        };
        for (file, text, kind, current) in SCHEMA_FILES {
            let schema = Schema::parse_str(text).unwrap_or_else(|e| panic!("schemas/{file} does not parse: {e}"));
            let w = Arc::new(WriterSchema {
                file: Cow::Borrowed(file),
                kind,
                fingerprint: fingerprint(&schema),
                schema,
                current,
            });
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

    /// Whether registry schema `id` is still to be fetched.
    pub fn needs(&self, id: u32) -> bool {
        !self.registered.read().expect("not poisoned").contains_key(&id)
    }

    /// Records what registry schema `id` is, from the registry's answer:
    /// the schema's text, or why there is none. Returns what it was found
    /// to be.
    pub fn learn(&self, id: u32, answer: Result<&str, String>) -> Learned {
        let learned = match answer {
            Err(reason) => Learned::Unusable(Unusable::Missing(reason)),
            Ok(text) => self.judge(id, text),
        };
        self.registered.write().expect("not poisoned").insert(id, learned.clone());
        learned
    }

    /// Records that registry schema `id` is the current schema of `kind`
    /// (the registry answered so for the schema the reconciler registered).
    pub fn learn_current(&self, id: u32, kind: SchemaKind) {
        let fp = self.current(kind).fingerprint;
        self.registered.write().expect("not poisoned").insert(id, Learned::Shipped(fp));
    }

    /// What schema `text` (registry id `id`) is to the reconciler.
    fn judge(&self, id: u32, text: &str) -> Learned {
        let schema = match Schema::parse_str(text) {
            Ok(s) => s,
            Err(e) => {
                return Learned::Unusable(Unusable::Incompatible {
                    kind: None,
                    reason: format!("not an Avro schema it can parse: {e}"),
                })
            }
        };
        let fp = fingerprint(&schema);
        if self.by_fingerprint.contains_key(&fp) {
            return Learned::Shipped(fp);
        }
        let name = match &schema {
            Schema::Record(r) => r.name.fullname(None),
            other => format!("a {:?} schema", apache_avro::schema::SchemaKind::from(other)),
        };
        let Some(kind) = SchemaKind::of_full_name(&name) else {
            return Learned::Unusable(Unusable::Incompatible {
                kind: None,
                reason: format!("it is {name}, none of the reconciler's records"),
            });
        };
        if let Err(e) = apache_avro::schema_compatibility::SchemaCompatibility::can_read(&schema, self.reader(kind)) {
            return Learned::Unusable(Unusable::Incompatible {
                kind: Some(kind),
                reason: format!("its records do not resolve to the reconciler's {}: {e}", kind.full_name()),
            });
        }
        Learned::Resolvable(Arc::new(WriterSchema {
            file: Cow::Owned(format!("registry id {id}")),
            kind,
            fingerprint: fp,
            schema,
            current: false,
        }))
    }

    /// Reads the framing's header and finds the writer schema: by
    /// fingerprint (single-object) or by registry id (Confluent), as
    /// `accept` allows.
    pub fn writer_for<'b>(
        &self,
        bytes: &'b [u8],
        expected: SchemaKind,
        accept: InputFraming,
    ) -> Result<(WriterRef<'_>, &'b [u8]), DecodeError> {
        let (writer, body) = match bytes.first() {
            Some(&CONFLUENT_MAGIC) if accept.accepts(Framing::Confluent) => self.by_id(bytes, expected)?,
            Some(&b) if b == MAGIC[0] && accept.accepts(Framing::SingleObject) => {
                if bytes.len() >= 2 && bytes[1] != MAGIC[1] {
                    return Err(bad_magic(bytes, accept));
                }
                if bytes.len() < HEADER_LEN {
                    return Err(DecodeError::TruncatedHeader {
                        len: bytes.len(),
                        framing: "single-object encoding",
                        needs: HEADER_LEN,
                    });
                }
                let fp = u64::from_le_bytes(bytes[2..HEADER_LEN].try_into().expect("8 bytes"));
                let w = self.by_fingerprint.get(&fp).ok_or(DecodeError::UnknownFingerprint { fingerprint: fp })?;
                (WriterRef::Shipped(w), &bytes[HEADER_LEN..])
            }
            Some(_) => return Err(bad_magic(bytes, accept)),
            None => {
                let (framing, needs) = match accept {
                    InputFraming::Confluent => ("the Confluent framing", CONFLUENT_HEADER_LEN),
                    _ => ("single-object encoding", HEADER_LEN),
                };
                return Err(DecodeError::TruncatedHeader { len: 0, framing, needs });
            }
        };
        if writer.kind != expected {
            return Err(DecodeError::WrongSchema {
                expected: expected.full_name(),
                found: writer.kind.full_name().to_owned(),
            });
        }
        Ok((writer, body))
    }

    /// The writer schema of a Confluent-framed record, by its id.
    fn by_id<'b>(&self, bytes: &'b [u8], expected: SchemaKind) -> Result<(WriterRef<'_>, &'b [u8]), DecodeError> {
        let Some(id) = super::framing::confluent_id(bytes) else {
            return Err(DecodeError::TruncatedHeader {
                len: bytes.len(),
                framing: "the Confluent framing",
                needs: CONFLUENT_HEADER_LEN,
            });
        };
        let learned = self.registered.read().expect("not poisoned").get(&id).cloned();
        let writer = match learned {
            None => {
                return Err(DecodeError::UnknownSchemaId {
                    id,
                    reason: "not fetched from a schema registry (none is configured here)".into(),
                })
            }
            Some(Learned::Shipped(fp)) => WriterRef::Shipped(&self.by_fingerprint[&fp]),
            Some(Learned::Resolvable(w)) => WriterRef::Registered(w),
            Some(Learned::Unusable(Unusable::Missing(reason))) => {
                return Err(DecodeError::UnknownSchemaId { id, reason })
            }
            Some(Learned::Unusable(Unusable::Incompatible { kind, reason })) => {
                let reason = match kind {
                    Some(k) if k != expected => format!("it is a {}, not a {}", k.full_name(), expected.full_name()),
                    _ => reason,
                };
                return Err(DecodeError::IncompatibleSchema { id, expected: expected.full_name(), reason });
            }
        };
        Ok((writer, &bytes[CONFLUENT_HEADER_LEN..]))
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
    /// Either framing is read: the output topics carry what the instance
    /// that wrote them was configured for.
    pub fn decode_serde<T: DeserializeOwned>(&self, kind: SchemaKind, bytes: &[u8]) -> Result<T, DecodeError> {
        let (writer, body) = self.writer_for(bytes, kind, InputFraming::Both)?;
        let value = decode_value(&writer, body, Some(self.reader(kind)))?;
        apache_avro::from_value(&value)
            .map_err(|e| DecodeError::Malformed { schema: kind.full_name().to_owned(), detail: e.to_string() })
    }
}

/// The error for a record whose first bytes are no framing `accept` reads.
fn bad_magic(bytes: &[u8], accept: InputFraming) -> DecodeError {
    let found = bytes.iter().take(2).map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(" ");
    DecodeError::BadMagic { expected: accept.expected(), found }
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
