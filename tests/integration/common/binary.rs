//! `reconciler run`, the binary users run, as a child process with its
//! HTTP server: what `/readyz` and `/metrics` answer while a fault lasts,
//! how it exits and what it says when it does.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use reconciler::config::Config;

/// One `reconciler run` process.
pub struct Binary {
    child: Child,
    /// Its log (stderr, appended across restarts of the same name).
    pub log: PathBuf,
    /// Where its HTTP server listens.
    pub addr: SocketAddr,
}

impl Binary {
    /// Starts `reconciler --config FILE run` with `cfg` written whole to
    /// `dir/name/reconciler.toml`, its HTTP server on a free port, its log
    /// appended to `dir/name.log`; returns once the server answers.
    pub fn spawn(cfg: &Config, dir: &Path, name: &str) -> Binary {
        let addr: SocketAddr = format!("127.0.0.1:{}", super::free_port()).parse().unwrap();
        let mut cfg = cfg.clone();
        cfg.http.bind = addr.to_string();
        let file = super::child::write_full_config(&cfg, &dir.join(name));
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_reconciler"));
        // Only the file configures it.
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("RECONCILER_")) {
            cmd.env_remove(k);
        }
        let child = cmd
            .arg("--config")
            .arg(&file)
            .arg("run")
            .env("RECONCILER_LOG", "info,rdkafka=warn")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut b = Binary { child, log, addr };
        let up = super::wait_for(Duration::from_secs(60), || {
            b.exited().is_some() || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
        });
        assert!(up && b.exited().is_none(), "reconciler run did not serve HTTP on {addr}; log:\n{}", b.log_tail());
        b
    }

    /// `/readyz`'s status code and body.
    pub fn readyz(&self) -> (u16, String) {
        super::http::request(self.addr, "GET", "/readyz", &[], "")
    }

    /// The value of the series `name` (without labels) on `/metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, text) = super::http::request(self.addr, "GET", "/metrics", &[], "");
        text.lines()
            .filter_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .find_map(|v| v.trim().parse().ok())
    }

    /// Waits until `/readyz` answers 200; whether it did within `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        super::wait_for(timeout, || self.readyz().0 == 200)
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits up to `timeout` for it to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        super::wait_for(timeout, || {
            status = self.exited();
            status.is_some()
        });
        status
    }

    /// `kill -TERM` and wait: it finishes its batch and exits 0.
    pub fn stop(mut self) {
        super::child::signal(self.child.id(), "TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "SIGTERM exits 0, got {status:?}; log:\n{}", self.log_tail());
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        super::child::tail(&self.log)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// After a fault: waits for the rest of `paced`'s workload and compares
/// the outputs with its ground truth (`loadgen verify`), waits for the group
/// to settle (every timer fired consumed back and committed), stops
/// `instance`, and checks I1–I3 against a reference run over the input log.
/// Prints the figures as `suite: ...`; the caller asserts on them.
pub fn verify_and_check(
    cfg: &Config,
    paced: super::Paced,
    instance: Binary,
    suite: &str,
) -> (super::check::Figures, reconciler::loadgen::verify::Report) {
    use super::check;
    let (published, truth) = paced.join();
    let report =
        reconciler::loadgen::verify::verify(cfg, &truth, Duration::from_secs(180), Duration::from_secs(2)).unwrap();
    let settled =
        check::wait_settled(cfg, truth.verdict_count as usize, Duration::from_secs(120), || instance.readyz().0 == 200);
    if let Err(why) = settled {
        panic!("{why}; log:\n{}\n{why}", instance.log_tail());
    }
    instance.stop();
    let input = check::read_all(cfg, &[&cfg.topics.events]);
    let outputs = check::read_all(cfg, &check::output_topics(cfg));
    let f = check::check(cfg, &input, &outputs, &[&cfg.state_dir]);
    println!(
        "{suite}: records in {} ({} published by the workload), verdicts out {} distinct of {} expected, \
         outputs {}, byte-identical repeats {}, losses {}, non-identical repeats {}; loadgen verify: {}",
        f.inputs,
        published.records,
        report.verdicts_seen,
        truth.verdict_count,
        f.outputs,
        f.duplicates,
        f.losses,
        f.divergent,
        if report.complete && report.agrees() { "AGREE" } else { "DISAGREE" }
    );
    (f, report)
}
