//! The data layer against a real RocksDB store, driven by the pipeline's
//! own batch step ([`Applier`]: decode, `core::apply`, timeline, one
//! atomic write), without a broker.

use std::collections::BTreeMap;

use super::*;
use crate::codec::Codec;
use crate::config::Config;
use crate::core::event::{Body, Decision, EffectObserved, Event, EvidenceSource, Requested};
use crate::core::{AnomalyKind, Disposition, Status};
use crate::loadgen::MemoryTopic;
use crate::metrics::Metrics;
use crate::pipeline::{Applier, Stats};
use crate::records::{event_record, event_record_signing_control, signed, ProducerRecord, Record};
use crate::signature::ControlKeys;
use crate::store::tests::{temp, TempDir};
use crate::store::{Batch, Store};

/// The harness's control key.
const KEY: &str = "operator-tests-control-key";

struct Harness {
    store: Store,
    cfg: Config,
    /// The input topic the events are appended to (one partition).
    topic: MemoryTopic,
    _dir: TempDir,
}

fn ev(id: &str, seq: Option<i64>, at: i64, body: Body) -> Event {
    Event {
        event_id: id.into(),
        operation_id: "op-1".into(),
        entity_id: "cust-1".into(),
        operation_type: "sync_customer".into(),
        seq,
        occurred_at: at,
        producer: "test".into(),
        body,
    }
}

fn requested() -> Body {
    Body::Requested(Requested {
        expected_version: Some(7),
        idempotent: false,
        destination: "crm".into(),
        ..Default::default()
    })
}

fn observed(version: i64) -> Body {
    Body::EffectObserved(EffectObserved {
        remote_id: Some("crm-1".into()),
        observed_version: Some(version),
        observed_fingerprint: None,
        source: EvidenceSource::DestinationQuery,
        evidence_ref: None,
    })
}

impl Harness {
    fn new(name: &str) -> Harness {
        let dir = temp(&format!("operator-{name}"));
        let store = Store::open(&dir.0, "t.events", false).unwrap();
        let mut cfg = Config::default();
        cfg.security.control_keys = vec![KEY.into()];
        Harness { store, cfg, topic: MemoryTopic::new(1), _dir: dir }
    }

    /// One batch of events on partition 0, through the pipeline's batch
    /// step; how each was accounted for, read back from the timeline of
    /// operation op-1 (every event here is of op-1).
    /// Control events are signed with the configured key, as the
    /// reconciler's own tools sign them.
    fn batch(&mut self, events: Vec<Event>) -> Vec<Disposition> {
        let codec = Codec::new();
        let keys = self.cfg.security.loaded();
        let records =
            events.iter().map(|e| event_record_signing_control(&codec, &keys, &self.cfg.topics.events, e).unwrap());
        self.records(records.collect(), events.len())
    }

    /// [`Harness::batch`] of records as they are (signed or not).
    fn records(&mut self, records: Vec<ProducerRecord>, n: usize) -> Vec<Disposition> {
        let (codec, policy, keys) = (Codec::new(), self.cfg.policy(), self.cfg.security.loaded());
        let metrics = Metrics::new(self.cfg.types.keys(), 0);
        let applier = Applier::new(&self.cfg, &self.store, &policy, &codec, &keys, &metrics);
        let records: Vec<Record> = records.into_iter().map(|r| self.topic.append(r)).collect();
        let mut next = BTreeMap::from([(0, self.store.next_offset(0).unwrap().unwrap_or(0))]);
        let applied = applier.apply(&records, &mut next, &BTreeMap::new(), &mut Stats::default()).unwrap();
        self.store.write_encoded(&applied.batch).unwrap();
        let timeline = self.store.timeline(0, "op-1").unwrap();
        timeline.entries.iter().rev().take(n).rev().map(|e| e.disposition).collect()
    }
}

