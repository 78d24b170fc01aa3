//! `guarantee = "exactly_once"` on Apache Kafka's transactions: crashes at
//! every crash point of a transaction, a zombie fenced by its lost
//! generation (KIP-447), a zombie fenced by its transactional id, and a
//! transaction left open by a killed instance that the broker aborts when
//! its transaction timeout passes.
//!
//! Every check reads the outputs as a `read_committed` downstream service
//! would, and asserts the invariants of tests/integration/common/check.rs
//! with **no** repeat at all: each output once, byte-identical to the
//! uninterrupted reference run over the same input log.

use crate::common;

use std::time::{Duration, Instant};

use common::check::{self, Figures};
use common::child::Instance;
use common::run::{stopped, wait_crash, Run};
use common::wait_for;
use reconciler::config::{Config, Guarantee};
use reconciler::crash::{CRASH_POINTS, EXACTLY_ONCE_CRASH_POINTS, TIMER_SENT};
use reconciler::kafka::reader::Isolation;
use reconciler::loadgen::rng::Rng;

fn full() -> bool {
    std::env::var("RELIABILITY_FULL").is_ok_and(|v| v == "1")
}

/// A restarted instance keeps the group membership of the one it replaces
/// (`group.instance.id`, as users of Kafka Streams do to ride out
/// restarts): it takes its dead predecessor's place in the group at once,
/// instead of waiting for that member's session to expire. The crash suite
/// restarts an instance after each of its 30-odd crashes.
fn static_member(run: &mut Run) {
    let id = format!("{}-member-0", run.cfg.consumer.group_id);
    run.cfg.kafka.insert("group.instance.id".into(), id);
    run.config_file = common::child::write_config(&run.cfg, &run.dir);
}

/// An exactly-once run on the test broker, with the short session of the
/// reliability runs (a stopped member's partitions move on quickly) and a
/// short rebalance timeout (a member killed in the middle of a join holds
/// the next rebalance no longer than that).
fn exactly_once(name: &str, copies: usize, batch_size: usize) -> (Run, Vec<reconciler::records::InputRecord>) {
    Run::prepare_with(name, copies, batch_size, |cfg: &mut Config| {
        cfg.kafka.insert("max.poll.interval.ms".into(), "10000".into());
        cfg.guarantee = Guarantee::ExactlyOnce;
    })
}

/// Settles the run and checks it; then asserts exactly once: nothing lost,
/// nothing repeated, nothing divergent.
fn settle_exactly_once(run: &Run, running: Vec<Instance>, dirs: &[&std::path::Path], what: &str) -> Figures {
    let f = run.settle_and_check(running, dirs);
    assert_eq!((f.losses, f.divergent, f.duplicates), (0, 0, 0), "{what}: not exactly once: {f:?}");
    f
}

