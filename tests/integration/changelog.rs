//! The state changelog on Apache Kafka: compacted by the broker's log
//! cleaner, it is what a machine replaced after the input's head is gone
//! restores its partitions from, and the instance goes on exactly as one
//! that kept its state would have.

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::check;
use common::run::Run;
use reconciler::clock::system_clock;
use reconciler::demo;
use reconciler::pipeline::Pipeline;

/// The changelog topic created beforehand for the log cleaner to work on
/// it within seconds: segments rolled every 100 ms, cleaned once 1 % of
/// a log is dirty, tombstones kept 100 ms after their first cleaning.
fn create_quick_compacting_changelog(cfg: &reconciler::config::Config) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        reconciler::kafka::client_config(&[], &cfg.kafka, &[]).create().unwrap();
    let topic = NewTopic::new(cfg.topics.changelog().expect("on"), cfg.topics.partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("min.compaction.lag.ms", "0")
        .set("delete.retention.ms", "100");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in futures::executor::block_on(admin.create_topics(&[topic], &opts)).unwrap() {
        r.unwrap();
    }
}

/// The positions of the changelog's tombstones (null values) and the
/// number of records it holds.
fn tombstones(cfg: &reconciler::config::Config) -> (BTreeSet<(i32, i64)>, usize) {
    let records = check::read_all(cfg, &[cfg.topics.changelog().expect("on")]);
    (records.iter().filter(|r| r.value.is_none()).map(|r| (r.partition, r.offset)).collect(), records.len())
}

/// Instance A processes most of the workload, with a short retention, so
/// that closed operations leave the state and leave tombstones in the
/// changelog. Apache Kafka's log cleaner compacts the changelog as it
/// grows: superseded values go, and the tombstones seen earlier go once
/// their retention passed. Then A's machine is replaced (its state
/// directory is gone) and the input's head is deleted (DeleteRecords).
/// Instance B, with an empty state directory, takes over every partition
/// while the rest arrives: it restores each from the compacted changelog
/// (its log says so for each, it applied no input record silently), and
/// every output of the run equals, byte for byte and in order per key, the
/// reference run of one uninterrupted instance over the whole input; B's
/// final state equals the reference state (I1–I4 of
/// tests/integration/common/check.rs).
#[test]
fn a_replaced_machine_restores_from_the_compacted_changelog_without_the_inputs_head_and_agrees_byte_for_byte() {
    let _serial = common::serial();
    let (run, workload) = Run::prepare_with("lost-history", 12, 60, |cfg| cfg.time.retention_ms = 1_000);
    create_quick_compacting_changelog(&run.cfg);
    let parts = 4;
    let dir_a = common::temp_dir("lost-history-a");
    let a = run.spawn_named("a", &dir_a, None);
    run.publish_part(&workload, 0, parts);
    assert!(run.wait_caught_up(Duration::from_secs(90)), "A did not catch up; log:\n{}", a.log_tail());
    // Closed operations leave the state once their retention passes.
    let mut seen = (BTreeSet::new(), 0);
    let left = common::wait_for(Duration::from_secs(60), || {
        seen = tombstones(&run.cfg);
        !seen.0.is_empty()
    });
    assert!(left, "no tombstone in the changelog: no operation left retention; log:\n{}", a.log_tail());
    let first_tombstones = seen.0.clone();
    // The cleaner works as the changelog grows: the rest of A's share.
    for part in 1..parts - 1 {
        run.publish_part(&workload, part, parts);
    }
    assert!(run.wait_caught_up(Duration::from_secs(90)), "A did not catch up; log:\n{}", a.log_tail());
    let written = |cfg: &reconciler::config::Config| -> i64 {
        check::end_offsets(cfg, cfg.topics.changelog().expect("on")).values().sum()
    };
    let compacted = common::wait_for(Duration::from_secs(90), || {
        seen = tombstones(&run.cfg);
        (seen.1 as i64) < written(&run.cfg) && first_tombstones.iter().any(|t| !seen.0.contains(t))
    });
    let dropped = first_tombstones.iter().filter(|t| !seen.0.contains(t)).count();
    assert!(
        compacted,
        "the changelog was not compacted within 90 s: {} records of {} written; {dropped} of the first {} tombstones dropped",
        seen.1,
        written(&run.cfg),
        first_tombstones.len()
    );
    a.stop();
    std::fs::remove_dir_all(&dir_a).unwrap();
    // The input's head, kept to check against, then deleted from the log.
    let head = check::read_all(&run.cfg, &[&run.cfg.topics.events]);
    check::delete_head(&run.cfg, &run.cfg.topics.events);
    let marks = reconciler::kafka::reader::watermarks(&run.cfg.kafka, &run.cfg.topics.events).unwrap();
    assert!(marks.values().all(|(low, high)| low == high), "the head was not deleted: {marks:?}");

    run.publish_part(&workload, parts - 1, parts);
    let dir_b = common::temp_dir("lost-history-b");
    let b = run.spawn_named("b", &dir_b, None);
    let log_b = b.log.clone();
    // Settle and check against the reference over the whole input.
    let mut f = {
        let partitions = run.cfg.topics.partitions as usize;
        let settled = common::check::wait_settled(&run.cfg, run.verdicts, Duration::from_secs(120), || {
            b.owned() == partitions && b.ready()
        });
        let tail = b.log_tail();
        b.stop();
        if let Err(why) = settled {
            panic!("B did not settle: {why}; log:\n{tail}\nB did not settle: {why}");
        }
        let tail = common::check::read_all(&run.cfg, &[&run.cfg.topics.events]);
        assert!(!tail.is_empty(), "the last part arrived");
        let mut input = head.clone();
        input.extend(tail);
        input.sort_by_key(|r| (r.partition, r.offset));
        let outputs = common::check::read_all(&run.cfg, &common::check::output_topics(&run.cfg));
        common::check::check(&run.cfg, &input, &outputs, &[&dir_b])
    };
    let log = std::fs::read_to_string(&log_b).unwrap();
    let from_changelog = log.matches("Partition restored from the changelog").count();
    assert_eq!(from_changelog, run.cfg.topics.partitions as usize, "every partition restored from the changelog");
    assert!(!log.contains("restoring its state from the log"), "B replayed the input:\n{log}");
    let stats = log.lines().find(|l| l.starts_with("child stats:")).expect("B printed its stats");
    assert!(stats.contains(" restored: 0,"), "B applied input records silently: {stats}");
    f.iterations = 1;
    f.print(&format!(
        "compacted changelog ({} of {} records left, {dropped} of {} early tombstones dropped; {from_changelog} partitions restored, input head deleted)",
        seen.1,
        written(&run.cfg),
        first_tombstones.len()
    ));
    assert_eq!((f.losses, f.divergent), (0, 0));
}

