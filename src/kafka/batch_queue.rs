//! The group member's records, read a batch at a time.
//!
//! rust-rdkafka's `BaseConsumer::poll` hands out one message per call, and
//! each call reads the clock, polls librdkafka's queue once (whose own poll
//! bookkeeping reads the clock twice more) and allocates an `Arc` for the
//! message's event: with the copy into a [`Record`], 8.8 % of the run
//! loop's samples in a dwarf profile of a preloaded run, half of it the
//! poll itself. `rd_kafka_consume_batch_queue` takes a batch in one call.
//!
//! It cannot read the consumer's own queue: that queue also carries the
//! group's rebalances, which rust-rdkafka takes as events, and a batch read
//! serves a rebalance itself with a forced unassign (librdkafka's
//! `rd_kafka_poll_cb` when no rebalance callback is set). So each assigned
//! partition's queue is forwarded to a [`BatchQueue`] of its own, read in
//! batches, while the consumer's queue keeps the rebalances and commit
//! results and is still polled for them (see
//! [`super::consumer::GroupConsumer::poll_batch`]).
//!
//! The Kafka adapter's unsafe code is here and in [`super::report_pump`]:
//! librdkafka's queue and message calls, each with the invariant it relies
//! on.

use std::ffi::{c_void, CStr};
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rd;
use tracing::warn;

use crate::records::Record;

/// A librdkafka queue owned by this process that assigned partitions are
/// forwarded to.
pub struct BatchQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
}

// librdkafka's queues are thread-safe: every operation on one takes its lock.
unsafe impl Send for BatchQueue {}
unsafe impl Sync for BatchQueue {}

impl BatchQueue {
    /// A new, empty queue of client `rk` (`None` if librdkafka refuses).
    ///
    /// # Safety
    /// `rk` must be a live client handle, and the queue must be dropped
    /// before the client is destroyed.
    pub unsafe fn new(rk: *mut rd::rd_kafka_t) -> Option<BatchQueue> {
        NonNull::new(rd::rd_kafka_queue_new(rk)).map(|queue| BatchQueue { queue })
    }

    /// Forwards `partition` of `topic` here; false if the client has no
    /// such partition. Needed after every assignment: librdkafka clears a
    /// partition's forwarding when it stops fetching it. Set before its
    /// fetch starts, the forwarding is kept (librdkafka does not replace a
    /// forwarding the application set).
    ///
    /// # Safety
    /// `rk` must be the live client this queue was made for.
    pub unsafe fn forward(&self, rk: *mut rd::rd_kafka_t, topic: &CStr, partition: i32) -> bool {
        let Some(q) = NonNull::new(rd::rd_kafka_queue_get_partition(rk, topic.as_ptr(), partition)) else {
            return false;
        };
        rd::rd_kafka_queue_forward(q.as_ptr(), self.queue.as_ptr());
        // The handle only: the forwarding belongs to the partition's queue.
        rd::rd_kafka_queue_destroy(q.as_ptr());
        true
    }

    /// Appends to `out` up to `max` records, waiting at most `wait` for the
    /// first (none: only those already fetched), each tagged with `topic`;
    /// returns how many it appended. A consumer error in their place is
    /// logged and skipped, and its partition and offset added to `errors`:
    /// the batch read moves a partition's position past every message it
    /// hands out, an error too, and a partition's error carries the offset
    /// of the record it could not fetch (see [`super::consumer`]'s
    /// positions).
    pub fn take(
        &self,
        out: &mut Vec<Record>,
        max: usize,
        wait: Duration,
        topic: &Arc<str>,
        errors: &mut Vec<ConsumeError>,
    ) -> usize {
        /// Most messages taken in one call (the array lives on the stack).
        const CHUNK: usize = 512;
        let mut messages = [std::ptr::null_mut::<rd::rd_kafka_message_t>(); CHUNK];
        let mut appended = 0;
        // Whole milliseconds, rounded up: a wait shorter than one is not none.
        let mut wait_ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        while appended < max {
            let want = (max - appended).min(CHUNK);
            // SAFETY: the queue is live (owned by self); librdkafka writes at
            // most `want` message pointers into the array.
            let n =
                unsafe { rd::rd_kafka_consume_batch_queue(self.queue.as_ptr(), wait_ms, messages.as_mut_ptr(), want) };
            let n = usize::try_from(n).unwrap_or(0);
            for &m in &messages[..n] {
                // SAFETY: each pointer was just handed out by librdkafka and
                // is destroyed once, right after it is copied.
                unsafe {
                    match record_of(m, topic) {
                        Ok(r) => {
                            out.push(r);
                            appended += 1;
                        }
                        Err(e) => {
                            warn!(partition = (*m).partition, offset = (*m).offset, error = %e, "Consumer error");
                            errors.push(ConsumeError { partition: (*m).partition, offset: (*m).offset, code: e });
                        }
                    }
                    rd::rd_kafka_message_destroy(m);
                }
            }
            if n < want {
                break;
            }
            // A batch longer than one array: the rest is what is already here.
            wait_ms = 0;
        }
        appended
    }
}

impl Drop for BatchQueue {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_queue_new and destroyed only here. A
        // partition still forwarded here keeps the queue's memory until its
        // fetch stops; what reaches it meanwhile is discarded.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// A consumer error delivered in a message's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumeError {
    /// Its partition.
    pub partition: i32,
    /// The offset it names (below zero: none).
    pub offset: i64,
    /// What went wrong.
    pub code: rdkafka::error::RDKafkaErrorCode,
}

/// An owned copy of message `m`, or its error when it carries one (a
/// consumer error delivered in a message's place).
///
/// # Safety
/// `m` must be a live message from librdkafka. It stays a raw pointer:
/// librdkafka caches the parsed headers in the message it is given.
unsafe fn record_of(
    m: *mut rd::rd_kafka_message_t,
    topic: &Arc<str>,
) -> Result<Record, rdkafka::error::RDKafkaErrorCode> {
    let (err, partition, offset) = ((*m).err, (*m).partition, (*m).offset);
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(err.into());
    }
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    let at = rd::rd_kafka_message_timestamp(m, &mut kind);
    // As rust-rdkafka reads it: none when the type says so or the time is -1.
    let timestamp = (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && at != -1).then_some(at);
    Ok(Record {
        topic: topic.clone(),
        partition,
        offset,
        timestamp,
        key: copied((*m).key, (*m).key_len),
        value: copied((*m).payload, (*m).len),
        headers: headers_of(m),
    })
}

/// The headers of `m`, in order. A name that is not UTF-8 is kept with its
/// invalid bytes replaced (rust-rdkafka's own reader panicked on one).
///
/// # Safety
/// `m` must be a live message from librdkafka.
unsafe fn headers_of(m: *mut rd::rd_kafka_message_t) -> Vec<(String, Option<Vec<u8>>)> {
    let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    if rd::rd_kafka_message_headers(m, &mut hdrs) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        || hdrs.is_null()
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for idx in 0.. {
        let (mut name, mut value, mut size): (*const c_char, *const c_void, usize) =
            (std::ptr::null(), std::ptr::null(), 0);
        if rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            break;
        }
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        out.push((name, copied(value, size)));
    }
    out
}

/// The `len` bytes at `p` copied, or `None` for a null pointer (librdkafka's
/// null key, value or header value).
///
/// # Safety
/// A non-null `p` must point to `len` bytes of a live message.
unsafe fn copied(p: *const c_void, len: usize) -> Option<Vec<u8>> {
    (!p.is_null()).then(|| std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec())
}