#[test]
fn explain_shows_redeliveries_and_held_events_in_arrival_order() {
    let mut h = Harness::new("explain");
    let t = 1_000;
    h.batch(vec![ev("e1", Some(1), t, requested()), ev("e3", Some(3), t + 2, observed(7))]);
    // A redelivery of e1 and the gap filler, in a later batch.
    let ds = h.batch(vec![
        ev("e1", Some(1), t, requested()),
        ev("e2", Some(2), t + 1, Body::Started { attempt: 1, worker: "w".into() }),
    ]);
    assert_eq!(ds, vec![Disposition::Duplicate, Disposition::Applied]);
    let x = explain(&h.store, "op-1").unwrap().expect("known operation");
    assert_eq!(x.state, Status::Confirmed);
    let rows: Vec<(i64, &str, Disposition, u32, u32, bool)> = x
        .timeline
        .iter()
        .map(|r| {
            (r.entry.offset, r.entry.event_id.as_str(), r.entry.disposition, r.delivery, r.deliveries, r.still_held)
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, "e1", Disposition::Applied, 1, 2, false),
            (1, "e3", Disposition::Held, 1, 1, false),
            (2, "e1", Disposition::Duplicate, 2, 2, false),
            (3, "e2", Disposition::Applied, 1, 1, false),
        ]
    );
    // The verdict shows where it was decided: when e2 released e3.
    assert_eq!(x.timeline[3].entry.verdicts.len(), 1);
    assert_eq!(x.timeline[3].entry.verdicts[0].trigger_event_id, "e3");
    assert!(x.timeline[1].entry.anomalies.iter().any(|a| a.kind.as_str() == "OUT_OF_ORDER"));
    assert!(x.timeline[2].entry.anomalies.iter().any(|a| a.kind.as_str() == "DUPLICATE_DELIVERY"));
    // Each names its entry's own event (which the stored entry leaves
    // implicit), and the body's fields read back as one line.
    assert!(x.timeline[1].entry.anomalies.iter().all(|a| a.event_id == "e3"));
    assert!(x.timeline[2].entry.anomalies.iter().all(|a| a.event_id == "e1"));
    assert_eq!(
        (x.timeline[3].entry.body.as_str(), x.timeline[3].entry.summary.as_str()),
        ("Started", "attempt 1 by w")
    );
    assert_eq!(x.expected.as_ref().unwrap().version, Some(7));
    assert_eq!(x.observed.version, Some(7));
    assert!(explain(&h.store, "op-unknown").unwrap().is_none());
    serde_json::to_string(&x).unwrap();
}

#[test]
fn review_lists_the_case_and_resolve_checks_with_the_cores_rule() {
    let mut h = Harness::new("review");
    let t = 10_000;
    h.batch(vec![ev("e1", Some(1), t, requested()), ev("e2", None, t + 5, observed(6))]);
    let q = review(&h.store, &ReviewFilter::default(), t + 65).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!((q[0].operation_id.as_str(), q[0].age_ms, q[0].since), ("op-1", 60, t + 5));
    assert_eq!(q[0].outcome.map(|o| o.as_str()), Some("DIVERGENT"));
    assert_eq!(q[0].allowed_decisions, vec![Decision::Confirm, Decision::Requeue, Decision::Close]);
    let older = ReviewFilter { older_than_ms: Some(61), ..Default::default() };
    assert!(review(&h.store, &older, t + 65).unwrap().is_empty());
    let other = ReviewFilter { operation_type: Some("other".into()), ..Default::default() };
    assert!(review(&h.store, &other, t + 65).unwrap().is_empty());

    let req = |decision| ResolveRequest {
        operation_id: "op-1".into(),
        decision,
        actor: "ana".into(),
        note: "CRM shows v6, accepted".into(),
        evidence_checked: vec!["crm".into()],
    };
    let err = resolve::prepare(&h.store, &req(Decision::Compensate), t + 70).unwrap_err();
    assert!(err.to_string().contains("COMPENSATE is allowed only after a DUPLICATE_EFFECT"), "{err}");
    let d = resolve::prepare(&h.store, &req(Decision::Confirm), t + 70).unwrap();
    assert_eq!(d.partition, 0);
    assert_eq!(d.event.event_id, resolve::prepare(&h.store, &req(Decision::Confirm), t + 99).unwrap().event.event_id);
    // Applied through the "log": out of review, decision in the timeline.
    assert_eq!(h.batch(vec![d.event.clone()]), vec![Disposition::Applied]);
    assert!(review(&h.store, &ReviewFilter::default(), t + 100).unwrap().is_empty());
    let x = explain(&h.store, "op-1").unwrap().unwrap();
    let last = x.timeline.last().unwrap();
    assert_eq!(last.entry.manual.as_ref().unwrap().actor, "ana");
    assert_eq!(last.entry.verdicts[0].outcome.as_str(), "CORRECT");
    let err = resolve::prepare(&h.store, &req(Decision::Confirm), t + 120).unwrap_err();
    assert!(err.to_string().contains("in state CONFIRMED"), "{err}");
}

