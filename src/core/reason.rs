//! A verdict's reason: the sentence it publishes, and the template and
//! arguments the sentence was made of.
//!
//! Every reason the state machine gives is one of a score of fixed
//! sentences with a few values in them. The store keeps a reason as its
//! template's number and its arguments, not as the sentence: the sentence
//! was about sixty bytes, a tenth of a stored operation, written again with
//! every change of the operation and its changelog record. Reading renders
//! the sentence with the same code that made it ([`Template::render`]), so
//! the text read back is byte-identical to the one published.
//!
//! A template's number and text are therefore part of the store's format:
//! append new templates at the end; changing or removing one needs a new
//! store format (`FORMAT` in `store/rocks.rs`).

use std::fmt::{self, Display, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most arguments a template takes.
pub const MAX_ARGS: usize = 3;

macro_rules! templates {
    ($($(#[$meta:meta])* $variant:ident => [$($part:literal),+ $(,)?]),+ $(,)?) => {
        /// A reason's sentence, as its fixed parts around its arguments.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Template {
            $($(#[$meta])* $variant,)+
        }

        impl Template {
            /// Every template, in number order (`t as usize` indexes it).
            pub const ALL: &'static [Template] = &[$(Template::$variant),+];

            /// The fixed text around the arguments: one part more than
            /// there are arguments.
            pub fn parts(self) -> &'static [&'static str] {
                match self {
                    $(Template::$variant => &[$($part),+],)+
                }
            }
        }
    };
}

templates! {
    /// A permanent failure: attempt, error code.
    FailedPermanently => ["Attempt ", " failed permanently (", "): the effect does not exist and retrying will not create it."],
    /// A failure at the attempt limit: attempt, error code, limit.
    FailedAtLimit => ["Attempt ", " failed (", ") and the limit of ", " attempts is reached: the effect does not exist."],
    /// No effect found, requeue: source, why it is safe.
    AbsentRequeue => ["A ", " found no effect; requeue is safe because ", "."],
    /// No effect found, requeues exhausted: source, requeues.
    AbsentExhausted => ["A ", " found no effect, and the operation was already requeued ", " time(s), the limit: a person must decide."],
    /// No effect found for an attempted, non-idempotent operation: source.
    AbsentReview => ["A ", " found no effect, but the operation is not idempotent and was attempted: a person must decide."],
    /// Cancelled: the reason given.
    Cancelled => ["Cancelled: ", "."],
    /// A person's decision: actor, what they did, note.
    Manual => ["", " ", " after manual review: ", ""],
    /// A second remote id: source, new remote id, first remote id.
    DuplicateEffect => ["A ", " found the effect a second time under remote id ", " (first: ", "): it exists more than once."],
    /// The effect as expected: source, expectation.
    AsExpected => ["A ", " found the effect with ", " as expected."],
    /// The effect not as expected: source, observed, expected.
    Divergent => ["A ", " found the effect with ", " where ", " was expected: never overwritten automatically."],
    /// Overdue and never started: window.
    NeverStarted => ["Never started within ", " ms of the request: requeue is safe."],
    /// Overdue, never started, requeues exhausted: window, requeues.
    NeverStartedExhausted => ["Never started within ", " ms of the request, and already requeued ", " time(s), the limit: a person must decide."],
    /// Overdue and idempotent: window, attempts.
    NoEffectRequeue => ["No effect confirmed within ", " ms after ", " attempt(s); the operation is idempotent, so requeue."],
    /// Overdue, idempotent, requeues exhausted: window, attempts, requeues.
    NoEffectExhausted => ["No effect confirmed within ", " ms after ", " attempt(s), and already requeued ", " time(s), the limit: a person must decide."],
    /// Overdue and not idempotent: window, attempts.
    NoEffectReview => ["No effect confirmed within ", " ms after ", " attempt(s), and the operation is not idempotent: a retry could duplicate it."],
    /// Outcome unknown, probe: attempt, window.
    UnknownProbe => ["The outcome of attempt ", " is unknown after ", " ms: probe the destination with the idempotency key."],
    /// Outcome unknown, no key: attempt, window.
    UnknownNoKey => ["The outcome of attempt ", " is unknown after ", " ms and there is no idempotency key to probe with."],
    /// The probe's follow-up came due: window.
    ProbeUnanswered => ["The probe was not answered within ", " ms (no new evidence for the operation): a person must decide."],
    /// The requeue's follow-up came due: window.
    RequeueAgain => ["No new attempt started within ", " ms of the requeue: requeue again."],
    /// The requeue's follow-up came due, requeues exhausted: requeues, window.
    RequeueExhausted => ["Requeued ", " time(s), no new attempt started within ", " ms of the last requeue: a person must decide."],
    /// Superseded: by which operation, its version, this one's version.
    Superseded => ["Superseded by operation ", ", which requested ", " of the same entity and destination (", " here): closed, never requeued."],
}

impl Template {
    /// The template of number `n` (its position in [`Template::ALL`]).
    pub fn from_number(n: u8) -> Option<Template> {
        Template::ALL.get(usize::from(n)).copied()
    }

    /// The sentence with `args` in it; `None` when their count is not the
    /// template's.
    pub fn render<S: AsRef<str>>(self, args: &[S]) -> Option<String> {
        let parts = self.parts();
        if args.len() + 1 != parts.len() {
            return None;
        }
        Some(interleave(parts, |text, i| text.push_str(args[i].as_ref())))
    }
}

/// `parts` with an argument written between each two (`arg(text, i)`
/// writes argument `i`): the one loop that makes a sentence, for
/// [`Reason::of`] and [`Template::render`] alike, so that reading a stored
/// reason gives back the published text byte for byte.
fn interleave(parts: &[&str], mut arg: impl FnMut(&mut String, usize)) -> String {
    let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() + 32);
    text.push_str(parts[0]);
    for (i, part) in parts[1..].iter().enumerate() {
        arg(&mut text, i);
        text.push_str(part);
    }
    text
}

/// A verdict's reason. It reads, compares, prints and serializes as its
/// sentence; [`Reason::template`] and [`Reason::args`] tell which template
/// and arguments made it, when a template did.
#[derive(Clone)]
pub struct Reason {
    text: String,
    form: Option<Form>,
}

/// Which template made a reason, and where its arguments are in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Form {
    template: Template,
    args: [(u32, u32); MAX_ARGS],
}

impl Reason {
    /// `template` with `args`, each written with its `Display`.
    ///
    /// Panics when the count of `args` is not the template's: a mistake in
    /// the state machine, which its tests cover for every template.
    pub fn of(template: Template, args: &[&dyn Display]) -> Reason {
        let parts = template.parts();
        assert_eq!(args.len() + 1, parts.len(), "{template:?} takes {} argument(s)", parts.len() - 1);
        let mut spans = [(0, 0); MAX_ARGS];
        let text = interleave(parts, |text, i| {
            let start = text.len();
            write!(text, "{}", args[i]).expect("writing to a String");
            spans[i] = (offset(start), offset(text.len()));
        });
        Reason { text, form: Some(Form { template, args: spans }) }
    }

    /// A sentence that no template made (a conflict's detail).
    pub fn text(text: String) -> Reason {
        Reason { text, form: None }
    }

    /// The sentence.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The sentence, owned.
    pub fn into_string(self) -> String {
        self.text
    }

    /// The template that made the sentence; `None` when none did.
    pub fn template(&self) -> Option<Template> {
        self.form.map(|f| f.template)
    }

    /// The arguments the template was given, in order (none when no
    /// template made the sentence).
    pub fn args(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let spans = self.form.as_ref().map_or(&[][..], |f| &f.args[..f.template.parts().len() - 1]);
        spans.iter().map(|&(s, e)| &self.text[s as usize..e as usize])
    }
}

/// A position in a reason's text (a reason is never 4 GiB long).
fn offset(n: usize) -> u32 {
    u32::try_from(n).expect("a reason shorter than 4 GiB")
}

impl std::ops::Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

/// Equal sentences are equal reasons, however they were made (a verdict
/// decoded from the topic has no form).
impl PartialEq for Reason {
    fn eq(&self, other: &Reason) -> bool {
        self.text == other.text
    }
}

impl Eq for Reason {}

impl From<String> for Reason {
    fn from(text: String) -> Reason {
        Reason::text(text)
    }
}

impl From<&str> for Reason {
    fn from(text: &str) -> Reason {
        Reason::text(text.to_owned())
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Reason, D::Error> {
        String::deserialize(d).map(Reason::text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample arguments, with text that looks like a template's parts.
    const ARGS: [&str; MAX_ARGS] = ["worker response", " after manual review: ", ""];

    #[test]
    fn every_template_renders_what_it_made() {
        for &t in Template::ALL {
            let n = t.parts().len() - 1;
            assert!(n <= MAX_ARGS, "{t:?}");
            let args: Vec<&dyn Display> = ARGS[..n].iter().map(|a| a as &dyn Display).collect();
            let made = Reason::of(t, &args);
            let parts: Vec<&str> = made.args().collect();
            assert_eq!((made.template(), parts.as_slice()), (Some(t), &ARGS[..n]));
            assert_eq!(t.render(&parts).as_deref(), Some(made.as_str()), "{t:?}");
            assert_eq!(Template::from_number(t as u8), Some(t));
        }
        assert_eq!(Template::from_number(Template::ALL.len() as u8), None);
    }

    #[test]
    fn a_wrong_argument_count_renders_nothing() {
        assert_eq!(Template::Cancelled.render(&["a", "b"]), None);
        assert_eq!(Template::Cancelled.render(&["why"]).as_deref(), Some("Cancelled: why."));
    }

    #[test]
    fn a_reason_is_its_sentence() {
        let made = Reason::of(Template::AsExpected, &[&"receipt", &"version 7"]);
        assert_eq!(made.as_str(), "A receipt found the effect with version 7 as expected.");
        assert_eq!(made, Reason::from(made.as_str()));
        assert_eq!(format!("{made:?}"), format!("{:?}", made.as_str()));
        let free = Reason::from("free text");
        assert_eq!((free.template(), free.args().count()), (None, 0));
    }
}
