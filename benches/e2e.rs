//! The end-to-end harness: in one run against one broker,
//!
//! 1. preloads a fault-injected loadgen workload (≥ 1M records by default)
//!    into a fresh input topic and writes its ground truth;
//! 2. runs the release binary (`reconciler run`) until the verdict topic
//!    holds as many verdicts as the truth expects (timer verdicts included),
//!    sampling its CPU time and peak RSS from /proc; then checks every
//!    output against the truth (`loadgen verify`);
//! 3. runs the bare rdkafka passthrough (`reconciler loadgen passthrough`)
//!    over the same topic as the baseline, measured the same way;
//! 4. measures the input's own path at half the measured rate (loadgen to
//!    a bare consumer, event time = send time: the floor of producer,
//!    broker and fetch), then runs a fresh pipeline while loadgen publishes
//!    at that rate, and reports p50/p99 event→verdict latency next to the
//!    floor.
//!
//! Each pipeline's log goes to /tmp/<run>.log (<run>-eos.log,
//! <run>-lat.log), kept:
//! RECONCILER_LOG=warn,reconciler::pipeline=debug,reconciler::pipeline::apply=info
//! times every batch.
//!
//!   scripts/bench-e2e.sh            (builds, starts Apache Kafka, runs this)
//!   KAFKA_BROKERS=127.0.0.1:9092 E2E_OPERATIONS=300000 cargo bench --bench e2e
//!
//! Other knobs: E2E_PARTITIONS (6), E2E_LATENCY_SECS (20, 0 skips),
//! E2E_SKIP_VERIFY=1, E2E_BIN (default: target/release/reconciler),
//! E2E_EXACTLY_ONCE=1: after step 2, the pipeline again over the same input
//! with `guarantee = "exactly_once"` (own group, state and output topics),
//! and the ratio of the two (needs a broker with transactions, as Apache
//! Kafka has). E2E_CHANGELOG=false: no state changelog
//! (what the changelog costs). E2E_KAFKA="key=value,...": more `[kafka]`
//! settings for every instance of the run (experiments).
//! E2E_LATENCY_RATE=<records/s>: the latency step's rate (default half the
//! pipeline's measured rate; fixed, binaries compare at one rate).
//! E2E_LATENCY_DUMP=<file>: each verdict of the latency step as a line
//! "<produced at, ms since the epoch> <latency ms>" (the tail, by time).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::{ClientConfig, Offset};
use reconciler::codec::Codec;
use reconciler::config::{Config, Topics};
use reconciler::kafka::admin;
use reconciler::kafka::reader::TopicReader;
use reconciler::loadgen::{self, EventTime, Generator, Options, Workload};

#[path = "support/proc_stats.rs"]
mod proc_stats;
use proc_stats::{broker_pid, clock_ticks, sample, Busy, ProcSample, ThreadCpu};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn binary() -> PathBuf {
    if let Ok(b) = std::env::var("E2E_BIN") {
        return b.into();
    }
    // This bench runs from target/release/deps/.
    let exe = std::env::current_exe().expect("own path");
    exe.parent().and_then(Path::parent).expect("target/release").join("reconciler")
}

/// Counts the records of a topic by reading it (tansu's memory engine
/// reports high watermarks that lag what it holds, so they cannot be used).
/// It watches the pipeline's outputs (the passthrough reports its own end).
struct Counter {
    consumer: BaseConsumer,
    n: i64,
}

impl Counter {
    fn new(brokers: &str, topics: &[&str], partitions: i32) -> Counter {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", format!("{}.counter", topics[0]))
            .set("enable.auto.commit", "false")
            // As short as the pipeline's own (CONSUMER_DEFAULTS): the
            // first output is timed by when this counter sees it.
            .set("fetch.wait.max.ms", "10")
            // noida-db answers fetches whole, whatever their size limit.
            .set("receive.message.max.bytes", "104857600")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for topic in topics {
            for p in 0..partitions {
                tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
            }
        }
        consumer.assign(&tpl).unwrap();
        Counter { consumer, n: 0 }
    }

    /// Polls until the consumer knows its position in every partition (it
    /// is fetching), or 5 s pass.
    fn warm_up(&mut self) {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            self.count();
            let fetching = self.consumer.position().is_ok_and(|tpl| {
                let e = tpl.elements();
                !e.is_empty() && e.iter().all(|e| matches!(e.offset(), Offset::Offset(_)))
            });
            if fetching {
                return;
            }
        }
    }

    /// Records seen so far (reads what is available for up to ~20 ms).
    fn count(&mut self) -> i64 {
        let until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < until {
            match self.consumer.poll(Duration::from_millis(5)) {
                Some(Ok(_)) => self.n += 1,
                Some(Err(e)) => panic!("counting: {e}"),
                None => {}
            }
        }
        self.n
    }
}

