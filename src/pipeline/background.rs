//! A thread that runs beside the run loop (the metrics sampler, the broker
//! watch) until the pipeline stops: it gets a stop flag to watch, and is
//! told to stop and joined when its handle is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The running thread; stops (and joins) when dropped.
pub(crate) struct Background {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts `body` on a thread called `name`; `body` returns once the
    /// flag it is given is set.
    pub(crate) fn spawn(name: &str, body: impl FnOnce(&AtomicBool) + Send + 'static) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&flag))
            .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"));
        Background { stop, handle: Some(handle) }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
