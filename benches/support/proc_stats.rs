//! CPU time and peak RSS of a child process, from /proc: how the
//! end-to-end benches measure the binaries they start.

#![allow(dead_code)]

use std::process::Command;

/// The kernel's clock ticks per second (CPU times in /proc are in ticks).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU seconds and peak RSS of a running process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub cpu_s: f64,
    pub peak_rss_mb: f64,
}

/// The name and the CPU time (user + system, in ticks) of a process's or
/// thread's `stat` file.
fn name_and_cpu(stat: &str) -> Option<(&str, f64)> {
    // Fields after the command name (which may hold spaces) in parentheses.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let f: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    Some((&stat[open + 1..close], f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?))
}

/// The CPU time (user + system) and peak RSS of process `pid`.
pub fn sample(pid: u32, ticks: f64) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let cpu = name_and_cpu(&stat)?.1 / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = hwm.split_whitespace().nth(1)?.parse().ok()?;
    Some(ProcSample { cpu_s: cpu, peak_rss_mb: kb / 1024.0 })
}

/// Cores kept busy by some processes over a span: the CPU seconds each
/// used from [`Busy::start`] to [`Busy::report`], over the span's wall
/// time. The latency steps run the broker, the pipeline and the harness
/// on the same cores; a tail that grows with the cores they leave idle
/// shrinking is the machine's, not the pipeline's alone.
pub struct Busy {
    started: std::time::Instant,
    /// (name, pid, CPU seconds at the start).
    procs: Vec<(&'static str, u32, f64)>,
    ticks: f64,
}

impl Busy {
    /// Starts the span for `procs` (name, pid); a process whose /proc
    /// cannot be read is left out.
    pub fn start(procs: &[(&'static str, u32)], ticks: f64) -> Busy {
        let procs = procs.iter().filter_map(|(n, pid)| Some((*n, *pid, sample(*pid, ticks)?.cpu_s))).collect();
        Busy { started: std::time::Instant::now(), procs, ticks }
    }

    /// "broker 0.83, pipeline 0.61, harness 0.40 cores (of 2)" since the
    /// start.
    pub fn report(&self) -> String {
        let wall = self.elapsed();
        let each: Vec<String> =
            self.procs.iter().filter_map(|(n, _, _)| Some(format!("{n} {:.2}", self.cpu_s(n)? / wall))).collect();
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        format!("{} cores (of {cores})", each.join(", "))
    }

    /// CPU seconds process `name` used since the start, if it can still
    /// be read.
    pub fn cpu_s(&self, name: &str) -> Option<f64> {
        let (_, pid, cpu0) = self.procs.iter().find(|(n, _, _)| *n == name)?;
        Some(sample(*pid, self.ticks)?.cpu_s - cpu0)
    }

    /// Wall seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64().max(1e-3)
    }
}

/// The pid of the broker `scripts/broker.sh` started on the port of
/// `brokers` (from its pid file), if it did.
pub fn broker_pid(brokers: &str) -> Option<u32> {
    let port = brokers.split(',').next()?.rsplit(':').next()?;
    let dir = std::env::var("RECONCILER_RUN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".run"));
    std::fs::read_to_string(dir.join(format!("broker-{port}.pid"))).ok()?.trim().parse().ok()
}

/// What a thread of the reconciler does, from its name (threads that
/// nobody named inherit the process's, hence the main-thread check).
fn thread_group(pid: u32, tid: u32, comm: &str) -> &'static str {
    if tid == pid {
        "run loop"
    } else if comm.starts_with("rdk:")
        || comm.starts_with("producer poll")
        || comm.starts_with("delivery report")
        || comm.starts_with("kafka-client")
    {
        "librdkafka"
    } else if comm.starts_with("rocksdb:") {
        "RocksDB"
    } else if comm.starts_with("rayon-") {
        "rayon pool"
    } else if comm.starts_with("metrics-sampler") {
        // The state gauges' scan of the store (pipeline/sampler.rs).
        "sampler"
    } else {
        "other"
    }
}

/// CPU seconds of each thread of a process seen so far, by thread id: a
/// thread keeps its last sample after it ends (what it used after that
/// sample is only in the process's total).
#[derive(Debug, Clone, Default)]
pub struct ThreadCpu {
    threads: std::collections::BTreeMap<u32, (&'static str, f64)>,
}

impl ThreadCpu {
    /// Reads every thread of `pid` now.
    pub fn sample(&mut self, pid: u32, ticks: f64) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
            let Some((comm, cpu)) = name_and_cpu(&stat) else { continue };
            self.threads.insert(tid, (thread_group(pid, tid, comm), cpu / ticks));
        }
    }

    /// CPU seconds by group ("run loop", "librdkafka", "RocksDB", "rayon
    /// pool", "other"), largest first.
    pub fn by_group(&self) -> Vec<(&'static str, f64)> {
        let mut groups: std::collections::BTreeMap<&'static str, f64> = Default::default();
        for (group, cpu) in self.threads.values() {
            *groups.entry(group).or_default() += cpu;
        }
        let mut out: Vec<_> = groups.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }

    /// "run loop 0.41, rayon pool 0.22, ..." cores: each group's CPU since
    /// `earlier` (a sample of the same process) over `wall` seconds.
    pub fn cores_since(&self, earlier: &ThreadCpu, wall: f64) -> String {
        let before: std::collections::BTreeMap<&str, f64> = earlier.by_group().into_iter().collect();
        let shown: Vec<String> = self
            .by_group()
            .iter()
            .map(|(g, s)| (g, (s - before.get(g).copied().unwrap_or(0.0)) / wall))
            .filter(|(_, c)| *c >= 0.005)
            .map(|(g, c)| format!("{g} {c:.2}"))
            .collect();
        shown.join(", ")
    }

    /// "run loop 6.90, librdkafka 1.93, ..." per 1M of `records`.
    pub fn per_million(&self, records: u64) -> String {
        let m = records as f64 / 1e6;
        let shown: Vec<String> =
            self.by_group().iter().filter(|(_, s)| s / m >= 0.005).map(|(g, s)| format!("{g} {:.2}", s / m)).collect();
        shown.join(", ")
    }
}