fn config(brokers: &str, prefix: &str, partitions: i32) -> (Config, PathBuf) {
    config_with(brokers, prefix, partitions, None, false)
}

/// A run's config: topics named by `prefix` (the input `input` when given),
/// its own group and state, `exactly_once` or the default guarantee.
fn config_with(
    brokers: &str,
    prefix: &str,
    partitions: i32,
    input: Option<&str>,
    exactly_once: bool,
) -> (Config, PathBuf) {
    let mut cfg = Config::default();
    cfg.kafka.insert("bootstrap.servers".into(), brokers.into());
    // noida-db answers fetches whole, whatever their size limit.
    cfg.kafka.insert("receive.message.max.bytes".into(), "104857600".into());
    cfg.topics = Topics::named(prefix, partitions);
    if !env_or("E2E_CHANGELOG", true) {
        cfg.topics.no_changelog();
    }
    if let Some(events) = input {
        cfg.topics.events = events.to_owned();
    }
    cfg.consumer.group_id = format!("{prefix}.group");
    // Timers and the workload's decisions signed and checked, as in
    // production.
    cfg.security.control_keys = vec![BENCH_CONTROL_KEY.into()];
    let dir = std::env::temp_dir().join(prefix);
    std::fs::create_dir_all(&dir).unwrap();
    cfg.state_dir = dir.join("state");
    let file = dir.join("reconciler.toml");
    let t = &cfg.topics;
    let guarantee = if exactly_once { "exactly_once" } else { "at_least_once" };
    let mut toml = format!(
        "guarantee = {guarantee:?}\nstate_dir = {:?}\n[topics]\nevents = {:?}\nverdicts = {:?}\nanomalies = {:?}\ndlq = {:?}\ncommands = {:?}\nchangelog = {:?}\nfleet = {:?}\npartitions = {partitions}\n[consumer]\ngroup_id = {:?}\n[security]\ncontrol_keys = [{BENCH_CONTROL_KEY:?}]\n[kafka]\n\"bootstrap.servers\" = {:?}\n\"receive.message.max.bytes\" = \"104857600\"\n",
        cfg.state_dir, t.events, t.verdicts, t.anomalies, t.dlq, t.commands, t.changelog().unwrap_or_default(), t.fleet().unwrap_or_default(), cfg.consumer.group_id, brokers
    );
    // E2E_KAFKA="key=value,key=value": more [kafka] settings (experiments).
    for (k, v) in std::env::var("E2E_KAFKA").unwrap_or_default().split(',').filter_map(|kv| kv.split_once('=')) {
        toml.push_str(&format!("{k:?} = {v:?}\n"));
        cfg.kafka.insert(k.to_owned(), v.to_owned());
    }
    std::fs::write(&file, toml).unwrap();
    (cfg, file)
}

/// The control key of the benchmark's instances and loadgen.
const BENCH_CONTROL_KEY: &str = "e2e-bench-control-key";

fn spawn(config: &Path, args: &[&str]) -> Child {
    command(config, args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary().display()))
}

/// The command line of an instance (its log goes to stderr).
fn command(config: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(binary());
    c.arg("--config")
        .arg(config)
        .args(args)
        .env("RECONCILER_LOG", std::env::var("RECONCILER_LOG").unwrap_or_else(|_| "warn".into()));
    c
}

/// `spawn` with the child's output and log going to the file `log`.
fn spawn_logged(config: &Path, args: &[&str], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    command(config, args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary().display()))
}

fn stop(child: &mut Child) {
    // The passthrough ends by itself: no `kill` of a process that is gone.
    if matches!(child.try_wait(), Ok(None)) {
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    }
    let _ = child.wait();
}

struct Measured {
    records: u64,
    wall: Duration,
    /// From the start of the process to its first output.
    first_output: Option<Duration>,
    /// From the first output to the end (without start-up and group join).
    busy: Duration,
    proc: ProcSample,
    /// CPU by thread group (see [`ThreadCpu`]).
    threads: ThreadCpu,
    /// CPU seconds the harness itself used meanwhile (reading the outputs
    /// to count them): taken from the same two cores.
    harness_cpu_s: f64,
    stdout: String,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.records as f64 / self.wall.as_secs_f64()
    }
    fn busy_rate(&self) -> f64 {
        self.records as f64 / self.busy.as_secs_f64()
    }
    fn cpu_per_million(&self) -> f64 {
        self.proc.cpu_s / (self.records as f64 / 1e6)
    }
}

