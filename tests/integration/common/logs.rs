//! The log lines of the pipelines a test runs in its own process, kept in
//! memory so that a failing test can say what the pipeline did (its
//! assignment, its warnings) without every passing test printing them
//! (`scripts/test.sh` shows every test's output).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Mutex, Once};

/// Lines kept: the latest ones, of whichever test runs (broker tests run
/// one at a time, see [`super::serial`]).
const KEPT: usize = 4_000;

static LINES: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

/// Installs the in-memory log (once per process; a process that installed
/// another subscriber first keeps it). `RECONCILER_LOG` overrides the level.
pub fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("RECONCILER_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,reconciler=info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_thread_names(true)
            .with_writer(|| Sink)
            .try_init();
    });
}

/// A position in the log: [`since`] gives the lines after it.
pub fn mark() -> usize {
    total()
}

/// The lines logged since `mark`, as one text (the oldest dropped past
/// [`KEPT`]).
pub fn since(mark: usize) -> String {
    let lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
    let first = mark.saturating_sub(dropped(&lines));
    lines.iter().skip(first).map(String::as_str).collect()
}

static TOTAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn total() -> usize {
    TOTAL.load(std::sync::atomic::Ordering::SeqCst)
}

fn dropped(lines: &VecDeque<String>) -> usize {
    total() - lines.len()
}

/// Appends each formatted event as one line.
struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        lines.push_back(String::from_utf8_lossy(buf).into_owned());
        TOTAL.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if lines.len() > KEPT {
            lines.pop_front();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
