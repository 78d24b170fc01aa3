//! The timer wheel: the timer index in the store, compared with
//! the wall clock, becomes `DeadlineReached` events in the input log, so
//! that every timeout is judged when it is consumed and a replay reproduces
//! it without a clock.
//!
//! Two rules keep a timer from firing twice or early:
//! - a partition fires nothing until it has consumed everything that was in
//!   it when it was assigned (below that mark lie the deadline events a
//!   previous owner, or a previous run, already wrote);
//! - a timer published but not yet consumed back is not published again.
//!
//! A partition's scan starts at its floor, not at its start: every live
//! timer due before the floor is in flight (published and acknowledged,
//! not yet consumed back). Each firing moves or removes its timer, which
//! leaves a tombstone in the store until a compaction drops it, and a seek
//! from the partition's start stepped over all of those at every tick.
//! The floor only rises once a tick's firings are acknowledged: to just
//! past the time scanned, or to the last timer read when the tick read
//! the most it may. It goes back down to the due time of every timer
//! written since (the store notes them, after the write), to the
//! partition's start after a restore wrote it, and to the due time of
//! every `DeadlineReached` consumed back, whoever fired it (its timer may
//! still be there). A partition assigned again, or not caught up, scans
//! from its start.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tracing::debug;

use super::PipelineError;
use crate::codec::Codec;
use crate::core::Event;
use crate::kafka::consumer::GroupConsumer;
use crate::kafka::watermarks::Watermarks;
use crate::records::{event_record, signed, ProducerRecord};
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
    pub record: ProducerRecord,
    pub partition: i32,
    key: (String, i64),
}

/// What the wheel remembers between ticks.
#[derive(Default)]
pub(super) struct TimerWheel {
    /// Timers published but not yet consumed back: (operation, due time)
    /// → the partition they went to. A partition that leaves forgets its
    /// own: its firings may be consumed back by another owner, and kept
    /// here they would hide the same timer (same operation, same due time)
    /// from every later tick if the partition came back with it live.
    fired: HashMap<(String, i64), i32>,
    /// Per owned partition: the high watermark at assignment until the
    /// partition has consumed past it (`None` once it has). Past it the
    /// partition stays caught up whatever new traffic arrives.
    catch_up: BTreeMap<i32, Option<i64>>,
    /// Per partition, where its scan starts (see the module's doc); none:
    /// at its start.
    floors: BTreeMap<i32, i64>,
    /// The floors the last tick's scans earned, raised to once its firings
    /// are acknowledged.
    earned: Vec<(i32, i64)>,
    /// The earliest due time of the `DeadlineReached` events consumed back
    /// since the last tick: every floor goes back to it at the next (not at
    /// once, so that a floor earned by a scan before them cannot pass it
    /// again).
    consumed_from: Option<i64>,
    /// The partitions [`TimerWheel::retain`] last kept: called after every
    /// poll with the same set, it has nothing to forget (walking `fired`
    /// each time was 1 % of the run loop with a tick's firings in flight).
    /// A partition that left and came back between two calls is forgotten
    /// by [`TimerWheel::assigned`].
    retained_for: Vec<i32>,
}

impl TimerWheel {
    /// Partition `p` was (re)assigned: it must catch up again. Its
    /// firings are forgotten: each was acknowledged before the assignment
    /// (a tick publishes and waits in one step), so it lies below the mark
    /// the partition catches up to, and is consumed back, or was consumed
    /// by another owner, before the partition fires again.
    pub fn assigned(&mut self, p: i32) {
        self.catch_up.remove(&p);
        self.forget_floor(p);
        self.fired.retain(|_, q| *q != p);
    }

    /// Forgets partitions that are not in `owned`.
    pub fn retain(&mut self, owned: &[i32]) {
        if self.retained_for == owned {
            return;
        }
        self.retained_for = owned.to_vec();
        self.catch_up.retain(|p, _| owned.contains(p));
        self.floors.retain(|p, _| owned.contains(p));
        self.earned.retain(|(p, _)| owned.contains(p));
        self.fired.retain(|_, p| owned.contains(p));
    }

    /// `DeadlineReached` events consumed back: (operation, due time).
    pub fn consumed(&mut self, deadlines: Vec<(String, i64)>) {
        for d in deadlines {
            // Whether this instance fired it or not: the timer may still be
            // there (a stale or refused deadline moves nothing).
            self.consumed_from = Some(self.consumed_from.map_or(d.1, |at| at.min(d.1)));
            self.fired.remove(&d);
        }
    }

