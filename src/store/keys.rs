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
}
