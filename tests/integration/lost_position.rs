//! Faults of the input's log under a deployment's stored state: the topic
//! deleted and created again while the state directory stays (what a
//! development stack meets when the broker loses its volume), and a
//! deployment that kept its changelog under the previous default name.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use reconciler::clock::system_clock;
use reconciler::config::{Config, OnLostPosition};
use reconciler::demo;
use reconciler::kafka::admin;
use reconciler::kafka::watermarks::Watermarks;
use reconciler::pipeline::{previous_names, Pipeline, PipelineError};

use crate::common::check::{self, caught_up};
use crate::common::{self, run::Run};

/// Runs a pipeline in a thread until `done` says so (then stops it) or it
/// fails; its result, and the seconds it ran.
fn run_until(cfg: &Config, mut done: impl FnMut() -> bool, limit: Duration) -> (Result<(), PipelineError>, f64) {
    let started = Instant::now();
    let shutdown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pipeline = Pipeline::new(cfg.clone(), system_clock()).expect("the pipeline starts");
    let flag = shutdown.clone();
    let handle = std::thread::spawn(move || pipeline.run(&flag));
    while !handle.is_finished() && started.elapsed() < limit && !done() {
        std::thread::sleep(Duration::from_millis(200)); // polling interval
    }
    shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    (handle.join().expect("the pipeline thread"), started.elapsed().as_secs_f64())
}

/// Deletes `topic` and creates it again, empty, with `partitions`.
fn recreate(cfg: &Config, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", common::brokers()).create().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let deleted = rt.block_on(admin.delete_topics(&[topic], &AdminOptions::new())).unwrap();
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    let marks = Watermarks::new(&cfg.kafka).unwrap();
    assert!(common::wait_for(Duration::from_secs(60), || !marks.exists(topic).unwrap_or(true)), "{topic} not deleted");
    // Deletion finishes on the broker after metadata stops naming the
    // topic: a create meanwhile is refused, and tried again.
    let created = common::wait_for(Duration::from_secs(60), || {
        admin::ensure_topics(&cfg.kafka, &[topic], partitions, 1).is_ok()
            && (0..partitions).all(|p| marks.range(topic, p, Duration::from_secs(5)).is_ok_and(|r| r == (0, 0)))
    });
    assert!(created, "{topic} not created again");
}

/// The ids of the verdicts of `cfg` published at or after `from`.
fn verdicts_since(cfg: &Config, from: &BTreeMap<i32, i64>) -> HashSet<String> {
    let codec = reconciler::codec::Codec::new();
    check::read_all(cfg, &[&cfg.topics.verdicts])
        .into_iter()
        .filter(|r| r.offset >= from.get(&r.partition).copied().unwrap_or(0))
        .map(|r| codec.decode_verdict(r.value.as_deref().expect("a verdict")).expect("it decodes").verdict_id)
        .collect()
}

/// `reconciler run` (the binary) stopped by a lost position stays up: its
/// `/readyz` answers 503 with the facts, its `/metrics` counts the stop,
/// and it exits non-zero on SIGTERM. Its log, piped and not a terminal,
/// carries no colour codes.
fn stopped_binary_waits_not_ready(run: &Run) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_reconciler"))
        .args(["--config", run.config_file.to_str().unwrap(), "run"])
        .env("RECONCILER_HTTP__BIND", "127.0.0.1:0")
        .env("RECONCILER_SECURITY__CONTROL_KEYS", format!("[{:?}]", common::CONTROL_KEY))
        .env("RECONCILER_LOG", "info,rdkafka=warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (rx, collector) = common::child::stderr_lines(&mut child);
    let addr: std::net::SocketAddr = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server's log line");
        if line.contains("HTTP server listening") {
            let at = line.split("addr=").nth(1).expect("the address field");
            break at.split_whitespace().next().unwrap().parse().unwrap_or_else(|e| panic!("{e}: {line}"));
        }
    };
    let stopped = common::wait_for(Duration::from_secs(60), || {
        let (code, body) = common::http::request(addr, "GET", "/readyz", &[], "");
        code == 503 && body.contains("past the log's end")
    });
    let (_, readiness) = common::http::request(addr, "GET", "/readyz", &[], "");
    let (_, metrics) = common::http::request(addr, "GET", "/metrics", &[], "");
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    let lines = collector.join().unwrap();
    println!("lost position (binary): stopped, /readyz {readiness}, exit {status}");
    assert!(stopped, "/readyz red with the facts: {readiness}\n{}", lines.join("\n"));
    // Every partition of the assignment is checked (each lost here).
    let fails = metrics
        .lines()
        .find_map(|l| l.strip_prefix("reconciler_lost_positions_total{action=\"fail\"} "))
        .and_then(|v| v.parse::<u32>().ok());
    assert!(fails.is_some_and(|n| n >= 1), "{metrics}");
    assert!(!status.success(), "exits non-zero after the stop");
    assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "no colour codes in a piped log: {lines:?}");
}

