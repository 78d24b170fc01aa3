//! Signatures of the control events the reconciler writes to its own input
//! (the rule they serve is `core::trust`).
//!
//! A signature is an HMAC-SHA256 over the record's key and value under a
//! control key, carried in the record's [`HEADER`] as lowercase hex. Keys
//! rotate: the first configured key signs, every configured key verifies,
//! so a new key is rolled out first to the verifiers' list (second place),
//! then moved to the front, and the old one is dropped once no record
//! signed with it is left to replay (the input's retention).
//!
//! The MAC input is a domain tag, the topic, the key's length, the key and
//! the value (lengths before the variable parts), so no (topic, key, value)
//! can be shifted into another with the same MAC, and a signed record
//! copied into another topic (another environment's input with the same
//! keys) does not verify there.
//! The check is pure: the same keys give the same [`Authenticity`] on a
//! replay of the same log. Comparisons are constant-time (the `hmac`
//! crate's `verify_slice`).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::core::Authenticity;

/// The header that carries a record's signature.
pub const HEADER: &str = "reconciler.signature";

/// Shortest control key accepted: 16 bytes (128 bits).
pub const MIN_KEY_BYTES: usize = 16;

/// Domain separation: a MAC of this scheme is never valid for another use
/// of the same key.
const DOMAIN: &[u8] = b"reconciler.control.v1\0";

/// The configured control keys (the first signs, all verify). Its debug
/// form never shows them.
#[derive(Clone, Default)]
pub struct ControlKeys {
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for ControlKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ControlKeys({} key(s), [REDACTED])", self.keys.len())
    }
}

impl ControlKeys {
    /// The keys in configuration order.
    pub fn new(keys: impl IntoIterator<Item = Vec<u8>>) -> ControlKeys {
        ControlKeys { keys: keys.into_iter().collect() }
    }

    /// Whether no key is configured (nothing can be signed or verified).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The signature of a record of `topic` with `key` and `value` under
    /// the first key, as the [`HEADER`] value; `None` without keys.
    pub fn sign(&self, topic: &str, key: Option<&[u8]>, value: &[u8]) -> Option<Vec<u8>> {
        let first = self.keys.first()?;
        let tag = mac(first, topic, key, value).finalize().into_bytes();
        Some(hex(&tag))
    }

    /// What `header` (the [`HEADER`] value, if any) proves of a record of
    /// `topic` with `key` and `value`.
    pub fn check(&self, topic: &str, key: Option<&[u8]>, value: &[u8], header: Option<&[u8]>) -> Authenticity {
        let Some(header) = header else { return Authenticity::Unsigned };
        let Some(tag) = unhex(header) else { return Authenticity::BadSignature };
        if self.keys.iter().any(|k| mac(k, topic, key, value).verify_slice(&tag).is_ok()) {
            Authenticity::Signed
        } else {
            Authenticity::BadSignature
        }
    }
}

/// Whether secrets `a` and `b` are equal, in time that depends on neither
/// where they differ nor their lengths: both are hashed (as messages, so
/// `t` and `t\0` differ) under a fixed HMAC key and the tags compared with
/// the `hmac` crate's constant-time check. For the HTTP bearer token.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let tag = |secret: &[u8]| {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(b"reconciler.secret-compare.v1")
            .expect("HMAC takes keys of any length");
        m.update(secret);
        m
    };
    tag(a).verify_slice(&tag(b).finalize().into_bytes()).is_ok()
}

fn mac(secret: &[u8], topic: &str, key: Option<&[u8]>, value: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(DOMAIN);
    m.update(&(topic.len() as u64).to_be_bytes());
    m.update(topic.as_bytes());
    let key = key.unwrap_or_default();
    m.update(&(key.len() as u64).to_be_bytes());
    m.update(key);
    m.update(value);
    m
}

/// `bytes` as lowercase hex, two digits a byte. By table rather than
/// through the formatting machinery: one `write!` per byte was two thirds
/// of a signature's cost in a profile (every timer firing is signed).
fn hex(bytes: &[u8]) -> Vec<u8> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0x0f)]]).collect()
}

