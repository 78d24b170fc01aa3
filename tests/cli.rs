//! The binary's edge: bad configuration fails at start, naming the field,
//! before anything connects; every command has --help.

use std::process::Command;

fn reconciler(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reconciler"));
    cmd.args(args);
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

#[test]
fn missing_config_file_is_named() {
    let (ok, out) = reconciler(&["--config", "/nonexistent/reconciler.toml", "run"], &[]);
    assert!(!ok);
    assert!(out.contains("/nonexistent/reconciler.toml"), "{out}");
}

#[test]
fn every_command_has_help() {
    for cmd in [vec!["--help"], vec!["run", "--help"], vec!["demo", "--help"]] {
        let (ok, out) = reconciler(&cmd, &[]);
        assert!(ok, "{cmd:?}: {out}");
        assert!(out.contains("Usage"), "{cmd:?}: {out}");
    }
}
