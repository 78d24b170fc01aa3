//! The name table of the core's enums, written once per enum.
//!
//! Outcomes, actions, states, anomaly kinds and the rest are published as
//! Avro enum symbols, matched against the schemas and used as metric
//! labels. [`named_enum!`] turns one list of `Variant => "NAME"` pairs into
//! the enum, its `ALL` array and its `as_str`, so the three cannot drift
//! apart when a variant is added.

/// Declares a fieldless enum from one list of `Variant => "NAME"` pairs and
/// generates, in an inherent `impl`:
///
/// - `pub const ALL: [Self; N]`: every variant in declaration order
///   (`v as usize` indexes it); for an enum of an Avro schema this is the
///   order of its symbols, which the codec writes as indices;
/// - `pub fn as_str(self) -> &'static str`: the variant's name.
///
/// Attributes (doc comments, derives, `#[serde(...)]`) pass through to the
/// enum and its variants unchanged, so the serialized form stays the one
/// the enum's own `rename_all` gives; the tests below hold it equal to the
/// names listed here.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident => $text:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(
                $(#[$variant_meta])*
                $variant,
            )+
        }

        impl $name {
            /// Every variant, in declaration order (`v as usize` indexes it);
            /// for an enum of a schema, the order of its symbols.
            pub const ALL: [Self; [$($text),+].len()] = [$(Self::$variant),+];

            /// The variant's name: the schema symbol (or metric label), the
            /// same string serde writes.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::fmt::Debug;

    use serde::de::DeserializeOwned;
    use serde::Serialize;

    use crate::core::event::{Decision, ErrorClass, EvidenceSource, ProbeErrorClass};
    use crate::core::output::{Action, AnomalyKind, Escalation, Outcome, RepairAction, Status};
    use crate::core::Disposition;

    /// `as_str` is what serde writes and reads back, names are distinct, and
    /// `ALL[v as usize] == v`.
    fn check<T>(all: &[T], name: fn(T) -> &'static str, index: fn(T) -> usize)
    where
        T: Copy + PartialEq + Debug + Serialize + DeserializeOwned,
    {
        let mut seen = HashSet::new();
        for (i, &v) in all.iter().enumerate() {
            assert_eq!(index(v), i, "{v:?} is not at its declaration index");
            assert!(seen.insert(name(v)), "{v:?}: name {} used twice", name(v));
            assert_eq!(serde_json::to_value(v).unwrap(), serde_json::Value::from(name(v)), "{v:?}");
            assert_eq!(serde_json::from_value::<T>(serde_json::Value::from(name(v))).unwrap(), v);
        }
    }

    #[test]
    fn names_are_the_serde_form_in_declaration_order() {
        check(&Status::ALL, Status::as_str, |v| v as usize);
        check(&Outcome::ALL, Outcome::as_str, |v| v as usize);
        check(&Action::ALL, Action::as_str, |v| v as usize);
        check(&AnomalyKind::ALL, AnomalyKind::as_str, |v| v as usize);
        check(&RepairAction::ALL, RepairAction::as_str, |v| v as usize);
        check(&Escalation::ALL, Escalation::as_str, |v| v as usize);
        check(&Decision::ALL, Decision::as_str, |v| v as usize);
        check(&ErrorClass::ALL, ErrorClass::as_str, |v| v as usize);
        check(&EvidenceSource::ALL, EvidenceSource::as_str, |v| v as usize);
        check(&ProbeErrorClass::ALL, ProbeErrorClass::as_str, |v| v as usize);
        check(&Disposition::ALL, Disposition::as_str, |v| v as usize);
    }

    #[test]
    fn names_are_unchanged() {
        assert_eq!(Status::RetryScheduled.as_str(), "RETRY_SCHEDULED");
        assert_eq!(Status::ALL.len(), 10);
        assert_eq!(AnomalyKind::ALL.len(), 10);
        assert_eq!(AnomalyKind::ForgedControlEvent.as_str(), "FORGED_CONTROL_EVENT");
        assert_eq!(Disposition::Anomalous.as_str(), "anomalous");
        assert_eq!(Disposition::ALL[Disposition::Ignored as usize], Disposition::Ignored);
        assert_eq!(EvidenceSource::ResultFile.as_str(), "RESULT_FILE");
    }
}
