//! A verdict's reason as a timeline entry stores it: the number of the
//! template that made it and its arguments, or its text when no template
//! made it (a conflict's detail). See [`crate::core::reason`]: reading
//! renders the sentence with the code that made it, so it comes back
//! byte-identical to the one published, in about a fifth of the bytes.

use serde::de::Error as _;
use serde::ser::SerializeTupleVariant;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::reason::{Reason, Template};

/// The name serde gives the stored enum (postcard writes only the variant's
/// number: 0 the text, 1 the template's number and its arguments).
const NAME: &str = "StoredReason";

/// A reason as written.
pub(super) struct ReasonRef<'a>(pub &'a Reason);

impl Serialize for ReasonRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.template() {
            None => s.serialize_newtype_variant(NAME, 0, "Text", self.0.as_str()),
            Some(template) => {
                let mut v = s.serialize_tuple_variant(NAME, 1, "Form", 2)?;
                v.serialize_field(&(template as u8))?;
                v.serialize_field(&Args(self.0))?;
                v.end()
            }
        }
    }
}

/// A reason's arguments, written as a sequence of strings.
struct Args<'a>(&'a Reason);

impl Serialize for Args<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Postcard writes a sequence's length first: the iterator's exact.
        s.collect_seq(self.0.args())
    }
}

/// [`ReasonRef`] read back, as [`ReasonRef`] writes it.
#[derive(Deserialize)]
#[serde(rename = "StoredReason")]
enum Stored<'a> {
    Text(String),
    Form(u8, #[serde(borrow)] Vec<&'a str>),
}

/// A stored reason, read and rendered. An unknown template number or a
/// wrong count of arguments is an error of the value (written by a newer
/// format, or damaged).
pub(super) struct Rendered(pub String);

impl<'de> Deserialize<'de> for Rendered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rendered, D::Error> {
        match Stored::deserialize(d)? {
            Stored::Text(text) => Ok(Rendered(text)),
            Stored::Form(n, args) => (Template::from_number(n).and_then(|t| t.render(&args)))
                .map(Rendered)
                .ok_or_else(|| D::Error::custom(format_args!("no reason template {n} of {} argument(s)", args.len()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(r: &Reason) -> Vec<u8> {
        postcard::to_allocvec(&ReasonRef(r)).unwrap()
    }

    #[test]
    fn a_reason_reads_back_as_its_sentence() {
        let made = Reason::of(Template::Divergent, &[&"receipt", &"version 8", &"version 7"]);
        let text = Reason::from("Revision 3 was written twice.");
        for r in [&made, &text] {
            let back: Rendered = postcard::from_bytes(&stored(r)).unwrap();
            assert_eq!(back.0, r.as_str());
        }
        // The variant, the template's number, the count of arguments, and
        // each argument's length and text: not the sentence.
        assert_eq!(
            stored(&made).len(),
            3 + ["receipt", "version 8", "version 7"].map(|a| 1 + a.len()).iter().sum::<usize>()
        );
        assert!(stored(&made).len() < made.len() / 2);
    }

    #[test]
    fn an_unknown_template_is_an_error() {
        let bytes = postcard::to_allocvec(&(1u8, Template::ALL.len() as u8, vec!["x"])).unwrap();
        assert!(postcard::from_bytes::<Rendered>(&bytes).is_err());
        let bytes = postcard::to_allocvec(&(1u8, Template::Cancelled as u8, vec!["x", "y"])).unwrap();
        assert!(postcard::from_bytes::<Rendered>(&bytes).is_err());
    }
}