    /// The tick's timers, acknowledged by the broker (possibly none): not
    /// to be published again until they are consumed back. The floors the
    /// tick's scans earned hold from now on.
    pub fn fired(&mut self, due: Vec<Due>) {
        self.fired.extend(due.into_iter().map(|d| (d.key, d.partition)));
        for (p, floor) in self.earned.drain(..) {
            let f = self.floors.entry(p).or_insert(floor);
            *f = (*f).max(floor);
        }
    }

    fn forget_floor(&mut self, p: i32) {
        self.floors.remove(&p);
        self.earned.retain(|(q, _)| *q != p);
    }

    /// Takes every floor back to the timers written and the firings
    /// consumed back since the last tick.
    fn lower_floors(&mut self, store: &Store) {
        let lower = |f: &mut i64, at: i64| *f = (*f).min(at);
        for (p, at) in store.take_timer_puts() {
            if let Some(f) = self.floors.get_mut(&p) {
                lower(f, at);
            }
        }
        if let Some(at) = self.consumed_from.take() {
            self.floors.values_mut().for_each(|f| lower(f, at));
        }
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
        self.earned.clear();
        self.lower_floors(store);
        for (&p, &next) in owned {
            if !self.caught_up(p, next, marks) {
                self.forget_floor(p);
                continue;
            }
            caught_up += 1;
            let from = self.floors.get(&p).copied().unwrap_or(i64::MIN);
            let timers = store.due_timers_from(p, from, now, PER_TICK)?;
            // Every live timer due before the floor earned is in flight
            // once this tick's are: all of them up to `now`, or up to the
            // last one read when the tick could not read them all.
            let earned = match timers.last() {
                Some(last) if timers.len() == PER_TICK => last.at,
                _ => now.saturating_add(1),
            };
            self.earned.push((p, earned));
            for t in timers {
                let key = (t.operation_id, t.at);
                if self.fired.contains_key(&key) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn due(partition: i32, operation: &str, at: i64) -> Due {
        let record = ProducerRecord { topic: "events".into(), key: None, value: None, headers: Vec::new() };
        Due { record, partition, key: (operation.into(), at) }
    }

    fn in_flight(wheel: &TimerWheel, operation: &str, at: i64) -> bool {
        wheel.fired.contains_key(&(operation.to_string(), at))
    }

    #[test]
    fn a_partition_that_leaves_or_comes_back_forgets_its_firings() {
        let mut wheel = TimerWheel::default();
        wheel.fired(vec![due(1, "op-a", 10), due(2, "op-b", 20), due(3, "op-c", 30)]);
        assert!(in_flight(&wheel, "op-a", 10) && in_flight(&wheel, "op-b", 20) && in_flight(&wheel, "op-c", 30));

        // Partition 1 revoked: another owner may consume op-a's deadline.
        wheel.retain(&[2, 3]);
        assert!(!in_flight(&wheel, "op-a", 10));
        assert!(in_flight(&wheel, "op-b", 20) && in_flight(&wheel, "op-c", 30));

        // Partition 2 assigned again: its firing lies below its catch-up mark.
        wheel.assigned(2);
        assert!(!in_flight(&wheel, "op-b", 20));
        assert!(in_flight(&wheel, "op-c", 30));

        // Consumed back: no longer in flight, whoever fired it.
        wheel.consumed(vec![("op-c".into(), 30)]);
        assert!(wheel.fired.is_empty());
    }

    /// `retain` runs after every poll: the same partitions again forget
    /// nothing of theirs, and a partition that left is still forgotten.
    #[test]
    fn the_same_partitions_again_keep_their_firings() {
        let mut wheel = TimerWheel::default();
        wheel.retain(&[1, 2]);
        wheel.fired(vec![due(1, "op-a", 10), due(2, "op-b", 20)]);
        wheel.retain(&[1, 2]);
        assert!(in_flight(&wheel, "op-a", 10) && in_flight(&wheel, "op-b", 20));
        wheel.retain(&[2]);
        assert!(!in_flight(&wheel, "op-a", 10) && in_flight(&wheel, "op-b", 20));
        wheel.retain(&[]);
        assert!(wheel.fired.is_empty());
    }
}
