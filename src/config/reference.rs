//! The configuration reference (`docs/configuration.md`), generated from
//! the configuration types themselves: their JSON Schema (derived with
//! `schemars`) gives each key's type, its default (the types' `Default`)
//! and its description (the doc comment on the field). A page written by
//! hand drifts from the code; this one cannot, and a test compares the
//! committed page and `reconciler.example.toml` with what the code says.

use serde_json::Value;

use super::Config;

/// One key of the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Its path in the file: `consumer.batch_size`, `types.<name>.max_attempts`.
    pub path: String,
    /// What values it takes, in words (`integer`, `one of "fail", "restore"`).
    pub kind: String,
    /// Its default as a TOML value, or `None` when it has none (unset, or
    /// required in its table).
    pub default: Option<Value>,
    /// Whether the key must be given (a key of a table without defaults).
    pub required: bool,
    /// The doc comment of the field.
    pub description: String,
    /// For a key with a fixed set of values: each value and what it means.
    pub values: Vec<(String, String)>,
}

/// One table of the configuration (`[consumer]`), or the top level.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    /// Its path (`consumer`, `types.<name>`); empty for the top level.
    pub path: String,
    /// The doc comment of the table's type or of the field holding it.
    pub description: String,
    /// Its keys, in the order the code declares them.
    pub keys: Vec<Key>,
}

/// The configuration's JSON Schema, every sub-schema inlined.
pub fn schema() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true);
    settings.into_generator().into_root_schema_for::<Config>().to_value()
}

/// Every table of the configuration and its keys: the top level first,
/// then the tables in the order the code declares them.
pub fn sections() -> Vec<Section> {
    let root = schema();
    let mut out = vec![Section { path: String::new(), description: String::new(), keys: Vec::new() }];
    walk(&root, 0, &mut out);
    out
}

