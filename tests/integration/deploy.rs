//! Checks of the deployment files that can be made without a container
//! engine (none runs on the development machines):
//!
//! - docker-compose.yml follows the Compose specification's JSON schema, and
//!   every file, port, topic and variable it names exists and agrees with
//!   what the binary really does with it;
//! - the Dockerfile builds with the same scripts as CI and runs as non-root;
//! - the Prometheus and Grafana provisioning point at what compose mounts.
//!
//! YAML is read through `tests/deploy/to_json.mjs` (Node.js, installed by
//! `scripts/setup.sh --tests`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// A YAML file as JSON; `compose` also validates it against the Compose
/// specification's schema.
fn yaml(rel: &Path, compose: bool) -> Result<Value, String> {
    let mut cmd = Command::new("node");
    cmd.arg(root().join("tests/deploy/to_json.mjs"));
    if compose {
        cmd.arg("--compose");
    }
    let out = cmd.arg(rel).output().expect("running node (scripts/setup.sh --tests installs it)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("to_json.mjs prints JSON"))
}

fn compose() -> Value {
    yaml(&root().join("docker-compose.yml"), true).unwrap_or_else(|e| panic!("docker-compose.yml is invalid:\n{e}"))
}

fn service<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["services"].get(name).unwrap_or_else(|| panic!("docker-compose.yml has no service {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().expect("a string").to_owned()).collect()).unwrap_or_default()
}

fn env_of(svc: &Value) -> BTreeMap<String, String> {
    svc["environment"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), defaults(v.as_str().expect("env values are strings")))).collect())
        .unwrap_or_default()
}

/// `value` as compose sets it when the variables it names are unset:
/// each `${NAME:-default}` becomes its default.
fn defaults(value: &str) -> String {
    let re = regex::Regex::new(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}").unwrap();
    re.replace_all(value, "$1").into_owned()
}

/// "HOST:CONTAINER" port mappings of a service, container side.
fn container_ports(svc: &Value) -> Vec<u16> {
    strings(&svc["ports"]).iter().map(|p| p.rsplit(':').next().unwrap().parse().expect("a port number")).collect()
}

/// The port of a `host:port` address or of an http URL.
fn port_of(addr: &str) -> u16 {
    let rest = addr.split("://").last().unwrap();
    let hostport = rest.split('/').next().unwrap();
    hostport.rsplit(':').next().unwrap().parse().unwrap_or_else(|_| panic!("no port in {addr}"))
}

/// Image path → repository path, from the Dockerfile's `COPY src dst`
/// lines (not the `--from` ones: those copy build output).
fn dockerfile_copies() -> BTreeMap<String, String> {
    read("Dockerfile")
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            (parts[1].to_owned(), parts[0].to_owned())
        })
        .collect()
}

/// The effective configuration the binary builds from `file` and `env`
/// (`reconciler config`), as TOML.
fn effective_config(file: &Path, env: &BTreeMap<String, String>) -> toml::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reconciler"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("RECONCILER_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env).env("RECONCILER_CONFIG_FILE", file).arg("config");
    let out = cmd.output().expect("running reconciler config");
    assert!(out.status.success(), "reconciler config failed: {}", String::from_utf8_lossy(&out.stderr));
    toml::from_str(std::str::from_utf8(&out.stdout).unwrap()).expect("reconciler config prints TOML")
}

#[test]
fn compose_follows_the_specification_and_the_check_can_fail() {
    compose();
    let dir = tempdir();
    let bad = dir.join("bad.yml");
    std::fs::write(&bad, read("docker-compose.yml").replace("    healthcheck:", "    healthckeck:")).unwrap();
    let err = yaml(&bad, true).expect_err("a misspelt key must fail the schema");
    assert!(err.contains("healthckeck"), "{err}");
}

