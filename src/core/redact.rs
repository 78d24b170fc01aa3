//! Redaction of free-text evidence (`detail`, `evidence_ref`, `note`).
//!
//! Evidence must be a safe reference, never secrets or personal data.
//! Every free-text field passes through here before the core stores or
//! publishes it, so nothing downstream (state, verdicts, explain) can leak it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use regex::{Regex, RegexSet};

/// What replaces a redacted match.
pub const REDACTED: &str = "[REDACTED]";

/// Patterns matched by default: e-mail addresses, bearer tokens, `key=value`
/// secrets and card-like digit runs.
pub const DEFAULT_PATTERNS: [&str; 4] = [
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    r"(?i)bearer\s+[A-Za-z0-9._~+/=-]+",
    r"(?i)(password|passwd|secret|token|api[_-]?key)\s*[=:]\s*\S+",
    r"\b\d(?:[ -]?\d){12,18}\b",
];

/// A compiled set of redaction patterns.
#[derive(Debug, Clone)]
pub struct Redactor {
    patterns: Vec<Regex>,
    /// All patterns in one automaton: clean text (the common case) is
    /// recognised in a single pass.
    any: RegexSet,
}

/// A pattern that does not compile; names the pattern.
#[derive(Debug, thiserror::Error)]
#[error("invalid redaction pattern {pattern:?}: {source}")]
pub struct PatternError {
    /// The pattern as configured.
    pub pattern: String,
    /// Why the regex engine rejected it.
    #[source]
    pub source: regex::Error,
}

/// Every pattern list compiled so far in this process, by its patterns:
/// each compilation takes about 15 million instructions (callgrind of the
/// four default patterns), and one process builds the same list several
/// times (the configuration's validation, the pipeline's policy, the
/// metrics sampler's, every `Policy::default()`). A clone shares the
/// compiled automata (each clone keeps its own search cache). A process
/// compiles a handful of lists (the default and the configured one), so
/// the map stays small; lists that fail to compile are not kept.
static COMPILED: LazyLock<Mutex<HashMap<Vec<String>, Redactor>>> = LazyLock::new(Mutex::default);

impl Redactor {
    /// Compiles `patterns`; fails naming the first pattern that does not
    /// compile. A list already compiled in this process is not compiled
    /// again.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        let key: Vec<String> = patterns.iter().map(|p| p.as_ref().to_owned()).collect();
        // Compiled under the lock: two threads asking for the same new
        // list compile it once.
        let mut compiled = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = compiled.get(&key) {
            return Ok(r.clone());
        }
        let r = Redactor::compile(&key)?;
        compiled.insert(key, r.clone());
        Ok(r)
    }

    /// Compiles `patterns` as given.
    fn compile<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        #[cfg(test)]
        tests::COMPILATIONS.with(|n| n.set(n.get() + 1));
        let patterns = patterns
            .iter()
            .map(|p| Regex::new(p.as_ref()).map_err(|source| PatternError { pattern: p.as_ref().to_owned(), source }))
            .collect::<Result<Vec<Regex>, _>>()?;
        let any = RegexSet::new(patterns.iter().map(Regex::as_str)).expect("each pattern compiled alone");
        Ok(Redactor { patterns, any })
    }

    /// `text` with every match of every pattern replaced by [`REDACTED`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        if !self.any.is_match(text) {
            return out;
        }
        for re in &self.patterns {
            if re.is_match(&out) {
                out = Cow::Owned(re.replace_all(&out, REDACTED).into_owned());
            }
        }
        out
    }

    /// Redacts an owned string in place (no allocation when nothing matches).
    pub fn redact_in_place(&self, text: &mut String) {
        if let Cow::Owned(s) = self.redact(text) {
            *text = s;
        }
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(&DEFAULT_PATTERNS).expect("default patterns compile")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_patterns_remove_secrets_and_personal_data() {
        let r = Redactor::default();
        let s = "timeout for jane.doe@example.com with Bearer abc.def token=s3cr3t card 4111 1111 1111 1111";
        let out = r.redact(s);
        assert!(!out.contains("jane.doe"), "{out}");
        assert!(!out.contains("abc.def"), "{out}");
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(!out.contains("4111"), "{out}");
        assert!(out.starts_with("timeout for [REDACTED]"), "{out}");
    }

    #[test]
    fn clean_text_is_borrowed_unchanged() {
        let r = Redactor::default();
        assert!(matches!(r.redact("HTTP 504 after 30s"), Cow::Borrowed(_)));
    }

    /// Configured patterns replace the default list; a list compiled
    /// before is shared, not mixed with another.
    #[test]
    fn configured_patterns_replace_the_default_ones() {
        let r = Redactor::new(&["internal-[0-9]+"]).unwrap();
        assert_eq!(r.redact("host internal-42 for jane.doe@example.com"), "host [REDACTED] for jane.doe@example.com");
        let d = Redactor::new(&DEFAULT_PATTERNS.map(String::from)).unwrap();
        assert_eq!(d.redact("mail jane.doe@example.com"), "mail [REDACTED]");
    }

    thread_local! {
        /// Compilations made by this thread (tests run on threads of their
        /// own, so a test counts only its own).
        pub(super) static COMPILATIONS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// A list compiled once is shared by every later `new` of the same
    /// list, in any order of its callers; another list compiles anew.
    #[test]
    fn a_list_is_compiled_once_per_process() {
        let before = COMPILATIONS.with(|n| n.get());
        let first = Redactor::new(&["order-secret-[0-9]+", "(?i)pin=\\d+"]).unwrap();
        let again = Redactor::new(&["order-secret-[0-9]+".to_owned(), "(?i)pin=\\d+".to_owned()]).unwrap();
        assert_eq!(COMPILATIONS.with(|n| n.get()) - before, 1);
        for r in [&first, &again] {
            assert_eq!(r.redact("order-secret-7 PIN=1234 ok"), "[REDACTED] [REDACTED] ok");
        }
        let other = Redactor::new(&["order-secret-[0-9]+"]).unwrap();
        assert_eq!(COMPILATIONS.with(|n| n.get()) - before, 2);
        assert_eq!(other.redact("order-secret-7 PIN=1234"), "[REDACTED] PIN=1234");
    }

    #[test]
    fn bad_pattern_is_named() {
        let err = Redactor::new(&["ok", "(unclosed"]).unwrap_err();
        assert_eq!(err.pattern, "(unclosed");
    }
}
