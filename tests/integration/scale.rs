//! Scale-out and scale-in under load (issue 17): 1 → 3 → 2 instances on
//! 12 partitions while loadgen publishes. Every partition that moves to an
//! instance without its current state is restored from the changelog,
//! never by replaying the input; `loadgen verify` agrees with the ground
//! truth; and every output equals, byte for byte and in order per key, the
//! reference run of one uninterrupted instance over the same input log,
//! with the final state of each partition's last owner equal to the
//! reference state.

use std::time::Duration;

use reconciler::clock::system_clock;
use reconciler::loadgen::{self, EventTime, Faults, Generator, Workload};

use crate::common;
use common::child::Instance;

const PARTITIONS: i32 = 12;

/// Waits (up to `limit`) until `instances` together own every partition,
/// each at least one, and all are ready (restored and caught up).
fn wait_spread(instances: &[&Instance], limit: Duration) -> bool {
    common::wait_for(limit, || {
        let owned: Vec<usize> = instances.iter().map(|i| i.owned()).collect();
        owned.iter().sum::<usize>() == PARTITIONS as usize && owned.iter().all(|n| *n > 0)
    })
}

fn count(log: &std::path::Path, what: &str) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches(what).count()
}

#[test]
fn scaling_1_3_2_under_load_restores_moved_partitions_from_the_changelog_and_agrees() {
    let _serial = common::serial();
    let mut cfg = common::config("scale");
    cfg.topics = reconciler::config::Topics::named(&common::unique("scale"), PARTITIONS);
    cfg.consumer.batch_size = 500;
    cfg.kafka.insert("session.timeout.ms".into(), "6000".into());
    cfg.kafka.insert("heartbeat.interval.ms".into(), "1000".into());
    cfg.kafka.insert("max.poll.interval.ms".into(), "20000".into());
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let dir = common::temp_dir("scale-run");
    let config_file = common::child::write_config(&cfg, &dir);
    let ops = std::env::var("SCALE_TEST_OPERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let workload = Workload {
        operations: ops,
        entities: None,
        seed: 41,
        rate: 1_000,
        event_time: EventTime::Now,
        confirm_within_ms: 3_000,
        truth: None,
        quiet: true,
        faults: Faults { probed: 0.0, ..Faults::uniform(0.045) },
    };
    let o = workload.options(&cfg, (system_clock())()).unwrap();
    let publisher = {
        let cfg = cfg.clone();
        std::thread::spawn(move || loadgen::publish(&cfg, Generator::new(o), true, false).unwrap())
    };

    let dirs: Vec<_> = ["a", "b", "c"].iter().map(|n| common::temp_dir(&format!("scale-{n}"))).collect();
    let logs: Vec<_> = ["a", "b", "c"].iter().map(|n| dir.join(format!("{n}.log"))).collect();
    let spawn = |i: usize| Instance::spawn(&config_file, Some(&dirs[i]), None, &logs[i]);
    let a = spawn(0);
    assert!(wait_spread(&[&a], Duration::from_secs(60)), "A never owned every partition:\n{}", a.log_tail());
    // Some load in every partition's changelog before the first move.
    let restored = |i: usize| count(&logs[i], "Partition restored from the changelog");
    let changelog_end = |p: i32| {
        let w = reconciler::kafka::watermarks::Watermarks::new(&cfg.kafka).unwrap();
        w.range(cfg.topics.changelog().expect("on"), p, Duration::from_secs(10)).map(|r| r.1).unwrap_or(0)
    };
    assert!(
        common::wait_for(Duration::from_secs(60), || (0..PARTITIONS).all(|p| changelog_end(p) > 0)),
        "A wrote no changelog for some partition"
    );

    // 1 → 3.
    let started = std::time::Instant::now();
    let loaded_at_3 = !publisher.is_finished();
    let (b, c) = (spawn(1), spawn(2));
    assert!(wait_spread(&[&a, &b, &c], Duration::from_secs(90)), "three members never shared the partitions");
    let (b3, c3) = (b.owned(), c.owned());
    assert!(
        common::wait_for(Duration::from_secs(90), || restored(1) >= b3 && restored(2) >= c3),
        "B and C did not restore their partitions from the changelog:\n{}\n{}",
        b.log_tail(),
        c.log_tail()
    );
    let before_in = restored(0) + restored(1);
    // Each of the three processes new records of every partition it owns
    // (the group's offsets move past where they were): when C leaves, the
    // state A kept of C's partitions is behind, and B has none of them.
    let at_3 = common::check::committed(&cfg);
    assert!(
        common::wait_for(Duration::from_secs(60), || {
            let now = common::check::committed(&cfg);
            (0..PARTITIONS).all(|p| now.get(&p) > at_3.get(&p))
        }),
        "the three members made no progress in some partition"
    );

    // 3 → 2: C leaves; A and B take its partitions over (A with the
    // stale state it kept of them, B without any).
    let loaded_at_2 = !publisher.is_finished();
    let at_2 = started.elapsed();
    c.stop();
    assert!(wait_spread(&[&a, &b], Duration::from_secs(90)), "A and B never shared the partitions after C left");
    assert!(
        common::wait_for(Duration::from_secs(90), || restored(0) + restored(1) >= before_in + c3),
        "C's partitions were not restored from the changelog:\n{}\n{}",
        a.log_tail(),
        b.log_tail()
    );

    let (published, truth) = publisher.join().unwrap();
    // Both moves began while loadgen was publishing.
    assert!(
        loaded_at_3 && loaded_at_2,
        "loadgen had finished before a move ({loaded_at_3}, {loaded_at_2}): raise SCALE_TEST_OPERATIONS"
    );
    assert_eq!(published.records, truth.records);
    let report = loadgen::verify::verify(&cfg, &truth, Duration::from_secs(180), Duration::from_millis(1500)).unwrap();
    assert!(
        common::wait_for(Duration::from_secs(60), || a.ready() && b.ready()),
        "A and B did not settle:\n{}\n{}",
        a.log_tail(),
        b.log_tail()
    );
    // The moves of the scenario, counted before the teardown (whose own
    // rebalance is not part of it).
    let replayed: usize = logs.iter().map(|l| count(l, "restoring its state from the log")).sum();
    let from_changelog: usize = (0..3).map(restored).sum();
    // Both told to stop at once, so that neither takes the other's
    // partitions over on its way out.
    common::child::signal(b.pid(), "TERM");
    a.stop();
    b.stop();
    assert!(report.complete && report.agrees(), "{}", report.render());
    assert_eq!(replayed, 0, "a moved partition replayed the input instead of the changelog");

    // The whole run against the reference of one uninterrupted instance.
    let input = common::check::read_all(&cfg, &[&cfg.topics.events]);
    let outputs = common::check::read_all(&cfg, &common::check::output_topics(&cfg));
    let state_dirs: Vec<&std::path::Path> = dirs.iter().map(|d| d.as_path()).collect();
    let mut f = common::check::check(&cfg, &input, &outputs, &state_dirs);
    f.iterations = 1;
    f.print(&format!(
        "scale 1 → 3 → 2 on {PARTITIONS} partitions under load ({} records; B took {b3}, C took {c3}; C left {:.1} s after B and C joined; {from_changelog} partition restores, all from the changelog)",
        truth.records,
        at_2.as_secs_f64()
    ));
    assert_eq!((f.losses, f.divergent), (0, 0));
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}
