//! The state directory's volume full in the middle of a run.
//!
//! The state directory lives on a tmpfs of its own (mounting one needs
//! root: the test says so and fails without it). In the middle of the run
//! the volume is shrunk to what it holds plus a little, so that the
//! pipeline's own next writes fill it, whatever the store's format makes
//! each batch weigh. The pipeline must stop, exit non-zero, and say which
//! directory is full and that it needs space; the group's committed offsets
//! must not be past what the store holds. Then the volume is given room
//! again and a restart must lose nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use common::binary::Binary;
use common::check;
use reconciler::store::Store;

/// A tmpfs mounted on a directory; unmounted when dropped, however the
/// test ends (declare it before anything that writes there, so that it is
/// dropped after them).
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (a mount option value, e.g. `64m`) on `dir`.
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "this test mounts a tmpfs for the state directory, which needs root (CI runs the suites as root); run it as root"
        );
        mount(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", dir.to_str().unwrap()]);
        Tmpfs { dir: dir.to_owned() }
    }

    /// Changes the volume's size (down to what it holds, at least).
    fn resize(&self, size: &str) {
        mount(&["-o", &format!("remount,size={size}"), self.dir.to_str().unwrap()]);
    }

    /// Bytes in use on the volume.
    fn used(&self) -> u64 {
        let path = std::ffi::CString::new(self.dir.to_str().unwrap()).unwrap();
        // SAFETY: `path` is a NUL-terminated string and `stat` a properly
        // sized, writable statvfs that the call fills.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0, "statvfs {}", self.dir.display());
        (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let dir = self.dir.to_str().unwrap();
        let unmounted = Command::new("umount").arg(dir).status().is_ok_and(|s| s.success());
        if !unmounted {
            // Something still holds it open: detach it now, freed when let go.
            let _ = Command::new("umount").args(["-l", dir]).status();
        }
    }
}

fn mount(args: &[&str]) {
    let out = Command::new("mount").args(args).output().expect("running mount");
    assert!(out.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_full_state_volume_stops_the_pipeline_naming_the_directory_and_a_restart_with_room_loses_nothing() {
    let _serial = common::serial();
    let mut cfg = common::config("diskfull");
    let volume = Tmpfs::mount(&common::temp_dir("diskfull-volume"), "64m");
    cfg.state_dir = volume.dir.join("state");
    let t = &cfg.topics;
    reconciler::kafka::admin::ensure_topics(&cfg.kafka, &t.all(), t.partitions, 1).unwrap();
    let dir = common::temp_dir("diskfull-run");

    // About 40 s of input at 300 records/s.
    let paced = common::Paced::start(&cfg, 3_000, 43, 300);
    let expected = paced.expected.verdict_count as usize;
    let mut first = Binary::spawn(&cfg, &dir, "reconciler");
    assert!(first.wait_ready(Duration::from_secs(60)), "never ready; log:\n{}", first.log_tail());
    let mut verdicts = common::VerdictCount::new(&cfg);
    assert!(
        common::wait_for(Duration::from_secs(90), || verdicts.now() >= expected / 5),
        "no progress to a fifth of the verdicts; log:\n{}",
        first.log_tail()
    );

    // Mid-run: the volume keeps what it holds and 256 KiB more.
    let used = volume.used();
    volume.resize(&format!("{}k", used / 1024 + 256));
    let full_at = Instant::now();
    let status = first.wait_exit(Duration::from_secs(120));
    let stopped_after = full_at.elapsed();
    let verdicts_at_stop = verdicts.now();
    let mid_run = !paced.finished();
    let status =
        status.unwrap_or_else(|| panic!("still running 120 s after its volume filled; log:\n{}", first.log_tail()));
    let log = std::fs::read_to_string(&first.log).unwrap();
    let error = log.lines().rfind(|l| l.starts_with("error: ")).unwrap_or_default().to_owned();
    drop(first);
    // The offsets committed by then, and those stored (read once the
    // volume has room again: opening the store writes).
    let committed = check::committed(&cfg);
    volume.resize("64m");
    let stored: BTreeMap<i32, i64> = {
        let store = Store::open(&cfg.state_dir, &cfg.topics.events, false).expect("the store opens once it has room");
        (0..cfg.topics.partitions).filter_map(|p| store.next_offset(p).unwrap().map(|n| (p, n))).collect()
    };

    // A restart with room goes on from the stored offsets.
    let second = Binary::spawn(&cfg, &dir, "reconciler");
    let (f, report) = common::binary::verify_and_check(&cfg, paced, second, "disk full");

    println!(
        "disk full: volume shrunk to {} KiB after {verdicts_at_stop} of {expected} verdicts; the pipeline stopped {:.1} s \
         later ({status}) with: {error}",
        used / 1024 + 256,
        stopped_after.as_secs_f64()
    );
    println!("disk full: committed offsets {committed:?}, stored offsets {stored:?}");
    assert!(mid_run && verdicts_at_stop < expected, "the volume filled after the run, not in the middle of it");
    assert!(!status.success(), "a pipeline that cannot write its state exits non-zero, got {status}");
    let state_dir = cfg.state_dir.display().to_string();
    assert!(
        error.contains(&state_dir) && error.contains("out of disk space") && error.contains("free"),
        "the error names the state directory {state_dir} and that it needs space: {error}"
    );
    assert!(committed.values().any(|n| *n > 0), "nothing was committed before the volume filled");
    for (p, n) in &committed {
        let at = stored.get(p).copied().unwrap_or(0);
        assert!(*n <= at, "partition {p}: the group's offset {n} is past the stored offset {at}");
    }
    assert!(report.complete && report.agrees(), "{}", report.render());
    assert_eq!((f.losses, f.divergent), (0, 0));
}