#[test]
fn compose_mounts_and_builds_files_that_exist() {
    let c = compose();
    let mut checked = 0;
    for (name, svc) in c["services"].as_object().unwrap() {
        for v in strings(&svc["volumes"]) {
            let src = v.split(':').next().unwrap();
            if src.starts_with("./") {
                assert!(root().join(src).exists(), "service {name} mounts {src}, which does not exist");
                checked += 1;
            } else {
                assert!(c["volumes"].get(src).is_some(), "service {name} uses undeclared volume {src}");
            }
        }
        if let Some(ctx) = svc["build"].as_str() {
            assert!(root().join(ctx).join("Dockerfile").exists(), "service {name} builds {ctx} without a Dockerfile");
        }
    }
    assert!(checked >= 3, "expected the Prometheus and Grafana mounts, checked {checked}");
}

#[test]
fn reconciler_service_config_is_valid_and_agrees_with_the_stack() {
    let c = compose();
    let svc = service(&c, "reconciler");
    // Every service running the image runs a command the binary accepts
    // (the reconciler itself, the load generator of the `loadgen` profile).
    let image = svc["image"].as_str().unwrap();
    let mut commands = 0;
    for (name, s) in c["services"].as_object().unwrap().iter().filter(|(_, s)| s["image"] == image) {
        let mut args = vec!["reconciler".to_owned()];
        args.extend(strings(&s["command"]));
        <reconciler::cli::Cli as clap::Parser>::try_parse_from(&args)
            .unwrap_or_else(|e| panic!("service {name}: command {args:?}: {e}"));
        commands += 1;
    }
    assert_eq!(commands, 2, "the reconciler and the load generator");

    // The config file the image carries, with the service's environment.
    let mut env = env_of(svc);
    let in_image = env.remove("RECONCILER_CONFIG_FILE").expect("the service names its config file");
    let copies = dockerfile_copies();
    let in_repo = copies.get(&in_image).unwrap_or_else(|| panic!("the Dockerfile does not COPY {in_image}"));
    env.retain(|k, _| k.starts_with("RECONCILER_") && k != "RECONCILER_LOG");
    let cfg = effective_config(&root().join(in_repo), &env);

    // Every RECONCILER_* variable is a real configuration key: the binary
    // applied it (unknown keys already fail `reconciler config`).
    for (k, v) in &env {
        let path: Vec<String> = k["RECONCILER_".len()..].split("__").map(|s| s.to_lowercase()).collect();
        let mut at = &cfg;
        for p in &path {
            at = at.get(p).unwrap_or_else(|| panic!("{k} names no configuration key"));
        }
        // Secrets are printed masked: present is all that can be seen.
        let shown: Vec<&str> = match at.as_array() {
            Some(list) => list.iter().map(|x| x.as_str().expect("a list of strings")).collect(),
            None => vec![at.as_str().expect("a string setting")],
        };
        let as_toml = toml::from_str::<toml::Table>(&format!("v = {v}")).ok().and_then(|t| t.get("v").cloned());
        let given: Vec<String> = match as_toml {
            Some(toml::Value::Array(list)) => list.iter().map(|x| x.as_str().unwrap_or_default().to_owned()).collect(),
            _ => vec![v.clone()],
        };
        assert_eq!(shown.len(), given.len(), "{k} was not applied: {shown:?}");
        for (s, g) in shown.iter().zip(&given) {
            assert!(s == g || *s == reconciler::config::REDACTED, "{k} was not applied: {shown:?}");
        }
    }

    // The HTTP port: published, health-checked, exposed and scraped.
    let bind = cfg["http"]["bind"].as_str().expect("http.bind");
    let port = port_of(bind);
    assert!(bind.starts_with("0.0.0.0:"), "inside a container the server must listen on every interface: {bind}");
    assert_eq!(container_ports(svc), vec![port], "published port");
    let health = strings(&svc["healthcheck"]["test"]).join(" ");
    assert!(health.contains("/readyz") && port_of(health.split_whitespace().last().unwrap()) == port, "{health}");
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains(&format!("EXPOSE {port}")), "the Dockerfile must EXPOSE {port}");
    assert!(dockerfile.contains(&format!("127.0.0.1:{port}/readyz")), "the image's HEALTHCHECK must probe {port}");
    assert!(env.contains_key("RECONCILER_HTTP__TOKEN"), "resolve and redrive need a token");
    let prometheus = service(&c, "prometheus");
    let config_dir = strings(&prometheus["volumes"])
        .iter()
        .find_map(|v| {
            v.split(':').nth(1).filter(|dst| *dst == "/etc/prometheus").map(|_| v.split(':').next().unwrap().to_owned())
        })
        .expect("Prometheus mounts its configuration");
    assert!(strings(&prometheus["command"]).contains(&"--config.file=/etc/prometheus/prometheus.yml".to_owned()));
    let scrape = yaml(&root().join(&config_dir).join("prometheus.yml"), false).unwrap();
    let targets = strings(&scrape["scrape_configs"][0]["static_configs"][0]["targets"]);
    assert_eq!(targets, vec![format!("reconciler:{port}")], "Prometheus scrapes the reconciler service's port");

    // State survives container restarts.
    let state_dir = cfg["state_dir"].as_str().unwrap();
    let mounts: Vec<String> =
        strings(&svc["volumes"]).iter().map(|v| v.split(':').nth(1).unwrap().to_owned()).collect();
    assert!(mounts.iter().any(|m| state_dir.starts_with(m.as_str())), "{state_dir} is not on a volume ({mounts:?})");

    // The brokers it dials are Kafka's advertised in-network listener.
    let kafka_env = env_of(service(&c, "kafka"));
    let servers = cfg["kafka"]["bootstrap.servers"].as_str().unwrap();
    let advertised = &kafka_env["KAFKA_ADVERTISED_LISTENERS"];
    assert!(advertised.split(',').any(|l| l.ends_with(&format!("//{servers}"))), "{servers} not in {advertised}");

    // topics-init creates exactly the configured topics, partitioned as
    // configured.
    let init = strings(&service(&c, "topics-init")["command"]).join("\n");
    let topics = &cfg["topics"];
    let names: BTreeSet<&str> =
        ["events", "verdicts", "anomalies", "dlq", "commands"].iter().map(|k| topics[*k].as_str().unwrap()).collect();
    let list = init.lines().find(|l| l.trim_start().starts_with("for topic in")).expect("a loop over the topics");
    let created: BTreeSet<&str> =
        list.trim().trim_start_matches("for topic in").trim_end_matches("; do").split_whitespace().collect();
    assert_eq!(created, names, "topics-init must create the configured topics");
    let partitions = topics["partitions"].as_integer().unwrap();
    assert!(init.contains(&format!("--partitions {partitions}")), "topics-init partitions != topics.partitions");
}

