//! Workload runs of the reliability suites (tests/integration/reliability.rs,
//! tests/integration/exactly_once.rs): a config with topics, group and state
//! of its own, child instances, and the waits and checks around them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::check::{self, Figures};
use super::child::Instance;
use reconciler::clock::system_clock;
use reconciler::config::Config;
use reconciler::core::Output;
use reconciler::demo;
use reconciler::records::InputRecord;

/// A workload run: its config (own topics, group, state), the config file
/// for child instances, and how many verdicts settle it.
pub struct Run {
    pub cfg: Config,
    pub dir: PathBuf,
    pub config_file: PathBuf,
    pub records: usize,
    pub verdicts: usize,
}

impl Run {
    /// Creates the topics and publishes `copies` copies of the demo workload.
    pub fn new(name: &str, copies: usize, batch_size: usize) -> Run {
        let (run, workload) = Run::prepare(name, copies, batch_size, None);
        demo::publish(&run.cfg, &workload).unwrap();
        run
    }

    /// Creates the topics (on `brokers`, else the test broker) and returns
    /// the workload to publish.
    pub fn prepare(name: &str, copies: usize, batch_size: usize, brokers: Option<&str>) -> (Run, Vec<InputRecord>) {
        Run::prepare_with(name, copies, batch_size, |cfg| {
            if let Some(b) = brokers {
                cfg.kafka.insert("bootstrap.servers".into(), b.to_owned());
            }
        })
    }

    /// [`Run::prepare`] with the config changed by `configure` first.
    pub fn prepare_with(
        name: &str,
        copies: usize,
        batch_size: usize,
        configure: impl FnOnce(&mut Config),
    ) -> (Run, Vec<InputRecord>) {
        let mut cfg = super::config(name);
        configure(&mut cfg);
        demo::configure(&mut cfg);
        cfg.consumer.batch_size = batch_size;
        // Short windows, so that every timer of the workload fires within
        // seconds, and a short session, so that a killed member's partitions
        // move on quickly.
        cfg.time.reorder_window_ms = 2_000;
        cfg.kafka.insert("session.timeout.ms".into(), "6000".into());
        cfg.kafka.insert("heartbeat.interval.ms".into(), "1000".into());
        // A member killed in the middle of a join holds the group's next
        // rebalance for its rebalance timeout (`max.poll.interval.ms`, 5 min
        // by default): a full-suite run saw a survivor handed no partition
        // for the 120 s of its settle after the crash suite killed an
        // instance that had just joined. A short one bounds that wait.
        cfg.kafka.entry("max.poll.interval.ms".into()).or_insert_with(|| "20000".into());
        let start = (system_clock())();
        let records = demo::workload(start, copies);
        let (outputs, _) = demo::predict(&cfg, &records, start + 3_600_000);
        let verdicts = outputs.iter().filter(|o| matches!(o, Output::Verdict(_))).count();
        let t = &cfg.topics;
        reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
        let dir = super::temp_dir(&format!("{name}-run"));
        let config_file = super::child::write_config(&cfg, &dir);
        (Run { cfg, dir, config_file, records: records.len(), verdicts }, records)
    }

    /// Publishes part `i` of `n` of the workload (in order).
    pub fn publish_part(&self, workload: &[InputRecord], i: usize, n: usize) {
        let (a, b) = (workload.len() * i / n, workload.len() * (i + 1) / n);
        demo::publish(&self.cfg, &workload[a..b]).unwrap();
    }

    /// After a member died or stalled: the broker expires it once its
    /// session (6 s) passes and hands its partitions to the survivor, which
    /// catches up.
    pub fn wait_taken_over(&self, what: &str) {
        assert!(self.wait_caught_up(Duration::from_secs(90)), "the survivor did not take over after {what}");
    }