/// Adds the keys of `schema` to section `here`, and its tables as sections
/// of their own after it.
fn walk(schema: &Value, here: usize, out: &mut Vec<Section>) {
    let required: Vec<&str> =
        schema["required"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else { return };
    let prefix = out[here].path.clone();
    let mut tables = Vec::new();
    for (name, prop) in props {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        let prop = non_null(prop);
        if prop.get("properties").is_some() {
            tables.push((path, description(prop), prop.clone()));
        } else if let Some(entry) = prop.get("additionalProperties").filter(|e| e.get("properties").is_some()) {
            let entry_path = format!("{path}.<name>");
            let text = join(&description(prop), &description(entry));
            tables.push((entry_path, text, entry.clone()));
        } else {
            out[here].keys.push(key(path, prop, required.contains(&name.as_str())));
        }
    }
    for (path, text, table) in tables {
        out.push(Section { path, description: text, keys: Vec::new() });
        walk(&table, out.len() - 1, out);
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a.to_owned(),
        (true, false) => b.to_owned(),
        (false, false) => format!("{a}\n\n{b}"),
    }
}

fn key(path: String, prop: &Value, required: bool) -> Key {
    let values = variants(prop);
    let kind = if values.is_empty() {
        kind(prop)
    } else {
        format!("one of {}", values.iter().map(|(v, _)| format!("`\"{v}\"`")).collect::<Vec<_>>().join(", "))
    };
    let default = prop.get("default").filter(|d| !d.is_null()).cloned();
    Key { path, kind, default, required, description: description(prop), values }
}

/// The schema of an optional value without its `null` alternative.
fn non_null(prop: &Value) -> &Value {
    match prop["anyOf"].as_array() {
        Some(alts) if alts.len() == 2 && alts.iter().any(|a| a["type"] == "null") => {
            alts.iter().find(|a| a["type"] != "null").expect("one alternative is not null")
        }
        _ => prop,
    }
}

fn description(prop: &Value) -> String {
    prop["description"].as_str().unwrap_or_default().trim().to_owned()
}

/// The values of an enumeration and their doc comments.
fn variants(prop: &Value) -> Vec<(String, String)> {
    let prop = non_null(prop);
    if let Some(alts) = prop["oneOf"].as_array() {
        return alts
            .iter()
            .flat_map(|a| {
                let text = description(a);
                let names: Vec<String> = match (&a["const"], a["enum"].as_array()) {
                    (Value::String(s), _) => vec![s.clone()],
                    (_, Some(e)) => e.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
                    _ => Vec::new(),
                };
                names.into_iter().map(move |n| (n, text.clone()))
            })
            .collect();
    }
    prop["enum"]
        .as_array()
        .map(|e| e.iter().filter_map(|v| v.as_str().map(|s| (s.to_owned(), String::new()))).collect())
        .unwrap_or_default()
}

/// The type of a value, in words.
fn kind(prop: &Value) -> String {
    let prop = non_null(prop);
    let ty = match &prop["type"] {
        Value::String(t) => t.as_str(),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("value"),
        _ => "value",
    };
    match ty {
        "array" => format!("list of {}", plural(&kind(&prop["items"]))),
        "object" => match prop.get("additionalProperties") {
            Some(v) if v.is_object() => format!("table of {}", plural(&kind(v))),
            _ => "table".into(),
        },
        "integer" if prop["minimum"].as_f64() == Some(0.0) => "integer (0 or more)".into(),
        other => other.into(),
    }
}

/// `integer (0 or more)` as `integers (0 or more)`.
fn plural(kind: &str) -> String {
    match kind.split_once(' ') {
        Some((noun, rest)) => format!("{noun}s {rest}"),
        None => format!("{kind}s"),
    }
}

/// The environment variable that sets `path` (`RECONCILER_CONSUMER__BATCH_SIZE`).
pub fn env_var(path: &str) -> String {
    let upper: Vec<String> = path
        .split('.')
        .map(|part| if part == "<name>" { "<NAME>".to_owned() } else { part.to_ascii_uppercase() })
        .collect();
    format!("RECONCILER_{}", upper.join("__"))
}

/// A value as written in TOML (by the `toml` crate, as `reconciler config`
/// prints the configuration); `unset` for none.
pub fn toml_value(v: &Value) -> String {
    match toml::Value::try_from(v) {
        Ok(t) => t.to_string(),
        Err(_) => "unset".into(),
    }
}

const INTRO: &str = "# Configuration reference

<!-- Generated from the configuration types by `reconciler reference config`;
     edit the doc comments in src/config/, not this page. -->

reconciler reads its configuration from three places, each overriding the
one before:

1. the defaults below;
2. a TOML file, given with `--config FILE` (or `RECONCILER_CONFIG_FILE`);
3. `RECONCILER_*` environment variables: the key's path in capitals, tables
   separated by `__` (`consumer.batch_size` is
   `RECONCILER_CONSUMER__BATCH_SIZE`). A list or a table is given in TOML
   syntax: `RECONCILER_SECURITY__CONTROL_KEYS='[\"<secret>\"]'`;

and `--brokers` overrides `kafka.\"bootstrap.servers\"`.

An unknown key or a value of the wrong type stops the start, naming the
field; so does a value the code refuses (a negative window, a topic name
Kafka would refuse). `reconciler config` prints the configuration in effect,
secrets redacted. [`reconciler.example.toml`](../reconciler.example.toml)
sets every key to its default.

Durations are in milliseconds (`_ms`) unless the key says otherwise. The
windows of `[time]` and `[types.<name>]` are in event time (the
`occurred_at` of the events: a replay decides as the live run did);
`time.timer_interval_ms` and every other duration are wall-clock time.
";

/// The whole reference page, as committed in `docs/configuration.md`.
pub fn markdown() -> String {
    let mut out = String::from(INTRO);
    for section in sections() {
        out.push('\n');
        if section.path.is_empty() {
            out.push_str("## Top level\n");
        } else {
            out.push_str(&format!("## `[{}]`\n", section.path));
        }
        if !section.description.is_empty() {
            out.push('\n');
            out.push_str(&section.description);
            out.push('\n');
        }
        if section.path == "kafka" || section.keys.is_empty() {
            continue;
        }
        for k in &section.keys {
            out.push_str(&format!("\n### `{}`\n\n", k.path));
            out.push_str(&format!("- Type: {}\n", k.kind));
            let default = match (&k.default, k.required) {
                (_, true) => "none: required in this table".to_owned(),
                (Some(d), _) => format!("`{}`", toml_value(d)),
                (None, _) => "unset".to_owned(),
            };
            out.push_str(&format!("- Default: {default}\n"));
            out.push_str(&format!("- Environment: `{}`\n", env_var(&k.path)));
            if !k.description.is_empty() {
                out.push('\n');
                out.push_str(&k.description);
                out.push('\n');
            }
            let described: Vec<_> = k.values.iter().filter(|(_, d)| !d.is_empty()).collect();
            if !described.is_empty() {
                out.push('\n');
                for (v, d) in described {
                    out.push_str(&format!("- `\"{v}\"`: {}\n", d.replace('\n', " ")));
                }
            }
        }
    }
    out
}