#[test]
fn dockerfile_builds_with_the_ci_scripts_and_runs_as_non_root() {
    let dockerfile = read("Dockerfile");
    let runs: Vec<&str> = dockerfile.lines().filter(|l| l.contains("scripts/")).collect();
    assert!(runs.iter().any(|l| l.contains("scripts/setup.sh --build")), "the builder installs with setup.sh");
    assert!(runs.iter().any(|l| l.contains("scripts/build.sh")), "the builder builds with build.sh");
    let test = read("scripts/test.sh");
    assert!(test.contains("scripts/setup.sh") && test.contains("scripts/build.sh"), "CI uses the same scripts");
    let build = read("scripts/build.sh");
    assert!(build.contains("cargo build --release --locked --bin reconciler"), "{build}");

    for (dst, src) in dockerfile_copies() {
        assert!(root().join(&src).exists(), "COPY {src} {dst}: {src} does not exist");
    }
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = runtime.lines().find_map(|l| l.strip_prefix("USER ")).expect("the runtime stage sets USER");
    assert!(user != "root" && user != "0", "runs as {user}");
    assert!(runtime.contains("ENTRYPOINT [\"reconciler\"]"), "the image's entry point is the binary");
}

/// scripts/env.sh sends cargo's intermediate artifacts to ~/.cache unless
/// told otherwise: in the image build both directories must lie in the
/// cache mount, or every build compiles RocksDB again.
#[test]
fn dockerfile_keeps_both_cargo_directories_in_its_build_cache() {
    let dockerfile = read("Dockerfile");
    let caches: Vec<&str> = dockerfile
        .split("--mount=type=cache,target=")
        .skip(1)
        .map(|rest| rest.split([',', ' ', '\\', '\n']).next().unwrap())
        .collect();
    let env = read("scripts/env.sh");
    for var in ["CARGO_TARGET_DIR", "CARGO_BUILD_BUILD_DIR"] {
        assert!(env.contains(&format!("export {var}=")), "scripts/env.sh no longer sets {var}: revisit this test");
        let value = dockerfile
            .lines()
            .filter_map(|l| l.strip_prefix("ENV "))
            .flat_map(|l| l.split_whitespace())
            .find_map(|kv| kv.strip_prefix(&format!("{var}=")))
            .unwrap_or_else(|| panic!("the Dockerfile does not set {var}"));
        assert!(caches.iter().any(|c| value.starts_with(c)), "{var}={value} is outside the cache mounts {caches:?}");
    }
}

