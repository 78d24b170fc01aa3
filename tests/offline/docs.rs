//! The reference pages and the example configuration against the code:
//! `docs/configuration.md` and `docs/metrics.md` are what `reconciler
//! reference` prints, and `reconciler.example.toml` sets every key the code
//! knows to its default (or shows it commented out), so none of the three
//! can drift from the others.
//!
//! After changing a doc comment, a default or a metric, regenerate the
//! pages with `RECONCILER_BLESS=1 cargo test --test offline docs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reconciler::config::reference::{sections, toml_value, Key};
use reconciler::config::Config;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The committed page `rel` must equal `generated`; with `RECONCILER_BLESS`
/// set, it is rewritten instead.
fn page_matches(rel: &str, generated: &str) {
    let path: PathBuf = root().join(rel);
    if std::env::var_os("RECONCILER_BLESS").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| committed.lines().count().min(generated.lines().count()) + 1, |i| i + 1);
        panic!(
            "{rel} is not what the code generates (first difference at line {line}).\n\
             Regenerate it: RECONCILER_BLESS=1 cargo test --test offline docs"
        );
    }
}

#[test]
fn the_configuration_reference_is_generated_from_the_code() {
    page_matches("docs/configuration.md", &reconciler::config::reference::markdown());
}

#[test]
fn the_metrics_reference_is_generated_from_the_code() {
    page_matches("docs/metrics.md", &reconciler::metrics::reference::markdown());
}

/// Every key the code knows, every default and description present: a
/// reference with a gap would pass the page comparison.
#[test]
fn every_key_of_the_configuration_is_described_with_its_type() {
    let keys: Vec<Key> = sections().into_iter().flat_map(|s| s.keys).collect();
    for path in
        ["consumer.max_record_bytes", "store.block_cache_mb", "store.write_buffer_mb", "probe.answer_retention_ms"]
    {
        assert!(keys.iter().any(|k| k.path == path), "the reference lacks {path}");
    }
    for k in &keys {
        assert!(!k.description.is_empty(), "{} has no doc comment", k.path);
        assert!(!k.kind.is_empty() && k.kind != "value", "{} has no type: {:?}", k.path, k.kind);
    }
    let batch = keys.iter().find(|k| k.path == "consumer.batch_size").unwrap();
    assert_eq!(batch.default.as_ref().map(toml_value).as_deref(), Some("2000"));
}

/// The tables whose names are the user's (an operation type, a
/// destination): the example shows one of each, with example values.
const EXAMPLE_TABLES: [&str; 2] = ["types", "destinations"];

/// Keys of the example file: each `key = value` set (and its value), and
/// each `# key = value` shown commented, by the table it is in. Tables of
/// the user's names are reported as `types.<name>`.
struct ExampleKeys {
    set: BTreeMap<String, String>,
    commented: BTreeMap<String, String>,
}

fn example_keys(text: &str) -> ExampleKeys {
    let mut set = BTreeMap::new();
    let mut commented = BTreeMap::new();
    let mut table = String::new();
    for line in text.lines() {
        let (is_comment, body) = match line.trim_start().strip_prefix('#') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, line.trim_start()),
        };
        if let Some(header) = body.strip_prefix('[') {
            let name = header.split(']').next().unwrap_or_default();
            if name.contains(' ') || name.is_empty() {
                continue;
            }
            table = match name.split_once('.') {
                Some((map, _)) if EXAMPLE_TABLES.contains(&map) => format!("{map}.<name>"),
                _ => name.to_owned(),
            };
            continue;
        }
        let Some((key, value)) = body.split_once('=') else { continue };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.\"-".contains(c)) {
            continue;
        }
        let path = if table.is_empty() { key.to_owned() } else { format!("{table}.{key}") };
        let value = value.split(" #").next().unwrap_or_default().trim().to_owned();
        if is_comment {
            commented.entry(path).or_insert(value);
        } else {
            set.insert(path, value);
        }
    }
    ExampleKeys { set, commented }
}

/// What in the example file `text` disagrees with the code.
fn example_problems(text: &str) -> Vec<String> {
    let example = example_keys(text);
    let keys: Vec<Key> = sections().into_iter().flat_map(|s| s.keys).collect();
    let mut problems = Vec::new();
    for k in &keys {
        if k.path == "kafka" {
            continue;
        }
        let in_example_table = EXAMPLE_TABLES.iter().any(|t| k.path.starts_with(&format!("{t}.<name>.")));
        match (example.set.get(&k.path), example.commented.get(&k.path)) {
            (None, None) => {
                problems.push(format!("{} is missing (set it to its default, or show it commented)", k.path))
            }
            (Some(v), _) if !in_example_table => match &k.default {
                Some(d) if *v != toml_value(d) => {
                    problems.push(format!("{} = {v}, but its default is {}", k.path, toml_value(d)))
                }
                None => problems.push(format!("{} has no default: show it commented out", k.path)),
                _ => {}
            },
            _ => {}
        }
    }
    let known: Vec<&str> = keys.iter().map(|k| k.path.as_str()).collect();
    for path in example.set.keys().chain(example.commented.keys()) {
        let top = path.split('.').next().unwrap_or_default();
        if top != "kafka" && !known.contains(&path.as_str()) {
            problems.push(format!("{path} is not a key the code knows"));
        }
    }
    problems
}

#[test]
fn the_example_configuration_sets_every_key_to_its_default() {
    let text = std::fs::read_to_string(root().join("reconciler.example.toml")).unwrap();
    let parsed: Config = toml::from_str(&text).expect("reconciler.example.toml is a valid configuration");
    parsed.validate().expect("reconciler.example.toml passes the configuration's checks");
    let problems = example_problems(&text);
    assert!(problems.is_empty(), "reconciler.example.toml disagrees with the code:\n  {}", problems.join("\n  "));
}

/// The comparison above can fail: a key the example lacks, a value that is
/// not the default and a key the code does not know are each reported.
#[test]
fn the_example_check_reports_a_missing_key_a_wrong_default_and_an_unknown_key() {
    let text = std::fs::read_to_string(root().join("reconciler.example.toml")).unwrap();
    assert!(text.contains("\nbatch_size = 2000") && text.contains("\nbatch_wait_ms = 50"));
    let wrong =
        text.replace("\nbatch_size = 2000", "\nbatch_size = 3000").replace("\nbatch_wait_ms = 50", "\nbatch_wait = 50");
    let problems = example_problems(&wrong);
    assert!(problems.iter().any(|p| p == "consumer.batch_size = 3000, but its default is 2000"), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("consumer.batch_wait_ms is missing")), "{problems:?}");
    assert!(problems.iter().any(|p| p == "consumer.batch_wait is not a key the code knows"), "{problems:?}");
}