/// Runs a child until `progress()` reaches `target`, sampling it.
fn measure(
    mut child: Child,
    records: u64,
    ticks: f64,
    mut progress: impl FnMut() -> i64,
    target: i64,
    timeout: Duration,
) -> Measured {
    let began = Instant::now();
    let harness_before = sample(std::process::id(), ticks).unwrap_or_default().cpu_s;
    let mut first_output: Option<Instant> = None;
    let mut last = ProcSample::default();
    let mut threads = ThreadCpu::default();
    let mut threads_read = Instant::now();
    loop {
        if let Some(s) = sample(child.id(), ticks) {
            last = s;
        }
        // Every thread's file a few times a second, not on every loop: the
        // harness shares the cores with what it measures.
        if threads_read.elapsed() >= Duration::from_millis(250) {
            threads.sample(child.id(), ticks);
            threads_read = Instant::now();
        }
        let n = progress();
        if std::env::var("E2E_DEBUG").is_ok() {
            eprintln!("{:?}: {n} of {target}", began.elapsed());
            if began.elapsed() > Duration::from_secs(15) {
                break;
            }
        }
        if n > 0 && first_output.is_none() {
            first_output = Some(Instant::now());
        }
        if n >= target {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Only the passthrough ends by itself, once all is acknowledged.
            assert!(status.success(), "the process failed ({status}) after {n} of {target}");
            break;
        }
        assert!(began.elapsed() < timeout, "only {n} of {target} after {timeout:?}");
    }
    let wall = began.elapsed();
    if let Some(s) = sample(child.id(), ticks) {
        last = s;
    }
    threads.sample(child.id(), ticks);
    let harness_cpu_s = sample(std::process::id(), ticks).unwrap_or_default().cpu_s - harness_before;
    let busy = first_output.map_or(wall, |f| f.elapsed());
    let first_output = first_output.map(|f| f.duration_since(began));
    stop(&mut child);
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        use std::io::Read;
        let _ = out.read_to_string(&mut stdout);
    }
    Measured { records, wall, first_output, busy, proc: last, threads, harness_cpu_s, stdout }
}

/// Runs `reconciler run` with `file` until the outputs of `cfg` hold
/// `expected` records, and prints its figures after `label`.
fn run_pipeline(
    brokers: &str,
    cfg: &Config,
    file: &Path,
    records: u64,
    ticks: f64,
    expected: i64,
    label: &str,
) -> Measured {
    let t = &cfg.topics;
    let mut outputs = Counter::new(brokers, &[&t.verdicts, &t.anomalies, &t.dlq], t.partitions);
    // The counter connected and fetching before the process starts: its
    // own start (connections, offsets) is not the pipeline's first output.
    outputs.warm_up();
    // Its log to a file kept after the run (a pipe nobody reads while it
    // runs would stall a chatty log level): /tmp/<run>.log.
    let log = file.parent().expect("in the run's directory").with_extension("log");
    println!("{label} log: {}", log.display());
    let child = spawn_logged(file, &["run"], &log);
    let m = measure(child, records, ticks, || outputs.count(), expected, Duration::from_secs(120 + records / 5_000));
    println!(
        "{label} {records} records in {:.2} s = {:.0} records/s ({:.0}/s after the first verdict); {:.2} CPU s per 1M records; peak RSS {:.0} MB",
        m.wall.as_secs_f64(),
        m.rate(),
        m.busy_rate(),
        m.cpu_per_million(),
        m.proc.peak_rss_mb
    );
    println!(
        "{label} CPU s per 1M records by thread: {}; the harness counting outputs meanwhile: {:.2}",
        m.threads.per_million(records),
        m.harness_cpu_s / (records as f64 / 1e6)
    );
    m
}

/// Checks the outputs of `cfg` against the ground truth and prints it.
fn verify(cfg: &Config, truth: &loadgen::truth::GroundTruth, records: u64, label: &str) {
    let began = Instant::now();
    let report =
        loadgen::verify::verify(cfg, truth, Duration::from_secs(30 + records / 10_000), Duration::from_secs(2))
            .unwrap();
    println!(
        "{label} {} of {} operations agree, {} of {} verdicts, anomalies {}, dead letters {} ({:.0} s)",
        report.operations_agreeing,
        report.operations,
        report.verdicts_seen,
        report.verdicts_expected,
        if report.anomalies.values().all(|(e, s)| e == s) { "all equal" } else { "DIFFER" },
        if report.dead_letters.values().all(|(e, s)| e == s) { "all equal" } else { "DIFFER" },
        began.elapsed().as_secs_f64()
    );
    if !report.agrees() {
        println!("{}", report.render());
    }
}

