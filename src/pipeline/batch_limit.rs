//! How many records the next batch takes.
//!
//! Small after start-up or an idle poll, doubling while batches come back
//! full, up to `[consumer] batch_size`. That size is chosen for CPU:
//! larger batches walk more memory than the core's cache holds
//! (BENCHMARKS.md, "Defaults chosen by measurement"). But each batch may also wait for
//! the broker: the loop waits for the oldest batch in flight when too many
//! are behind the changelog (see `in_flight.rs`). When input comes in
//! faster than the loop takes it, and that wait is a large share of each
//! cycle, the configured size loses more to the wait than it saves in
//! cache. The backlog then takes many
//! cycles to clear, and the tail latency grows. Measured at 40,000
//! records/s on two shared cores: the wait was two fifths of each cycle
//! at 2,000 records, and batches of 5,000 gave a p99 event→verdict of
//! 184 and 306 ms against 979 and 1,111 ms (BENCHMARKS.md).
//! So, while batches come back full and the smoothed share of the wait
//! stays above [`GROW_AT`], the limit keeps doubling, up to [`STRETCH`]
//! times the configured size. It halves back when the share falls below
//! [`SHRINK_AT`]. A poll that comes back short leaves it as it is (it
//! does not bind then), and an idle poll starts the ramp over. A preloaded
//! topic read at full rate waits little (8 % of its cycles), so its
//! batches stay at the configured size.

use std::time::Duration;

/// From start-up or an idle poll a batch takes at most 1/RAMP_FIRST of
/// the configured size (but at least [`RAMP_FLOOR`] records). A preloaded
/// topic's first batch of 5,000 records (the default `batch_size` then)
/// took 83 ms to apply (cold caches, fresh memory) before any verdict
/// could go out; a burst after a quiet spell waited the same way. Thin
/// input never fills a batch, so it is not affected; thick input reaches
/// full batches in a few.
const RAMP_FIRST: usize = 16;

/// The smallest first batch of a ramp: a few hundred records apply in a
/// few milliseconds, so smaller `batch_size`s are not ramped at all (the
/// crash suites choose theirs, 10 to 99, to place their crash points).
const RAMP_FLOOR: usize = 256;

/// The most a limit grows past the configured size, as a multiple of it.
const STRETCH: usize = 4;

/// Share of a cycle spent waiting for acknowledgements (smoothed) above
/// which full batches grow past the configured size.
const GROW_AT: f64 = 0.2;

/// Share below which a stretched limit halves back.
const SHRINK_AT: f64 = 0.10;

/// Weight of the latest batch in the smoothed share: a single slow
/// acknowledgement does not stretch the batches on its own.
const LATEST: f64 = 0.25;

/// The next batch's limit, and what it is decided from.
#[derive(Debug, Clone)]
pub(super) struct BatchLimit {
    limit: usize,
    /// `[consumer] batch_size`.
    full: usize,
    /// Smoothed share of the last batches' cycles spent waiting for the
    /// batches in flight.
    waiting: f64,
}

impl BatchLimit {
    /// The limit of a first poll, for batches of `full` records.
    pub(super) fn new(full: usize) -> Self {
        BatchLimit { limit: first(full), full, waiting: 0.0 }
    }

    /// The most records the next poll takes.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// A poll returned `got` records (at most [`Self::limit`]).
    pub(super) fn polled(&mut self, got: usize) {
        let full = self.full;
        self.limit = if got == 0 {
            self.waiting = 0.0;
            first(full)
        } else if got < self.limit {
            // Thin input: the limit does not bind, and a burst that comes
            // while the loop still waits is taken in as large a batch.
            self.limit
        } else if self.limit < full {
            self.limit.saturating_mul(2).min(full)
        } else if self.waiting > GROW_AT {
            self.limit.saturating_mul(2).min(full.saturating_mul(STRETCH))
        } else if self.waiting < SHRINK_AT {
            (self.limit / 2).max(full)
        } else {
            self.limit
        };
    }

