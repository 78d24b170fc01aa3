//! The invariants every reliability test checks (issue 6), against a
//! reference run computed from the input log itself:
//!
//! - I1 no loss: every input offset of every partition is accounted for
//!   exactly once (applied, duplicate, held/anomalous, or dead-lettered),
//!   the counts add up per partition, and the instance's stored offsets
//!   reach the end of the log.
//! - I2 no divergent duplicates: an output may repeat only byte-identical,
//!   with the same id; de-duplicated by id it equals the reference.
//! - I3 determinism: the final state (and its digest) and the de-duplicated
//!   outputs, per output key in order, equal those of an uninterrupted
//!   in-memory run over the same input log (timer events included: they are
//!   in the log).
//! - I4 liveness: after the faults heal, the group's committed offsets reach
//!   the end of the input log (lag zero) and the expected verdicts arrive.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use reconciler::codec::Codec;
use reconciler::config::Config;
use reconciler::core::memory::MemoryEngine;
use reconciler::core::{OperationState, SourcePos};
use reconciler::kafka::client_config;
use reconciler::kafka::reader::{Isolation, TopicReader};
use reconciler::records::ProducerRecord;
use reconciler::records::Record;
use reconciler::records::{dead_letter, decode_record, output_record};
use reconciler::store::Store;

/// What a suite prints and asserts: figures of one or many runs.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub iterations: usize,
    pub crashes: usize,
    pub inputs: usize,
    pub outputs: usize,
    /// Outputs seen more than once (byte-identical: allowed).
    pub duplicates: usize,
    /// Reference outputs never published (must be 0).
    pub losses: usize,
    /// Outputs repeated with other bytes under the same id (must be 0).
    pub divergent: usize,
}

impl Figures {
    pub fn add(&mut self, o: &Figures) {
        self.iterations += o.iterations;
        self.crashes += o.crashes;
        self.inputs += o.inputs;
        self.outputs += o.outputs;
        self.duplicates += o.duplicates;
        self.losses += o.losses;
        self.divergent += o.divergent;
    }

    /// The one line each suite prints.
    pub fn print(&self, suite: &str) {
        println!(
            "{suite}: iterations {}, crashes injected {}, inputs {}, outputs {}, byte-identical duplicates {}, \
             losses {}, non-identical duplicates {}",
            self.iterations, self.crashes, self.inputs, self.outputs, self.duplicates, self.losses, self.divergent
        );
    }
}

/// The uninterrupted run over the input log, in memory.
pub struct Reference {
    /// Per (output topic, key): the outputs in the order they are produced.
    pub streams: BTreeMap<(String, Vec<u8>), Vec<ProducerRecord>>,
    /// Per input partition: records by disposition (`dead_letter` included).
    pub accounting: BTreeMap<i32, BTreeMap<&'static str, u64>>,
    /// Per input partition: the final state.
    pub engines: BTreeMap<i32, MemoryEngine>,
    /// Per input partition: records in the log.
    pub records: BTreeMap<i32, u64>,
}

/// The codec `cfg` configures (its schemas registered when it uses a
/// schema registry), knowing every schema the records of `input` name.
pub fn codec_for(cfg: &Config, input: &[Record]) -> Codec {
    let (codec, fetcher, _) = reconciler::registry::codec(cfg).expect("the schema registry answers");
    if let Some(f) = fetcher {
        let never = std::sync::atomic::AtomicBool::new(false);
        let values = input.iter().filter_map(|r| r.value.as_deref());
        f.learn(&codec, values, &never, |e| panic!("the schema registry fails: {e}"), || ()).unwrap();
    }
    codec
}

