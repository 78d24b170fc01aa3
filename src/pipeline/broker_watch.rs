//! Whether the broker answers, watched from a thread of its own.
//!
//! A broker the instance cannot reach (a network cut, the broker down)
//! stops everything: no input is read, no output acknowledged, no timer
//! fired. The run loop cannot be the one to notice: it may be waiting for
//! acknowledgements the whole time, and librdkafka keeps the assignment
//! until its own session timeout (45 s by default), so the partitions stay
//! "owned and caught up" and readiness would stay green through the
//! outage. So this thread asks the broker for the input topic's metadata
//! every [`ASK_EVERY`], on the watermark client (the same `[kafka]`
//! settings, hence the same way to the broker, as the group member).
//! Each answer sets `reconciler_broker_last_answer_timestamp_seconds`
//! (the alert `ReconcilerBrokerUnreachable` watches it); no answer for
//! [`UNREACHABLE_AFTER`] turns readiness red until the next answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::kafka::watermarks::Watermarks;
use crate::metrics::Metrics;

/// How often the broker is asked.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// How long an ask waits for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// No answer for this long turns readiness red: longer than a leader
/// election or a broker's restart on the same data takes, short enough
/// that an orchestrator or a person learns of an outage within seconds.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(10);

/// How often the thread looks at its stop flag while it waits.
const TICK: Duration = Duration::from_millis(100);

/// The answers seen so far, and what they mean for readiness.
#[derive(Debug)]
struct Silence {
    /// When the broker last answered (at start: when the watch began, the
    /// pipeline having just talked to the broker to start).
    last_answer: Instant,
    /// Whether the broker counts as unreachable now.
    unreachable: bool,
}

/// What an ask changed.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    /// Nothing to report.
    None,
    /// Silent for longer than the bound: for how long.
    Unreachable(Duration),
    /// Answering again after being unreachable for this long.
    Back(Duration),
}

impl Silence {
    fn new(now: Instant) -> Silence {
        Silence { last_answer: now, unreachable: false }
    }

    /// The outcome of an ask made at `now`.
    fn observe(&mut self, answered: bool, now: Instant) -> Change {
        let silent_for = now.saturating_duration_since(self.last_answer);
        if answered {
            self.last_answer = now;
            let was = std::mem::replace(&mut self.unreachable, false);
            return if was { Change::Back(silent_for) } else { Change::None };
        }
        if silent_for >= UNREACHABLE_AFTER {
            self.unreachable = true;
            return Change::Unreachable(silent_for);
        }
        Change::None
    }
}

/// The running watch; stops (and joins) when dropped.
pub struct BrokerWatch {
    _thread: super::background::Background,
}

impl BrokerWatch {
    /// Starts asking the broker for `topic`'s metadata through `watermarks`,
    /// reporting to `metrics`.
    pub fn start(metrics: Arc<Metrics>, watermarks: Arc<Watermarks>, topic: String) -> BrokerWatch {
        let thread =
            super::background::Background::spawn("broker-watch", move |stop| run(&metrics, &watermarks, &topic, stop));
        BrokerWatch { _thread: thread }
    }
}

/// Wall-clock time now, in Unix milliseconds: the gauge is compared with
/// Prometheus' own `time()`, so it is the machine's clock, not the
/// pipeline's injected one.
fn unix_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    since.as_millis() as i64
}

fn run(metrics: &Metrics, watermarks: &Watermarks, topic: &str, stop: &AtomicBool) {
    let mut silence = Silence::new(Instant::now());
    while !stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let answer = watermarks.ask(topic, ANSWER_WITHIN);
        if answer.is_ok() {
            metrics.broker_answered(unix_ms());
        }
        let was_unreachable = silence.unreachable;
        match (silence.observe(answer.is_ok(), Instant::now()), answer) {
            (Change::Unreachable(silent), Err(e)) => {
                if !was_unreachable {
                    warn!(seconds = silent.as_secs(), error = %e, "The broker does not answer; not ready until it does");
                }
                metrics.set_broker_unreachable(Some(format!(
                    "the broker has not answered for {} s: {e}",
                    silent.as_secs()
                )));
            }
            (Change::Back(silent), _) => {
                info!(seconds = silent.as_secs(), "The broker answers again");
                metrics.set_broker_unreachable(None);
            }
            _ => {}
        }
        while !stop.load(Ordering::SeqCst) && asked.elapsed() < ASK_EVERY {
            std::thread::sleep(TICK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_turns_red_only_after_the_bound_and_green_at_the_next_answer() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut s = Silence::new(t0);
        assert_eq!(s.observe(true, at(1)), Change::None);
        // Silent from 1 s on: within the bound nothing changes.
        assert_eq!(s.observe(false, at(5)), Change::None);
        assert_eq!(s.observe(false, at(10)), Change::None);
        assert_eq!(s.observe(false, at(11)), Change::Unreachable(Duration::from_secs(10)));
        assert_eq!(s.observe(false, at(12)), Change::Unreachable(Duration::from_secs(11)));
        assert_eq!(s.observe(true, at(13)), Change::Back(Duration::from_secs(12)));
        // The bound counts from the last answer again.
        assert_eq!(s.observe(false, at(22)), Change::None);
        assert_eq!(s.observe(false, at(23)), Change::Unreachable(Duration::from_secs(10)));
    }

    #[test]
    fn a_broker_silent_from_the_start_is_unreachable_after_the_bound() {
        let t0 = Instant::now();
        let mut s = Silence::new(t0);
        assert_eq!(s.observe(false, t0 + UNREACHABLE_AFTER - Duration::from_millis(1)), Change::None);
        assert_eq!(s.observe(false, t0 + UNREACHABLE_AFTER), Change::Unreachable(UNREACHABLE_AFTER));
    }
}
