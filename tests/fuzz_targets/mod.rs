//! The fuzz targets' bodies, shared by the cargo-fuzz crate (fuzz/) and the
//! corpus replay of the regular suite (tests/fuzz_corpus.rs), so that CI runs
//! exactly what the fuzzers ran over every committed corpus file.
//!
//! Only the pure core and the codec are used: the fuzz crate builds the
//! library without its IO feature (no RocksDB, no librdkafka).

use reconciler::codec::{validate_key, Codec};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{Event, Output, Policy, SourcePos};

/// Any bytes as an input record's value: decoding never panics; what the
/// direct decoder accepts, apache-avro's generic path accepts the same; and
/// what decodes, re-encodes and decodes to the same event.
pub fn decode(codec: &Codec, data: &[u8]) {
    let Ok(ev) = codec.decode_event(data) else { return };
    let generic = codec.decode_event_generic(data).expect("the generic decoder accepts what the direct one does");
    assert_eq!(generic, ev, "the two decoders disagree");
    let again = codec.encode_event(&ev).expect("a decoded event encodes");
    assert_eq!(codec.decode_event(&again).expect("a re-encoded event decodes"), ev, "round trip");
}

/// Splits `data` into records: a length byte, a key flag byte, then that
/// many bytes of value. The key flag chooses the event's own entity id (a
/// well-routed record) or a wrong key.
fn records(data: &[u8]) -> Vec<(bool, &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let (len, good_key) = (rest[0] as usize, rest[1] & 1 == 0);
        let body = &rest[2..];
        let take = len.min(body.len());
        out.push((good_key, &body[..take]));
        rest = &body[take..];
    }
    out
}

/// One partition's log through decode → validate → apply, then every timer
/// fired: the outputs and the final state, in a printable form.
fn run(codec: &Codec, policy: &Policy, data: &[u8]) -> (Vec<Output>, Vec<String>) {
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    let mut latest = 0i64;
    for (offset, (good_key, value)) in records(data).into_iter().enumerate() {
        let Ok(ev): Result<Event, _> = codec.decode_event(value) else { continue };
        let key = if good_key { ev.entity_id.clone().into_bytes() } else { b"wrong-key".to_vec() };
        if validate_key(Some(&key), &ev).is_err() {
            continue; // a dead letter
        }
        latest = latest.max(ev.occurred_at);
        engine.process(policy, ev, SourcePos { partition: 0, offset: offset as i64 }, &mut out);
    }
    let mut offset = 1 << 40;
    let until = latest.saturating_add(policy.retention_ms.saturating_mul(2));
    engine.run_timers(
        policy,
        until,
        || {
            offset += 1;
            SourcePos { partition: 0, offset }
        },
        &mut out,
    );
    let mut state: Vec<String> = engine.ops.values().map(|o| format!("{o:?}")).collect();
    state.sort();
    (out, state)
}

/// Any sequence of records through the core: no panic, and the same input
/// gives the same outputs and state (determinism).
pub fn decode_apply(codec: &Codec, data: &[u8]) {
    // Built once: the redaction patterns compile to regexes.
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    let policy = POLICY.get_or_init(|| Policy { reorder_max_held: 4, ..Policy::default() });
    let first = run(codec, policy, data);
    let second = run(codec, policy, data);
    assert_eq!(first, second, "the same input gave different outputs or state");
}