    /// A batch was applied and sent in `cycle`, of which it spent
    /// `waited` moving the batches in flight on (waiting for them if too
    /// many were).
    pub(super) fn waited(&mut self, waited: Duration, cycle: Duration) {
        let share = if cycle.is_zero() { 0.0 } else { (waited.as_secs_f64() / cycle.as_secs_f64()).min(1.0) };
        self.waiting = (1.0 - LATEST) * self.waiting + LATEST * share;
    }
}

/// The first limit after start-up or an idle poll.
fn first(full: usize) -> usize {
    (full / RAMP_FIRST).max(RAMP_FLOOR).min(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(mut b: BatchLimit, got: usize) -> BatchLimit {
        b.polled(got);
        b
    }

    /// From start-up or an idle poll a batch is small, full batches double
    /// the next one's limit up to the configured size, and a batch that
    /// came back short (thin input) keeps the limit where it is.
    #[test]
    fn batch_limits_ramp_up_after_idle_and_stay_for_thin_input() {
        let full = 5000;
        let mut b = BatchLimit::new(full);
        assert_eq!(b.limit(), 312);
        let mut limits = vec![b.limit()];
        while b.limit() < full {
            b.polled(b.limit());
            limits.push(b.limit());
        }
        assert_eq!(limits, [312, 624, 1248, 2496, 4992, 5000]);
        assert_eq!(polled(b.clone(), 4000).limit(), full, "thin input keeps the limit");
        b.polled(full);
        assert_eq!(b.limit(), full, "no waiting: full batches stay at the configured size");
        assert_eq!(polled(b, 0).limit(), 312, "an idle poll starts over");
        assert_eq!(BatchLimit::new(1).limit(), 1, "a batch size of 1 stays 1");
        for small in [10, 99, 256] {
            assert_eq!(BatchLimit::new(small).limit(), small, "batch size {small} is not ramped");
        }
        assert_eq!(BatchLimit::new(1000).limit(), 256, "at least RAMP_FLOOR records");
    }

    /// Full batches that keep waiting for acknowledgements stretch the
    /// limit up to STRETCH times the configured size; less waiting halves
    /// it back, and an idle poll starts the ramp over.
    #[test]
    fn batches_stretch_while_the_loop_waits_for_acknowledgements() {
        let full = 2000;
        let mut b = BatchLimit::new(full);
        while b.limit() < full {
            b.polled(b.limit());
        }
        let cycle = Duration::from_millis(33);
        // One slow acknowledgement is not enough.
        b.waited(Duration::from_millis(20), cycle);
        b.polled(full);
        assert_eq!(b.limit(), full);
        // Two fifths of every cycle, batch after batch.
        let mut limits = Vec::new();
        for _ in 0..5 {
            b.waited(Duration::from_millis(13), cycle);
            b.polled(b.limit());
            limits.push(b.limit());
        }
        assert_eq!(limits, [4000, 8000, 8000, 8000, 8000], "grows once the smoothed share passes GROW_AT");
        b.polled(3000);
        assert_eq!(b.limit(), 8000, "a short poll keeps the limit");
        // Waiting between the thresholds holds the limit.
        for _ in 0..10 {
            b.waited(Duration::from_millis(6), cycle);
        }
        b.polled(b.limit());
        assert_eq!(b.limit(), 8000);
        // Acknowledgements in time: back down, one halving per full batch.
        for _ in 0..10 {
            b.waited(Duration::ZERO, cycle);
        }
        b.polled(b.limit());
        assert_eq!(b.limit(), 4000);
        b.polled(b.limit());
        assert_eq!(b.limit(), 2000);
        b.polled(b.limit());
        assert_eq!(b.limit(), 2000, "never below the configured size while full");
        // An idle poll starts over, and forgets the waiting.
        for _ in 0..10 {
            b.waited(Duration::from_millis(20), cycle);
        }
        b.polled(b.limit());
        assert_eq!(b.limit(), 4000);
        b.polled(0);
        assert_eq!(b.limit(), 256);
        assert_eq!(b.waiting, 0.0);
    }
}