/// Runs the pipeline's decode → apply → encode over `input` (the whole
/// input topic) in partition order, as one uninterrupted instance would.
pub fn reference(cfg: &Config, input: &[Record]) -> Reference {
    let codec = codec_for(cfg, input);
    let policy = cfg.policy();
    let keys = cfg.security.loaded();
    let mut sorted: Vec<&Record> = input.iter().collect();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    let mut r = Reference {
        streams: BTreeMap::new(),
        accounting: BTreeMap::new(),
        engines: BTreeMap::new(),
        records: BTreeMap::new(),
    };
    let mut out = Vec::new();
    for rec in sorted {
        *r.records.entry(rec.partition).or_default() += 1;
        let counts = r.accounting.entry(rec.partition).or_default();
        let produced: Vec<ProducerRecord> = match decode_record(&codec, cfg.consumer.max_record_bytes, rec) {
            Err(e) => {
                *counts.entry("dead_letter").or_default() += 1;
                vec![dead_letter(&cfg.topics.dlq, rec, &e)]
            }
            Ok(ev) => {
                let engine = r.engines.entry(rec.partition).or_default();
                let pos = SourcePos { partition: rec.partition, offset: rec.offset };
                let auth = reconciler::records::authenticity(&keys, rec, &ev);
                let d = engine.process_checked(&policy, ev, auth, pos, &mut out);
                *counts.entry(d.as_str()).or_default() += 1;
                out.drain(..).map(|o| output_record(&codec, &cfg.topics, &o).unwrap()).collect()
            }
        };
        for o in produced {
            r.streams.entry((o.topic.clone(), o.key.clone().unwrap_or_default())).or_default().push(o);
        }
    }
    r
}

/// The identity of an output: verdict, anomaly or command id, or the source
/// position of a dead letter.
fn id_of(codec: &Codec, cfg: &Config, topic: &str, value: &[u8], headers: &[(String, Option<Vec<u8>>)]) -> String {
    let t = &cfg.topics;
    if topic == t.verdicts {
        codec.decode_verdict(value).map(|v| v.verdict_id).expect("a published verdict decodes")
    } else if topic == t.anomalies {
        codec.decode_anomaly(value).map(|a| a.anomaly_id).expect("a published anomaly decodes")
    } else if topic == t.commands {
        codec.decode_command(value).map(|c| c.command_id).expect("a published command decodes")
    } else {
        let h = |k: &str| headers.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone()).unwrap_or_default();
        format!(
            "dlq:{}:{}",
            String::from_utf8_lossy(&h("reconciler.source.partition")),
            String::from_utf8_lossy(&h("reconciler.source.offset"))
        )
    }
}

/// I2 and I3 on the outputs, I1 and I3 on the state in `state_dirs`
/// (the instances must be stopped). Panics with the first violation;
/// returns the figures.
pub fn check(cfg: &Config, input: &[Record], outputs: &[Record], state_dirs: &[&Path]) -> Figures {
    let reference = reference(cfg, input);
    let codec = codec_for(cfg, input);
    let mut f = Figures { inputs: input.len(), outputs: outputs.len(), ..Figures::default() };

    // I2: same id, same bytes; then first occurrences per key, in order.
    let mut seen: HashMap<(String, String), &Record> = HashMap::new();
    let mut got: BTreeMap<(String, Vec<u8>), Vec<ProducerRecord>> = BTreeMap::new();
    for r in outputs {
        let value = r.value.clone().unwrap_or_default();
        let id = id_of(&codec, cfg, &r.topic, &value, &r.headers);
        match seen.get(&(r.topic.to_string(), id.clone())) {
            Some(prev) => {
                f.duplicates += 1;
                if (&prev.key, &prev.value, &prev.headers) != (&r.key, &r.value, &r.headers) {
                    f.divergent += 1;
                    eprintln!("non-identical duplicate of {id} on {}", r.topic);
                }
            }
            None => {
                seen.insert((r.topic.to_string(), id), r);
                got.entry((r.topic.to_string(), r.key.clone().unwrap_or_default())).or_default().push(ProducerRecord {
                    topic: r.topic.to_string(),
                    key: r.key.clone(),
                    value: r.value.clone(),
                    headers: r.headers.clone(),
                });
            }
        }
    }
    let want: usize = reference.streams.values().map(Vec::len).sum();
    let have: usize = got.values().map(Vec::len).sum();
    f.losses = want.saturating_sub(have);
    assert_eq!(f.divergent, 0, "I2: outputs repeated with different bytes");
    for (k, stream) in &reference.streams {
        let key = String::from_utf8_lossy(&k.1);
        let g = got.get(k).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            g.len(),
            stream.len(),
            "I1/I3: {} outputs for key {key} on {}, the reference has {}",
            g.len(),
            k.0,
            stream.len()
        );
        for (i, (a, b)) in g.iter().zip(stream).enumerate() {
            assert_eq!(a, b, "I3: output {i} for key {key} on {} differs from the reference", k.0);
        }
    }
    assert_eq!(got.len(), reference.streams.len(), "I3: outputs for keys the reference has none for");
    assert_eq!(f.losses, 0);

    // I1: every offset accounted for once, counts add up per partition.
    for (p, counts) in &reference.accounting {
        assert_eq!(counts.values().sum::<u64>(), reference.records[p], "I1: partition {p} accounting {counts:?}");
    }
    // I1/I3: the instance that owns each partition last stored the whole
    // log of it, and its state equals the reference's.
    let stores: Vec<Store> =
        state_dirs.iter().map(|d| Store::open(d, &cfg.topics.events, false).expect("store opens")).collect();
    for (p, n) in &reference.records {
        let end = input.iter().filter(|r| r.partition == *p).map(|r| r.offset + 1).max().unwrap();
        // At or past it: under exactly_once the stored offset also passes
        // the transaction markers after the last record.
        let owner = stores
            .iter()
            .filter(|s| s.next_offset(*p).unwrap() >= Some(end))
            .max_by_key(|s| s.next_offset(*p).unwrap())
            .unwrap_or_else(|| panic!("I1: no instance stored partition {p} to its end {end} ({n} records)"));
        let mut ops: BTreeMap<String, OperationState> =
            owner.ops_of(*p).unwrap().into_iter().map(|o| (o.operation_id.clone(), o)).collect();
        let engine = reference.engines.get(p).cloned().unwrap_or_default();
        assert_eq!(ops.len(), engine.ops.len(), "I3: operations of partition {p}");
        for (id, want) in &engine.ops {
            let got = ops.remove(id).unwrap_or_else(|| panic!("I3: operation {id} missing from partition {p}"));
            assert_eq!(&got, want, "I3: state of {id} differs from the uninterrupted reference");
        }
        for (id, want) in &engine.entities {
            assert_eq!(&owner.get_entity(*p, id).unwrap(), want, "I3: entity {id} of partition {p}");
        }
    }
    f
}

