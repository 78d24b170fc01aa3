//! The fuzz targets' bodies, shared by the cargo-fuzz crate (fuzz/) and the
//! corpus replay of the regular suite (tests/fuzz_corpus.rs), so that CI runs
//! exactly what the fuzzers ran over every committed corpus file.
//!
//! Only the pure core, the codec and the signature check are used: the fuzz crate builds the
//! library without its IO feature (no RocksDB, no librdkafka).

use reconciler::codec::{validate_key, Codec};
use reconciler::core::memory::MemoryEngine;
use reconciler::core::trust;
use reconciler::core::{Authenticity, Event, Output, Policy, SourcePos};
use reconciler::signature::ControlKeys;

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

/// How a fuzzed record is signed (bits 1-2 of its flag byte).
#[derive(Clone, Copy)]
enum Signing {
    /// With the engine's control key (what the reconciler's tools do).
    Signed,
    /// No signature header.
    Unsigned,
    /// A header of arbitrary bytes (the record's own, reversed).
    Garbage,
    /// A real signature under a key the engine does not have.
    OtherKey,
}

/// Splits `data` into records: a length byte, a flag byte, then that many
/// bytes of value. Bit 0 of the flag chooses the event's own entity id (a
/// well-routed record) or a wrong key; bits 1-2 how it is signed.
fn records(data: &[u8]) -> Vec<(bool, Signing, &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let (len, flag) = (rest[0] as usize, rest[1]);
        let signing =
            [Signing::Signed, Signing::Unsigned, Signing::Garbage, Signing::OtherKey][(flag >> 1 & 3) as usize];
        let body = &rest[2..];
        let take = len.min(body.len());
        out.push((flag & 1 == 0, signing, &body[..take]));
        rest = &body[take..];
    }
    out
}

/// The signature check of a record with `key` and `value` signed as
/// `signing` says, against `keys`.
fn authenticity(keys: &ControlKeys, signing: Signing, key: &[u8], value: &[u8]) -> Authenticity {
    let header: Option<Vec<u8>> = match signing {
        Signing::Signed => keys.sign("fuzz.events", Some(key), value),
        Signing::Unsigned => None,
        Signing::Garbage => Some(value.iter().rev().copied().collect()),
        Signing::OtherKey => ControlKeys::new([b"not-the-engine-key".to_vec()]).sign("fuzz.events", Some(key), value),
    };
    keys.check("fuzz.events", Some(key), value, header.as_deref())
}

/// One partition's log through decode → validate → signature check →
/// apply, then every timer fired: the outputs and the final state, in a
/// printable form. A control event the core refuses must leave the state
/// exactly as it was.
fn run(codec: &Codec, policy: &Policy, data: &[u8]) -> (Vec<Output>, Vec<String>) {
    let keys = ControlKeys::new([b"the-engine-control-key".to_vec()]);
    let mut engine = MemoryEngine::new();
    let mut out = Vec::new();
    let mut latest = 0i64;
    for (offset, (good_key, signing, value)) in records(data).into_iter().enumerate() {
        let Ok(ev): Result<Event, _> = codec.decode_event(value) else { continue };
        let key = if good_key { ev.entity_id.clone().into_bytes() } else { b"wrong-key".to_vec() };
        if validate_key(Some(&key), &ev).is_err() {
            continue; // a dead letter
        }
        let auth = authenticity(&keys, signing, &key, value);
        if matches!(signing, Signing::Signed) {
            assert_eq!(auth, Authenticity::Signed, "a record signed with the engine's key verifies");
        } else {
            assert_ne!(auth, Authenticity::Signed, "nothing else verifies");
        }
        latest = latest.max(ev.occurred_at);
        let refused = trust::refused(policy, &ev.body, auth);
        let before = refused.then(|| printable(&engine));
        engine.process_checked(policy, ev, auth, SourcePos { partition: 0, offset: offset as i64 }, &mut out);
        if let Some(before) = before {
            assert_eq!(printable(&engine), before, "a refused control event changed the state");
        }
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
    (out, printable(&engine))
}

/// The engine's state as sorted lines.
fn printable(engine: &MemoryEngine) -> Vec<String> {
    let mut state: Vec<String> = engine.ops.values().map(|o| format!("{o:?}")).collect();
    state.extend(engine.entities.iter().map(|(id, e)| format!("{id}: {e:?}")));
    state.sort();
    state
}

/// Any sequence of records through the core: no panic, and the same input
/// gives the same outputs and state (determinism).
pub fn decode_apply(codec: &Codec, data: &[u8]) {
    // Built once: the redaction patterns compile to regexes.
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    let policy = POLICY.get_or_init(|| Policy { reorder_max_held: 4, signed_control: true, ..Policy::default() });
    let first = run(codec, policy, data);
    let second = run(codec, policy, data);
    assert_eq!(first, second, "the same input gave different outputs or state");
}
