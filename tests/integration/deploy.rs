//! Checks of the deployment files that can be made without a container
//! engine (none runs on the development machines):
//!
//! - docker-compose.yml follows the Compose specification's JSON schema, and
//!   every file, port, topic and variable it names exists and agrees with
//!   what the binary really does with it;
//! - it is safe to start: secrets have no defaults (`${NAME:?why}`), every
//!   port is published on 127.0.0.1 only, its header says how to set each
//!   required variable and how to start fresh;
//! - the outbox profile's relay reaches its PostgreSQL and the input topic;
//! - the Dockerfile builds with the same scripts as CI and runs as non-root;
//! - the Prometheus and Grafana provisioning point at what compose mounts.
//!
//! YAML is read through `tests/deploy/to_json.mjs` (Node.js, installed by
//! `scripts/setup.sh --tests`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;
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
        .map(|m| m.iter().map(|(k, v)| (k.clone(), as_started(v.as_str().expect("env values are strings")))).collect())
        .unwrap_or_default()
}

/// Values for the variables docker-compose.yml requires (`${NAME:?why}`),
/// as a user sets them before starting the stack (its header says how).
const REQUIRED: [(&str, &str); 4] = [
    ("RECONCILER_HTTP_TOKEN", "token-of-the-deploy-test"),
    ("RECONCILER_CONTROL_KEYS", r#"["control-key-of-the-deploy-test"]"#),
    ("OUTBOX_DB_PASSWORD", "outbox-password-of-the-deploy-test"),
    ("GRAFANA_ADMIN_PASSWORD", "grafana-password-of-the-deploy-test"),
];

/// `${NAME:?why}`: compose refuses to start while NAME is unset or empty.
fn required_variable() -> Regex {
    Regex::new(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?([^}]*)\}").unwrap()
}

/// `value` as compose sets it when the required variables are set (to the
/// values of [`REQUIRED`]) and the others are unset: `${NAME:-default}`
/// becomes its default, `${NAME:?why}` NAME's value.
fn as_started(value: &str) -> String {
    let defaulted = Regex::new(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}").unwrap().replace_all(value, "$1");
    required_variable()
        .replace_all(&defaulted, |c: &regex::Captures<'_>| {
            let name = &c[1];
            REQUIRED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
                .unwrap_or_else(|| panic!("docker-compose.yml requires {name}: give it a value in REQUIRED"))
        })
        .into_owned()
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

/// The configuration file, in the repository, that a service of the image
/// reads: the one its `RECONCILER_CONFIG_FILE` names (taken out of `env`),
/// else the image's own (the Dockerfile's `ENV`).
fn config_file_of(env: &mut BTreeMap<String, String>) -> PathBuf {
    let in_image = env.remove("RECONCILER_CONFIG_FILE").unwrap_or_else(|| {
        read("Dockerfile")
            .lines()
            .filter_map(|l| l.strip_prefix("ENV "))
            .flat_map(|l| l.split_whitespace())
            .find_map(|kv| kv.strip_prefix("RECONCILER_CONFIG_FILE=").map(str::to_owned))
            .expect("neither the service nor the image names a config file")
    });
    let copies = dockerfile_copies();
    let in_repo = copies.get(&in_image).unwrap_or_else(|| panic!("the Dockerfile does not COPY {in_image}"));
    root().join(in_repo)
}

/// Compose service `name`'s `RECONCILER_*` variables (the log filter
/// aside) and the effective configuration the binary builds from them and
/// the config file of its image.
fn service_config(c: &Value, name: &str) -> (BTreeMap<String, String>, toml::Value) {
    let mut env = env_of(service(c, name));
    let file = config_file_of(&mut env);
    env.retain(|k, _| k.starts_with("RECONCILER_") && k != "RECONCILER_LOG");
    let cfg = effective_config(&file, &env);
    (env, cfg)
}

/// Every `RECONCILER_*` variable of service `name` is a real configuration
/// key and the binary applied it (unknown keys already fail `reconciler
/// config`).
fn assert_applied(name: &str, env: &BTreeMap<String, String>, cfg: &toml::Value) {
    for (k, v) in env {
        let path: Vec<String> = k["RECONCILER_".len()..].split("__").map(|s| s.to_lowercase()).collect();
        let mut at = cfg;
        for p in &path {
            at = at.get(p).unwrap_or_else(|| panic!("service {name}: {k} names no configuration key"));
        }
        // Secrets are printed masked: present is all that can be seen.
        let shown: Vec<String> = match at {
            toml::Value::Array(list) => {
                list.iter().map(|x| x.as_str().expect("a list of strings").to_owned()).collect()
            }
            toml::Value::String(s) => vec![s.clone()],
            toml::Value::Integer(i) => vec![i.to_string()],
            toml::Value::Boolean(b) => vec![b.to_string()],
            other => panic!("service {name}: {k} is {other:?}"),
        };
        let as_toml = toml::from_str::<toml::Table>(&format!("v = {v}")).ok().and_then(|t| t.get("v").cloned());
        let given: Vec<String> = match as_toml {
            Some(toml::Value::Array(list)) => list.iter().map(|x| x.as_str().unwrap_or_default().to_owned()).collect(),
            _ => vec![v.clone()],
        };
        assert_eq!(shown.len(), given.len(), "service {name}: {k} was not applied: {shown:?}");
        for (s, g) in shown.iter().zip(&given) {
            assert!(s == g || s == reconciler::config::REDACTED, "service {name}: {k} was not applied: {shown:?}");
        }
    }
}

