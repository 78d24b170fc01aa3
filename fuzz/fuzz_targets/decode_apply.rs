//! cargo-fuzz target: see tests/fuzz_targets/mod.rs (decode_apply).
#![no_main]

#[path = "../../tests/fuzz_targets/mod.rs"]
#[allow(dead_code)]
mod targets;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use reconciler::codec::Codec;

fuzz_target!(|data: &[u8]| {
    static CODEC: OnceLock<Codec> = OnceLock::new();
    targets::decode_apply(CODEC.get_or_init(Codec::new), data);
});
