//! Running a few jobs at once on rayon's pool (the apply lanes of a batch,
//! the store writes of those lanes).
//!
//! rayon's threads live as long as the process, so each keeps its
//! allocator heap warm: a thread per batch made the allocator hand out and
//! zero fresh pages all the time.

/// Builds rayon's global pool, once, with its threads named `rayon-N`:
/// unnamed threads take the process's name, and per-thread CPU (`top -H`,
/// the e2e harness) could not tell them from the run loop. Built on first
/// use, as rayon would, so a command that runs no jobs starts no threads.
fn named_pool() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        // Fails only if the pool was built already (then it keeps its names).
        let _ = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("rayon-{i}")).build_global();
    });
}

/// Runs `jobs` at once, the first on the calling thread and the others on
/// rayon's pool, and returns their results in job order. A panic in a job
/// is a panic here, once every job has ended.
pub(crate) fn run_all<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<T> {
    named_pool();
    let mut results: Vec<Option<T>> = jobs.iter().map(|_| None).collect();
    rayon::in_place_scope(|s| {
        let mut jobs = jobs.into_iter().zip(results.iter_mut());
        let here = jobs.next();
        for (job, slot) in jobs {
            s.spawn(move |_| *slot = Some(job()));
        }
        if let Some((job, slot)) = here {
            *slot = Some(job());
        }
    });
    results.into_iter().map(|r| r.expect("every job ran")).collect()
}

#[cfg(test)]
mod tests {
    use super::run_all;

    #[test]
    fn results_come_back_in_job_order() {
        let jobs: Vec<_> = (0..5u64).map(|i| move || (i, std::thread::current().id())).collect();
        let results = run_all(jobs);
        assert_eq!(results.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(results[0].1, std::thread::current().id(), "the first job runs on the caller");
        assert!(run_all(Vec::<fn() -> u8>::new()).is_empty());
    }
}