/// The bytes of lowercase or uppercase hex `text` (a SHA-256 tag's 64
/// digits); `None` for anything else.
fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> ControlKeys {
        ControlKeys::new(names.iter().map(|k| k.as_bytes().to_vec()))
    }

    /// The scheme's bytes, as the module's doc states them: a tag computed
    /// independently (Python's `hmac` over the same input) is the one
    /// written, in lowercase hex.
    #[test]
    fn a_signature_is_the_hmac_of_the_documented_input_in_lowercase_hex() {
        let sig = keys(&["old-key-0123456789"]).sign("t", Some(b"e"), b"value").unwrap();
        assert_eq!(sig, b"a426e1112522930846877087a4abd2eee1130c0aa590015e3411c963d83c2a8a");
    }

    #[test]
    fn the_first_key_signs_and_every_key_verifies() {
        let (old, new) = ("old-key-0123456789", "new-key-0123456789");
        let by_old = keys(&[old]).sign("t", Some(b"e"), b"value").unwrap();
        let by_new = keys(&[new, old]).sign("t", Some(b"e"), b"value").unwrap();
        assert_ne!(by_old, by_new, "the first key signs");
        let both = keys(&[new, old]);
        assert_eq!(both.check("t", Some(b"e"), b"value", Some(&by_old)), Authenticity::Signed);
        assert_eq!(both.check("t", Some(b"e"), b"value", Some(&by_new)), Authenticity::Signed);
        // Rotated out: the old key's signatures are refused.
        assert_eq!(keys(&[new]).check("t", Some(b"e"), b"value", Some(&by_old)), Authenticity::BadSignature);
    }

    #[test]
    fn a_signature_covers_key_and_value() {
        let k = keys(&["k-0123456789abcdef"]);
        let sig = k.sign("t", Some(b"e1"), b"value").unwrap();
        assert_eq!(k.check("t", Some(b"e1"), b"value", Some(&sig)), Authenticity::Signed);
        assert_eq!(k.check("t", Some(b"e2"), b"value", Some(&sig)), Authenticity::BadSignature);
        assert_eq!(k.check("t", Some(b"e1"), b"valuf", Some(&sig)), Authenticity::BadSignature);
        assert_eq!(k.check("t", None, b"value", Some(&sig)), Authenticity::BadSignature);
        // The topic is in the MAC: a copy in another topic does not verify.
        assert_eq!(k.check("u", Some(b"e1"), b"value", Some(&sig)), Authenticity::BadSignature);
        // The key's length is in the MAC: moving bytes between key and value fails.
        assert_eq!(k.check("t", Some(b"e1v"), b"alue", Some(&sig)), Authenticity::BadSignature);
        assert_eq!(k.check("t", Some(b"e1"), b"value", None), Authenticity::Unsigned);
        assert_eq!(k.check("t", Some(b"e1"), b"value", Some(b"not hex")), Authenticity::BadSignature);
        let upper = String::from_utf8(sig.clone()).unwrap().to_uppercase();
        assert_eq!(k.check("t", Some(b"e1"), b"value", Some(upper.as_bytes())), Authenticity::Signed);
        let mut flipped = sig.clone();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        assert_eq!(k.check("t", Some(b"e1"), b"value", Some(&flipped)), Authenticity::BadSignature);
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"t0k3n", b"t0k3n"));
        assert!(!same_secret(b"t0k3n", b"t0k3m"));
        assert!(!same_secret(b"t0k3n", b"t0k3"));
        assert!(!same_secret(b"", b"x"));
        assert!(!same_secret(b"t", b"t\0"), "not HMAC's zero-padded keys");
    }

    #[test]
    fn no_keys_sign_nothing_and_verify_nothing() {
        let none = ControlKeys::default();
        assert_eq!(none.sign("t", Some(b"e"), b"v"), None);
        let sig = keys(&["k-0123456789abcdef"]).sign("t", Some(b"e"), b"v").unwrap();
        assert_eq!(none.check("t", Some(b"e"), b"v", Some(&sig)), Authenticity::BadSignature);
        assert!(!format!("{:?}", keys(&["secret-0123456789"])).contains("secret"));
    }
}
