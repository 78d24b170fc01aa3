//! Reconciler instances as child processes, so that tests can `kill -9`,
//! `SIGSTOP` and crash them.
//!
//! The child is the test binary itself, re-executed to run only its
//! `child_instance` test (see [`child_main`]), which runs the pipeline of
//! the library *as the tests link it*: with the crash points of the
//! `failpoints` feature, armed by `FAILPOINTS`. (The `reconciler` binary of
//! a plain build has none, and in a shared target directory it may have
//! been rebuilt from another branch.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use reconciler::config::Config;

/// Writes `cfg` as the TOML file the binary reads.
pub fn write_config(cfg: &Config, dir: &Path) -> PathBuf {
    let t = &cfg.topics;
    let mut toml = format!(
        "state_dir = {:?}\n[topics]\nevents = {:?}\nverdicts = {:?}\nanomalies = {:?}\ndlq = {:?}\ncommands = {:?}\nchangelog = {:?}\nfleet = {:?}\npartitions = {}\n\
         [consumer]\ngroup_id = {:?}\nbatch_size = {}\nbatch_wait_ms = {}\nmax_record_bytes = {}\n\
         [time]\nreorder_window_ms = {}\ntimer_interval_ms = {}\nretention_ms = {}\n[kafka]\n",
        cfg.state_dir,
        t.events,
        t.verdicts,
        t.anomalies,
        t.dlq,
        t.commands,
        t.changelog().unwrap_or_default(),
        t.fleet().unwrap_or_default(),
        t.partitions,
        cfg.consumer.group_id,
        cfg.consumer.batch_size,
        cfg.consumer.batch_wait_ms,
        cfg.consumer.max_record_bytes,
        cfg.time.reorder_window_ms,
        cfg.time.timer_interval_ms,
        cfg.time.retention_ms,
    );
    for (k, v) in &cfg.kafka {
        toml.push_str(&format!("{k:?} = {v:?}\n"));
    }
    let s = &cfg.security;
    toml.push_str(&format!(
        "[security]\ncontrol_keys = {:?}\nallow_unsigned_control = {}\n",
        s.control_keys, s.allow_unsigned_control
    ));
    if cfg.guarantee == reconciler::config::Guarantee::ExactlyOnce {
        // Top-level keys go before the first table.
        toml.insert_str(0, "guarantee = \"exactly_once\"\n");
        if let Some(id) = &cfg.consumer.transactional_id {
            toml = toml.replacen("[consumer]\n", &format!("[consumer]\ntransactional_id = {id:?}\n"), 1);
        }
    }
    for (ty, tc) in &cfg.types {
        toml.push_str(&format!("[types.{ty}]\n"));
        if let Some(ms) = tc.confirm_within_ms {
            toml.push_str(&format!("confirm_within_ms = {ms}\n"));
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("reconciler.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

const CHILD_CONFIG: &str = "RELIABILITY_CHILD_CONFIG";
const CHILD_STATE_DIR: &str = "RELIABILITY_CHILD_STATE_DIR";
const CHILD_READY_FILE: &str = "RELIABILITY_CHILD_READY_FILE";

/// What every child process starts with, when the environment variable
/// `config_var` names its config file (else it is the ignored test run
/// normally: `None`): the crash points armed by `FAILPOINTS`, logs to
/// stderr by `RECONCILER_LOG`, the config, and a flag SIGTERM sets.
fn child_setup(
    config_var: &str,
) -> Option<(fail::FailScenario<'static>, Config, std::sync::Arc<std::sync::atomic::AtomicBool>)> {
    let config = std::env::var_os(config_var)?;
    let failpoints = fail::FailScenario::setup();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RECONCILER_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let cfg = Config::load(Some(Path::new(&config))).expect("child config loads");
    let shutdown = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, shutdown.clone()).unwrap();
    Some((failpoints, cfg, shutdown))
}

/// The body of the `child_instance` test of the integration binary
/// (ignored, so it runs only when re-executed by [`Instance::spawn`]):
/// `reconciler run` with the config file named by the environment, until
/// SIGTERM. Crash points abort it; a pipeline error panics (exit 101).
pub fn child_main() {
    let Some((_failpoints, mut cfg, shutdown)) = child_setup(CHILD_CONFIG) else { return };
    if let Some(d) = std::env::var_os(CHILD_STATE_DIR) {
        cfg.state_dir = d.into();
    }
    let mut p = reconciler::pipeline::Pipeline::new(cfg, reconciler::clock::system_clock()).expect("pipeline starts");
    // Readiness (every owned partition restored and caught up) to a file
    // the test polls, as /readyz would answer it.
    if let Some(file) = std::env::var_os(CHILD_READY_FILE) {
        let metrics = p.metrics();
        std::thread::spawn(move || loop {
            let r = metrics.readiness();
            let _ = std::fs::write(&file, format!("{} {}", if r.ready { "ready" } else { "not ready" }, r.partitions));
            std::thread::sleep(std::time::Duration::from_millis(100)); // a sampling period
        });
    }
    p.run(&shutdown).expect("pipeline runs");
    eprintln!("child stats: {:?}", p.stats);
}

/// One `reconciler run` child process.
pub struct Instance {
    pub child: Child,
    pub log: PathBuf,
    ready_file: PathBuf,
}

impl Instance {
    /// Starts `reconciler --config FILE run`, with `failpoints` (the
    /// FAILPOINTS variable of the `fail` crate) when given. Logs (warn and
    /// up) are appended to `log`.
    pub fn spawn(config: &Path, state_dir: Option<&Path>, failpoints: Option<&str>, log: &Path) -> Instance {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_instance", "--ignored", "--nocapture", "--test-threads=1"]);
        let ready_file = log.with_extension(format!("{}.ready", unique_suffix()));
        cmd.env(CHILD_CONFIG, config).env(CHILD_READY_FILE, &ready_file).env_remove(CHILD_STATE_DIR);
        if let Some(d) = state_dir {
            cmd.env(CHILD_STATE_DIR, d);
        }
        // Batches and partition moves are logged: the zombie test reads them.
        cmd.env("RECONCILER_LOG", "warn,reconciler::pipeline=debug,reconciler::kafka::consumer=info")
            .env_remove("FAILPOINTS");
        if let Some(f) = failpoints {
            cmd.env("FAILPOINTS", f);
        }
        let child = cmd.stdout(Stdio::null()).stderr(out).spawn().unwrap();
        Instance { child, log: log.to_owned(), ready_file }
    }

    /// Whether the instance reports itself ready: assigned, every owned
    /// partition restored and caught up (what `/readyz` answers).
    pub fn ready(&self) -> bool {
        std::fs::read_to_string(&self.ready_file).is_ok_and(|s| s.starts_with("ready "))
    }

    /// How many input partitions the instance owns, as it last reported.
    pub fn owned(&self) -> usize {
        std::fs::read_to_string(&self.ready_file)
            .ok()
            .and_then(|s| s.rsplit(' ').next().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Whether it died of a crash point (SIGABRT). Panics if it exited any
    /// other way (a pipeline error is a failure, not an injected crash).
    pub fn crashed(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        match self.exited() {
            None => false,
            Some(s) if s.signal() == Some(6) => true,
            Some(s) => panic!("the instance exited with {s:?}, not at a crash point; log:\n{}", self.log_tail()),
        }
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        self.child.wait().unwrap();
    }

    /// `kill -TERM` and wait: the instance finishes its batch and exits 0.
    pub fn stop(mut self) {
        signal(self.child.id(), "TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "SIGTERM exits 0, got {status:?}; log:\n{}", tail(&self.log));
    }

    /// The last lines of the log, last first.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A suffix no other instance of this test run uses.
fn unique_suffix() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst).to_string()
}

/// Sends a signal by name (`kill -NAME pid`), without a libc dependency.
pub fn signal(pid: u32, name: &str) {
    Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
}

/// The last lines of an instance's log, oldest first, for a failure
/// message. 200: an instance that fires timers logs one line per timer, and
/// 25 lines of a stalled survivor (the exactly-once suite's intermittent
/// "not settled") showed only its last timer batch, not where it waited.
/// CI shows the start and the end of a long output, which cuts the middle
/// of a long message: so the latest lines come last, next to the reason,
/// and a message that ends in a tail states its reason again after it.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(200)..].join("\n")
}

/// Where the threads of a live process `pid` are, for the failure message
/// of a process that should have exited: each thread's name and its
/// innermost frames that have source (the standard library's and the
/// thread plumbing's left out), from gdb when the machine has it
/// (librdkafka's per-broker threads, always in their poll, are counted,
/// not shown). The whole dump goes to `dump`.
pub fn stacks(pid: u32, dump: &Path) -> String {
    let out = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx", "-ex", "thread apply all bt 40"])
        .stdin(Stdio::null())
        .output();
    let Ok(out) = out else { return "(no gdb on this machine: no stacks)".into() };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::write(dump, &text);
    let mut threads: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if line.starts_with("Thread ") {
            let name = line.rsplit('"').nth(1).unwrap_or("?").to_owned();
            threads.push((name, Vec::new()));
        } else if let (Some(rest), Some((_, frames))) = (line.strip_prefix('#'), threads.last_mut()) {
            let func =
                rest.split_once(" in ").map_or(rest.trim_start_matches(|c: char| c.is_ascii_digit()), |(_, f)| f);
            // The function without its arguments and generic parameters.
            let func = func.split(" (").next().unwrap_or("").trim();
            let func = func.split('<').next().filter(|f| !f.is_empty()).unwrap_or(func);
            let plumbing = ["__", "std::", "core::", "alloc::", "syscall", "cnd_", "{closure", "start_thread", "clone"];
            if line.contains(" at ") && !plumbing.iter().any(|p| func.starts_with(p)) && frames.len() < 5 {
                frames.push(func.to_owned());
            }
        }
    }
    if threads.is_empty() {
        // Attached to nothing (no such process, or ptrace refused): say why.
        let why = String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("no output").to_owned();
        return format!("(gdb showed no threads: {why})");
    }
    let brokers = threads.iter().filter(|(n, _)| n.starts_with("rdk:broker")).count();
    let mut lines: Vec<String> = threads
        .iter()
        .filter(|(n, _)| !n.starts_with("rdk:broker"))
        .map(|(n, f)| format!("  {n}: {}", f.join(" < ")))
        .collect();
    lines.push(format!("  ({brokers} rdk:broker threads; all stacks in {})", dump.display()));
    lines.join("\n")
}

const PROBE_CHILD_CONFIG: &str = "PROBE_CHILD_CONFIG";

/// The body of the `probe_child_instance` test: `reconciler probe` with the
/// config file named by the environment, until SIGTERM (crash points armed
/// by `FAILPOINTS`).
pub fn probe_child_main() {
    let Some((_failpoints, cfg, shutdown)) = child_setup(PROBE_CHILD_CONFIG) else { return };
    let registry = ::prometheus::Registry::new();
    let mut worker = reconciler::probe::ProbeWorker::new(cfg, &registry).expect("probe worker starts");
    worker.run(&shutdown).expect("probe worker runs");
}

/// Writes the whole of `cfg` as a TOML file the binary reads.
pub fn write_full_config(cfg: &Config, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("reconciler.toml");
    std::fs::write(&file, toml::to_string(cfg).unwrap()).unwrap();
    file
}

/// Starts a `reconciler probe` child on `config`, `failpoints` armed when
/// given, logging to `log`.
pub fn spawn_probe(config: &Path, failpoints: Option<&str>, log: &Path) -> Instance {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "probe_child_instance", "--ignored", "--nocapture", "--test-threads=1"]);
    cmd.env(PROBE_CHILD_CONFIG, config).env("RECONCILER_LOG", "info").env_remove("FAILPOINTS");
    if let Some(f) = failpoints {
        cmd.env("FAILPOINTS", f);
    }
    let child = cmd.stdout(Stdio::null()).stderr(out).spawn().unwrap();
    Instance { child, log: log.to_owned(), ready_file: log.with_extension("no-ready-file") }
}

const RELAY_CHILD_CONFIG: &str = "RELAY_CHILD_CONFIG";

/// The body of the `relay_child_instance` test: `reconciler relay` with the
/// config file named by the environment, until SIGTERM (crash points armed
/// by `FAILPOINTS`).
pub fn relay_child_main() {
    let Some((_failpoints, cfg, shutdown)) = child_setup(RELAY_CHILD_CONFIG) else { return };
    let registry = ::prometheus::Registry::new();
    let mut relay = reconciler::outbox::relay::Relay::new(&cfg, &registry).expect("relay starts");
    let _server = cfg.relay.bind_addr().expect("relay.bind parses").map(|addr| {
        reconciler::http::Server::relay(addr, registry, relay.readiness()).expect("relay's HTTP server starts")
    });
    relay.run(&shutdown).expect("relay runs");
}

/// Starts a `reconciler relay` child on `config` (whose `[relay]
/// connection_env` variable is set to `connection`), `failpoints` armed
/// when given, logging to `log`.
pub fn spawn_relay(config: &Path, env: (&str, &str), failpoints: Option<&str>, log: &Path) -> Instance {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "relay_child_instance", "--ignored", "--nocapture", "--test-threads=1"]);
    cmd.env(RELAY_CHILD_CONFIG, config).env(env.0, env.1).env("RECONCILER_LOG", "info").env_remove("FAILPOINTS");
    if let Some(f) = failpoints {
        cmd.env("FAILPOINTS", f);
    }
    let child = cmd.stdout(Stdio::null()).stderr(out).spawn().unwrap();
    Instance { child, log: log.to_owned(), ready_file: log.with_extension("no-ready-file") }
}

/// The lines `child` writes to its piped stderr, each as it comes (the
/// receiver) and all of them once it exits (the thread's result).
pub fn stderr_lines(child: &mut Child) -> (std::sync::mpsc::Receiver<String>, std::thread::JoinHandle<Vec<String>>) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr is piped");
    let collector = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            lines.push(line);
        }
        lines
    });
    (rx, collector)
}
