//! The group member's batch reads (`src/kafka/batch_queue.rs`): every
//! assigned partition is forwarded to a queue of the member's own and read
//! a batch at a time, while the member's own queue keeps the rebalances.
//! These tests check what the pipeline relies on: every record whole (key,
//! value, timestamp, headers) and in its partition's order, exactly once
//! across members when a rebalance moves partitions and each member starts
//! where the records handed out so far end.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use reconciler::config::Config;
use reconciler::kafka::admin;
use reconciler::kafka::consumer::{Assigned, GroupConsumer, OutOfRange};
use reconciler::records::Record;

use crate::common;

const PARTITIONS: i32 = 3;

/// What record `i` of partition `p` carries, as produced: a key, a value,
/// a timestamp, and headers (bytes, a null value, an empty value) on two
/// records of three.
fn expected(topic: &str, p: i32, i: i64) -> Record {
    let headers = match i % 3 {
        0 => vec![("trace".to_owned(), Some(format!("t-{p}-{i}").into_bytes())), ("null".to_owned(), None)],
        1 => vec![("empty".to_owned(), Some(Vec::new()))],
        _ => Vec::new(),
    };
    Record {
        topic: topic.into(),
        partition: p,
        offset: i,
        timestamp: Some(1_700_000_000_000 + i * 10 + i64::from(p)),
        key: Some(format!("key-{p}-{i}").into_bytes()),
        value: Some(format!("value {p} {i} {}", "x".repeat((i % 50) as usize)).into_bytes()),
        headers,
    }
}

/// An idempotent producer: a retry neither repeats nor reorders a record,
/// which the offsets `check_all` expects rely on.
fn producer(cfg: &Config) -> BaseProducer {
    reconciler::kafka::client_config(&[], &cfg.kafka, &[("enable.idempotence", "true")]).create().unwrap()
}

