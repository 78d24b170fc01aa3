//! Serializing a stored value onto the end of a buffer that already holds
//! others (a batch's keys and values, a timeline entry's prefix).
//!
//! postcard's own way to append, `to_extend`, goes through
//! `Extend<u8>`: every byte it pushes is a one-item `extend`, every slice
//! an iterator of bytes, and the buffer is moved in and out of the call.
//! Operation states and timeline entries are serialized for every record
//! applied, so this writes with `push` and `extend_from_slice` instead.
//! The bytes are postcard's either way (the same serializer; only the
//! sink differs), so stored values do not change.

use postcard::ser_flavors::Flavor;
use serde::Serialize;

/// A postcard sink that appends to a borrowed `Vec<u8>`.
struct Tail<'a>(&'a mut Vec<u8>);

impl Flavor for Tail<'_> {
    type Output = ();

    #[inline(always)]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline(always)]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        // postcard writes every varint as a slice, nearly all of one byte
        // (lengths, counts, small numbers): pushed, not a call to memcpy.
        match bytes {
            [byte] => self.0.push(*byte),
            _ => self.0.extend_from_slice(bytes),
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `value`, serialized by postcard, to `buf`. The state types
/// serialize to a growable buffer without fail (no maps of unknown length,
/// no custom errors), so a failure is a bug.
pub(crate) fn append<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) {
    postcard::serialize_with_flavor(value, Tail(buf)).expect("stored values serialize to a Vec");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    struct Sample<'a> {
        small: u8,
        big: u64,
        negative: i64,
        text: &'a str,
        bytes: &'a [u8],
        maybe: Option<i32>,
        map: BTreeMap<i64, String>,
    }

    #[test]
    fn appends_exactly_what_postcard_writes() {
        let sample = Sample {
            small: 7,
            big: u64::MAX - 3,
            negative: -1_234_567_890_123,
            text: "op-1.requested",
            bytes: &[0, 1, 2, 255],
            maybe: Some(-5),
            map: [(3, "three".to_owned()), (-9, String::new())].into(),
        };
        let mut buf = b"prefix".to_vec();
        append(&mut buf, &sample);
        let mut expected = b"prefix".to_vec();
        expected.extend(postcard::to_allocvec(&sample).unwrap());
        assert_eq!(buf, expected);
    }
}
