//! CI's share of the fuzzing: every file of the committed corpus
//! (fuzz/corpus/<target>/, minimized) through the same target functions the
//! fuzzers run (tests/fuzz_targets/mod.rs). A crash found by a fuzzer is
//! added to the corpus and stays here as a regression test.

#[path = "../fuzz_targets/mod.rs"]
mod fuzz_targets;

use std::path::Path;

use reconciler::codec::Codec;

fn replay(target: &str, f: impl Fn(&Codec, &[u8])) -> usize {
    let codec = Codec::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let name = path.display().to_string();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&codec, &data))).is_err() {
            panic!("corpus file {name} fails the {target} target");
        }
        n += 1;
    }
    assert!(n > 0, "no corpus for {target}");
    println!("{target}: {n} corpus files replayed");
    n
}

#[test]
fn decode_corpus_replays_without_a_failure() {
    replay("decode", fuzz_targets::decode);
}

#[test]
fn decode_apply_corpus_replays_without_a_failure() {
    replay("decode_apply", fuzz_targets::decode_apply);
}

/// Writes the seed corpus (valid encodings of the demo workload and of
/// poison variants) into fuzz/corpus/. Run once by hand:
/// `cargo test --release --test fuzz_corpus -- --ignored write_seed_corpus`.
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_seed_corpus() {
    let codec = Codec::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let records = reconciler::demo::workload(1_700_000_000_000, 1);
    let events: Vec<Vec<u8>> = records
        .iter()
        .filter_map(|r| match r {
            reconciler::records::InputRecord::Event(e) => Some(codec.encode_event(e).unwrap()),
            _ => None,
        })
        .collect();
    std::fs::create_dir_all(root.join("decode")).unwrap();
    for (i, e) in events.iter().enumerate() {
        std::fs::write(root.join("decode").join(format!("seed-{i:03}")), e).unwrap();
    }
    // decode_apply: each operation's story as one log (records of up to
    // 255 bytes: length, key flag, value).
    std::fs::create_dir_all(root.join("decode_apply")).unwrap();
    let mut log = Vec::new();
    let mut n = 0;
    for e in &events {
        if e.len() > 255 {
            continue;
        }
        log.push(e.len() as u8);
        log.push(0);
        log.extend_from_slice(e);
        if log.len() > 600 {
            std::fs::write(root.join("decode_apply").join(format!("seed-{n:03}")), &log).unwrap();
            log.clear();
            n += 1;
        }
    }
    std::fs::write(root.join("decode_apply").join(format!("seed-{n:03}")), &log).unwrap();
}