/// A refused operator learns what the case accepts instead.
#[test]
fn refusal_names_the_decisions_the_operation_accepts() {
    let mut h = Harness::new("refusal");
    let t = 10_000;
    h.batch(vec![ev("e1", Some(1), t, requested()), ev("e2", None, t + 5, observed(6))]);
    let req = |decision| ResolveRequest {
        operation_id: "op-1".into(),
        decision,
        actor: "ana".into(),
        note: "checked".into(),
        evidence_checked: vec![],
    };
    let err = resolve::prepare(&h.store, &req(Decision::Compensate), t + 70).unwrap_err();
    assert!(err.to_string().ends_with("it accepts CONFIRM, REQUEUE, CLOSE now"), "{err}");
    let divergent = ReviewFilter { outcome: Some(crate::core::Outcome::Divergent), ..Default::default() };
    assert_eq!(review(&h.store, &divergent, t + 70).unwrap().len(), 1);
    let missing = ReviewFilter { outcome: Some(crate::core::Outcome::Missing), ..Default::default() };
    assert!(review(&h.store, &missing, t + 70).unwrap().is_empty());
    let d = resolve::prepare(&h.store, &req(Decision::Close), t + 70).unwrap();
    h.batch(vec![d.event]);
    let err = resolve::prepare(&h.store, &req(Decision::Close), t + 80).unwrap_err();
    assert!(err.to_string().ends_with("it accepts no decision now (see `reconciler explain`)"), "{err}");
}

#[test]
fn timeline_keeps_the_latest_entries_up_to_the_cap_and_the_digest_is_stable() {
    let mut h = Harness::new("cap");
    h.batch(vec![ev("e1", Some(1), 0, requested())]);
    let digest = state_digest(&h.store).unwrap();
    let cap = crate::store::timeline::TIMELINE_CAP as usize;
    let n = cap + 10;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        h.batch(chunk.iter().map(|_| ev("e1", Some(1), 0, requested())).collect());
    }
    let x = explain(&h.store, "op-1").unwrap().unwrap();
    assert_eq!(x.timeline.len(), cap);
    assert_eq!(x.timeline_dropped, (n + 1 - cap) as u64);
    assert_eq!(x.timeline.last().unwrap().entry.ordinal, n as u64);
    assert!(x.timeline.windows(2).all(|w| w[0].entry.ordinal + 1 == w[1].entry.ordinal));
    // Duplicates changed the counters: the digest moves; it is a function
    // of the state only.
    let after = state_digest(&h.store).unwrap();
    assert_ne!(after.digest, digest.digest);
    assert_eq!((after.operations, after.entities), (1, 1));
    assert_eq!(after, state_digest(&h.store).unwrap());
}

