//! Crash points for the reliability suites (tests/integration/reliability.rs).
//!
//! `point("name")` is a fail point of the `fail` crate whose `return`
//! action aborts the process on the spot, like `kill -9`: no destructor runs,
//! nothing is flushed beyond what the code already made durable
//! (`return(stop)` stops the process instead: a zombie). The child processes
//! of the tests arm them through the `FAILPOINTS` environment variable, e.g.
//! `FAILPOINTS=pipeline::after_store=3*off->return` crashes at the fourth
//! batch written to the store.
//!
//! Without the `failpoints` feature (any plain `cargo build`, so the
//! release binary) a crash point is an empty inline function: zero cost,
//! and no environment variable can make the binary crash.

/// Whether this build has its crash points (the `failpoints` feature).
pub const ARMED: bool = cfg!(feature = "failpoints");

/// The crash points, in the order of a batch's life.
pub const CRASH_POINTS: [&str; 6] = [
    // A batch applied in memory half-way, nothing written yet.
    "pipeline::mid_batch",
    // State, offsets and outbox written; nothing published.
    "pipeline::after_store",
    // Outputs acknowledged by the broker; the outbox not yet cleared.
    "pipeline::after_publish",
    // DeadlineReached events published; not yet recorded as fired.
    "pipeline::timer_fired",
    // On restart: the previous outbox re-published, not yet cleared.
    "pipeline::after_republish",
    // Restoring a partition: changelog records read into the store, or
    // input records applied silently.
    "pipeline::restoring",
];

/// The crash points only `guarantee = "exactly_once"` passes
/// (`src/pipeline/exactly_once.rs`).
pub const EXACTLY_ONCE_CRASH_POINTS: [&str; 2] = [
    // Outputs and offsets sent in the open transaction; not committed.
    "pipeline::before_commit",
    // The transaction committed; the state not yet written to the store.
    "pipeline::after_commit",
];

/// The crash point inside a timer firing: its `DeadlineReached` events
/// sent, their acknowledgements not awaited (some, all or none of them in
/// the log).
pub const TIMER_SENT: &str = "pipeline::timer_sent";

/// The crash point of the changelog's publication.
pub const CHANGELOG_CRASH_POINTS: [&str; 1] = [
    // A batch's changelog records acknowledged but its offsets records,
    // then the crash:
    // the changelog ends with a batch cut short (src/store/restoring.rs).
    "pipeline::changelog_cut",
];

/// The crash points of the probe worker (`src/probe/worker.rs`).
pub const PROBE_CRASH_POINTS: [&str; 2] = [
    // Answers stored in the worker's ledger; nothing published.
    "probe::after_ledger",
    // Answers acknowledged by the broker; the offsets not yet moved.
    "probe::after_publish",
];

/// The crash points of the outbox relay (`src/outbox/relay.rs`).
pub const RELAY_CRASH_POINTS: [&str; 1] = [
    // A claimed batch acknowledged by the broker; not yet marked published.
    "relay::published",
];

/// The crash points of the operator's re-drives.
pub const REDRIVE_CRASH_POINTS: [&str; 2] = [
    // Dead letters re-published to the input and their `sending` audit
    // written; the `sent` audit not yet (src/operator/dlq.rs).
    "dlq::redriven",
    // Outbox dead letters pending again and audited in the open
    // transaction; not committed (src/outbox/dead_letter.rs).
    "outbox::redriven",
];

/// Ends the process at once (SIGABRT: no unwinding, no flush).
pub fn crash(point: &str) -> ! {
    eprintln!("crash point {point} reached: aborting");
    std::process::abort()
}

/// Evaluates crash point `name`: armed with `return` it crashes the
/// process; with `return(stop)` the process stops itself (SIGSTOP, every
/// thread, as a zombie member would) and goes on where it was once resumed.
#[cfg(feature = "failpoints")]
pub fn point(name: &str) {
    match fail::eval(name, |arg| arg) {
        None => {}
        Some(Some(arg)) if arg == "stop" => {
            eprintln!("crash point {name} reached: stopping");
            // raise() stops this thread before it returns (`kill -STOP` from
            // a child process let the thread run on for a few milliseconds).
            // SAFETY: raise has no memory-safety preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        Some(_) => crash(name),
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn point(_name: &str) {}

/// Whether crash point `name` is reached now and armed, for a point
/// that stands between two halves of a step: the caller does the first
/// half and then [`crash`]es.
#[cfg(feature = "failpoints")]
pub fn fires(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

/// Without the `failpoints` feature: never.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fires(_name: &str) -> bool {
    false
}
