//! Wall-clock time, read here and injected where decisions depend on it
//! (so that tests can move time), and how a time is written for people.
//!
//! The core never reads a clock (time comes in as data); the pipeline's
//! timer wheel, the state gauges and the operator tools take a [`Clock`].
//! This module depends on nothing of the crate.

use std::sync::Arc;

/// Wall-clock milliseconds since the epoch; injected so tests can move time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(now_ms)
}

/// The system clock's milliseconds since the epoch, read now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Milliseconds since the epoch as `2026-11-29T11:02:03.456Z` (UTC).
pub fn format_time(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_in_utc_to_the_millisecond() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
        let before = now_ms();
        assert!((system_clock())() >= before);
    }
}