/// The input topic deleted and created again under the state of 4 copies
/// of the workload, and one new copy published: by default the pipeline
/// stops at assignment, naming the partition, the stored position and the
/// log's range, and nothing moves (no group offset is committed, no
/// verdict is published); with `on_lost_position = "reset"` it
/// forgets the state, reads the new log from its start and publishes
/// exactly the verdicts the core predicts for the new copy alone. Without
/// the check (`auto.offset.reset` as Kafka clients default it), the same
/// start skips every new record: the restore rule takes them for records
/// the group already published.
#[test]
fn a_recreated_input_topic_stops_with_the_facts_and_reset_rebuilds_from_the_new_log() {
    let (run, first) = Run::prepare("lost-position", 4, 500, None);
    let cfg = run.cfg.clone();
    demo::publish(&cfg, &first).unwrap();
    let (ran, secs) =
        run_until(&cfg, || caught_up(&cfg) && run.verdicts_so_far() >= run.verdicts, Duration::from_secs(120));
    ran.expect("the first run");
    assert!(run.verdicts_so_far() >= run.verdicts, "the first run settled in {secs:.1} s");
    let stored = check::committed(&cfg);
    let verdict_end = check::end_offsets(&cfg, &cfg.topics.verdicts);

    recreate(&cfg, &cfg.topics.events, cfg.topics.partitions);
    let start = (system_clock())();
    let second = demo::workload(start, 1);
    demo::publish(&cfg, &second).unwrap();
    let new_end = check::end_offsets(&cfg, &cfg.topics.events);
    assert!(
        new_end.iter().all(|(p, e)| stored.get(p).is_some_and(|s| s > e)),
        "stored {stored:?}, new log {new_end:?}"
    );

    // (Kafka deletes a deleted topic's group offsets.)
    let group_before = check::committed(&cfg);
    // The default: stop, with the facts, and move nothing.
    let (ran, secs) = run_until(&cfg, || false, Duration::from_secs(60));
    let err = ran.expect_err("a lost position stops the pipeline").to_string();
    println!("lost position (fail): stopped after {secs:.1} s: {err}");
    for words in ["of ".to_owned() + &cfg.topics.events, "past the log's end".into(), "on_lost_position".into()] {
        assert!(err.contains(&words), "{words}: {err}");
    }
    assert!(stored.values().any(|s| err.contains(&format!("position {s} "))), "the stored position is named: {err}");
    assert_eq!(check::committed(&cfg), group_before, "the group's offsets did not move");
    assert!(verdicts_since(&cfg, &verdict_end).is_empty(), "nothing was published");
    stopped_binary_waits_not_ready(&run);
    assert_eq!(check::committed(&cfg), group_before, "the binary's stop moved nothing either");

    // "reset": the new log from its start, as if the state were new.
    let mut reset = cfg.clone();
    reset.consumer.on_lost_position = OnLostPosition::Reset;
    let expected: HashSet<String> =
        demo::predicted_verdicts(&reset, &second, start).into_iter().map(|v| v.verdict_id).collect();
    let (ran, secs) = run_until(
        &reset,
        || verdicts_since(&reset, &verdict_end).len() >= expected.len() && caught_up(&reset),
        Duration::from_secs(120),
    );
    ran.expect("the reset run");
    let published = verdicts_since(&reset, &verdict_end);
    println!(
        "lost position (reset): {} records in the new log, {} verdicts published of {} predicted, {} missing, {} unexpected, caught up in {secs:.1} s",
        new_end.values().sum::<i64>(),
        published.len(),
        expected.len(),
        expected.difference(&published).count(),
        published.difference(&expected).count()
    );
    assert_eq!(published, expected, "the verdicts the core predicts for the new log alone");
    // (The input grew by the timers the pipeline publishes there.)
    assert!(caught_up(&reset), "the group's offsets follow the new log: {:?}", check::committed(&reset));
}

