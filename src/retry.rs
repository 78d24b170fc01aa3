//! Exponential back-off, the one used wherever something is retried: the
//! probe worker, the outbox relay, the registry client and the pipeline's
//! publishing. Pure: the caller draws the randomness (the core reads none,
//! and tests pass fixed draws).

use std::time::Duration;

/// The wait before attempt number `attempt + 1` of something that failed
/// `attempt` times (a probe query, an outbox row's publish):
/// `initial * 2^(attempt-1)` capped at `max`, of which a random half
/// (`draw` in [0, 1)) is kept ("equal jitter": workers that failed together
/// do not retry together, and none retries at once). A Retry-After the
/// other side sent is honoured, up to `max`.
pub fn backoff(attempt: u32, initial: Duration, max: Duration, retry_after: Option<Duration>, draw: f64) -> Duration {
    let exp = initial.saturating_mul(1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX)).min(max);
    let jittered = exp / 2 + exp.mul_f64(draw.clamp(0.0, 1.0) / 2.0);
    match retry_after {
        Some(r) => jittered.max(r.min(max)),
        None => jittered,
    }
}

/// Waits that double from `initial` up to `max`, without jitter: for a
/// loop that retries alone (one instance publishing its own outputs),
/// where spreading the retries of many workers does not apply.
#[derive(Debug, Clone)]
pub struct Doubling {
    attempt: u32,
    initial: Duration,
    max: Duration,
}

impl Doubling {
    /// Waits starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Doubling {
        Doubling { attempt: 0, initial, max }
    }

    /// The next wait: [`backoff`] of one more failure, with all of its
    /// jitter range kept.
    pub fn next_wait(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        backoff(self.attempt, self.initial, self.max, None, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_jittered_and_honours_retry_after() {
        let (i, m) = (Duration::from_millis(100), Duration::from_millis(1000));
        assert_eq!(backoff(1, i, m, None, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(1, i, m, None, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(3, i, m, None, 1.0), Duration::from_millis(400));
        assert_eq!(backoff(10, i, m, None, 1.0), m);
        assert_eq!(backoff(40, i, m, None, 1.0), m, "no overflow");
        assert_eq!(backoff(1, i, m, Some(Duration::from_millis(700)), 0.0), Duration::from_millis(700));
        assert_eq!(backoff(1, i, m, Some(Duration::from_secs(60)), 0.0), m, "Retry-After capped");
    }

    #[test]
    fn doubling_waits_double_up_to_the_cap() {
        let mut d = Doubling::new(Duration::from_millis(100), Duration::from_secs(5));
        let waits: Vec<u128> = (0..8).map(|_| d.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
