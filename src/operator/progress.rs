//! Replay's progress display: one bar for the whole input (events/s, ETA)
//! and one per partition, on stderr. Hidden when stderr is not a terminal.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::replay::Progress;

/// The bars of one replay.
pub struct ReplayBars {
    multi: MultiProgress,
    total: Option<ProgressBar>,
    partitions: Vec<ProgressBar>,
}

impl Default for ReplayBars {
    fn default() -> Self {
        ReplayBars { multi: MultiProgress::new(), total: None, partitions: Vec::new() }
    }
}

impl ReplayBars {
    /// Shows `p` (the bars are made on the first call).
    pub fn update(&mut self, p: &Progress) {
        if self.total.is_none() {
            let style = |t: &str| ProgressStyle::with_template(t).expect("valid template").progress_chars("=> ");
            let total = self.multi.add(ProgressBar::new(p.total().max(0) as u64));
            total.set_style(style("replay       [{bar:40}] {pos}/{len} events  {msg}"));
            for part in &p.partitions {
                let b = self.multi.add(ProgressBar::new(part.total.max(0) as u64));
                b.set_style(style("  partition {prefix:>3} [{bar:40}] {pos}/{len}"));
                b.set_prefix(part.partition.to_string());
                self.partitions.push(b);
            }
            self.total = Some(total);
        }
        let eta = p.eta_ms.map_or_else(|| "-".to_owned(), |ms| super::render::age(ms as i64));
        if let Some(t) = &self.total {
            t.set_position(p.done().max(0) as u64);
            t.set_message(format!("{:.0} events/s, ETA {eta}", p.events_per_sec));
        }
        for (b, part) in self.partitions.iter().zip(&p.partitions) {
            b.set_position(part.done.max(0) as u64);
        }
    }

    /// Leaves the final state on screen.
    pub fn finish(&self) {
        for b in self.total.iter().chain(&self.partitions) {
            b.finish();
        }
    }
}
