//! The binary's edge: bad configuration fails at start, naming the field,
//! before anything connects; every command has --help.

use std::process::Command;

fn reconciler(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reconciler"));
    cmd.args(args).env_remove("RECONCILER_SECURITY__CONTROL_KEYS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn config_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("reconciler-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("reconciler.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn unknown_key_fails_at_start_naming_it() {
    let path = config_file("unknown", "[consumer]\nbatch_sise = 10\n");
    let (ok, out) = reconciler(&["--config", path.to_str().unwrap(), "run"], &[]);
    assert!(!ok);
    assert!(out.contains("batch_sise"), "{out}");
}

#[test]
fn bad_value_fails_at_start_naming_the_field() {
    let path = config_file("bad", "[time]\ntimer_interval_ms = 5000\n");
    let (ok, out) = reconciler(&["--config", path.to_str().unwrap(), "run"], &[]);
    assert!(!ok);
    assert!(out.contains("time.timer_interval_ms"), "{out}");
}

#[test]
fn bad_environment_override_fails_naming_the_field() {
    let (ok, out) = reconciler(&["run"], &[("RECONCILER_TOPICS__PARTITIONS", "0")]);
    assert!(!ok);
    assert!(out.contains("topics.partitions"), "{out}");
}

/// An instance that could neither sign its timers nor accept a
/// decision does not start; the error names the field and the way out.
#[test]
fn run_without_control_keys_fails_at_start_naming_the_field() {
    let (ok, out) = reconciler(&["run"], &[]);
    assert!(!ok);
    assert!(out.contains("security.control_keys") && out.contains("RECONCILER_SECURITY__CONTROL_KEYS"), "{out}");
    assert!(out.contains("allow_unsigned_control"), "{out}");
    let (ok, out) = reconciler(&["run"], &[("RECONCILER_SECURITY__CONTROL_KEYS", "[\"short\"]")]);
    assert!(!ok);
    assert!(out.contains("security.control_keys[0]") && out.contains("at least 16"), "{out}");
}

/// The relay and the outbox commands without a database (or with
/// a bad setting) fail at once, naming the field; before any broker is
/// asked.
#[test]
fn relay_without_its_connection_variable_fails_at_start_naming_the_field() {
    for args in [&["relay"][..], &["outbox", "dead-letters"], &["outbox", "redrive", "--id", "1", "--actor", "a"]] {
        let (ok, out) = reconciler(args, &[("OUTBOX_DATABASE_URL", "")]);
        assert!(!ok, "{args:?}");
        assert!(out.contains("relay.connection_env") && out.contains("OUTBOX_DATABASE_URL"), "{args:?}: {out}");
    }
    let (ok, out) = reconciler(&["relay"], &[("RECONCILER_RELAY__BATCH_SIZE", "0")]);
    assert!(!ok && out.contains("relay.batch_size"), "{out}");
    let (ok, out) = reconciler(&["relay"], &[("OUTBOX_DATABASE_URL", "host=")]);
    assert!(!ok && out.contains("not a PostgreSQL connection string"), "{out}");
}

/// librdkafka's property names hold dots, which a variable name cannot:
/// `RECONCILER_KAFKA` takes a TOML inline table, merged key by key over the
/// file's `[kafka]` (how a SASL password stays out of the file).
#[test]
fn kafka_properties_from_the_environment_merge_over_the_file() {
    let path = config_file(
        "kafka-env",
        "[kafka]\n\"bootstrap.servers\" = \"k1:9093\"\n\"security.protocol\" = \"SASL_SSL\"\n",
    );
    let (ok, out) = reconciler(
        &["--config", path.to_str().unwrap(), "config"],
        &[("RECONCILER_KAFKA", r#"{ "sasl.password" = "s3cret-from-env", "sasl.username" = "recon" }"#)],
    );
    assert!(ok, "{out}");
    for line in [
        r#""bootstrap.servers" = "k1:9093""#,
        r#""security.protocol" = "SASL_SSL""#,
        r#""sasl.username" = "recon""#,
        r#""sasl.password" = "[REDACTED]""#,
    ] {
        assert!(out.lines().any(|l| l == line), "no {line} in:\n{out}");
    }
    assert!(!out.contains("s3cret-from-env"), "{out}");
}

#[test]
fn missing_config_file_is_named() {
    let (ok, out) = reconciler(&["--config", "/nonexistent/reconciler.toml", "run"], &[]);
    assert!(!ok);
    assert!(out.contains("/nonexistent/reconciler.toml"), "{out}");
}

#[test]
fn every_command_has_help_with_an_example() {
    let commands: [&[&str]; 15] = [
        &[],
        &["run"],
        &["config"],
        &["demo"],
        &["explain"],
        &["review"],
        &["resolve"],
        &["replay"],
        &["dlq"],
        &["dlq", "inspect"],
        &["dlq", "redrive"],
        &["relay"],
        &["outbox"],
        &["outbox", "dead-letters"],
        &["outbox", "redrive"],
    ];
    for cmd in commands {
        let args: Vec<&str> = cmd.iter().copied().chain(["--help"]).collect();
        let (ok, out) = reconciler(&args, &[]);
        assert!(ok, "{args:?}: {out}");
        assert!(out.contains("Usage") && out.contains("Example"), "{args:?} has no example: {out}");
    }
}

/// `explain` and the panel print decisions as CONFIRM; typed back, they
/// must be understood (the failure is then about the state, not the word).
#[test]
fn decision_and_outcome_are_accepted_as_explain_prints_them() {
    let missing = std::env::temp_dir().join(format!("reconciler-cli-{}-no-state", std::process::id()));
    let dir = missing.to_str().unwrap();
    for decision in ["CONFIRM", "confirm", "Close"] {
        let args = ["resolve", "op-1", "--decision", decision, "--actor", "a", "--note", "n", "--state-dir", dir];
        let (ok, out) = reconciler(&args, &[]);
        assert!(!ok && out.contains("no state store"), "{decision}: {out}");
    }
    let (ok, out) = reconciler(&["resolve", "op-1", "--decision", "approve", "--actor", "a", "--note", "n"], &[]);
    assert!(!ok && out.contains("CONFIRM, REQUEUE, COMPENSATE, CLOSE"), "{out}");
    let (ok, out) = reconciler(&["review", "--outcome", "duplicate_effect", "--state-dir", dir], &[]);
    assert!(!ok && out.contains("no state store"), "{out}");
}