/// Produces records `from..to` of every partition, interleaved, and waits
/// for their acknowledgements.
fn produce_with(producer: &BaseProducer, topic: &str, from: i64, to: i64) {
    for i in from..to {
        for p in 0..PARTITIONS {
            let r = expected(topic, p, i);
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = headers.insert(Header { key: k, value: v.as_deref() });
            }
            let mut br = BaseRecord::to(topic)
                .partition(p)
                .key(r.key.as_deref().unwrap())
                .payload(r.value.as_deref().unwrap())
                .timestamp(r.timestamp.unwrap());
            if !r.headers.is_empty() {
                br = br.headers(headers);
            }
            producer.send(br).map_err(|(e, _)| e).unwrap();
            producer.poll(Duration::ZERO);
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// [`produce_with`] a producer of its own.
fn produce(cfg: &Config, topic: &str, from: i64, to: i64) {
    produce_with(&producer(cfg), topic, from, to);
}

/// The records handed out so far, by partition, and where each partition's
/// next record is (what a member starts from, as the pipeline's store says).
#[derive(Default)]
struct Handed {
    by_partition: BTreeMap<i32, Vec<Record>>,
}

impl Handed {
    fn next(&self, p: i32) -> Option<i64> {
        self.by_partition.get(&p).and_then(|v| v.last()).map(|r| r.offset + 1)
    }

    fn total(&self) -> usize {
        self.by_partition.values().map(Vec::len).sum()
    }
}

/// A member of `group` whose assigned partitions start after the records
/// `handed` holds.
fn member(cfg: &Config, topic: &str, handed: &Arc<Mutex<Handed>>) -> GroupConsumer {
    let h = handed.clone();
    let start = Box::new(move |p, committed| Ok(Assigned { start: h.lock().unwrap().next(p), committed }));
    GroupConsumer::new(&cfg.kafka, &cfg.consumer.group_id, topic, start, OutOfRange::Stop).unwrap()
}

/// One `poll_batch` of `m`, its records noted in `handed`; the batch's size.
fn poll(m: &GroupConsumer, handed: &Mutex<Handed>, max: usize) -> usize {
    let (records, _) = m.poll_batch(max, Duration::from_millis(50)).unwrap();
    assert!(records.len() <= max, "{} records for a batch of at most {max}", records.len());
    let n = records.len();
    let mut h = handed.lock().unwrap();
    for r in records {
        h.by_partition.entry(r.partition).or_default().push(r);
    }
    n
}

/// Polls `members` in turn, `max` records a batch, until `handed` holds
/// `total` records or `until` passes.
fn read_until(members: &[&GroupConsumer], handed: &Mutex<Handed>, total: usize, max: usize, until: Instant) {
    while handed.lock().unwrap().total() < total && Instant::now() < until {
        for m in members {
            poll(m, handed, max);
        }
    }
}

/// Every partition holds records `0..per_partition` exactly as produced,
/// each once, in order, and none of `members` has more to hand out.
fn check_all(members: &[&GroupConsumer], handed: &Mutex<Handed>, topic: &str, per_partition: i64) {
    {
        let handed = handed.lock().unwrap();
        for p in 0..PARTITIONS {
            let got = handed.by_partition.get(&p).map(Vec::as_slice).unwrap_or_default();
            let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, (0..per_partition).collect::<Vec<_>>(), "partition {p}: each offset once, in order");
            for r in got {
                assert_eq!(*r, expected(topic, p, r.offset), "partition {p} offset {}", r.offset);
            }
        }
    }
    let more: usize = members.iter().map(|m| poll(m, handed, 2_000)).sum();
    assert_eq!(more, 0, "nothing more, and nothing twice");
}

/// A group of its own on a topic of its own, records `0..records` of
/// each partition produced, nothing handed out yet.
fn setup(name: &str, records: i64) -> (Config, String, Arc<Mutex<Handed>>) {
    let cfg = common::config(name);
    let topic = cfg.topics.events.clone();
    admin::ensure_topics(&cfg.kafka, &[topic.as_str()], PARTITIONS, 1).unwrap();
    produce(&cfg, &topic, 0, records);
    (cfg, topic, Arc::new(Mutex::new(Handed::default())))
}

/// A member alone reads records from three partitions, more than one of
/// the batch queue's chunks (512) at a time, whole and in order, and a
/// small `max` caps each batch.
#[test]
fn a_member_hands_out_every_record_whole_and_in_order() {
    let _serial = common::serial();
    let (cfg, topic, handed) = setup("consumer-batches", 1_500);
    let m = member(&cfg, &topic, &handed);
    let until = Instant::now() + Duration::from_secs(60);
    // Small batches first, then large ones.
    read_until(&[&m], &handed, 300, 7, until);
    read_until(&[&m], &handed, 4_500, 2_000, until);
    check_all(&[&m], &handed, &topic, 1_500);
}

/// A second member joins while records keep coming: the group moves
/// partitions with records fetched but not handed out (each member's
/// partitions are revoked, their queued records dropped, and assigned and
/// forwarded again), and every record is handed out once across the two,
/// in order, each member starting where the records handed out so far end.
#[test]
fn records_are_handed_out_once_across_a_rebalance() {
    let _serial = common::serial();
    let (cfg, topic, handed) = setup("consumer-rebalance", 300);
    let a = member(&cfg, &topic, &handed);
    let until = Instant::now() + Duration::from_secs(90);
    read_until(&[&a], &handed, 900, 100, until);
    let b = member(&cfg, &topic, &handed);
    let owned_by_both = || {
        let (oa, ob) = (a.ownership().owned(), b.ownership().owned());
        !oa.is_empty() && !ob.is_empty() && oa.is_disjoint(&ob) && oa.len() + ob.len() == PARTITIONS as usize
    };
    // Until the group has split the partitions: ten more records of each
    // partition per round, read a few at a time, so that every partition
    // has records in flight when it is revoked.
    let feed = producer(&cfg);
    let mut produced = 300;
    while !owned_by_both() && Instant::now() < until {
        produce_with(&feed, &topic, produced, produced + 10);
        produced += 10;
        poll(&a, &handed, 5);
        poll(&b, &handed, 5);
    }
    assert!(
        owned_by_both(),
        "the group split the partitions: {:?} and {:?}",
        a.ownership().owned(),
        b.ownership().owned()
    );
    assert!(
        handed.lock().unwrap().total() < produced as usize * PARTITIONS as usize,
        "records were left to hand out when the partitions moved"
    );
    produce_with(&feed, &topic, produced, produced + 100);
    produced += 100;
    read_until(&[&a, &b], &handed, produced as usize * PARTITIONS as usize, 100, until);
    check_all(&[&a, &b], &handed, &topic, produced);
}