/// One seeded iteration: a crash at a crash point chosen by `seed % 6`,
/// then a `kill -9` at a random moment, then a survivor.
fn crash_iteration(seed: u64) -> Figures {
    let mut rng = Rng::new(seed);
    let copies = 4 + rng.below(if full() { 16 } else { 6 }) as usize;
    let batch_size = 10 + rng.below(90) as usize;
    let (mut run, workload) = exactly_once(&format!("eos-crash{seed}"), copies, batch_size);
    static_member(&mut run);
    reconciler::demo::publish(&run.cfg, &workload).unwrap();
    let scenario = (seed % 6) as usize;
    let mut crashes = 0;
    let crash_with = |spec: String, crashes: &mut usize| {
        run.crash_with(seed, &spec);
        *crashes += 1;
    };
    let [before_commit, after_commit] = EXACTLY_ONCE_CRASH_POINTS;
    match scenario {
        // Outputs and offsets sent in the open transaction, not committed.
        0 => crash_with(format!("{before_commit}={}*off->return", rng.below(4)), &mut crashes),
        // Committed, the store not yet written.
        1 => crash_with(format!("{after_commit}={}*off->return", rng.below(4)), &mut crashes),
        // Committed and stored (the store write is the batch's last step).
        2 => crash_with(format!("{}={}*off->return", CRASH_POINTS[1], rng.below(4)), &mut crashes),
        // Timers committed, not yet recorded as fired.
        3 => crash_with(format!("{}=return", CRASH_POINTS[3]), &mut crashes),
        4 => {
            // The state directory is lost after a crash between commit and
            // store: the restore runs from nothing up to the committed
            // offsets, and crashes half-way through.
            crash_with(format!("{after_commit}={}*off->return", rng.below(3)), &mut crashes);
            std::fs::remove_dir_all(&run.cfg.state_dir).unwrap();
            // Half-way means within what the restore will read: the records
            // before the committed offsets. A first crash at a commit of
            // few records (a batch of timers, or small ones as the input
            // trickled in) leaves fewer than the crash point would skip.
            let drawn = rng.below(10);
            let restored: i64 = check::committed(&run.cfg).values().sum();
            if restored > 0 {
                let skip = drawn.min(restored as u64 - 1);
                crash_with(format!("{}={skip}*off->return", CRASH_POINTS[5]), &mut crashes);
            } else {
                println!("  seed {seed}: nothing committed before the first crash, no restore to crash in");
            }
        }
        _ => crash_with(format!("{before_commit}=1*off->return"), &mut crashes),
    }
    // And a kill -9 at a random moment.
    let i = run.spawn(None);
    let target = rng.below(run.verdicts as u64 / 2 + 1) as usize + 1;
    assert!(run.wait_verdicts(target, Duration::from_secs(90)), "seed {seed}: no progress; log:\n{}", i.log_tail());
    std::thread::sleep(Duration::from_millis(rng.below(300))); // a random moment
    i.kill9();
    crashes += 1;
    let survivor = run.spawn(None);
    let mut f = settle_exactly_once(&run, vec![survivor], &[&run.cfg.state_dir], &format!("seed {seed}"));
    f.iterations = 1;
    f.crashes = crashes;
    println!(
        "  seed {seed}: scenario {scenario}, {} records, batch {batch_size}, {crashes} crashes, {} outputs read committed",
        run.records, f.outputs
    );
    f
}

