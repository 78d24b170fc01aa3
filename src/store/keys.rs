//! Key layouts. Every key starts with the big-endian partition so that a
//! partition's state is one contiguous range (restore, drop on revoke).

/// `partition ++ id`.
pub(crate) fn scoped(partition: i32, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + id.len());
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// The id of a key made by [`scoped`] (`None`: too short, or not UTF-8).
pub(crate) fn scoped_id(key: &[u8]) -> Option<&str> {
    key.get(4..).and_then(|id| std::str::from_utf8(id).ok())
}

/// Order-preserving encoding of a signed time.
fn time_bytes(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

/// `partition ++ time ++ operation_id`: a partition's timers in time order.
pub(crate) fn timer(partition: i32, at: i64, operation_id: &str) -> Vec<u8> {
    let mut k = timer_prefix(partition, at, operation_id.len());
    k.extend_from_slice(operation_id.as_bytes());
    k
}

/// `partition ++ time`, with room for `more` bytes after it.
fn timer_prefix(partition: i32, at: i64, more: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(12 + more);
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(&time_bytes(at));
    k
}

/// The first key of any timer of `partition` due at or after `at`.
pub(crate) fn timer_from(partition: i32, at: i64) -> Vec<u8> {
    timer_prefix(partition, at, 0)
}

/// The partition and due time of a key made by [`timer`] (`None`: too short).
pub(crate) fn timer_due(key: &[u8]) -> Option<(i32, i64)> {
    let at = fixed::<8>(key.get(4..)?).map(|b| (u64::from_be_bytes(b) ^ (1 << 63)) as i64)?;
    Some((partition_of(key)?, at))
}

/// The first key after every timer of `partition` due at or before `at`.
pub(crate) fn timer_upper(partition: i32, at: i64) -> Vec<u8> {
    timer_from(partition, at.saturating_add(1))
}

/// `partition ++ len(operation_id) ++ operation_id`: an operation's
/// timeline head, and the prefix of its entries. The length makes the
/// prefix of one operation never the prefix of another's.
pub(crate) fn timeline_head(partition: i32, operation_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(12 + operation_id.len());
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(&(operation_id.len() as u32).to_be_bytes());
    k.extend_from_slice(operation_id.as_bytes());
    k
}

/// `head ++ slot`: one ring slot of an operation's timeline.
pub(crate) fn timeline_entry(partition: i32, operation_id: &str, slot: u32) -> Vec<u8> {
    let mut k = timeline_head(partition, operation_id);
    k.extend_from_slice(&slot.to_be_bytes());
    k
}

/// The first key after an operation's whole timeline (head and entries).
pub(crate) fn timeline_end(partition: i32, operation_id: &str) -> Vec<u8> {
    let mut k = timeline_head(partition, operation_id);
    k.extend_from_slice(&[0xff; 5]);
    k
}

pub(crate) fn partition_prefix(partition: i32) -> [u8; 4] {
    (partition as u32).to_be_bytes()
}

/// `seq`: an outbox entry, in the order batches were written.
pub(crate) fn outbox(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// A key or value of a fixed size, or `None` when the bytes are not that
/// long (a store written by something else, or damaged).
fn fixed<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
    bytes.get(..N)?.try_into().ok()
}

/// The partition a partition-scoped key belongs to.
pub(crate) fn partition_of(key: &[u8]) -> Option<i32> {
    fixed::<4>(key).map(|b| u32::from_be_bytes(b) as i32)
}

/// The sequence number of an outbox key.
pub(crate) fn outbox_seq(key: &[u8]) -> Option<u64> {
    fixed::<8>(key).map(u64::from_be_bytes)
}

/// A stored offset (next offset to apply).
pub(crate) fn offset(value: i64) -> [u8; 8] {
    value.to_be_bytes()
}

/// A stored offset, read back.
pub(crate) fn offset_of(value: &[u8]) -> Option<i64> {
    fixed::<8>(value).map(i64::from_be_bytes)
}

/// The store format marker, read back.
pub(crate) fn format_of(value: &[u8]) -> Option<u32> {
    fixed::<4>(value).map(u32::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_keys_sort_by_partition_then_time() {
        let mut keys = vec![timer(1, 5, "a"), timer(0, 100, "b"), timer(0, -3, "c"), timer(0, 7, "d")];
        keys.sort();
        assert_eq!(keys, vec![timer(0, -3, "c"), timer(0, 7, "d"), timer(0, 100, "b"), timer(1, 5, "a")]);
        assert!(timer(0, 7, "zzz") < timer_upper(0, 7));
        assert!(timer(0, 8, "") >= timer_upper(0, 7));
        // A scan from a time starts at that time's first timer, after
        // every earlier one and the partition's start.
        assert!(timer(0, 6, "zzz") < timer_from(0, 7) && timer_from(0, 7) <= timer(0, 7, ""));
        assert!(timer_from(1, i64::MIN) > timer(0, i64::MAX, "a") && timer_from(1, i64::MIN) <= timer(1, i64::MIN, ""));
        for (p, at) in [(0, -3), (7, 1_700_000_000_000), (i32::MAX, i64::MIN), (3, i64::MAX)] {
            assert_eq!(timer_due(&timer(p, at, "op-1")), Some((p, at)));
        }
        assert_eq!(timer_due(&timer_from(2, 5)[..11]), None);
    }

    #[test]
    fn fixed_size_parts_read_back_and_short_ones_are_refused() {
        assert_eq!(partition_of(&scoped(7, "op")), Some(7));
        assert_eq!(outbox_seq(&outbox(u64::MAX - 1)), Some(u64::MAX - 1));
        assert_eq!(offset_of(&offset(-3)), Some(-3));
        assert_eq!(format_of(&3u32.to_be_bytes()), Some(3));
        assert_eq!(
            (partition_of(b"abc"), outbox_seq(b"1234567"), offset_of(b""), format_of(b"x")),
            (None, None, None, None)
        );
    }

    #[test]
    fn a_timeline_range_holds_its_operation_only() {
        let (start, end) = (timeline_head(0, "op"), timeline_end(0, "op"));
        for k in [timeline_head(0, "op"), timeline_entry(0, "op", 0), timeline_entry(0, "op", u32::MAX)] {
            assert!(k >= start && k < end);
        }
        for other in
            [timeline_head(0, "op2"), timeline_entry(0, "o", 0), timeline_head(1, "op"), timeline_head(0, "oq")]
        {
            assert!(!(other >= start && other < end), "{other:?}");
        }
    }
}