fn main() {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let operations: u64 = env_or("E2E_OPERATIONS", 300_000);
    let partitions: i32 = env_or("E2E_PARTITIONS", 6);
    let latency_secs: u64 = env_or("E2E_LATENCY_SECS", 20);
    let ticks = clock_ticks();
    let run_id = format!("e2e-{}-{}", std::process::id(), reconciler::clock::now_ms());
    println!("binary: {}", binary().display());

    // 1. Preload.
    let (cfg, file) = config(&brokers, &run_id, partitions);
    let t = cfg.topics.clone();
    admin::ensure_topics(&cfg.kafka, &t.all(), partitions, 1).unwrap();
    let opts = Options::preload(operations, 1, reconciler::clock::now_ms());
    let (published, truth) = loadgen::publish(&cfg, Generator::new(opts), false, false).unwrap();
    println!(
        "preloaded {} records ({} operations, {} dead letters to be) in {:.1} s; expecting {} verdicts ({} timer), {} anomalies",
        published.records,
        truth.operations,
        truth.dead_letters,
        published.elapsed.as_secs_f64(),
        truth.verdict_count,
        truth.timer_verdicts,
        truth.anomaly_count()
    );
    let records = published.records;

    // 2. The pipeline.
    // Done when every output is in: verdicts (timer verdicts included),
    // anomalies (orphans found by timers included) and dead letters.
    let outputs_expected = (truth.verdict_count + truth.anomaly_count() + truth.dead_letters) as i64;
    let pipeline = run_pipeline(&brokers, &cfg, &file, records, ticks, outputs_expected, "pipeline:   ");
    if std::env::var("E2E_EXACTLY_ONCE").is_ok_and(|v| v == "1") {
        let (eos_cfg, eos_file) = config_with(&brokers, &format!("{run_id}-eos"), partitions, Some(&t.events), true);
        admin::ensure_topics(&eos_cfg.kafka, &eos_cfg.topics.all(), partitions, 1).unwrap();
        let eos = run_pipeline(&brokers, &eos_cfg, &eos_file, records, ticks, outputs_expected, "exactly_once:");
        println!(
            "ratio exactly_once/at_least_once: {:.2} (wall), {:.2} (after first output); CPU per record {:.2}x",
            eos.rate() / pipeline.rate(),
            eos.busy_rate() / pipeline.busy_rate(),
            eos.cpu_per_million() / pipeline.cpu_per_million()
        );
        if std::env::var("E2E_SKIP_VERIFY").is_err() {
            verify(&eos_cfg, &truth, records, "verify (exactly_once):");
        }
    }
    if std::env::var("E2E_SKIP_VERIFY").is_err() {
        verify(&cfg, &truth, records, "verify:     ");
    }

    // 3. The passthrough baseline over the same topic.
    let to = format!("{run_id}.passthrough");
    admin::ensure_topics(&cfg.kafka, &[to.as_str()], partitions, 1).unwrap();
    let count = records.to_string();
    let child = spawn(&file, &["loadgen", "passthrough", "--to", &to, "--count", &count]);
    // It exits once everything is acknowledged; its own figure (first
    // record consumed to last acknowledged) is the busy time.
    let mut base = measure(child, records, ticks, || 0, i64::MAX, Duration::from_secs(120 + records / 5_000));
    if let Some(secs) = base.stdout.split(" in ").nth(1).and_then(|r| r.split(' ').next()).and_then(|x| x.parse().ok())
    {
        base.busy = Duration::from_secs_f64(secs);
    }
    println!(
        "passthrough: {records} records in {:.2} s = {:.0} records/s ({:.0}/s from the first record in to the last acknowledged); {:.2} CPU s per 1M records; peak RSS {:.0} MB",
        base.wall.as_secs_f64(),
        base.rate(),
        base.busy_rate(),
        base.cpu_per_million(),
        base.proc.peak_rss_mb
    );
    println!("passthrough: CPU s per 1M records by thread: {}", base.threads.per_million(records));
    println!(
        "ratio pipeline/passthrough: {:.2} (wall), {:.2} (after first output)",
        pipeline.rate() / base.rate(),
        pipeline.busy_rate() / base.busy_rate()
    );

    // 4. Latency at half the measured rate.
    let step = (latency_secs > 0)
        .then(|| latency(&brokers, partitions, &format!("{run_id}-lat"), latency_rate(&pipeline), latency_secs));
    print_targets(&pipeline, &base, step);
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&run_id));
}

