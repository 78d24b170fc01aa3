//! Minimal reproductions of where noida-db 0.2.3 (the local broker with
//! transactions) differs from Apache Kafka in ways the exactly-once suites
//! had to design around. Ignored: they describe the broker, not the
//! reconciler. Run them against a noida-db broker with
//! `KAFKA_BROKERS=127.0.0.1:PORT cargo test --release --features
//! kafka-integration-tests --test integration -- --ignored noida_gap --nocapture`;
//! each prints what Kafka does and what the broker did. RELIABILITY.md
//! lists them.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::Offset;
use reconciler::kafka::client_config;

fn kafka() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("bootstrap.servers".to_owned(), common::brokers()),
        ("receive.message.max.bytes".to_owned(), "104857600".to_owned()),
    ])
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

/// KIP-447: Kafka refuses a TxnOffsetCommit whose group metadata is of a
/// past generation (the member lost its partitions), so a zombie's
/// transaction cannot commit. noida-db 0.2.3 accepts it.
#[test]
#[ignore = "a reproduction of a broker gap (noida-db), run by hand"]
fn noida_gap_stale_generation_txn_offset_commit_is_accepted() {
    let t = topic("gap-generation");
    let group = common::unique("gap-generation-group");
    let a = member(&group, &t);
    let stale = a.group_metadata().unwrap();
    drop(a); // leaves the group
    let _b = member(&group, &t); // a new generation
    let p = txn_producer(&common::unique("gap-generation-txn"));
    p.begin_transaction().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&t, 0, Offset::Offset(1)).unwrap();
    let sent = p.send_offsets_to_transaction(&tpl, &stale, Duration::from_secs(10));
    let committed = sent.is_ok() && p.commit_transaction(Duration::from_secs(10)).is_ok();
    println!("Kafka: the offsets of a stale generation are refused (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID), the transaction aborts");
    println!("this broker: send_offsets {sent:?}, committed {committed}");
}

/// Kafka removes a member whose session expired and completes the
/// rebalance without it. noida-db 0.2.3 checks a member's session only when
/// that member heartbeats again, so a member killed with -9 stays in the
/// group and a new member's join waits for the rebalance timeout
/// (`max.poll.interval.ms`) and, if the dead member led the group, longer.
#[test]
#[ignore = "a reproduction of a broker gap (noida-db), run by hand"]
fn noida_gap_a_dead_member_is_not_expired() {
    let t = topic("gap-expiry");
    let group = common::unique("gap-expiry-group");
    let a = member(&group, &t);
    // Dead without leaving: never polled, never closed.
    std::mem::forget(a);
    std::thread::sleep(Duration::from_secs(8)); // past a's 6 s session: the point of the reproduction
    let started = Instant::now();
    let c: BaseConsumer =
        client_config(&[], &kafka(), &[("group.id", group.as_str()), ("session.timeout.ms", "6000")]).create().unwrap();
    c.subscribe(&[&t]).unwrap();
    while c.assignment().unwrap().count() == 0 && started.elapsed() < Duration::from_secs(60) {
        c.poll(Duration::from_millis(100));
    }
    println!("Kafka: the expired member is removed; the new member is assigned within about a second");
    println!("this broker: assigned {} partition(s) after {:?}", c.assignment().unwrap().count(), started.elapsed());
}

/// A read_committed reader that starts after an aborted transaction's
/// abort marker must see the same producer's later committed records.
/// noida-db 0.2.3 lists every aborted transaction of the partition in each
/// fetch response (Kafka lists only those overlapping the fetched range),
/// and librdkafka then drops that producer's records until an abort marker
/// it never meets.
#[test]
#[ignore = "a reproduction of a broker gap (noida-db), run by hand"]
fn noida_gap_read_committed_after_an_abort_misses_committed_records() {
    let t = topic("gap-aborted");
    let p = txn_producer(&common::unique("gap-aborted-txn"));
    p.begin_transaction().unwrap();
    p.send(BaseRecord::<[u8], [u8]>::to(&t).payload(b"aborted".as_slice())).unwrap();
    p.flush(Duration::from_secs(10)).unwrap();
    p.abort_transaction(Duration::from_secs(10)).unwrap();
    let after_abort =
        reconciler::kafka::reader::watermarks(&kafka(), &t).unwrap().get(&0).map(|(_, high)| *high).unwrap();
    p.begin_transaction().unwrap();
    p.send(BaseRecord::<[u8], [u8]>::to(&t).payload(b"committed".as_slice())).unwrap();
    p.commit_transaction(Duration::from_secs(10)).unwrap();
    let read_from = |offset: i64| {
        let c: BaseConsumer =
            client_config(&[], &kafka(), &[("group.id", "gap-reader"), ("isolation.level", "read_committed")])
                .create()
                .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&t, 0, Offset::Offset(offset)).unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                got.push(String::from_utf8_lossy(rdkafka::Message::payload(&m).unwrap_or_default()).into_owned());
            }
        }
        got
    };
    println!("Kafka: both readers see [\"committed\"]");
    println!(
        "this broker: from offset 0 {:?}, from offset {after_abort} (past the abort marker) {:?}",
        read_from(0),
        read_from(after_abort)
    );
}