/// Why the compose file at `path` is not safe to start as written: a
/// placeholder secret, a secret with a default or not asked for, a port
/// published beyond this machine, a required variable whose setting the
/// header does not show, no word on starting fresh. Empty when safe.
fn unsafe_to_start(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    // As written: `${NAME:-default}` not yet replaced by its default.
    let raw = yaml(path, false).unwrap();
    let mut problems = Vec::new();
    if text.to_lowercase().contains("change-me") {
        problems.push("a change-me placeholder".to_owned());
    }
    let whole_required = Regex::new(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:\?[^}]+\}$").unwrap();
    let secret_key = Regex::new(r"(?i)token|keys?$|password|secret").unwrap();
    // A connection string's password, quoted or not.
    let password_in = Regex::new(r"password=(?:'([^']*)'|(\S*))").unwrap();
    for (name, svc) in raw["services"].as_object().unwrap() {
        for (k, v) in svc["environment"].as_object().into_iter().flatten() {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let secret = if secret_key.is_match(k) {
                Some(v.as_str())
            } else {
                password_in.captures(&v).map(|c| c.get(1).or_else(|| c.get(2)).unwrap().as_str())
            };
            if secret.is_some_and(|s| !whole_required.is_match(s)) {
                problems.push(format!("service {name}: {k} is not a required variable (${{NAME:?why}}): {v}"));
            }
        }
        for p in strings(&svc["ports"]) {
            let parts: Vec<&str> = p.split(':').collect();
            if parts.len() != 3 || parts[0] != "127.0.0.1" {
                problems.push(format!("service {name}: port {p} is not published on 127.0.0.1 only"));
            }
        }
    }
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#') || l.trim().is_empty()).collect();
    let header = header.join("\n");
    let mut named = BTreeSet::new();
    for c in required_variable().captures_iter(&text) {
        let var = c[1].to_owned();
        if named.insert(var.clone()) && !header.contains(&format!("#   {var}=")) {
            problems.push(format!("the header does not show how to set {var}"));
        }
    }
    if !header.contains("docker compose down -v") {
        problems.push("the header does not say how to start fresh (docker compose down -v)".to_owned());
    }
    problems
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
fn compose_is_safe_to_start_and_the_check_can_fail() {
    let path = root().join("docker-compose.yml");
    assert_eq!(unsafe_to_start(&path), Vec::<String>::new(), "docker-compose.yml");

    // Each kind of unsafe setting is caught.
    let text = read("docker-compose.yml");
    let password = Regex::new(r"password='\$\{OUTBOX_DB_PASSWORD:\?[^}]*\}'").unwrap();
    let mutations: [(&str, String, &str); 5] = [
        (
            "a secret with a default",
            text.replace(
                "RECONCILER_HTTP__TOKEN: ${RECONCILER_HTTP_TOKEN:?",
                "RECONCILER_HTTP__TOKEN: ${RECONCILER_HTTP_TOKEN:-",
            ),
            "RECONCILER_HTTP__TOKEN",
        ),
        ("a password written out", password.replace(&text, "password=hunter2").into_owned(), "OUTBOX_DATABASE_URL"),
        ("a port open to the network", text.replace("\"127.0.0.1:9090:9090\"", "\"9090:9090\""), "prometheus"),
        (
            "a required variable the header does not explain",
            text.replace("#   OUTBOX_DB_PASSWORD=", "#   OUTBOX_PASSWORD="),
            "OUTBOX_DB_PASSWORD",
        ),
        ("no word on starting fresh", text.replace("docker compose down -v", "docker compose down"), "down -v"),
    ];
    let dir = tempdir();
    for (i, (what, mutated, expect)) in mutations.iter().enumerate() {
        assert_ne!(mutated, &text, "{what}: the mutation no longer applies to docker-compose.yml; revisit this test");
        let file = dir.join(format!("unsafe-{i}.yml"));
        std::fs::write(&file, mutated).unwrap();
        let problems = unsafe_to_start(&file);
        assert!(problems.iter().any(|p| p.contains(expect)), "{what} was not caught: {problems:?}");
    }
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
    // (the reconciler itself, the load generator of the `loadgen` profile,
    // the relay of the `outbox` profile) with variables it applies.
    let image = svc["image"].as_str().unwrap();
    let mut commands = 0;
    for (name, s) in c["services"].as_object().unwrap().iter().filter(|(_, s)| s["image"] == image) {
        let mut args = vec!["reconciler".to_owned()];
        args.extend(strings(&s["command"]));
        <reconciler::cli::Cli as clap::Parser>::try_parse_from(&args)
            .unwrap_or_else(|e| panic!("service {name}: command {args:?}: {e}"));
        let (env, cfg) = service_config(&c, name);
        assert_applied(name, &env, &cfg);
        commands += 1;
    }
    assert_eq!(commands, 3, "the reconciler, the load generator and the relay");

    // The config file the image carries, with the service's environment.
    assert!(env_of(svc).contains_key("RECONCILER_CONFIG_FILE"), "the service names its config file");
    let (env, cfg) = service_config(&c, "reconciler");

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
    assert!(env.contains_key("RECONCILER_SECURITY__CONTROL_KEYS"), "run needs the control keys");
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
}