/// The instance crashes after every changelog record of a batch but its
/// offsets records was acknowledged (crash point
/// `pipeline::changelog_cut`): the changelog ends with a batch cut short. Restarted, the instance forgets the
/// partitions whose changelog it still owed, restores them from the
/// changelog, leaves the cut batch out and sets its writes back (its log
/// and the set-back counter say so), and applies that batch again. Had it
/// kept the cut batch's writes, the batch's events would be seen twice:
/// every output must still equal the reference run's, byte for byte, and
/// the final state the reference state.
#[test]
fn a_batch_whose_changelog_was_cut_short_by_a_crash_is_set_back_and_the_outputs_agree() {
    let _serial = common::serial();
    let run = Run::new("changelog-cut", 8, 40);
    let [cut] = reconciler::crash::CHANGELOG_CRASH_POINTS;
    run.crash_with(0, &format!("{cut}=2*off->return"));
    let survivor = run.spawn(None);
    let log = survivor.log.clone();
    let mut f = run.settle_and_check(vec![survivor], &[&run.cfg.state_dir]);
    let log = std::fs::read_to_string(&log).unwrap();
    let set_back = log.matches("The changelog ends with a batch cut short").count();
    assert!(set_back >= 1, "no restore found the cut batch:\n{log}");
    f.iterations = 1;
    f.crashes = 1;
    f.print(&format!("changelog cut short ({set_back} partitions set back)"));
    assert_eq!((f.losses, f.divergent), (0, 0));
}

/// A batch's changelog goes out while the batch after it is applied
/// (`src/pipeline/in_flight.rs`), so the last batch before the input runs
/// dry still owes its changelog when it is stored. Idle, the pipeline has
/// finished it: every changelog record it counted as published is in the
/// changelog topic, none is pending, and the group offsets are at the end
/// of the input.
#[test]
fn an_idle_pipeline_owes_no_changelog() {
    let _serial = common::serial();
    let mut cfg = common::config("changelog-idle");
    demo::configure(&mut cfg);
    let changelog = cfg.topics.changelog().expect("on by default").to_owned();
    let mut pipeline = Pipeline::new(cfg.clone(), system_clock()).expect("pipeline starts");
    let metrics = pipeline.metrics();
    let shutdown = Arc::new(AtomicBool::new(false));
    let flag = shutdown.clone();
    let handle = std::thread::spawn(move || pipeline.run(&flag).expect("pipeline runs"));
    demo::publish(&cfg, &demo::workload(reconciler::clock::now_ms(), 2)).unwrap();
    let end = check::end_offsets(&cfg, &cfg.topics.events);
    let metric = |name: &str| -> i64 {
        let line = metrics.render().lines().find(|l| l.split(' ').next() == Some(name)).map(str::to_owned);
        line.and_then(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok())).unwrap_or(-1)
    };
    // Timers firing later append to the input: at or past its end now.
    let idle = common::wait_for(Duration::from_secs(60), || {
        let committed = check::committed(&cfg);
        end.iter().all(|(p, e)| *e == 0 || committed.get(p).is_some_and(|c| c >= e))
            && metric("reconciler_changelog_pending_records") == 0
    });
    let mut counts = (0, 0);
    let agree = idle
        && common::wait_for(Duration::from_secs(20), || {
            counts = (metric("reconciler_changelog_records_total"), check::read_all(&cfg, &[&changelog]).len() as i64);
            counts.0 == counts.1
        });
    let pending = metric("reconciler_changelog_pending_records");
    shutdown.store(true, Ordering::SeqCst);
    handle.join().expect("pipeline thread");
    assert!(
        idle,
        "not idle: group offsets {:?} short of {end:?}, or {pending} changelog records pending",
        check::committed(&cfg)
    );
    assert!(counts.0 > 0, "nothing was published to the changelog");
    assert!(agree, "changelog records counted as published vs in the topic: {counts:?}");
}
