//! The state changelog on the real broker (issue 17): a machine replaced
//! after the input's head is gone restores its partitions from the
//! changelog, not from the input, and goes on exactly as an instance that
//! kept its state would have.

use crate::common;

use std::time::Duration;

use common::run::Run;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;

/// Deletes the records of `topic` below `before` (partition → offset) with
/// DeleteRecords; `Err` with the broker's answer when it does not do that.
fn delete_records(
    cfg: &reconciler::config::Config,
    topic: &str,
    before: &std::collections::BTreeMap<i32, i64>,
) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        reconciler::kafka::client_config(&[], &cfg.kafka, &[]).create().map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in before {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).map_err(|e| e.to_string())?;
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let result = futures::executor::block_on(admin.delete_records(&tpl, &opts)).map_err(|e| e.to_string())?;
    for e in result.elements() {
        if let Err(err) = e.error() {
            return Err(format!("partition {}: {err}", e.partition()));
        }
    }
    Ok(())
}

/// Instance A processes the first half of the workload and its machine is
/// replaced: its state directory is gone, and the input's head is deleted
/// where the broker supports DeleteRecords. Instance B, with an empty
/// state directory, takes over every partition while the second half
/// arrives. B restores each partition from the changelog (its log says so
/// for each, and it applied no input record silently), and every output of
/// the run equals, byte for byte and in order per key, the reference run
/// of one uninterrupted instance over the whole input; B's final state
/// equals the reference state (I1–I4 of tests/integration/common/check.rs).
#[test]
fn a_replaced_machine_restores_from_the_changelog_without_the_inputs_head_and_agrees_byte_for_byte() {
    let _serial = common::serial();
    let (run, workload) = Run::prepare("lost-history", 12, 60, None);
    run.publish_part(&workload, 0, 2);
    let dir_a = common::temp_dir("lost-history-a");
    let a = run.spawn_named("a", &dir_a, None);
    assert!(run.wait_caught_up(Duration::from_secs(90)), "A did not catch up; log:\n{}", a.log_tail());
    a.stop();
    std::fs::remove_dir_all(&dir_a).unwrap();
    // The reference needs the whole input: read it before the head goes.
    let input_head = common::check::read_all(&run.cfg, &[&run.cfg.topics.events]);
    let committed = common::check::committed(&run.cfg);
    let deleted = delete_records(&run.cfg, &run.cfg.topics.events, &committed);
    match &deleted {
        Ok(()) => {
            let low = reconciler::kafka::reader::watermarks(&run.cfg.kafka, &run.cfg.topics.events).unwrap();
            for (p, c) in &committed {
                assert_eq!(low[p].0, *c, "partition {p}: the head is deleted up to the committed offset");
            }
        }
        Err(why) => println!("  the broker does not delete records ({why}): B is shown not to read them instead"),
    }

    run.publish_part(&workload, 1, 2);
    let dir_b = common::temp_dir("lost-history-b");
    let b = run.spawn_named("b", &dir_b, None);
    let log_b = b.log.clone();
    let input_tail_from = input_head.len();
    // Settle and check against the reference over the whole input.
    let mut f = {
        let partitions = run.cfg.topics.partitions as usize;
        let settled = common::check::wait_settled(&run.cfg, run.verdicts, Duration::from_secs(120), || {
            b.owned() == partitions && b.ready()
        });
        let tail = b.log_tail();
        b.stop();
        assert!(settled, "B did not settle; log:\n{tail}");
        let mut input = input_head;
        let now = common::check::read_all(&run.cfg, &[&run.cfg.topics.events]);
        // With the head deleted, a reader starts at the low watermark.
        let have: std::collections::HashSet<(i32, i64)> = input.iter().map(|r| (r.partition, r.offset)).collect();
        input.extend(now.into_iter().filter(|r| !have.contains(&(r.partition, r.offset))));
        input.sort_by_key(|r| (r.partition, r.offset));
        assert!(input.len() > input_tail_from, "the second half arrived");
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
        "lost history ({}; {from_changelog} partitions restored from the changelog)",
        if deleted.is_ok() { "input head deleted" } else { "input head never read" }
    ));
    assert_eq!((f.losses, f.divergent), (0, 0));
}