/// A PROBE case waits for a machine, listed apart from the review
/// queue with its follow-up time; a person may still decide it.
#[test]
fn machine_cases_are_listed_with_their_follow_up_and_accept_decisions() {
    let mut h = Harness::new("machine");
    let t = 10_000;
    let probed = Body::Requested(Requested {
        expected_version: Some(7),
        idempotency_key: Some("k-1".into()),
        idempotent: true,
        destination: "crm".into(),
        confirm_within_ms: Some(1_000),
        ..Default::default()
    });
    h.batch(vec![
        ev("e1", Some(1), t, probed),
        ev("e2", Some(2), t + 10, Body::Started { attempt: 1, worker: "w".into() }),
        ev("e3", Some(3), t + 20, Body::OutcomeUnknown { attempt: 1, detail: "timeout".into() }),
    ]);
    h.batch(vec![Event::deadline_reached("op-1", "cust-1", "sync_customer", t + 1_000)]);
    assert!(review(&h.store, &ReviewFilter::default(), t + 1_500).unwrap().is_empty(), "not with a person yet");
    let machine = ReviewFilter { waiting: review::Waiting::Machine, ..Default::default() };
    let q = review(&h.store, &machine, t + 1_500).unwrap();
    assert_eq!(q.len(), 1);
    let it = &q[0];
    assert_eq!((it.since, it.age_ms, it.follow_up_at), (t + 1_000, 500, Some(t + 2_000)));
    assert_eq!(it.follow_up_action, Some(crate::core::RepairAction::Probe));
    assert_eq!(it.allowed_decisions, vec![Decision::Confirm, Decision::Requeue, Decision::Close]);
    let table = render::review(&q, review::Waiting::Machine);
    assert!(table.contains("follow-up") && table.contains("waiting for a machine action"), "{table}");
    let x = explain(&h.store, "op-1").unwrap().unwrap();
    assert_eq!(x.follow_up.map(|f| f.at), Some(t + 2_000));
    assert_eq!((x.next_timer_at, x.deadline_at), (Some(t + 2_000), None));
    assert!(render::explanation(&x).contains("Follow-up   PROBE at"), "{}", render::explanation(&x));
    // Nothing answers: at the follow-up the case goes to a person.
    h.batch(vec![Event::deadline_reached("op-1", "cust-1", "sync_customer", t + 2_000)]);
    assert!(review(&h.store, &machine, t + 2_500).unwrap().is_empty());
    let q = review(&h.store, &ReviewFilter::default(), t + 2_500).unwrap();
    assert_eq!((q.len(), q[0].reason.contains("probe was not answered")), (1, true));
    assert!(audit::untimed(&h.store).unwrap().is_empty());
}

/// The audit finds an open operation that nothing will wake again.
#[test]
fn audit_reports_an_open_operation_without_a_timer() {
    let mut h = Harness::new("audit");
    h.batch(vec![ev("e1", Some(1), 1_000, requested())]);
    assert!(audit::untimed(&h.store).unwrap().is_empty());
    // A state written without its timer (what a bug in the core would do).
    let (mut op, head) = h.store.load_op(0, "op-1").unwrap();
    let mut batch = Batch::default();
    batch.move_timer(0, "op-1", op.as_ref().and_then(|o| o.timer_at), None);
    op.as_mut().unwrap().timer_at = None;
    batch.put_op(0, "op-1".into(), op, head);
    h.store.commit(batch).unwrap();
    let untimed = audit::untimed(&h.store).unwrap();
    assert_eq!(untimed.len(), 1);
    assert_eq!(
        (untimed[0].operation_id.as_str(), untimed[0].state, untimed[0].timer_at),
        ("op-1", Status::Pending, None)
    );
}

