//! Key layouts. Every key starts with the big-endian partition so that a
//! partition's state is one contiguous range (restore, drop on revoke).

/// `partition ++ id`.
pub(crate) fn scoped(partition: i32, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + id.len());
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// Order-preserving encoding of a signed time.
fn time_bytes(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

/// `partition ++ time ++ operation_id`: a partition's timers in time order.
pub(crate) fn timer(partition: i32, at: i64, operation_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(12 + operation_id.len());
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(&time_bytes(at));
    k.extend_from_slice(operation_id.as_bytes());
    k
}

/// The first key after every timer of `partition` due at or before `at`.
pub(crate) fn timer_upper(partition: i32, at: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(12);
    k.extend_from_slice(&(partition as u32).to_be_bytes());
    k.extend_from_slice(&time_bytes(at.saturating_add(1)));
    k
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
