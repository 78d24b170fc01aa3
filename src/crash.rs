//! Crash points for the reliability suites (tests/integration/reliability.rs
//! and the others that kill a process at a chosen step), all named here.
//!
//! [`point`] is a fail point of the `fail` crate whose `return` action
//! aborts the process on the spot, like `kill -9`: no destructor runs,
//! nothing is flushed beyond what the code already made durable
//! (`return(stop)` stops the process instead: a zombie). The child
//! processes of the tests arm them through the `FAILPOINTS` environment
//! variable, e.g. `FAILPOINTS=pipeline::after_store=3*off->return` crashes
//! at the fourth batch written to the store.
//!
//! Without the `failpoints` feature (any plain `cargo build`, so the
//! release binary) a crash point is an empty inline function: zero cost,
//! and no environment variable can make the binary crash.
//!
//! This module depends on nothing of the crate, so every program (the
//! pipeline, the probe worker, the relay, the operator tools) marks its
//! steps without depending on another.

use std::fmt;

/// Whether this build has its crash points (the `failpoints` feature).
pub const ARMED: bool = cfg!(feature = "failpoints");

/// A step of a program where a test may end the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// A batch applied in memory half-way, nothing written yet.
    MidBatch,
    /// State, offsets and the batch's outputs written; nothing published.
    AfterStore,
    /// Outputs acknowledged by the broker; the stored outputs not yet
    /// cleared.
    AfterPublish,
    /// DeadlineReached events published; not yet recorded as fired.
    TimerFired,
    /// On restart: the outputs a previous run left unacknowledged
    /// re-published, not yet cleared.
    AfterRepublish,
    /// Restoring a partition: changelog records read into the store, or
    /// input records applied silently.
    Restoring,
    /// Under exactly-once: outputs and offsets sent in the open
    /// transaction; not committed.
    BeforeCommit,
    /// Under exactly-once: the transaction committed; the state not yet
    /// written to the store.
    AfterCommit,
    /// Inside a timer firing: its `DeadlineReached` events sent, their
    /// acknowledgements not awaited (some, all or none of them in the log).
    TimerSent,
    /// A batch's changelog records acknowledged but not its offsets
    /// records: the changelog ends with a batch cut short
    /// (src/store/restoring.rs).
    ChangelogCut,
    /// Probe worker: answers stored in its ledger; nothing published.
    ProbeAfterLedger,
    /// Probe worker: answers acknowledged by the broker; the offsets not
    /// yet moved.
    ProbeAfterPublish,
    /// Outbox relay: a claimed batch acknowledged by the broker; not yet
    /// marked published.
    RelayPublished,
    /// Dead letters re-published to the input and their `sending` audit
    /// written; the `sent` audit not yet (src/operator/dlq.rs).
    DlqRedriven,
    /// Outbox dead letters pending again and audited in the open
    /// transaction; not committed (src/outbox/dead_letter.rs).
    OutboxRedriven,
}

impl CrashPoint {
    /// Its name, as `FAILPOINTS` arms it.
    pub const fn name(self) -> &'static str {
        match self {
            CrashPoint::MidBatch => "pipeline::mid_batch",
            CrashPoint::AfterStore => "pipeline::after_store",
            CrashPoint::AfterPublish => "pipeline::after_publish",
            CrashPoint::TimerFired => "pipeline::timer_fired",
            CrashPoint::AfterRepublish => "pipeline::after_republish",
            CrashPoint::Restoring => "pipeline::restoring",
            CrashPoint::BeforeCommit => "pipeline::before_commit",
            CrashPoint::AfterCommit => "pipeline::after_commit",
            CrashPoint::TimerSent => "pipeline::timer_sent",
            CrashPoint::ChangelogCut => "pipeline::changelog_cut",
            CrashPoint::ProbeAfterLedger => "probe::after_ledger",
            CrashPoint::ProbeAfterPublish => "probe::after_publish",
            CrashPoint::RelayPublished => "relay::published",
            CrashPoint::DlqRedriven => "dlq::redriven",
            CrashPoint::OutboxRedriven => "outbox::redriven",
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The crash points of the pipeline's batch, in the order of its life.
pub const CRASH_POINTS: [CrashPoint; 6] = [
    CrashPoint::MidBatch,
    CrashPoint::AfterStore,
    CrashPoint::AfterPublish,
    CrashPoint::TimerFired,
    CrashPoint::AfterRepublish,
    CrashPoint::Restoring,
];

/// The crash points only `guarantee = "exactly_once"` passes.
pub const EXACTLY_ONCE_CRASH_POINTS: [CrashPoint; 2] = [CrashPoint::BeforeCommit, CrashPoint::AfterCommit];

/// The crash point inside a timer firing (see [`CrashPoint::TimerSent`]).
pub const TIMER_SENT: CrashPoint = CrashPoint::TimerSent;

/// The crash point of the changelog's publication.
pub const CHANGELOG_CRASH_POINTS: [CrashPoint; 1] = [CrashPoint::ChangelogCut];

/// The crash points of the probe worker.
pub const PROBE_CRASH_POINTS: [CrashPoint; 2] = [CrashPoint::ProbeAfterLedger, CrashPoint::ProbeAfterPublish];

/// The crash points of the outbox relay.
pub const RELAY_CRASH_POINTS: [CrashPoint; 1] = [CrashPoint::RelayPublished];

/// The crash points of the operator's re-drives.
pub const REDRIVE_CRASH_POINTS: [CrashPoint; 2] = [CrashPoint::DlqRedriven, CrashPoint::OutboxRedriven];

/// Ends the process at once (SIGABRT: no unwinding, no flush).
pub fn crash(point: CrashPoint) -> ! {
    eprintln!("crash point {point} reached: aborting");
    std::process::abort()
}

/// Evaluates crash point `point`: armed with `return` it crashes the
/// process; with `return(stop)` the process stops itself (SIGSTOP, every
/// thread, as a zombie member would) and goes on where it was once resumed.
#[cfg(feature = "failpoints")]
pub fn point(point: CrashPoint) {
    match fail::eval(point.name(), |arg| arg) {
        None => {}
        Some(Some(arg)) if arg == "stop" => {
            eprintln!("crash point {point} reached: stopping");
            // raise() stops this thread before it returns (`kill -STOP` from
            // a child process let the thread run on for a few milliseconds).
            // SAFETY: raise has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        Some(_) => crash(point),
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn point(_point: CrashPoint) {}

/// Whether crash point `point` is reached now and armed, for a point that
/// stands between two halves of a step: the caller does the first half and
/// then [`crash`]es.
#[cfg(feature = "failpoints")]
pub fn fires(point: CrashPoint) -> bool {
    fail::eval(point.name(), |_| ()).is_some()
}

/// Without the `failpoints` feature: never.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fires(_point: CrashPoint) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crash point is in one group the suites arm, under a name of
    /// its own.
    #[test]
    fn every_crash_point_has_a_distinct_name_and_a_group() {
        let groups: Vec<CrashPoint> = CRASH_POINTS
            .iter()
            .chain(&EXACTLY_ONCE_CRASH_POINTS)
            .chain(&CHANGELOG_CRASH_POINTS)
            .chain(&PROBE_CRASH_POINTS)
            .chain(&RELAY_CRASH_POINTS)
            .chain(&REDRIVE_CRASH_POINTS)
            .chain(std::iter::once(&CrashPoint::TimerSent))
            .copied()
            .collect();
        let names: std::collections::BTreeSet<&str> = groups.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), groups.len(), "a name used twice");
        assert_eq!(groups.len(), 15);
    }
}
