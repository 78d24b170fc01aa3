//! The two framings of Avro records on Kafka, told apart by the first byte.
//!
//! - Avro single-object encoding: `C3 01`, the 8-byte little-endian
//!   CRC-64-AVRO fingerprint of the writer schema, the body. The record
//!   names its schema itself; no service is needed.
//! - The Confluent framing: `00`, the 4-byte big-endian id of the writer
//!   schema in a schema registry, the body. What the serializers of
//!   Confluent's clients (Java, Python, Go, .NET, Node) and their kin write
//!   and read.
//!
//! A Confluent record can never be mistaken for a single-object one: `00`
//! and `C3` differ in the first byte.

use serde::{Deserialize, Serialize};

/// The first byte of a Confluent-framed record.
pub const CONFLUENT_MAGIC: u8 = 0;
/// Magic byte plus schema id.
pub const CONFLUENT_HEADER_LEN: usize = 5;

/// How a record's Avro bytes are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "io", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// Avro single-object encoding: `C3 01`, the 8-byte fingerprint, the
    /// body. Needs no registry.
    SingleObject,
    /// The Confluent framing: `00`, the 4-byte schema id, the body; schemas
    /// are registered in and fetched from a schema registry.
    Confluent,
}

/// Which framings a topic is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "io", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum InputFraming {
    /// Single-object encoded records only.
    SingleObject,
    /// Confluent-framed records only.
    Confluent,
    /// Either, told apart by the first byte (`C3` or `00`): for a
    /// migration of producers from one framing to the other.
    Both,
}

impl InputFraming {
    /// Whether records of `framing` are read.
    pub fn accepts(self, framing: Framing) -> bool {
        matches!(
            (self, framing),
            (InputFraming::Both, _)
                | (InputFraming::SingleObject, Framing::SingleObject)
                | (InputFraming::Confluent, Framing::Confluent)
        )
    }

    /// The framing of the events the reconciler itself writes to its input
    /// (timer firings, manual decisions, generated workloads): single-object
    /// unless only Confluent-framed records are read.
    pub fn written(self) -> Framing {
        match self {
            InputFraming::Confluent => Framing::Confluent,
            InputFraming::SingleObject | InputFraming::Both => Framing::SingleObject,
        }
    }

    /// What a record must start with, as a decode error says it.
    pub fn expected(self) -> &'static str {
        match self {
            InputFraming::SingleObject => "C3 01 (Avro single-object encoding)",
            InputFraming::Confluent => "00 (Confluent schema-registry framing)",
            InputFraming::Both => "C3 01 (Avro single-object encoding) or 00 (Confluent schema-registry framing)",
        }
    }
}

/// The Confluent header of schema `id`.
pub fn confluent_header(id: u32) -> [u8; CONFLUENT_HEADER_LEN] {
    let b = id.to_be_bytes();
    [CONFLUENT_MAGIC, b[0], b[1], b[2], b[3]]
}

/// The schema id of a Confluent-framed record, `None` for anything else
/// (the pipeline fetches the ids of a batch before it decodes the batch).
pub fn confluent_id(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [CONFLUENT_MAGIC, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_confluent_header_is_zero_then_the_id_big_endian() {
        assert_eq!(confluent_header(0x0102_0304), [0, 1, 2, 3, 4]);
        assert_eq!(confluent_id(&[0, 0, 0, 1, 7, 0xAA]), Some(263));
        assert_eq!(confluent_id(&[0, 0, 0, 1]), None, "too short");
        assert_eq!(confluent_id(&[0xC3, 1, 0, 0, 0, 0]), None, "single-object");
    }
}
