//! What the reconciler's guarantees rely on the broker's group coordinator
//! and transaction coordinator for, each shown in its smallest form with
//! librdkafka's clients, as the reconciler uses them:
//!
//! - a transaction carrying the offsets of a group generation that has
//!   passed cannot commit (KIP-447): a member that lost its partitions
//!   cannot publish outputs for them under `exactly_once`;
//! - a member that dies without leaving is expired after its session
//!   timeout, and its partitions move to the members left;
//! - a read_committed reader that starts past an aborted transaction reads
//!   the same producer's later committed records.
//!
//! A Kafka-protocol broker that differs here breaks the guarantee that
//! rests on it (RELIABILITY.md names the implementations seen to).

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;
use reconciler::kafka::client_config;

fn kafka() -> BTreeMap<String, String> {
    BTreeMap::from([("bootstrap.servers".to_owned(), common::brokers())])
}

fn topic(name: &str) -> String {
    let t = common::unique(name);
    reconciler::kafka::admin::ensure_topics(&kafka(), &[t.as_str()], 1, 1).unwrap();
    t
}

fn txn_producer(id: &str) -> ThreadedProducer<rdkafka::producer::DefaultProducerContext> {
    let p: ThreadedProducer<_> = client_config(&[], &kafka(), &[("transactional.id", id)]).create().unwrap();
    p.init_transactions(Duration::from_secs(10)).unwrap();
    p
}

fn member(group: &str, t: &str) -> BaseConsumer {
    let c: BaseConsumer = client_config(
        &[],
        &kafka(),
        &[("group.id", group), ("enable.auto.commit", "false"), ("session.timeout.ms", "6000")],
    )
    .create()
    .unwrap();
    c.subscribe(&[t]).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while c.assignment().unwrap().count() == 0 {
        assert!(Instant::now() < until, "no assignment");
        c.poll(Duration::from_millis(100));
    }
    c
}

/// KIP-447: the broker refuses a TxnOffsetCommit whose group metadata is
/// of a past generation (the member lost its partitions), so a zombie's
/// transaction cannot commit.
#[test]
fn a_transaction_with_a_stale_generations_offsets_cannot_commit() {
    let _serial = common::serial();
    let t = topic("generation");
    let group = common::unique("generation-group");
    let a = member(&group, &t);
    let stale = a.group_metadata().unwrap();
    drop(a); // leaves the group
    let _b = member(&group, &t); // a new generation
    let p = txn_producer(&common::unique("generation-txn"));
    p.begin_transaction().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&t, 0, Offset::Offset(1)).unwrap();
    let refused = match p.send_offsets_to_transaction(&tpl, &stale, Duration::from_secs(10)) {
        Err(e) => e.to_string(),
        Ok(()) => match p.commit_transaction(Duration::from_secs(10)) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("a transaction with a stale generation's offsets was committed"),
        },
    };
    println!("stale generation: the transaction's offsets were refused ({refused})");
    let why = refused.to_lowercase();
    assert!(
        why.contains("generation") || why.contains("unknown member"),
        "refused for another reason than the stale generation: {refused}"
    );
}

/// The broker removes a member whose session expired and completes the
/// rebalance without it: an instance killed with -9 (its heartbeats stop,
/// it never leaves) holds its partitions for its session timeout (6 s
/// here) and no longer; then a new member of the group gets them.
#[test]
fn a_dead_members_partitions_move_after_its_session_timeout() {
    let _serial = common::serial();
    let run = common::run::Run::new("expiry", 1, 50);
    let partitions = run.cfg.topics.partitions as usize;
    let dead = run.spawn(None);
    assert!(
        common::wait_for(Duration::from_secs(60), || dead.owned() == partitions),
        "the first instance never owned every partition; log:\n{}",
        dead.log_tail()
    );
    dead.kill9();
    let died = Instant::now();
    let c: BaseConsumer = client_config(
        &[],
        &run.cfg.kafka,
        &[("group.id", run.cfg.consumer.group_id.as_str()), ("session.timeout.ms", "6000")],
    )
    .create()
    .unwrap();
    c.subscribe(&[&run.cfg.topics.events]).unwrap();
    while c.assignment().unwrap().count() < partitions && died.elapsed() < Duration::from_secs(60) {
        c.poll(Duration::from_millis(100));
    }
    let moved = died.elapsed();
    println!("dead member: its partitions moved {:.1} s after its kill (session 6 s)", moved.as_secs_f64());
    assert_eq!(c.assignment().unwrap().count(), partitions, "the dead member's partitions did not move within 60 s");
}

/// A read_committed reader, from the start or from past an aborted
/// transaction's abort marker, sees the same producer's later committed
/// records and never the aborted ones. (A broker that lists every aborted
/// transaction of the partition in each fetch response, not only those
/// overlapping the fetched range, makes librdkafka drop that producer's
/// later records until an abort marker it never meets.)
#[test]
fn read_committed_past_an_abort_sees_the_later_committed_records() {
    let _serial = common::serial();
    let t = topic("aborted");
    let p = txn_producer(&common::unique("aborted-txn"));
    p.begin_transaction().unwrap();
    p.send(BaseRecord::<[u8], [u8]>::to(&t).payload(b"aborted".as_slice())).unwrap();
    p.flush(Duration::from_secs(10)).unwrap();
    p.abort_transaction(Duration::from_secs(10)).unwrap();
    // Past the abort marker: the last stable offset moves once the broker
    // has written it (after the abort returned).
    let stable =
        || reconciler::kafka::reader::watermarks(&kafka(), &t).unwrap().get(&0).map(|(_, high)| *high).unwrap();
    assert!(common::wait_for(Duration::from_secs(30), || stable() >= 2), "no abort marker after 30 s");
    let after_abort = stable();
    p.begin_transaction().unwrap();
    p.send(BaseRecord::<[u8], [u8]>::to(&t).payload(b"committed".as_slice())).unwrap();
    p.commit_transaction(Duration::from_secs(10)).unwrap();
    let read_from = |offset: i64| {
        let c: BaseConsumer =
            client_config(&[], &kafka(), &[("group.id", "aborted-reader"), ("isolation.level", "read_committed")])
                .create()
                .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&t, 0, Offset::Offset(offset)).unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until && !got.iter().any(|v| v == "committed") {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                got.push(String::from_utf8_lossy(rdkafka::Message::payload(&m).unwrap_or_default()).into_owned());
            }
        }
        got
    };
    let (from_start, past_abort) = (read_from(0), read_from(after_abort));
    println!("read_committed: from offset 0 {from_start:?}, from offset {after_abort} (past the abort marker) {past_abort:?}");
    assert_eq!(from_start, ["committed"]);
    assert_eq!(past_abort, ["committed"]);
}