/// Each performance target next to this run's figure, so that a regression
/// shows at a glance (`cargo bench --bench rebuild` measures the rebuild).
fn print_targets(pipeline: &Measured, base: &Measured, step: Option<Step>) {
    let row = |what: &str, target: &str, measured: String, met: bool| {
        println!("  {what:<44} {target:>9} {measured:>10}  {}", if met { "met" } else { "MISSED" });
    };
    println!("targets:");
    let wall = pipeline.rate() / base.rate();
    let busy = pipeline.busy_rate() / base.busy_rate();
    row("throughput / passthrough, from start", ">= 0.80", format!("{wall:.2}"), wall >= 0.8);
    row("throughput / passthrough, from first output", ">= 0.80", format!("{busy:.2}"), busy >= 0.8);
    let cpu = pipeline.cpu_per_million();
    row("CPU s per 1M records", "<= 3.5", format!("{cpu:.2}"), cpu <= 3.5);
    let first = pipeline.first_output.map_or(f64::INFINITY, |d| d.as_secs_f64());
    row("first output after start, s", "<= 0.3", format!("{first:.2}"), first <= 0.3);
    if let Some(Step { p50, p99, cpu_per_million }) = step {
        row("event->verdict p50 at half rate, ms", "<= 20", p50.to_string(), (0..=20).contains(&p50));
        row("event->verdict p99 at half rate, ms", "<= 100", p99.to_string(), (0..=100).contains(&p99));
        // Not a target of its own: what a record costs at that rate, where
        // batches are smaller than at full rate.
        if let Some(cpu) = cpu_per_million {
            println!("  {:<44} {:>9} {:>10.2}", "CPU s per 1M records at half rate", "", cpu);
        }
    }
}

/// What the latency step measured: event→verdict p50 and p99 (ms), and
/// the pipeline's CPU per 1M records while the step's input was
/// published.
struct Step {
    p50: i64,
    p99: i64,
    cpu_per_million: Option<f64>,
}

/// The latency step's rate: half the pipeline's measured rate, or
/// E2E_LATENCY_RATE records/s (to compare binaries at one rate).
fn latency_rate(pipeline: &Measured) -> f64 {
    std::env::var("E2E_LATENCY_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(pipeline.busy_rate() / 2.0)
}

/// How long after the latency step's start its first record is due.
const PUBLISH_LEAD: Duration = Duration::from_secs(2);

/// The paced publisher's thread, and how it says it is done.
struct Paced {
    thread: std::thread::JoinHandle<(loadgen::Published, loadgen::truth::GroundTruth)>,
    /// Disconnected once everything is acknowledged: polled, or waited on
    /// with a wait that wakes at once.
    finished: mpsc::Receiver<()>,
}

impl Paced {
    /// Whether everything is published and acknowledged.
    fn done(&self) -> bool {
        matches!(self.finished.try_recv(), Err(mpsc::TryRecvError::Disconnected))
    }
}

/// Publishes the workload `opts` paced, on a thread of its own.
fn publish_paced(cfg: Config, opts: Options) -> Paced {
    let (tx, finished) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let r = loadgen::publish(&cfg, Generator::new(opts), true, false);
        drop(tx);
        r.unwrap()
    });
    Paced { thread, finished }
}

/// The `p` quantile of sorted `v` (-1 when empty).
fn percentile(v: &[i64], p: f64) -> i64 {
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(-1)
}