/// A digest of a state (operations sorted by id), to print and compare.
pub fn digest(ops: &BTreeMap<String, OperationState>) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&postcard::to_allocvec(&ops.values().collect::<Vec<_>>()).unwrap())
}

/// The end of every partition of `topic` as a read_committed reader (the
/// default of librdkafka and of every reader here) sees it. Retried for a
/// minute: right after a broker restart a fresh client may find it not yet
/// serving.
pub fn end_offsets(cfg: &Config, topic: &str) -> BTreeMap<i32, i64> {
    end_offsets_with(cfg, topic, Isolation::ReadCommitted)
}

/// The end of each partition of `topic` as a reader of `isolation` sees
/// it: the high watermark (read_uncommitted), or the last stable offset,
/// below the first record of a transaction still open (read_committed).
pub fn end_offsets_with(cfg: &Config, topic: &str, isolation: Isolation) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = client_config(
        &[],
        &cfg.kafka,
        &[("group.id", "reliability-watermarks"), ("isolation.level", isolation.level())],
    )
    .create()
    .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    (0..cfg.topics.partitions)
        .map(|p| loop {
            match c.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                Ok((_, high)) => break (p, high),
                Err(e) if Instant::now() >= until => panic!("watermarks of {topic}/{p}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)), // retry interval
            }
        })
        .collect()
}

/// The group's committed offsets of the input topic.
pub fn committed(cfg: &Config) -> BTreeMap<i32, i64> {
    let c: BaseConsumer =
        client_config(&[], &cfg.kafka, &[("group.id", cfg.consumer.group_id.as_str())]).create().unwrap();
    reconciler::kafka::consumer::committed_offsets(&c, &cfg.topics.events, 0..cfg.topics.partitions).unwrap_or_default()
}

/// Commits `offset` for partition `partition` of the input topic in the
/// group's name from outside it, as an operator's reset of the group
/// would (Kafka accepts it only while the group has no member).
pub fn try_commit_as_group(cfg: &Config, partition: i32, offset: i64) -> rdkafka::error::KafkaResult<()> {
    let c: BaseConsumer =
        client_config(&[], &cfg.kafka, &[("group.id", cfg.consumer.group_id.as_str())]).create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&cfg.topics.events, partition, rdkafka::Offset::Offset(offset)).unwrap();
    c.commit(&tpl, rdkafka::consumer::CommitMode::Sync)
}

/// Whether the group's committed offsets reach the current end of every
/// non-empty input partition.
pub fn caught_up(cfg: &Config) -> bool {
    let c = committed(cfg);
    end_offsets(cfg, &cfg.topics.events).iter().all(|(p, e)| *e == 0 || c.get(p) == Some(e))
}