/// Control events that do not carry a signature of a configured
/// key change nothing (not even the event ids the genuine ones will use),
/// are flagged FORGED_CONTROL_EVENT with the producer and position, and
/// show in `explain`; a signature of a key rotated out is refused, one of
/// the current key accepted.
#[test]
fn unsigned_or_badly_signed_control_events_change_nothing() {
    let mut h = Harness::new("forged");
    let t = 10_000;
    let window = Body::Requested(Requested {
        expected_version: Some(7),
        idempotent: false,
        destination: "crm".into(),
        confirm_within_ms: Some(1_000),
        ..Default::default()
    });
    h.batch(vec![ev("e1", Some(1), t, window), ev("e2", None, t + 5, observed(6))]);
    let before = state_digest(&h.store).unwrap();
    let codec = Codec::new();
    let topic = h.cfg.topics.events.clone();
    let decision = |id: &str| {
        let body = Body::ManualDecision {
            actor: "mallory".into(),
            decision: Decision::Confirm,
            note: "trust me".into(),
            evidence_checked: vec![],
        };
        Event { producer: "billing-service".into(), ..ev(id, None, t + 50, body) }
    };
    let deadline = Event::deadline_reached("op-1", "cust-1", "sync_customer", t + 999_000);
    let old = ControlKeys::new([b"an-older-rotated-out-key".to_vec()]);
    let forged = vec![
        event_record(&codec, &topic, &decision("m1")).unwrap(),
        event_record(&codec, &topic, &deadline).unwrap(),
        signed(event_record(&codec, &topic, &decision("m2")).unwrap(), &old),
    ];
    let anomalies = |h: &Harness| {
        let x = explain(&h.store, "op-1").unwrap().unwrap();
        x.timeline
            .iter()
            .flat_map(|t| t.entry.anomalies.clone())
            .filter(|a| a.kind == AnomalyKind::ForgedControlEvent)
            .count()
    };
    assert_eq!(h.records(forged, 3), vec![Disposition::Anomalous; 3]);
    let after = state_digest(&h.store).unwrap();
    assert_eq!((after.operations, after.entities), (before.operations, before.entities));
    let x = explain(&h.store, "op-1").unwrap().unwrap();
    assert_eq!(x.state, Status::ManualReview, "still in review: the forged CONFIRM was not applied");
    assert_eq!(anomalies(&h), 3);
    let last = &x.timeline.last().unwrap().entry;
    assert!(last.anomalies[0].detail.contains("billing-service"), "{}", last.anomalies[0].detail);
    assert!(last.manual.is_none(), "a refused decision is not recorded as one: {:?}", last.manual);
    assert!(render::explanation(&x).contains("FORGED_CONTROL_EVENT"), "{}", render::explanation(&x));
    // The genuine decision with the same event id as a forged one is
    // still applied: the forged one left no trace in the dedup set.
    let keys = h.cfg.security.loaded();
    let genuine = signed(event_record(&codec, &topic, &decision("m1")).unwrap(), &keys);
    assert_eq!(h.records(vec![genuine], 1), vec![Disposition::Applied]);
    assert_eq!(explain(&h.store, "op-1").unwrap().unwrap().state, Status::Confirmed);
    // With the current key second (rotation), the old key's signature of
    // m2 is accepted: all configured keys verify.
    h.cfg.security.control_keys = vec!["a-newer-current-control-key".into(), "an-older-rotated-out-key".into()];
    let replayed = signed(event_record(&codec, &topic, &decision("m3")).unwrap(), &old);
    h.records(vec![replayed], 1);
    assert_eq!(anomalies(&h), 3, "verified this time (a CONFIRMED case then refuses the decision itself)");
}

/// An operation removed out of retention and opened again under the same
/// id in one batch starts a timeline of its own: none of the old one's
/// entries, in its value or moved out of it, is shown (nor read against
/// the new state, which does not hold what they name).
#[test]
fn an_operation_removed_and_opened_again_in_one_batch_starts_a_new_timeline() {
    let mut h = Harness::new("reopened");
    let t = 1_000;
    let started = Body::Started { attempt: 1, worker: "w".into() };
    h.batch(vec![
        ev("e1", Some(1), t, requested()),
        ev("e2", Some(2), t + 1, started),
        ev("e3", Some(3), t + 2, observed(7)),
    ]);
    // Redeliveries, until its first entries move out of its value.
    h.batch(vec![ev("e1", Some(1), t, requested()); 8]);
    assert_eq!(h.store.timeline(0, "op-1").unwrap().total, 11);
    let op = h.store.get_op(0, "op-1").unwrap().expect("stored");
    assert_eq!(op.status, Status::Confirmed);
    let end = op.timer_at.expect("its retention timer");
    let again = Body::Requested(Requested { destination: "erp".into(), ..Default::default() });
    let ds = h.batch(vec![
        Event::deadline_reached("op-1", "cust-1", "sync_customer", end),
        ev("new-1", Some(1), end + 1, again),
    ]);
    assert_eq!(ds, vec![Disposition::Applied], "only the new operation's request is in its timeline");
    let timeline = h.store.timeline(0, "op-1").unwrap();
    let shown: Vec<(&str, &str)> = timeline.entries.iter().map(|e| (e.event_id.as_str(), e.summary.as_str())).collect();
    assert_eq!(timeline.total, 1);
    assert_eq!(shown, [("new-1", "expects version - fingerprint -; not idempotent; key -; to erp")]);
    let x = explain(&h.store, "op-1").unwrap().expect("known operation");
    assert_eq!((x.state, x.timeline.len()), (Status::Pending, 1));
}
