//! Minimal reproduction: does a broker compact a `cleanup.policy=compact`
//! topic, and does it remove tombstones? Restoring a partition from its
//! changelog depends on it (a compacted changelog holds the live keys
//! only), and not every Kafka-protocol broker compacts, so this finds out
//! over the Kafka protocol only.
//!
//! ```sh
//! cargo run --release --example compaction_probe -- 127.0.0.1:19092 660
//! ```
//!
//! It creates a fresh compacted topic (1 partition), publishes
//! `a=1, a=2, b=1, b=<tombstone>, c=1`, then reads the whole partition
//! every 10 s for up to the given seconds, printing what is left each time
//! it changes. Apache Kafka's log cleaner (which never cleans the active
//! segment, so this needs `segment.ms`/`segment.bytes` small there) leaves
//! `a=2, b=<tombstone>, c=1` and, after `delete.retention.ms`, drops the
//! tombstone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reconciler::kafka::{admin, producer::Publisher, reader};
use reconciler::records::ProducerRecord;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let brokers = args.get(1).cloned().unwrap_or_else(|| "127.0.0.1:19092".into());
    let wait = Duration::from_secs(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(660));
    let kafka: BTreeMap<String, String> =
        [("bootstrap.servers".to_owned(), brokers), ("receive.message.max.bytes".to_owned(), "100000000".to_owned())]
            .into();
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let topic = format!("compaction-probe-{unique}");
    admin::ensure_compacted(&kafka, &topic, 1, 1)?;
    let record = |k: &str, v: Option<&str>| ProducerRecord {
        topic: topic.clone(),
        key: Some(k.as_bytes().to_vec()),
        value: v.map(|v| v.as_bytes().to_vec()),
        headers: Vec::new(),
    };
    let sent = [
        record("a", Some("1")),
        record("a", Some("2")),
        record("b", Some("1")),
        record("b", None),
        record("c", Some("1")),
    ];
    Publisher::new(&kafka, 1 << 20)?.publish_all(sent.iter().map(|r| (r, Some(0))))?;
    println!("topic {topic}: published a=1 a=2 b=1 b=<tombstone> c=1");
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let records = reader::read_to_end(&kafka, &topic, Duration::from_secs(30))?;
        let now: Vec<String> = records
            .iter()
            .map(|r| {
                let k = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
                let v = r.value.as_deref().map_or("<tombstone>".into(), |v| String::from_utf8_lossy(v).into_owned());
                format!("{}:{k}={v}", r.offset)
            })
            .collect();
        let now = now.join(" ");
        if now != last {
            println!("after {:>4} s: {} records: {now}", started.elapsed().as_secs(), records.len());
            last = now;
        }
        if started.elapsed() >= wait {
            break;
        }
        std::thread::sleep(Duration::from_secs(10)); // polling interval: the broker's cleaner runs on its own clock
    }
    println!("after {} s: done", started.elapsed().as_secs());
    Ok(())
}
