//! The timer wheel (SPEC §7): the timer index in the store, compared with
//! the wall clock, becomes `DeadlineReached` events in the input log, so
//! that every timeout is judged when it is consumed and a replay reproduces
//! it without a clock.
//!
//! Two rules keep a timer from firing twice or early:
//! - a partition fires nothing until it has consumed everything that was in
//!   it when it was assigned (below that mark lie the deadline events a
//!   previous owner, or a previous run, already wrote);
//! - a timer published but not yet consumed back is not published again.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tracing::debug;

use super::PipelineError;
use crate::codec::Codec;
use crate::core::Event;
use crate::kafka::consumer::GroupConsumer;
use crate::kafka::watermarks::Watermarks;
use crate::records::{event_record, signed, OutboxRecord};
use crate::signature::ControlKeys;
use crate::store::Store;

/// Most due timers a partition hands out per tick (the rest come next tick).
const PER_TICK: usize = 10_000;

/// Where the wheel learns how far a partition's log reaches and how far the
/// consumer has read it.
pub(super) struct Marks<'a> {
    pub consumer: &'a GroupConsumer,
    pub watermarks: &'a Watermarks,
    pub topic: &'a str,
}

/// A timer to publish: its event, the partition it goes to (the
/// operation's, whatever the key would hash to), and its identity.
pub(super) struct Due {
    pub record: OutboxRecord,
    pub partition: i32,
    key: (String, i64),
}

/// What the wheel remembers between ticks.
#[derive(Default)]
pub(super) struct TimerWheel {
    /// Timers published but not yet consumed back: (operation, due time).
    fired: HashSet<(String, i64)>,
    /// Per owned partition: the high watermark at assignment until the
    /// partition has consumed past it (`None` once it has). Past it the
    /// partition stays caught up whatever new traffic arrives.
    catch_up: BTreeMap<i32, Option<i64>>,
}

impl TimerWheel {
    /// Partition `p` was (re)assigned: it must catch up again.
    pub fn assigned(&mut self, p: i32) {
        self.catch_up.remove(&p);
    }

    /// Forgets partitions that are not in `owned`.
    pub fn retain(&mut self, owned: &[i32]) {
        self.catch_up.retain(|p, _| owned.contains(p));
    }

    /// `DeadlineReached` events consumed back: (operation, due time).
    pub fn consumed(&mut self, deadlines: Vec<(String, i64)>) {
        for d in deadlines {
            self.fired.remove(&d);
        }
    }

    /// Timers acknowledged by the broker: not to be published again until
    /// they are consumed back.
    pub fn fired(&mut self, due: Vec<Due>) {
        self.fired.extend(due.into_iter().map(|d| d.key));
    }

    /// Whether partition `p` (next offset to apply `next`) has consumed
    /// everything that was in it when it was assigned.
    fn caught_up(&mut self, p: i32, next: i64, marks: &Marks<'_>) -> bool {
        let target = match self.catch_up.get(&p) {
            Some(None) => return true,
            Some(Some(t)) => *t,
            None => match marks.watermarks.high(marks.topic, p, Duration::from_secs(1)) {
                Ok(high) if high >= 0 => high,
                _ => return false,
            },
        };
        // Past the target, or only transaction markers left before it.
        let done = next >= target || marks.consumer.position(p).is_some_and(|pos| pos >= target);
        self.catch_up.insert(p, if done { None } else { Some(target) });
        done
    }

    /// The timers of `owned` partitions (partition → next offset to apply)
    /// due at wall-clock time `now` that are not in flight, as events for
    /// the input topic; and how many partitions are caught up (the others
    /// fire nothing yet).
    pub fn due(
        &mut self,
        store: &Store,
        codec: &Codec,
        keys: &ControlKeys,
        marks: &Marks<'_>,
        owned: &BTreeMap<i32, i64>,
        now: i64,
    ) -> Result<(Vec<Due>, usize), PipelineError> {
        let mut due = Vec::new();
        let mut caught_up = 0;
        for (&p, &next) in owned {
            if !self.caught_up(p, next, marks) {
                continue;
            }
            caught_up += 1;
            for t in store.due_timers(p, now, PER_TICK)? {
                let key = (t.operation_id, t.at);
                if self.fired.contains(&key) {
                    continue;
                }
                let ev = Event::deadline_reached(&key.0, &t.entity_id, &t.operation_type, t.at);
                debug!(operation_id = %key.0, entity_id = %t.entity_id, due = t.at, "Timer due");
                let record = signed(event_record(codec, marks.topic, &ev)?, keys);
                due.push(Due { record, partition: p, key });
            }
        }
        Ok((due, caught_up))
    }
}
