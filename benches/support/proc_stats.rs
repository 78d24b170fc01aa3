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

/// The CPU time (user + system) and peak RSS of process `pid`.
pub fn sample(pid: u32, ticks: f64) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let cpu = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = hwm.split_whitespace().nth(1)?.parse().ok()?;
    Some(ProcSample { cpu_s: cpu, peak_rss_mb: kb / 1024.0 })
}