/// topics-init creates every topic the reconciler uses, laid out as the
/// reconciler itself creates a missing one (`kafka::admin`), so that it
/// needs no right to create topics.
#[test]
fn topics_init_creates_every_topic_the_reconciler_uses_as_it_would() {
    let c = compose();
    let (_, cfg) = service_config(&c, "reconciler");
    let topics: reconciler::config::Topics =
        cfg["topics"].clone().try_into().expect("[topics] as `reconciler config` prints it");
    let init = service(&c, "topics-init");
    let init_env = env_of(init);
    let script = strings(&init["command"]).join("\n");

    // Partitions and replication factor: one variable each, which the
    // reconciler reads too.
    assert_eq!(init_env["PARTITIONS"], topics.partitions.to_string(), "topics-init partitions != topics.partitions");
    assert_eq!(
        init_env["REPLICATION_FACTOR"],
        topics.replication_factor.to_string(),
        "topics-init replication factor != topics.replication_factor"
    );
    let raw = yaml(&root().join("docker-compose.yml"), false).unwrap();
    let raw_env = |svc: &str, k: &str| -> String {
        raw["services"][svc]["environment"][k]
            .as_str()
            .unwrap_or_else(|| panic!("service {svc} sets no {k}"))
            .to_owned()
    };
    assert_eq!(raw_env("topics-init", "PARTITIONS"), raw_env("reconciler", "RECONCILER_TOPICS__PARTITIONS"));
    assert_eq!(
        raw_env("topics-init", "REPLICATION_FACTOR"),
        raw_env("reconciler", "RECONCILER_TOPICS__REPLICATION_FACTOR")
    );
    assert!(script.contains(r#"--replication-factor "$REPLICATION_FACTOR""#), "{script}");
    assert!(read("docker-compose.yml").contains("production needs 3"), "say what production's replication factor is");

    // What it creates: name -> (partitions, compacted).
    let mut created: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut loop_names: Vec<String> = Vec::new();
    for line in script.lines().map(str::trim) {
        if let Some(list) = line.strip_prefix("for topic in ") {
            loop_names = list.trim_end_matches("; do").split_whitespace().map(str::to_owned).collect();
        } else if let Some(call) = line.strip_prefix("create ") {
            let words: Vec<&str> = call.split_whitespace().collect();
            let names = if words[0] == "\"$topic\"" { loop_names.clone() } else { vec![words[0].to_owned()] };
            let compacted = call.contains("--config cleanup.policy=compact");
            for n in names {
                let previous = created.insert(n.clone(), (words[1].trim_matches('"').to_owned(), compacted));
                assert!(previous.is_none(), "topics-init creates {n} twice");
            }
        }
    }
    let partitions = |token: &str| -> i32 {
        let value = if token == "$PARTITIONS" { init_env["PARTITIONS"].as_str() } else { token };
        value.parse().unwrap_or_else(|_| panic!("topics-init: {token} partitions"))
    };
    let created: BTreeMap<String, (i32, bool)> =
        created.into_iter().map(|(name, (p, compacted))| (name, (partitions(&p), compacted))).collect();

    let mut expected: BTreeMap<String, (i32, bool)> =
        topics.all().iter().map(|t| ((*t).to_owned(), (topics.partitions, false))).collect();
    // The changelog: compacted, one partition per input partition.
    expected.insert(topics.changelog().expect("the changelog is on").to_owned(), (topics.partitions, true));
    // The fleet and the re-drive audit: compacted, one partition.
    expected.insert(topics.fleet().expect("the fleet is on").to_owned(), (1, true));
    expected.insert(topics.dlq_audit().expect("the re-drive audit is on"), (1, true));
    assert_eq!(created, expected, "topics-init must create the configured topics");
}

#[test]
fn outbox_profile_runs_the_relay_against_its_postgres() {
    let c = compose();
    let relay = service(&c, "reconciler-relay");
    let pg = service(&c, "postgres");
    for (name, s) in [("reconciler-relay", relay), ("postgres", pg)] {
        assert_eq!(strings(&s["profiles"]), vec!["outbox".to_owned()], "{name} starts with --profile outbox only");
    }

    // The official image, pinned to a release the outbox's schema supports.
    let image = pg["image"].as_str().unwrap();
    let tag = image.strip_prefix("postgres:").unwrap_or_else(|| panic!("{image} is not the official postgres image"));
    let version: Vec<u32> =
        tag.split('.').map(|p| p.parse().unwrap_or_else(|_| panic!("{image} is not pinned to a release"))).collect();
    assert!(version.len() >= 2, "{image}: pin the minor version too");
    let sql = read("sql/outbox.sql");
    let needs: u32 = Regex::new(r"PostgreSQL (\d+) or later")
        .unwrap()
        .captures(&sql)
        .unwrap_or_else(|| panic!("sql/outbox.sql no longer says which PostgreSQL it needs: revisit this test"))[1]
        .parse()
        .unwrap();
    assert!(version[0] >= needs, "{image}: sql/outbox.sql needs PostgreSQL {needs} or later");

    // The schema: the relay installs it, or the image's init scripts run it.
    let command = strings(&relay["command"]);
    let init_scripts =
        strings(&pg["volumes"]).iter().any(|v| v.starts_with("./sql/outbox.sql:/docker-entrypoint-initdb.d/"));
    assert!(command.iter().any(|a| a == "--install") || init_scripts, "nothing creates the outbox table: {command:?}");

    // It starts once PostgreSQL answers and the input topic exists (the
    // relay checks the topic at start).
    assert_eq!(relay["depends_on"]["postgres"]["condition"], "service_healthy");
    assert_eq!(relay["depends_on"]["topics-init"]["condition"], "service_completed_successfully");

    // The connection string, in the variable [relay] connection_env names,
    // reaches this database as its user.
    let (_, cfg) = service_config(&c, "reconciler-relay");
    let var = cfg["relay"]["connection_env"].as_str().expect("relay.connection_env");
    let relay_env = env_of(relay);
    let conn = relay_env.get(var).unwrap_or_else(|| panic!("the relay reads {var}, which the service does not set"));
    let params: BTreeMap<&str, &str> = conn
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{var}: {kv} is not key=value"));
            (k, v.trim_matches('\''))
        })
        .collect();
    let pg_env = env_of(pg);
    assert_eq!(params.get("host"), Some(&"postgres"), "the relay dials the postgres service: {conn}");
    let pg_port: u16 = params.get("port").map_or(5432, |p| p.parse().unwrap());
    assert_eq!(container_ports(pg), vec![pg_port], "PostgreSQL's port");
    assert_eq!(params.get("user").copied(), Some(pg_env["POSTGRES_USER"].as_str()), "{conn}");
    assert_eq!(params.get("dbname").copied(), Some(pg_env["POSTGRES_DB"].as_str()), "{conn}");
    assert_eq!(params.get("password").copied(), Some(pg_env["POSTGRES_PASSWORD"].as_str()), "the same password");
    let pg_health = strings(&pg["healthcheck"]["test"]).join(" ");
    let (user, db) = (format!("-U {}", pg_env["POSTGRES_USER"]), format!("-d {}", pg_env["POSTGRES_DB"]));
    for needle in ["pg_isready", user.as_str(), db.as_str()] {
        assert!(pg_health.contains(needle), "the health check asks this database: {pg_health}");
    }

    // Its /metrics and /readyz: published and health-checked.
    let bind = cfg["relay"]["bind"].as_str().expect("relay.bind");
    assert!(bind.starts_with("0.0.0.0:"), "inside a container the relay must listen on every interface: {bind}");
    let port = port_of(bind);
    assert_eq!(container_ports(relay), vec![port], "the relay's published port");
    let health = strings(&relay["healthcheck"]["test"]).join(" ");
    assert!(health.contains("/readyz") && port_of(health.split_whitespace().last().unwrap()) == port, "{health}");
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

/// The dashboard shows what an operator of the reconciler looks for; that
/// each query names a series a real run exposes is checked by tests/http.rs
/// against a live /metrics.
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