#[test]
fn grafana_provisioning_matches_the_mounts_and_the_dashboard() {
    let c = compose();
    let grafana = service(&c, "grafana");
    let mounts: BTreeMap<String, String> = strings(&grafana["volumes"])
        .iter()
        .map(|v| {
            let mut parts = v.split(':');
            (parts.nth(1).unwrap().to_owned(), v.split(':').next().unwrap().trim_start_matches("./").to_owned())
        })
        .collect();
    let provisioning = Path::new(&mounts["/etc/grafana/provisioning"]).to_path_buf();

    let ds = yaml(&root().join(&provisioning).join("datasources/prometheus.yml"), false).unwrap();
    let ds = &ds["datasources"][0];
    let prometheus_port = container_ports(service(&c, "prometheus"))[0];
    assert_eq!(ds["url"], format!("http://prometheus:{prometheus_port}"));

    let provider = yaml(&root().join(&provisioning).join("dashboards/reconciler.yml"), false).unwrap();
    let dir = provider["providers"][0]["options"]["path"].as_str().unwrap();
    let (dashboard_in_container, dashboard_in_repo) =
        mounts.iter().find(|(dst, _)| dst.ends_with(".json")).expect("the dashboard is mounted");
    assert_eq!(Path::new(dashboard_in_container).parent().unwrap(), Path::new(dir), "provider path");

    let dashboard: Value = serde_json::from_str(&read(dashboard_in_repo)).expect("the dashboard is JSON");
    let mut uids = BTreeSet::new();
    collect_datasource_uids(&dashboard, &mut uids);
    assert_eq!(uids, BTreeSet::from([ds["uid"].as_str().unwrap().to_owned()]), "panels use the provisioned datasource");
}

/// The dashboard shows what an operator of the reconciler looks for
/// (issue 7's list); that each query names a series a real run exposes is
/// checked by tests/http.rs against a live /metrics.
#[test]
fn dashboard_shows_verdicts_reviews_age_anomalies_dead_letters_lag_throughput_and_latency() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/reconciler.json")).unwrap();
    let mut exprs = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "every panel has a title");
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().expect("a PromQL expression").to_owned());
        }
    }
    let uses = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    for needle in [
        "sum by (outcome) (rate(reconciler_verdicts_total",
        "reconciler_review_open",
        "reconciler_review_oldest_age_seconds",
        "max by (type) (reconciler_oldest_unconfirmed_age_seconds)",
        "sum by (kind) (rate(reconciler_anomalies_total",
        "rate(reconciler_dead_letters_total",
        "sum by (partition) (reconciler_consumer_lag)",
        "rate(reconciler_events_total",
        "histogram_quantile(0.99, sum by (le) (rate(reconciler_batch_duration_seconds_bucket",
        "histogram_quantile(0.5, sum by (le, type) (rate(reconciler_time_to_confirm_seconds_bucket",
    ] {
        assert!(uses(needle), "no panel queries {needle}");
    }
    let ids: BTreeSet<i64> =
        dashboard["panels"].as_array().unwrap().iter().map(|p| p["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), dashboard["panels"].as_array().unwrap().len(), "panel ids are unique");
}

fn collect_datasource_uids(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(uid) = m.get("datasource").and_then(|d| d.get("uid")).and_then(Value::as_str) {
                out.insert(uid.to_owned());
            }
            m.values().for_each(|x| collect_datasource_uids(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_datasource_uids(x, out)),
        _ => {}
    }
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "reconciler-deploy-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