/// Reads whole topics up to their current ends, as a `read_committed`
/// downstream service would.
pub fn read_all(cfg: &Config, topics: &[&str]) -> Vec<Record> {
    read_all_with(cfg, topics, Isolation::ReadCommitted)
}

/// Reads whole topics up to their current ends (transaction markers and,
/// read committed, aborted records count as read once passed).
pub fn read_all_with(cfg: &Config, topics: &[&str], isolation: Isolation) -> Vec<Record> {
    let ends: BTreeMap<(String, i32), i64> = topics
        .iter()
        .flat_map(|t| end_offsets(cfg, t).into_iter().map(move |(p, e)| ((t.to_string(), p), e)))
        .collect();
    let mut reader = TopicReader::with_isolation(&cfg.kafka, topics, cfg.topics.partitions, isolation).unwrap();
    assert!(reader.read_to(&ends, Duration::from_secs(60)), "could not read {topics:?} back to {ends:?}");
    reader.records
}

/// The output topics.
pub fn output_topics(cfg: &Config) -> [&str; 4] {
    let t = &cfg.topics;
    [&t.verdicts, &t.anomalies, &t.dlq, &t.commands]
}

/// How long [`wait_settled`] waits for a next verdict before it asks
/// `ready` anyway (above a session timeout of the suites, 6 s).
const STALLED: Duration = Duration::from_secs(8);

/// I4: waits until the group's committed offsets reach the end of every
/// input partition, `verdicts` distinct verdicts arrived, the running
/// instances report themselves ready (`ready`), and this stays so
/// for a quiet second (a late timer event would move the end). `ready` is
/// asked once every verdict is there, or when none has arrived for
/// [`STALLED`], so that a failure names the instances' state too. Returns
/// whether that happened within `timeout`, or what was still missing then
/// (the first line of a failed test's message, which CI logs keep).
pub fn wait_settled(
    cfg: &Config,
    verdicts: usize,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let until = Instant::now() + timeout;
    let mut quiet_since: Option<(Instant, BTreeMap<i32, i64>)> = None;
    let mut progress = (0, Instant::now());
    loop {
        // Read afresh from the beginning each time: the count is of
        // distinct verdicts, whatever was read before.
        let verdict_records = read_all(cfg, &[&cfg.topics.verdicts]);
        let distinct: std::collections::HashSet<&[u8]> =
            verdict_records.iter().filter_map(|r| r.value.as_deref()).collect();
        let end = end_offsets(cfg, &cfg.topics.events);
        // The committed offsets may be a previous incarnation's: the
        // running instances must also report every partition restored.
        // `ready` only once every verdict is there or none comes.
        if distinct.len() != progress.0 {
            progress = (distinct.len(), Instant::now());
        }
        let stalled = progress.1.elapsed() >= STALLED;
        let is_ready = (distinct.len() >= verdicts || stalled).then(&mut ready);
        let caught_up = || {
            let c = committed(cfg);
            end.iter().all(|(p, e)| *e == 0 || c.get(p) == Some(e))
        };
        let done = distinct.len() >= verdicts && is_ready == Some(true) && caught_up();
        match (&quiet_since, done) {
            (Some((since, at)), true) if *at == end => {
                if since.elapsed() >= Duration::from_secs(1) {
                    return Ok(());
                }
            }
            (_, true) => quiet_since = Some((Instant::now(), end.clone())),
            (_, false) => quiet_since = None,
        }
        if Instant::now() >= until {
            return Err(format!(
                "not settled after {timeout:?}: {} distinct verdicts of {verdicts}, instances ready: {is_ready:?}, committed {:?}, end {end:?}",
                distinct.len(),
                committed(cfg)
            ));
        }
    }
}

/// Deletes every record of `topic` below its current end (Kafka's
/// DeleteRecords): its low watermarks move there.
pub fn delete_head(cfg: &Config, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        reconciler::kafka::client_config(&[], &cfg.kafka, &[]).create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (p, end) in end_offsets(cfg, topic) {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(end)).unwrap();
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let done = futures::executor::block_on(admin.delete_records(&tpl, &opts)).unwrap();
    for e in done.elements() {
        assert!(e.error().is_ok(), "deleting the head of {topic}/{}: {:?}", e.partition(), e.error());
    }
}