/// A deployment whose changelog is under the previous default name, started
/// with the name left unset, stops and names the setting; a new group (a
/// second deployment) and a changelog named in the settings start.
#[test]
fn a_changelog_under_the_previous_default_name_is_named_not_abandoned() {
    let cfg = common::config("previous-name");
    let previous = common::unique("previous.state");
    let t = &cfg.topics;
    admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    admin::ensure_topics(&cfg.kafka, &[&previous], t.partitions, 1).unwrap();
    let marks = Watermarks::new(&cfg.kafka).unwrap();
    let mut unset = cfg.clone();
    unset.topics.changelog = None;
    unset.topics.name_after_group(&cfg.consumer.group_id);

    // A group that never processed the input: a new deployment.
    previous_names::check_against(&unset, &marks, &previous).expect("a new group starts");
    // The group has processed the input: its state is under the old name.
    check::try_commit_as_group(&cfg, 0, 1).unwrap();
    let err = previous_names::check_against(&unset, &marks, &previous).unwrap_err().to_string();
    println!("previous changelog name: {err}");
    assert!(err.contains("topics.changelog") && err.contains(&format!("changelog = \"{previous}\"")), "{err}");
    // Named in the settings, the changelog is whatever the operator says.
    previous_names::check_against(&cfg, &marks, &previous).expect("a named changelog starts");
}

/// A state directory left behind (a machine stopped for longer than the
/// group's offsets are kept) while others went on, and retention has since
/// deleted the input up to where they got: its stored position is before
/// the log's start. By default the start stops, naming it; with
/// `on_lost_position = "restore"` the partition is restored from the
/// changelog, whose position is in the log, and nothing is published again.
#[test]
fn a_stale_state_before_the_logs_start_is_restored_from_the_changelog() {
    let (run, workload) = Run::prepare("lost-restore", 3, 500, None);
    let cfg = run.cfg.clone();
    run.publish_part(&workload, 0, 2);
    run_until(&cfg, || caught_up(&cfg), Duration::from_secs(120)).0.expect("the first half");
    assert!(caught_up(&cfg), "the first half is processed");
    let stale = common::temp_dir("lost-restore-stale");
    copy_dir(&cfg.state_dir, &stale);
    run.publish_part(&workload, 1, 2);
    let (ran, secs) =
        run_until(&cfg, || caught_up(&cfg) && run.verdicts_so_far() >= run.verdicts, Duration::from_secs(120));
    ran.expect("the second half");
    assert!(run.verdicts_so_far() >= run.verdicts, "every verdict after {secs:.1} s");
    let verdict_end = check::end_offsets(&cfg, &cfg.topics.verdicts);
    check::delete_head(&cfg, &cfg.topics.events);

    // The stale copy, under a group whose offsets are gone.
    let mut stopped = cfg.clone();
    stopped.state_dir = stale;
    stopped.consumer.group_id = format!("{}.later", cfg.consumer.group_id);
    let (ran, _) = run_until(&stopped, || false, Duration::from_secs(60));
    let err = ran.expect_err("a position before the log's start stops the pipeline").to_string();
    println!("lost position (stale, fail): {err}");
    assert!(err.contains("before the log's start"), "{err}");

    let mut restore = stopped.clone();
    restore.consumer.on_lost_position = OnLostPosition::Restore;
    let (ran, secs) = run_until(&restore, || caught_up(&restore), Duration::from_secs(60));
    ran.expect("the restore run");
    let again = verdicts_since(&restore, &verdict_end);
    println!("lost position (stale, restore): restored from the changelog and caught up in {secs:.1} s, {} verdicts published again", again.len());
    assert!(caught_up(&restore), "the restored partitions go on from the changelog's position");
    assert!(again.is_empty(), "nothing published again: {again:?}");
}

