//! A producer's delivery reports, served by a thread that librdkafka wakes
//! when a report arrives, not by a timer.
//!
//! rust-rdkafka 0.38's `ThreadedProducer` calls `BaseProducer::poll` with
//! a 100 ms timeout in a loop. That poll keeps calling librdkafka until its
//! own deadline has passed, and hands it the time left in whole
//! milliseconds, rounded down (`Timeout::as_millis`): 99 ms once a few
//! microseconds have gone, then, with less than a millisecond left, 0,
//! which librdkafka takes as "do not wait". So every 100 ms ended with up
//! to a millisecond of zero-timeout polls in a tight loop: 0.9 % of a core
//! per producer, idle or loaded (measured on an idle `reconciler demo`:
//! the two producers' polling threads at 0.90 and 0.95 %, each more than
//! any other thread of the process; `strace` showed each wait time out
//! after 99 ms, then 0.8 ms without a system call before the next).
//!
//! Here librdkafka writes a byte to a socket whenever the producer's main
//! queue (its delivery reports, errors, logs and statistics) goes from
//! empty to non-empty (`rd_kafka_queue_io_event_enable`). The thread
//! sleeps in a blocking read of that socket, then serves the queue until
//! it is empty; librdkafka writes again only after the queue was served,
//! so a wake-up is never lost. Dropping the pump turns the wake-ups off,
//! then writes a byte of its own to stop the thread.
//!
//! One pump per producer: a second would take over the first's wake-ups.

use std::ffi::c_void;
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

/// The producer's main queue, as a handle of our own.
struct MainQueue(NonNull<rd::rd_kafka_queue_t>);

// librdkafka's queues are thread-safe: every operation on one takes its lock.
unsafe impl Send for MainQueue {}
unsafe impl Sync for MainQueue {}

impl MainQueue {
    /// Events waiting to be served.
    fn len(&self) -> usize {
        // SAFETY: the handle is live until `ReportPump::drop` destroys it,
        // after the only other user (the thread) has stopped.
        unsafe { rd::rd_kafka_queue_length(self.0.as_ptr()) }
    }
}

/// Serves one producer's delivery reports (and its errors and log lines)
/// for as long as it lives.
pub struct ReportPump {
    queue: Arc<MainQueue>,
    /// The end librdkafka writes its wake-ups to, and [`Drop`] its own.
    waker: UnixStream,
    /// The end the thread reads. Kept here too, so that it is closed only
    /// after the wake-ups are off (librdkafka's write to a socket whose
    /// reader is gone would fail with EPIPE).
    wakes: Arc<UnixStream>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The producer, kept alive until the queue's handle is released (a
    /// handle must not outlive its client). Dropped after [`Drop::drop`].
    _producer: Arc<dyn std::any::Any + Send + Sync>,
}

impl ReportPump {
    /// Starts serving `producer`'s main queue on a thread named `name`.
    pub(super) fn start<C: ProducerContext + Send + Sync + 'static>(
        producer: Arc<BaseProducer<C>>,
        name: &str,
    ) -> io::Result<ReportPump> {
        let (wakes, waker) = UnixStream::pair()?;
        // librdkafka writes from its own threads and must never block there.
        waker.set_nonblocking(true)?;
        // SAFETY: the client is live (we hold a reference); the handle is
        // destroyed in `drop`, while the producer still lives.
        let queue = unsafe { NonNull::new(rd::rd_kafka_queue_get_main(producer.client().native_ptr())) }
            .map(|q| Arc::new(MainQueue(q)))
            .ok_or_else(|| io::Error::other("librdkafka gave no main queue"))?;
        let stop = Arc::new(AtomicBool::new(false));
        // Built before the events are turned on: if the thread cannot be
        // started, dropping it turns them off again.
        let keep: Arc<dyn std::any::Any + Send + Sync> = producer.clone();
        let mut pump = ReportPump { queue, waker, wakes: Arc::new(wakes), stop, thread: None, _producer: keep };
        const WAKE: &[u8] = b"!";
        // SAFETY: the queue is live; librdkafka copies the payload; the
        // socket stays open until `drop` has turned the events off again.
        unsafe {
            rd::rd_kafka_queue_io_event_enable(
                pump.queue.0.as_ptr(),
                pump.waker.as_raw_fd(),
                WAKE.as_ptr() as *const c_void,
                WAKE.len(),
            )
        };
        let (queue, stop, wakes) = (Arc::clone(&pump.queue), Arc::clone(&pump.stop), Arc::clone(&pump.wakes));
        pump.thread = Some(std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                // Everything queued, also what came before the events
                // were turned on. One event per call: a zero-timeout
                // poll serves one and returns. Once stopped, whatever is
                // left is the producer's own flush's (`BaseProducer`'s
                // drop serves its queue itself).
                while queue.len() > 0 && !stop.load(Ordering::Acquire) {
                    producer.poll(Duration::ZERO);
                }
                if stop.load(Ordering::Acquire) {
                    break;
                }
                match (&*wakes).read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Not seen; without wake-ups, fall back to a timed poll.
                        tracing::warn!(error = %e, "Delivery reports: the wake-up socket failed, polling instead");
                        while !stop.load(Ordering::Acquire) {
                            producer.poll(Duration::from_millis(100));
                        }
                        break;
                    }
                }
            }
        })?);
        Ok(pump)
    }
}

impl Drop for ReportPump {
    fn drop(&mut self) {
        // SAFETY: the queue is live (our handle, the producer held by
        // `_producer`). Wake-ups off first, while both ends of the socket
        // are still open.
        unsafe { rd::rd_kafka_queue_io_event_enable(self.queue.0.as_ptr(), -1, std::ptr::null(), 0) };
        self.stop.store(true, Ordering::Release);
        // A full socket already holds a wake-up: the error can be ignored.
        let _ = (&self.waker).write(b"!");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the thread has stopped and no longer uses the handle; the
        // producer is still alive (held by `_producer`, dropped after this).
        unsafe { rd::rd_kafka_queue_destroy(self.queue.0.as_ptr()) };
    }
}
