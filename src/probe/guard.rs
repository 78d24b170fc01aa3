//! What stands between the worker and a destination: a limit on queries
//! in flight, a rate limit, a timeout, a circuit breaker, and the back-off
//! between two queries of the same probe request.
//!
//! The breaker and the back-off take the time and the random draw as
//! arguments, so their rules are tested without a clock.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::config::DestinationConfig;
use crate::core::event::ProbeErrorClass;

use super::destination::ProbeError;

/// The circuit breaker of one destination. Closed, it counts consecutive
/// failures; at the threshold it opens and refuses queries for `open_for`;
/// then it lets one trial query through (half-open): a success closes it,
/// a failure opens it again.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    open_for: Duration,
    failures: u32,
    open_until: Option<Instant>,
    trial_in_flight: bool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(threshold: u32, open_for: Duration) -> Breaker {
        Breaker { threshold, open_for, failures: 0, open_until: None, trial_in_flight: false }
    }

    /// Whether a query may go now; if not, how long until the next trial
    /// may (at least a millisecond while a trial is out).
    pub fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        match self.open_until {
            None => Ok(()),
            Some(until) if now < until => Err(until - now),
            Some(_) if self.trial_in_flight => Err(Duration::from_millis(1)),
            Some(_) => {
                self.trial_in_flight = true;
                Ok(())
            }
        }
    }

    /// The destination answered.
    pub fn success(&mut self) {
        self.failures = 0;
        self.open_until = None;
        self.trial_in_flight = false;
    }

    /// The destination failed (in a way that counts against it).
    pub fn failure(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        if self.trial_in_flight || self.failures >= self.threshold {
            self.open_until = Some(now + self.open_for);
            self.trial_in_flight = false;
        }
    }

    /// Whether the breaker refuses queries (open, or half-open with its
    /// trial out).
    pub fn is_open(&self) -> bool {
        self.open_until.is_some()
    }
}

/// The limits of one destination.
pub struct Guard {
    in_flight: Semaphore,
    rate: Option<DefaultDirectRateLimiter>,
    /// Longest wait for one answer.
    pub timeout: Duration,
    breaker: Mutex<Breaker>,
}

impl Guard {
    /// The limits `cfg` declares.
    pub fn new(cfg: &DestinationConfig) -> Guard {
        Guard {
            in_flight: Semaphore::new(cfg.concurrency),
            rate: cfg.rate_per_second.and_then(NonZeroU32::new).map(|r| RateLimiter::direct(Quota::per_second(r))),
            timeout: Duration::from_millis(cfg.timeout_ms),
            breaker: Mutex::new(Breaker::new(cfg.failure_threshold, Duration::from_millis(cfg.open_for_ms))),
        }
    }

    /// Runs `query` within the limits: refused at once while the circuit is
    /// open, else after a free slot and the rate limit, bounded by the
    /// timeout. The outcome feeds the breaker.
    pub async fn run<T, F>(&self, query: F) -> Result<T, ProbeError>
    where
        F: std::future::Future<Output = Result<T, ProbeError>>,
    {
        let _slot = self.in_flight.acquire().await.expect("the semaphore is never closed");
        if let Some(rate) = &self.rate {
            rate.until_ready().await;
        }
        // Asked once a slot is free: a query that waited while the circuit
        // opened does not go to the failing destination.
        if let Err(wait) = self.breaker.lock().expect("not poisoned").admit(Instant::now()) {
            let mut e = ProbeError::new(ProbeErrorClass::CircuitOpen, "the destination's circuit breaker is open");
            e.retry_after = Some(wait);
            return Err(e);
        }
        let result = match tokio::time::timeout(self.timeout, query).await {
            Ok(r) => r,
            Err(_) => Err(ProbeError::new(
                ProbeErrorClass::Timeout,
                format!("no answer within {} ms", self.timeout.as_millis()),
            )),
        };
        let mut breaker = self.breaker.lock().expect("not poisoned");
        match &result {
            Ok(_) => breaker.success(),
            Err(e) if e.counts_against_destination() => breaker.failure(Instant::now()),
            // A refusal or a malformed answer: the destination is up.
            Err(_) => breaker.success(),
        }
        result
    }

    /// Whether the destination's circuit is open now.
    pub fn circuit_open(&self) -> bool {
        self.breaker.lock().expect("not poisoned").is_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_at_the_threshold_and_lets_one_trial_through() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(10));
        for _ in 0..2 {
            assert!(b.admit(t0).is_ok());
            b.failure(t0);
        }
        assert!(!b.is_open());
        b.failure(t0);
        assert!(b.is_open());
        assert_eq!(b.admit(t0 + Duration::from_secs(9)), Err(Duration::from_secs(1)), "refused until open_for passed");
        let later = t0 + Duration::from_secs(10);
        assert!(b.admit(later).is_ok(), "one trial after open_for");
        assert!(b.admit(later).is_err(), "only one");
        b.failure(later);
        assert!(b.admit(later + Duration::from_secs(9)).is_err(), "a failed trial opens it again");
        let after = later + Duration::from_secs(10);
        assert!(b.admit(after).is_ok());
        b.success();
        assert!(!b.is_open());
        assert!(b.admit(after).is_ok() && b.admit(after).is_ok(), "closed again");
    }
}