    /// Waits until the group's committed offsets reach the end of the input
    /// (everything published so far is processed and its outputs acked).
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if check::caught_up(&self.cfg) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200)); // polling interval
        }
        false
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("reconciler.log")
    }

    pub fn spawn(&self, failpoints: Option<&str>) -> Instance {
        Instance::spawn(&self.config_file, None, failpoints, &self.log())
    }

    /// A named instance with a state directory of its own (and its own log).
    pub fn spawn_named(&self, name: &str, state_dir: &Path, failpoints: Option<&str>) -> Instance {
        Instance::spawn(&self.config_file, Some(state_dir), failpoints, &self.dir.join(format!("{name}.log")))
    }

    /// Starts an instance armed with crash point `spec` and waits until it
    /// crashes there (iteration `seed`, for the message).
    pub fn crash_with(&self, seed: u64, spec: &str) {
        let mut i = self.spawn(Some(spec));
        assert!(
            wait_crash(&mut i, Duration::from_secs(90)),
            "seed {seed}: {spec} never crashed; log:\n{}",
            i.log_tail()
        );
    }

    /// Distinct verdicts published so far.
    pub fn verdicts_so_far(&self) -> usize {
        let recs = check::read_all(&self.cfg, &[&self.cfg.topics.verdicts]);
        recs.iter().filter_map(|r| r.value.as_deref()).collect::<std::collections::HashSet<_>>().len()
    }

    /// Waits until at least `n` distinct verdicts were published.
    pub fn wait_verdicts(&self, n: usize, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.verdicts_so_far() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200)); // polling interval, not a wait for a condition
        }
        false
    }

    /// I4 with the instance running, then stops it and checks I1–I3.
    pub fn settle_and_check(&self, running: Vec<Instance>, state_dirs: &[&Path]) -> Figures {
        // Settled also means the running instances own every partition: an
        // instance started right after a crash waits for the dead member's
        // session to expire, while the dead member's committed offsets
        // already look caught up.
        let partitions = self.cfg.topics.partitions as usize;
        let settled = check::wait_settled(&self.cfg, self.verdicts, Duration::from_secs(120), || {
            let owned: usize = running.iter().map(Instance::owned).sum();
            owned == partitions && running.iter().all(Instance::ready)
        });
        let tails: Vec<String> = running.iter().map(Instance::log_tail).collect();
        for i in running {
            i.stop();
        }
        if let Err(why) = settled {
            panic!("I4: {why}; log:\n{}\nI4: {why}", tails.join("\n--\n"));
        }
        let input = check::read_all(&self.cfg, &[&self.cfg.topics.events]);
        let outputs = check::read_all(&self.cfg, &check::output_topics(&self.cfg));
        check::check(&self.cfg, &input, &outputs, state_dirs)
    }
}

/// Waits for a child to hit its crash point (it aborts).
pub fn wait_crash(i: &mut Instance, timeout: Duration) -> bool {
    super::wait_for(timeout, || i.crashed())
}

/// The port of the test broker (KAFKA_BROKERS) plus one: a broker of the
/// bounce suite's own, so that killing it disturbs no other test.
pub fn bounce_port() -> u16 {
    let brokers = super::brokers();
    let port: u16 = brokers.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(9092);
    std::env::var("BOUNCE_BROKER_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(port + 1)
}

/// `scripts/broker.sh VERB` on `port` with the engine of the test broker:
/// `BROKER_ENGINE`, Apache Kafka unless set.
pub fn broker(verb: &str, port: u16) {
    broker_engine(verb, port, &engine())
}

/// The engine of the brokers the suites start (`scripts/broker.sh`).
pub fn engine() -> String {
    std::env::var("BROKER_ENGINE").unwrap_or_else(|_| "kafka".into())
}

/// `scripts/broker.sh VERB ENGINE` on `port`.
pub fn broker_engine(verb: &str, port: u16, engine: &str) {
    broker_script(port, &[verb, engine], &[]);
}

/// `scripts/broker.sh ARGS...` on `port` with `env` set; its output.
pub fn broker_script(port: u16, args: &[&str], env: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/broker.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .env("BROKER_PORT", port.to_string())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "broker.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the bounce broker however the test ends.
pub struct BounceBroker(pub u16);

impl Drop for BounceBroker {
    fn drop(&mut self) {
        broker("stop", self.0);
    }
}

/// Lines of `log` from byte `from` on.
pub fn log_since(log: &Path, from: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.get(from..).unwrap_or_default().lines().map(str::to_owned).collect()
}

pub fn log_len(log: &Path) -> usize {
    std::fs::metadata(log).map_or(0, |m| m.len() as usize)
}

/// After resuming (log position `mark`), the zombie committed no batch
/// before it learned of the rebalance (a partition revoked or assigned, or
/// a batch fenced). Returns the number of batches fenced.
pub fn assert_zombie_wrote_nothing(log: &Path, mark: usize) -> usize {
    let after = log_since(log, mark);
    let first_move = after
        .iter()
        .position(|l| l.contains("revoked") || l.contains("assigned") || l.contains("Batch dropped"))
        .unwrap_or(after.len());
    let zombie_batches: Vec<&String> = after[..first_move].iter().filter(|l| l.contains("Batch committed")).collect();
    assert!(zombie_batches.is_empty(), "the resumed zombie wrote batches before the rebalance: {zombie_batches:#?}");
    after.iter().filter(|l| l.contains("Batch dropped")).count()
}

/// Whether process `pid` is stopped (SIGSTOP).
pub fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'))
}