/// A paced step in four quarters of its window: the latencies measured in
/// each, and the cores each process kept busy in each. On tansu's memory
/// engine the broker's CPU per record grows as its partitions fill: at
/// 85,000 records/s with nothing else running it took 0.29 cores in the
/// first second of the input-path step and 0.97 in its last. The tail
/// then grows through a step on two shared cores, and quarter by quarter
/// shows how much of that is the broker's.
struct Quarters {
    /// The window's first event time (ms since the epoch) and length.
    start_ms: i64,
    span_ms: i64,
    procs: Vec<(&'static str, u32)>,
    ticks: f64,
    /// The quarter being measured (and the pipeline's threads at its start);
    /// `None` before the window opens.
    busy: Option<(Busy, Option<ThreadCpu>)>,
    /// One report per quarter measured.
    cores: Vec<String>,
}

impl Quarters {
    fn new(start_ms: i64, secs: u64, procs: Vec<(&'static str, u32)>, ticks: f64) -> Self {
        Quarters { start_ms, span_ms: (secs as i64 * 1000).max(4), procs, ticks, busy: None, cores: Vec::new() }
    }

    /// The pipeline's pid (when it is among `procs`), whose threads each
    /// quarter also reports by group.
    fn pipeline(&self) -> Option<u32> {
        self.procs.iter().find(|(n, _)| *n == "pipeline").map(|(_, pid)| *pid)
    }

    /// Opens a quarter: the processes' CPU, and the pipeline's threads'.
    fn open(&self) -> (Busy, Option<ThreadCpu>) {
        let threads = self.pipeline().map(|pid| {
            let mut t = ThreadCpu::default();
            t.sample(pid, self.ticks);
            t
        });
        (Busy::start(&self.procs, self.ticks), threads)
    }

    /// Closes a quarter: "broker .., pipeline .. cores (of 2); pipeline by
    /// thread: run loop .., rayon pool .., ..". Which threads grow through
    /// the step is what tells the pipeline's own work from the broker's.
    fn close(&self, (busy, threads): &(Busy, Option<ThreadCpu>)) -> String {
        let mut report = busy.report();
        if let (Some(before), Some(pid)) = (threads, self.pipeline()) {
            let mut after = before.clone();
            after.sample(pid, self.ticks);
            report.push_str(&format!("; pipeline by thread: {}", after.cores_since(before, busy.elapsed())));
        }
        report
    }

    /// The quarter of event time `at_ms` (those outside go to the nearest).
    fn of(&self, at_ms: i64) -> usize {
        ((at_ms - self.start_ms).max(0) * 4 / self.span_ms).min(3) as usize
    }

    /// Called often while the step runs: closes the quarters that ended.
    fn tick(&mut self) {
        let now = reconciler::clock::now_ms();
        if now < self.start_ms {
            return;
        }
        let Some(busy) = &self.busy else {
            self.busy = Some(self.open());
            return;
        };
        if self.cores.len() < 3 && self.of(now) > self.cores.len() {
            let report = self.close(busy);
            self.cores.push(report);
            self.busy = Some(self.open());
        }
    }

    /// Closes the last quarter (once the step's records are all out).
    fn finish(&mut self) {
        if let (Some(busy), true) = (&self.busy, self.cores.len() < 4) {
            let report = self.close(busy);
            self.cores.push(report);
        }
        self.busy = None;
    }

    /// "p50 / p99 ms, cores" of each quarter of `timed` ((event time, latency)).
    fn report(&self, timed: impl IntoIterator<Item = (i64, i64)>) -> Vec<String> {
        let mut by: [Vec<i64>; 4] = Default::default();
        for (at, ms) in timed {
            by[self.of(at)].push(ms);
        }
        by.iter_mut()
            .enumerate()
            .map(|(q, v)| {
                v.sort_unstable();
                let cores = self.cores.get(q).map_or("-", String::as_str);
                format!("p50 {} / p99 {} ms ({cores})", percentile(v, 0.50), percentile(v, 0.99))
            })
            .collect()
    }
}

/// The floor under event→verdict latency on this broker, measured just
/// before the pipeline's step: loadgen publishes the same paced workload
/// (`args`) to a topic of its own while a bare consumer with the
/// pipeline's consumer settings measures each event from its event time to
/// its arrival (loadgen's producer, the broker, the fetch), nothing else
/// running. What the pipeline adds is the difference. (Run beside the
/// pipeline, a second consumer of the input slowed the pipeline's batches
/// several times over on two cores.) Returns the sorted latencies, the
/// cores the broker and the harness kept busy while they were published,
/// and each quarter's latencies and cores.
fn input_floor(cfg: &Config, partitions: i32, mut args: Workload, secs: u64) -> (Vec<i64>, String, Vec<String>) {
    let mut cfg = cfg.clone();
    cfg.topics.events = format!("{}.floor", cfg.topics.events);
    admin::ensure_topics(&cfg.kafka, &[cfg.topics.events.as_str()], partitions, 1).unwrap();
    let group = format!("{}.floor", cfg.consumer.group_id);
    let consumer: BaseConsumer = reconciler::kafka::client_config(
        &reconciler::kafka::CONSUMER_DEFAULTS,
        &cfg.kafka,
        &[("group.id", group.as_str()), ("enable.auto.commit", "false")],
    )
    .create()
    .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&cfg.topics.events, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    args.seed = 4;
    let opts = args.options(&cfg, reconciler::clock::now_ms() + PUBLISH_LEAD.as_millis() as i64).unwrap();
    let run_start = opts.start_ms;
    let busy = Busy::start(&sharing_cores(&cfg, None), clock_ticks());
    let mut quarters = Quarters::new(run_start, secs, sharing_cores(&cfg, None), clock_ticks());
    let paced = publish_paced(cfg, opts);
    let mut busy_report = None;
    use rdkafka::Message;
    let codec = Codec::new();
    // (event time, latency) of each event.
    let mut timed = Vec::new();
    let mut last = Instant::now();
    while !paced.done() || last.elapsed() < Duration::from_secs(3) {
        if paced.done() {
            busy_report.get_or_insert_with(|| busy.report());
            quarters.finish();
        } else {
            quarters.tick();
        }
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else { continue };
        let now = reconciler::clock::now_ms();
        last = Instant::now();
        if let Some(ev) = m.payload().and_then(|b| codec.decode_event(b).ok()) {
            if ev.occurred_at >= run_start && ev.occurred_at <= now {
                timed.push((ev.occurred_at, now - ev.occurred_at));
            }
        }
    }
    paced.thread.join().unwrap();
    let by_quarter = quarters.report(timed.iter().copied());
    let mut lat: Vec<i64> = timed.into_iter().map(|(_, ms)| ms).collect();
    lat.sort_unstable();
    (lat, busy_report.unwrap_or_else(|| busy.report()), by_quarter)
}

/// The broker (when `scripts/broker.sh` started it), the pipeline (when
/// running) and this harness, by pid: what shares the cores.
fn sharing_cores(cfg: &Config, pipeline: Option<u32>) -> Vec<(&'static str, u32)> {
    let brokers = cfg.kafka.get("bootstrap.servers").map_or("", String::as_str);
    let broker = broker_pid(brokers).map(|pid| ("broker", pid));
    let pipeline = pipeline.map(|pid| ("pipeline", pid));
    broker.into_iter().chain(pipeline).chain([("harness", std::process::id())]).collect()
}

/// Runs the latency step.
fn latency(brokers: &str, partitions: i32, prefix: &str, rate: f64, secs: u64) -> Step {
    let (cfg, file) = config(brokers, prefix, partitions);
    let t = cfg.topics.clone();
    admin::ensure_topics(&cfg.kafka, &t.all(), partitions, 1).unwrap();
    // Its log to a file, kept after the run (nothing reads a pipe while it
    // runs, and a debug log is how its batches are timed:
    // RECONCILER_LOG=warn,reconciler::pipeline=debug).
    let log = std::env::temp_dir().join(format!("{prefix}.log"));
    let mut args = Workload {
        operations: 200,
        entities: None,
        seed: 2,
        rate: rate as u64,
        event_time: EventTime::Now,
        confirm_within_ms: 300_000,
        truth: None,
        quiet: true,
        faults: loadgen::Faults::default(),
    };
    let per_unit = loadgen::records_per_unit(&args.options(&cfg, 0).unwrap());
    let operations = (rate * secs as f64 / per_unit) as u64;
    let (floor, floor_busy, floor_quarters) =
        input_floor(&cfg, partitions, Workload { operations, ..args.clone() }, secs);
    let mut child = spawn_logged(&file, &["run"], &log);
    // Warm-up: the pipeline has joined its group once these are judged.
    let warm = args.options(&cfg, reconciler::clock::now_ms()).unwrap();
    let (_, truth) = loadgen::publish(&cfg, Generator::new(warm), false, false).unwrap();
    let mut reader = TopicReader::new(&cfg.kafka, &[&t.verdicts], partitions).unwrap();
    assert!(
        reader.read_until(Duration::from_secs(120), |r| r.len() as u64 >= truth.verdict_count - truth.timer_verdicts)
    );
    let skip = reader.records.len();
    args.operations = operations;
    args.seed = 3;
    // The first record due PUBLISH_LEAD from now: the publisher is
    // connected by then. With 200 ms, records due while it started (about
    // 1.4 s of them) went out in one burst, and their wait was counted as
    // latency.
    let opts = args.options(&cfg, reconciler::clock::now_ms() + PUBLISH_LEAD.as_millis() as i64).unwrap();
    let run_start = opts.start_ms;
    let busy = Busy::start(&sharing_cores(&cfg, Some(child.id())), clock_ticks());
    let mut quarters = Quarters::new(run_start, secs, sharing_cores(&cfg, Some(child.id())), clock_ticks());
    let paced = publish_paced(cfg.clone(), opts);
    // The verdicts are read once the step is over, not while it runs. A
    // verdict's latency ends at its record's timestamp (when the pipeline
    // handed it to its producer), which reading it later does not change;
    // a reader beside the pipeline took a sixth of a core of the two it
    // measured (0.17 at 85,000 records/s: copying each record, decoding each
    // verdict), and no deployment runs its downstream services on the
    // reconciler's cores.
    let ticks = clock_ticks();
    let mut proc = ProcSample::default();
    loop {
        quarters.tick();
        if let Some(s) = sample(child.id(), ticks) {
            proc = s;
        }
        match paced.finished.recv_timeout(Duration::from_millis(100)) {
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Over the paced window, not the reading after it.
    let busy_report = busy.report();
    let step_cpu = busy.cpu_s("pipeline");
    quarters.finish();
    // Everything the pipeline published: read until nothing new came for
    // three seconds.
    let mut quiet_since = Instant::now();
    let mut read = reader.records.len();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        reader.read_until(Duration::from_millis(200), |_| false);
        if let Some(s) = sample(child.id(), ticks) {
            proc = s;
        }
        if reader.records.len() > read {
            read = reader.records.len();
            quiet_since = Instant::now();
        }
    }
    let codec = Codec::new();
    // (when produced, latency) of each verdict.
    let mut timed: Vec<(i64, i64)> = Vec::new();
    let now = reconciler::clock::now_ms();
    for r in &reader.records[skip..] {
        let Some(v) = r.value.as_deref().and_then(|b| codec.decode_verdict(b).ok()) else { continue };
        // The verdict's record timestamp: when the pipeline handed it
        // to its producer (after the state commit). Timer verdicts and
        // triggers stamped in the future (the beyond-window story) are
        // not event→verdict latencies.
        let produced = r.timestamp.unwrap_or(now);
        if v.decided_at >= run_start && !v.trigger_event_id.starts_with("deadline:") && v.decided_at <= produced {
            timed.push((produced, produced - v.decided_at));
        }
    }
    let published = paced.thread.join().unwrap().0;
    stop(&mut child);
    if let Ok(path) = std::env::var("E2E_LATENCY_DUMP") {
        // One line per verdict: when it was produced (ms since the epoch)
        // and its event→verdict latency, to line slow ones up with the
        // pipeline's batch log.
        let lines: String = timed.iter().map(|(at, ms)| format!("{at} {ms}\n")).collect();
        std::fs::write(&path, lines).expect("writing E2E_LATENCY_DUMP");
        println!("latency:     each verdict's production time and latency: {path}");
    }
    let mut lat: Vec<i64> = timed.iter().map(|(_, ms)| *ms).collect();
    lat.sort_unstable();
    let pct = |p: f64| percentile(&lat, p);
    println!(
        "latency:     the input's own path (event time → a bare consumer of the input topic, same client settings): p50 {} ms, p99 {} ms over {} events",
        percentile(&floor, 0.50),
        percentile(&floor, 0.99),
        floor.len()
    );
    println!(
        "latency:     at {:.0} records/s target ({:.0} achieved, {} records): event→verdict p50 {} ms, p99 {} ms, max {} ms over {} verdicts; peak RSS {:.0} MB",
        rate,
        // Over the paced window (the publisher waits PUBLISH_LEAD for the first).
        published.records as f64 / published.elapsed.saturating_sub(PUBLISH_LEAD).as_secs_f64().max(1e-3),
        published.records,
        pct(0.50),
        pct(0.99),
        lat.last().copied().unwrap_or(-1),
        lat.len(),
        proc.peak_rss_mb
    );
    println!("latency:     busy while published: input path alone {floor_busy}; pipeline step {busy_report}");
    // What a deployment at this rate pays per record: smaller batches
    // share each batch's fixed costs (the store write, the produce
    // requests, the wake-ups) among fewer records than at full rate.
    let cpu_per_million = step_cpu.map(|cpu| cpu / published.records.max(1) as f64 * 1e6);
    if let Some(cpu) = cpu_per_million {
        println!("latency:     the pipeline's CPU while published: {cpu:.2} CPU s per 1M records at this rate");
    }
    // By event time (a verdict's decided_at, its trigger's), as the input path's.
    let by_event_time = timed.iter().map(|(produced, ms)| (produced - ms, *ms));
    for (q, (input, pipeline)) in floor_quarters.iter().zip(quarters.report(by_event_time)).enumerate() {
        println!("latency:     quarter {} of the step: input path alone {input}; pipeline {pipeline}", q + 1);
    }
    println!("latency:     the pipeline's log: {}", log.display());
    // Its state directory (about 0.5 GB), like the main run's.
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(prefix));
    Step { p50: pct(0.50), p99: pct(0.99), cpu_per_million }
}