/// Copies directory `from` (files only, one level deep or more) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Two deployments over one input (blue/green, or a rebuild into new
/// topics with `run`), each with its own group and outputs and the state
/// topics left unset: each has a changelog of its own, and the second
/// publishes every verdict the first did instead of restoring the first's
/// state and skipping the input.
#[test]
fn two_deployments_over_one_input_keep_their_state_apart() {
    let (run, workload) = Run::prepare("blue-green", 2, 500, None);
    let mut blue = run.cfg.clone();
    blue.topics.changelog = None;
    blue.topics.fleet = None;
    blue.topics.name_after_group(&blue.consumer.group_id);
    demo::publish(&blue, &workload).unwrap();
    let (ran, secs) =
        run_until(&blue, || caught_up(&blue) && run.verdicts_so_far() >= run.verdicts, Duration::from_secs(120));
    ran.expect("blue");
    let blue_verdicts = run.verdicts_so_far();

    let mut green = blue.clone();
    green.consumer.group_id = format!("{}.green", blue.consumer.group_id);
    green.state_dir = common::temp_dir("blue-green-green-state");
    green.topics.verdicts = format!("{}.green", blue.topics.verdicts);
    green.topics.anomalies = format!("{}.green", blue.topics.anomalies);
    green.topics.dlq = format!("{}.green", blue.topics.dlq);
    green.topics.commands = format!("{}.green", blue.topics.commands);
    green.topics.changelog = None;
    green.topics.fleet = None;
    green.topics.name_after_group(&green.consumer.group_id);
    assert_ne!(green.topics.changelog(), blue.topics.changelog());
    let green_verdicts = || verdicts_since(&green, &BTreeMap::new()).len();
    let (ran, green_secs) =
        run_until(&green, || caught_up(&green) && green_verdicts() >= blue_verdicts, Duration::from_secs(120));
    ran.expect("green");
    println!(
        "two deployments: blue published {blue_verdicts} verdicts in {secs:.1} s, green {} in {green_secs:.1} s (changelogs {:?} and {:?})",
        green_verdicts(),
        blue.topics.changelog(),
        green.topics.changelog()
    );
    assert_eq!(green_verdicts(), blue_verdicts, "green decides every operation itself");
}

/// A position that leaves the log while the instance runs: it stops itself
/// in its first batch (`pipeline::mid_batch`, SIGSTOP) with its fetch
/// position where it was; meanwhile more records arrive and the input's
/// head is deleted past them (retention catching up with a lagging
/// consumer). Resumed within its session, it applies what it had fetched,
/// then the broker answers that its fetch position is out of range: it
/// stops, naming it, and commits nothing past what it applied.
#[test]
fn a_position_that_leaves_the_log_while_running_stops_the_instance() {
    let (run, workload) = Run::prepare("lost-running", 2, 20, None);
    let cfg = run.cfg.clone();
    run.publish_part(&workload, 0, 2);
    let mut child = run.spawn(Some("pipeline::mid_batch=1*return(stop)"));
    assert!(
        common::wait_for(Duration::from_secs(60), || common::run::stopped(child.pid())),
        "the instance never reached its stop point; log:\n{}",
        child.log_tail()
    );
    let first_end = check::end_offsets(&cfg, &cfg.topics.events);
    run.publish_part(&workload, 1, 2);
    check::delete_head(&cfg, &cfg.topics.events);
    let stopped_for = Instant::now();
    common::child::signal(child.pid(), "CONT");
    let exited = common::wait_for(Duration::from_secs(60), || child.exited().is_some());
    let log = std::fs::read_to_string(&child.log).unwrap_or_default();
    println!(
        "lost position (running): resumed after the head was deleted, exited {:.1} s later",
        stopped_for.elapsed().as_secs_f64()
    );
    assert!(exited, "the instance went on; log:\n{log}");
    // (The test child panics on the error and prints its fields.)
    assert!(
        log.contains("found while running") && log.contains("whose: \"fetch\""),
        "the stop names the facts:\n{log}"
    );
    let committed = check::committed(&cfg);
    assert!(
        committed.iter().all(|(p, c)| first_end.get(p).is_some_and(|e| c <= e)),
        "nothing committed past what was fetched before the deletion: {committed:?} > {first_end:?}"
    );
}