#[test]
fn exactly_once_crash_suite_each_output_once_byte_identical() {
    let _serial = common::serial();
    let iterations = if full() { 30 } else { 15 };
    let base: u64 = std::env::var("RELIABILITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut total = Figures::default();
    for seed in base..base + iterations {
        total.add(&crash_iteration(seed));
    }
    total.print("exactly-once crash suite");
    assert_eq!((total.losses, total.divergent, total.duplicates), (0, 0, 0));
    assert!(total.crashes >= 30, "{} crashes", total.crashes);
}

/// An exactly-once run of the demo workload (4 copies, batches of 30),
/// crashed once at `failpoints`, then settled by a restarted instance and
/// checked for exactly once.
fn crash_once_and_settle(name: &str, failpoints: &str) -> (Run, Figures) {
    let (mut run, workload) = exactly_once(name, 4, 30);
    static_member(&mut run);
    reconciler::demo::publish(&run.cfg, &workload).unwrap();
    let mut i = run.spawn(Some(failpoints));
    assert!(wait_crash(&mut i, Duration::from_secs(90)), "never crashed; log:\n{}", i.log_tail());
    let survivor = run.spawn(None);
    let f = settle_exactly_once(&run, vec![survivor], &[&run.cfg.state_dir], name);
    (run, f)
}

/// A crash in the middle of a timer firing (its `DeadlineReached` events
/// sent, their acknowledgements not awaited): the restarted
/// instance judges every overdue operation, each verdict once. The timers'
/// events are input, not outputs, so they are not published in a
/// transaction (a timer fired twice is judged once: src/pipeline/mod.rs).
#[test]
fn a_timer_firing_cut_short_is_judged_once_after_the_restart() {
    let _serial = common::serial();
    let (_, f) = crash_once_and_settle("eos-timer-cut", &format!("{TIMER_SENT}=return"));
    println!("timer firing cut short: {} outputs read committed, each once", f.outputs);
}

/// A downstream reader with read_uncommitted sees the records of a
/// transaction that was aborted (the instance crashed between producing
/// and committing, and its restart aborted it); read_committed never does.
#[test]
fn read_uncommitted_sees_aborted_outputs_read_committed_never_does() {
    let _serial = common::serial();
    let (run, f) = crash_once_and_settle("eos-isolation", &format!("{}=2*off->return", EXACTLY_ONCE_CRASH_POINTS[0]));
    let topics = check::output_topics(&run.cfg);
    let committed = check::read_all_with(&run.cfg, &topics, Isolation::ReadCommitted);
    let uncommitted = check::read_all_with(&run.cfg, &topics, Isolation::ReadUncommitted);
    // A record's identity: a dead letter's headers name its source offset.
    let distinct = |rs: &[reconciler::records::Record]| {
        rs.iter()
            .map(|r| (r.topic.clone(), r.key.clone(), r.value.clone(), r.headers.clone()))
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    println!(
        "isolation: read_committed {} records ({} distinct), read_uncommitted {} records ({} distinct)",
        committed.len(),
        distinct(&committed),
        uncommitted.len(),
        distinct(&uncommitted)
    );
    assert_eq!(committed.len(), f.outputs);
    assert_eq!(distinct(&committed), committed.len(), "read_committed saw a record twice");
    assert!(
        uncommitted.len() > committed.len(),
        "read_uncommitted should see the aborted transaction's records as well"
    );
    assert_eq!(distinct(&uncommitted), distinct(&committed), "the aborted records are the ones committed later");
}

/// The transaction timeout of a run's instances (`transaction.timeout.ms`):
/// the broker aborts a transaction left open longer than that. The test
/// broker checks for such transactions every second
/// (`transaction.abort.timed.out.transaction.cleanup.interval.ms`, set by
/// scripts/test.sh).
fn transaction_timeout(run: &mut Run, ms: u32) {
    run.cfg.kafka.insert("transaction.timeout.ms".into(), ms.to_string());
    run.config_file = common::child::write_config(&run.cfg, &run.dir);
}

/// Whether `log` says, `n` times or more, that an instance's transaction
/// was aborted.
fn aborted_in(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("its transaction was aborted").count()
}

/// A member stopped (SIGSTOP) inside its open transaction, past its
/// session, while input keeps arriving. The broker expires it and gives
/// its partitions to the other member, which takes them over while the
/// zombie is still stopped: the offsets the zombie sent in its
/// transaction stay pending until the broker aborts that transaction at
/// its timeout, and only then can the other member read where the
/// partitions stand. Resumed, the zombie commits nothing: it aborts (its
/// stall rule), or the broker, which has bumped its producer epoch, fences
/// it and it stops (KIP-447 would refuse its stale generation's offsets
/// besides). read_committed outputs then hold each output once and nothing
/// of that transaction, byte-identical to the reference run.
#[test]
fn a_zombie_stopped_in_its_transaction_loses_its_partitions_and_commits_nothing() {
    let _serial = common::serial();
    let (mut run, workload) = exactly_once("eos-zombie", 6, 20);
    transaction_timeout(&mut run, 10_000);
    let (dir_a, dir_b) = (run.cfg.state_dir.clone(), common::temp_dir("eos-zombie-b-state"));
    let partitions = run.cfg.topics.partitions as usize;
    run.publish_part(&workload, 0, 2);
    let a = run.spawn_named("a", &dir_a, None);
    assert!(run.wait_caught_up(Duration::from_secs(90)), "the first instance did not catch up");
    // B joins and stops itself inside its first transaction.
    let b = run.spawn_named("b", &dir_b, Some(&format!("{}=1*return(stop)", EXACTLY_ONCE_CRASH_POINTS[0])));
    assert!(
        wait_for(Duration::from_secs(60), || stopped(b.pid())),
        "the second instance never reached its stop point; log:\n{}",
        b.log_tail()
    );
    run.publish_part(&workload, 1, 2);
    let stalled = Instant::now();
    let took_over =
        wait_for(Duration::from_secs(90), || a.owned() == partitions) && run.wait_caught_up(Duration::from_secs(90));
    assert!(took_over, "A did not take B's partitions over while B was stopped; log:\n{}", a.log_tail());
    let takeover = stalled.elapsed();
    common::child::signal(b.pid(), "CONT");
    // Resumed, B finds its transaction gone: the broker aborted it at its
    // timeout and bumped its producer epoch. B either aborts first (its
    // stall rule) or is refused at the end of the transaction as fenced
    // and stops, exit non-zero, as a producer of a past epoch must; then
    // its supervisor starts it again.
    let log_b = run.dir.join("b.log");
    let mut b = b;
    let ended = wait_for(Duration::from_secs(60), || aborted_in(&log_b) > 0 || b.exited().is_some());
    assert!(ended, "the zombie neither aborted nor stopped; log:\n{}", b.log_tail());
    let fenced = match b.exited() {
        Some(status) => {
            assert!(!status.success(), "a fenced zombie exits non-zero");
            let log = std::fs::read_to_string(&log_b).unwrap_or_default();
            assert!(log.contains("fenced"), "the zombie stopped for another reason; log:\n{log}");
            true
        }
        None => false,
    };
    let b = if fenced { run.spawn_named("b", &dir_b, None) } else { b };
    let mut f = settle_exactly_once(&run, vec![a, b], &[&dir_a, &dir_b], "zombie");
    f.iterations = 1;
    f.crashes = 1;
    f.print("exactly-once zombie suite");
    println!(
        "exactly-once zombie suite: A owned every partition and had caught up {:.1} s into B's stall; the resumed zombie {}",
        takeover.as_secs_f64(),
        if fenced { "was fenced by the broker and restarted" } else { "aborted its transaction" }
    );
}

/// An instance killed (-9) inside its open transaction and never started
/// again: nothing will ever end that transaction but the broker, which
/// aborts it once its transaction timeout passes. Until then a
/// read_committed reader of the outputs stops at the transaction's first
/// record (the last stable offset); after, it reads to the end. The
/// instance that takes over, with a state directory (so a transactional
/// id) of its own, settles the run: each output once, nothing of the
/// killed instance's open transaction.
#[test]
fn a_transaction_left_open_by_a_killed_instance_is_aborted_at_its_timeout() {
    let _serial = common::serial();
    let (mut run, workload) = exactly_once("eos-abandoned", 4, 30);
    transaction_timeout(&mut run, 10_000);
    reconciler::demo::publish(&run.cfg, &workload).unwrap();
    let dir_2 = common::temp_dir("eos-abandoned-2-state");
    let first = run.spawn(Some(&format!("{}=2*off->return(stop)", EXACTLY_ONCE_CRASH_POINTS[0])));
    assert!(
        wait_for(Duration::from_secs(60), || stopped(first.pid())),
        "the instance never reached its stop point; log:\n{}",
        first.log_tail()
    );
    first.kill9();
    let killed = Instant::now();
    // The open transaction holds the last stable offset of some output
    // partition below its high watermark.
    let topics = check::output_topics(&run.cfg);
    let held = || {
        topics.iter().any(|t| {
            let high = check::end_offsets_with(&run.cfg, t, Isolation::ReadUncommitted);
            let stable = check::end_offsets_with(&run.cfg, t, Isolation::ReadCommitted);
            high != stable
        })
    };
    assert!(held(), "no output partition is held by the killed instance's open transaction");
    assert!(
        wait_for(Duration::from_secs(60), || !held()),
        "the broker did not abort the abandoned transaction within 60 s"
    );
    let released = killed.elapsed();
    assert!(released >= Duration::from_secs(9), "released after {released:?}, before the 10 s timeout could pass");
    let second = run.spawn_named("second", &dir_2, None);
    let mut f = settle_exactly_once(&run, vec![second], &[&run.cfg.state_dir, &dir_2], "abandoned transaction");
    f.iterations = 1;
    f.crashes = 1;
    f.print("exactly-once abandoned transaction");
    println!(
        "exactly-once abandoned transaction: aborted by the broker {:.1} s after the kill (timeout 10 s)",
        released.as_secs_f64()
    );
}

/// Fencing by the broker: a second instance started with the same
/// transactional id while the first is stopped inside its transaction
/// (within its session, so the stall rule does not see it) bumps the
/// producer epoch. The first, resumed, is refused by the broker at its
/// commit and stops; the outputs are still each once.
#[test]
fn the_broker_fences_a_zombie_with_the_same_transactional_id() {
    let _serial = common::serial();
    let (mut run, workload) = exactly_once("eos-fence", 6, 20);
    // A long session: only the broker's fence can stop the zombie.
    run.cfg.kafka.insert("session.timeout.ms".into(), "45000".into());
    run.cfg.kafka.insert("max.poll.interval.ms".into(), "60000".into());
    run.cfg.consumer.transactional_id = Some(format!("{}-instance-0", run.cfg.consumer.group_id));
    run.config_file = common::child::write_config(&run.cfg, &run.dir);
    let (dir_1, dir_2) = (run.cfg.state_dir.clone(), common::temp_dir("eos-fence-2-state"));
    run.publish_part(&workload, 0, 2);
    let mut first = run.spawn_named("first", &dir_1, Some(&format!("{}=1*return(stop)", EXACTLY_ONCE_CRASH_POINTS[0])));
    assert!(
        wait_for(Duration::from_secs(60), || stopped(first.pid())),
        "the first instance never reached its stop point; log:\n{}",
        first.log_tail()
    );
    // The replacement with the same transactional id (as a restarted pod
    // would be while the old one is paused).
    let second = run.spawn_named("second", &dir_2, None);
    let log_2 = run.dir.join("second.log");
    assert!(
        wait_for(Duration::from_secs(60), || std::fs::read_to_string(&log_2)
            .unwrap_or_default()
            .contains("transactions initialised")),
        "the replacement never initialised transactions; log:\n{}",
        second.log_tail()
    );
    common::child::signal(first.pid(), "CONT");
    // Twice the longest wait of the group protocol here. Its consumer's
    // close waits for its group requests to be answered, and a coordinator
    // may hold one for up to the rebalance timeout (a JoinGroup parked
    // until the round completes, max.poll.interval.ms = 60 s above; later
    // requests on that connection wait behind it), or librdkafka gives one
    // up after socket.timeout.ms (60 s). 60 s, the bound before, left no
    // margin over either (CI once found the instance still running then).
    let resumed = Instant::now();
    let limit = Duration::from_secs(120);
    if !wait_for(limit, || first.exited().is_some()) {
        let stacks = common::child::stacks(first.pid(), &run.dir.join("first.stacks"));
        panic!(
            "the fenced instance did not stop; log:\n{}\nits threads:\n{stacks}\nthe fenced instance did not stop within {limit:?} of its resumption",
            first.log_tail()
        );
    }
    let exited_after = resumed.elapsed();
    let status = first.exited().expect("exited above");
    assert!(!status.success(), "a fenced instance exits non-zero");
    let log_1 = std::fs::read_to_string(run.dir.join("first.log")).unwrap_or_default();
    assert!(
        log_1.contains("Transaction(Fatal") && log_1.contains("fenced by a newer instance"),
        "the first instance did not stop on the broker's fence; log:\n{log_1}"
    );
    run.publish_part(&workload, 1, 2);
    let mut f = settle_exactly_once(&run, vec![second], &[&dir_1, &dir_2], "fence");
    f.iterations = 1;
    f.crashes = 1;
    f.print("exactly-once broker fence");
    println!(
        "exactly-once broker fence: the fenced instance exited {:.1} s after its resumption",
        exited_after.as_secs_f64()
    );
}
