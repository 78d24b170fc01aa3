//! Announcing this instance on the fleet topic (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{Member, ANNOUNCE_EVERY};
use crate::kafka::producer::Publisher;
use crate::kafka::KafkaError;
use crate::records::ProducerRecord;

/// The partitions this instance owns now.
pub type Owned = Box<dyn Fn() -> BTreeSet<i32> + Send>;

/// Starts the announcer: publishes this member (`url`, what `owned` says)
/// to `topic` on every change and every [`ANNOUNCE_EVERY`] until
/// `shutdown`, then a tombstone. A publishing error is logged and the
/// announcement tried again on the next turn of the loop (each attempt
/// waits for its acknowledgement or the producer's timeout): the fleet view
/// is a convenience, never a reason to stop processing.
pub fn spawn(
    kafka: &BTreeMap<String, String>,
    topic: &str,
    url: String,
    owned: Owned,
    shutdown: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KafkaError> {
    let publisher = Publisher::new(kafka, 1 << 20)?;
    let topic = topic.to_owned();
    let handle = std::thread::Builder::new()
        .name("fleet-announce".into())
        .spawn(move || {
            info!(url = %url, topic = %topic, "Announcing this instance to the fleet");
            let mut last: Option<(BTreeSet<i32>, Instant)> = None;
            while !shutdown.load(Ordering::Relaxed) {
                let now = owned();
                let due = last.as_ref().is_none_or(|(was, at)| *was != now || at.elapsed() >= ANNOUNCE_EVERY);
                if due {
                    let member = Member {
                        url: url.clone(),
                        owned: now.iter().copied().collect(),
                        at_ms: crate::clock::now_ms(),
                        every_ms: ANNOUNCE_EVERY.as_millis() as i64,
                    };
                    let value = serde_json::to_vec(&member).expect("a member serializes");
                    // A failed announcement is due again on the next turn.
                    last = match publish(&publisher, &topic, &url, Some(value)) {
                        Ok(()) => Some((now, Instant::now())),
                        Err(e) => {
                            warn!(error = %e, "Announcing this instance to the fleet failed; retrying");
                            None
                        }
                    };
                }
                std::thread::sleep(Duration::from_millis(100)); // how soon a change is announced
            }
            if let Err(e) = publish(&publisher, &topic, &url, None) {
                warn!(error = %e, "Leaving the fleet failed: the others drop this instance once it is quiet");
            }
        })
        .map_err(|e| KafkaError::Timeout(format!("starting the fleet announcer: {e}")))?;
    Ok(handle)
}

fn publish(publisher: &Publisher, topic: &str, url: &str, value: Option<Vec<u8>>) -> Result<(), KafkaError> {
    let record =
        ProducerRecord { topic: topic.to_owned(), key: Some(url.as_bytes().to_vec()), value, headers: Vec::new() };
    publisher.publish_all([(&record, Some(0))]).map(drop)
}
