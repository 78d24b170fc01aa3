//! Terminal rendering of the operator tools' results (the `--json` forms
//! are the serde forms of the same values), and the parsing of durations
//! such as `10m` given on the command line.

use std::fmt::Write;

use super::dlq::{DeadLetter, RedriveReport};
use super::explain::Explanation;
use super::replay::ReplaySummary;
use super::review::{ReviewItem, Waiting};
use crate::core::event::Decision;
use crate::core::{Outcome, RepairAction};

/// Milliseconds since the epoch as `2026-11-29T11:02:03.456Z`.
pub fn time(ms: i64) -> String {
    crate::clock::format_time(ms)
}

/// A duration in ms as `3d 4h`, `2h 5m`, `5m 3s`, `12s`, `250ms`.
pub fn age(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms}ms"),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s / 60 % 60),
        _ => format!("{}d {}h", s / 86_400, s / 3600 % 24),
    }
}

/// Parses `500ms`, `30s`, `10m`, `2h`, `3d` (or a bare number of seconds)
/// into milliseconds.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: i64 = num.parse().map_err(|_| format!("{text:?} is not a duration like 10m, 2h or 3d"))?;
    let factor = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use ms, s, m, h or d")),
    };
    n.checked_mul(factor).ok_or_else(|| format!("{text:?} is too long"))
}

/// The value of `all` whose name (`name(v)`, e.g. `CONFIRM`) is `text` in
/// any case: the CLI, the API and the panel accept the names that
/// `explain`, `review` and the verdicts print, typed as a person types them.
fn parse_name<T: Copy>(what: &str, text: &str, all: &[T], name: fn(T) -> &'static str) -> Result<T, String> {
    let t = text.trim();
    all.iter().copied().find(|v| name(*v).eq_ignore_ascii_case(t)).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|v| name(*v)).collect();
        format!("{what} {text:?} is not one of {}", names.join(", "))
    })
}

/// Parses a decision (`confirm`, `CONFIRM`, ...).
pub fn parse_decision(text: &str) -> Result<Decision, String> {
    parse_name("decision", text, &Decision::ALL, Decision::as_str)
}

/// Parses a verdict outcome (`divergent`, `DUPLICATE_EFFECT`, ...).
pub fn parse_outcome(text: &str) -> Result<Outcome, String> {
    parse_name("outcome", text, &Outcome::ALL, Outcome::as_str)
}

/// Parses whose move a case waits for (`person`, `machine`).
pub fn parse_waiting(text: &str) -> Result<Waiting, String> {
    parse_name("waiting", text, &Waiting::ALL, Waiting::as_str)
}

/// Decisions as a person reads them: `CONFIRM, REQUEUE, CLOSE`.
pub fn decisions(ds: &[Decision]) -> String {
    ds.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(", ")
}

/// Pads/cuts `s` to `w` characters.
fn cell(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n > w {
        let cut: String = s.chars().take(w.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        format!("{s}{}", " ".repeat(w - n))
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), ToString::to_string)
}

/// `explain` for a terminal.
pub fn explanation(x: &Explanation) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Operation {}  ({}, entity {}, partition {})",
        x.operation_id, x.operation_type, x.entity_id, x.partition
    );
    let _ = writeln!(o, "State       {}", x.state.as_str());
    if let Some(since) = x.review_since {
        let _ = writeln!(o, "In review   since {}", time(since));
    }
    if let Some(d) = x.deadline_at {
        let _ = writeln!(o, "Deadline    {}", time(d));
    }
    if let Some(t) = x.next_attempt_at {
        let _ = writeln!(o, "Retry       scheduled by the worker for {}", time(t));
    }
    if let Some(f) = &x.follow_up {
        let then = match f.action {
            RepairAction::Probe => "to review if the probe is not answered",
            RepairAction::Requeue => "requeued again (or to review at the limit) if no attempt starts",
        };
        let _ = writeln!(o, "Follow-up   {} at {}: {then}", f.action.as_str(), time(f.at));
    }
    if x.requeues > 0 {
        let _ = writeln!(o, "Requeued    {} time(s) automatically", x.requeues);
    }
    if let Some(by) = &x.superseded_by {
        let _ = writeln!(
            o,
            "Superseded  by operation {} (version {}): never requeued",
            by.operation_id,
            opt(&by.expected_version)
        );
    }
    if let Some(v) = &x.last_verdict {
        let _ = writeln!(o, "Verdict     {} / {}: {}", v.outcome.as_str(), v.action.as_str(), v.reason);
    }
    if !x.allowed_decisions.is_empty() {
        let _ = writeln!(o, "Decisions   {}", decisions(&x.allowed_decisions));
        let _ = writeln!(o, "Decide with reconciler resolve {} --decision D --actor NAME --note TEXT", x.operation_id);
    }
    let _ = writeln!(o, "\n{:<14}{:<28}observed", "", "expected");
    let e = x.expected.as_ref();
    let ob = &x.observed;
    let row = |o: &mut String, name: &str, exp: String, obs: String| {
        let _ = writeln!(o, "{name:<14}{}{obs}", cell(&exp, 28));
    };
    row(&mut o, "version", e.map_or("-".into(), |e| opt(&e.version)), opt(&ob.version));
    row(&mut o, "fingerprint", e.map_or("-".into(), |e| opt(&e.fingerprint)), opt(&ob.fingerprint));
    row(
        &mut o,
        "remote ids",
        String::new(),
        if ob.remote_ids.is_empty() { "-".into() } else { ob.remote_ids.join(", ") },
    );
    row(&mut o, "attempts", e.map_or("-".into(), |e| format!("at most {}", e.max_attempts)), ob.attempts.to_string());
    if let Some(e) = e {
        let _ = writeln!(
            o,
            "requested     {} to {}, {}idempotent, key {}, confirm within {}",
            time(e.requested_at),
            e.destination,
            if e.idempotent { "" } else { "not " },
            opt(&e.idempotency_key),
            age(e.confirm_within_ms)
        );
    } else {
        let _ = writeln!(o, "requested     never (its Requested has not arrived)");
    }
    let c = &x.counts;
    let _ = writeln!(
        o,
        "counts        {} applied, {} duplicates, {} out of order, {} held now, {} orphaned, {} verdicts",
        c.events_applied, c.duplicates_seen, c.out_of_order_seen, c.held_now, c.orphaned_now, c.verdicts
    );
    let _ = writeln!(
        o,
        "\nTimeline ({} entries{}):",
        x.timeline.len(),
        if x.timeline_dropped > 0 {
            format!(", {} earlier ones dropped by the cap", x.timeline_dropped)
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        o,
        "  {:>3}  {:<11}  {:<24}  {:<24}  {:>4}  {:<16}  {:<10}  disposition",
        "#", "part/offset", "occurred", "event", "seq", "body", "delivery"
    );
    for r in &x.timeline {
        let e = &r.entry;
        let disposition = match e.disposition.as_str() {
            "held" if r.still_held => "held (waiting)".to_owned(),
            "held" => "held, applied later".to_owned(),
            d => d.to_owned(),
        };
        let delivery = if r.deliveries > 1 { format!("{} of {}", r.delivery, r.deliveries) } else { "1".into() };
        let _ = writeln!(
            o,
            "  {:>3}  {:<11}  {:<24}  {}  {:>4}  {:<16}  {:<10}  {}",
            e.ordinal,
            format!("{}/{}", e.partition, e.offset),
            time(e.occurred_at),
            cell(&e.event_id, 24),
            opt(&e.seq),
            e.body,
            delivery,
            disposition
        );
        let _ = writeln!(o, "{:>8}{}", "", e.summary);
        if let Some(m) = &e.manual {
            let checked = if m.evidence_checked.is_empty() { "-".to_owned() } else { m.evidence_checked.join(", ") };
            let _ = writeln!(
                o,
                "{:>8}decision {} by {}: {} (checked: {checked})",
                "",
                m.decision.as_str(),
                m.actor,
                m.note
            );
        }
        for a in &e.anomalies {
            let _ = writeln!(o, "{:>8}anomaly {}: {}", "", a.kind.as_str(), a.detail);
        }
        for v in &e.verdicts {
            let _ = writeln!(
                o,
                "{:>8}verdict {} / {} -> {} ({}): {}",
                "",
                v.outcome.as_str(),
                v.action.as_str(),
                v.state.as_str(),
                v.verdict_id,
                v.reason
            );
        }
    }
    o
}

/// The review queue (or the cases waiting for a machine) as a table.
pub fn review(items: &[ReviewItem], waiting: Waiting) -> String {
    if items.is_empty() {
        return match waiting {
            Waiting::Person => "No operation is waiting for review.\n",
            Waiting::Machine => "No operation is waiting for a machine action.\n",
        }
        .to_owned();
    }
    let machine = waiting == Waiting::Machine;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<9}  {:<28}  {:<16}  {:<16}  {:<16}  {:<13}  {}reason",
        "age",
        "operation",
        "entity",
        "type",
        "outcome",
        if machine { "waiting for" } else { "recommended" },
        if machine { format!("{:<24}  ", "follow-up") } else { String::new() }
    );
    for it in items {
        let follow_up = if machine {
            format!("{:<24}  ", it.follow_up_at.map_or_else(|| "-".to_owned(), time))
        } else {
            String::new()
        };
        let mut reason = it.reason.clone();
        if let Some(by) = &it.superseded_by {
            reason = format!("[superseded by {}] {reason}", by.operation_id);
        }
        let _ = writeln!(
            o,
            "{:<9}  {}  {}  {}  {:<16}  {:<13}  {follow_up}{reason}",
            age(it.age_ms),
            cell(&it.operation_id, 28),
            cell(&it.entity_id, 16),
            cell(&it.operation_type, 16),
            it.outcome.map_or("-", |x| x.as_str()),
            it.recommended_action.map_or("-", |x| x.as_str()),
        );
    }
    if machine {
        let _ = writeln!(o, "{} operation(s) waiting for a machine action, oldest first.", items.len());
        let _ = writeln!(
            o,
            "Unanswered at its follow-up, a case goes to review (a requeue is first retried up to the limit)."
        );
    } else {
        let _ = writeln!(o, "{} operation(s) in review, oldest first.", items.len());
    }
    let _ = writeln!(o, "Evidence and timeline: reconciler explain OPERATION");
    let _ = writeln!(o, "Decide: reconciler resolve OPERATION --decision D --actor NAME --note TEXT");
    o
}

/// Dead letters with their provenance.
pub fn dead_letters(items: &[DeadLetter]) -> String {
    if items.is_empty() {
        return "No dead letters match.\n".to_owned();
    }
    let mut o = String::new();
    let _ = writeln!(o, "dlq p/offset, class, key, value size, read from topic/partition/offset at time:");
    for d in items {
        let src = &d.source;
        let _ = writeln!(
            o,
            "{}/{}  {:<19}  key {}  value {}  from {}/{}/{} at {}",
            d.partition,
            d.offset,
            d.class,
            opt(&d.key),
            d.value_bytes.map_or_else(|| "null".to_owned(), |n| format!("{n} B")),
            src.topic,
            opt(&src.partition),
            opt(&src.offset),
            src.timestamp.map_or_else(|| "-".to_owned(), time)
        );
        let _ = writeln!(o, "    {}", d.message);
        if let Some(n) = d.truncated_from {
            let _ = writeln!(o, "    value truncated from {n} bytes: cannot be re-driven");
        }
        if let Some(r) = &d.redriven_from {
            let _ = writeln!(o, "    re-driven from {r}, and dead-lettered again");
        }
        if let Some(a) = &d.redriven {
            let _ = writeln!(o, "    re-driven by {} at {}: {}", a.actor, time(a.at_ms), a.note);
            if a.state == crate::operator::dlq::RedriveState::Sending {
                let _ = writeln!(
                    o,
                    "    that re-drive was cut short before the broker acknowledged it: it may or may not be on {}; \
                     `reconciler dlq redrive --offset {}:{}` sends it again (a copy that did get through is then \
                     a duplicate delivery of the same event)",
                    a.to_topic, d.partition, d.offset
                );
            }
        }
        for (k, v) in &d.headers {
            let _ = writeln!(o, "    header {k} = {}", opt(v));
        }
    }
    let mut classes: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for d in items {
        *classes.entry(d.class.as_str()).or_default() += 1;
    }
    let by: Vec<String> = classes.iter().map(|(c, n)| format!("{c} {n}")).collect();
    let _ = writeln!(o, "{} dead letter(s): {}.", items.len(), by.join(", "));
    o
}

/// The outbox's dead letters (`reconciler outbox dead-letters`).
pub fn outbox_dead_letters(s: &crate::outbox::dead_letter::OutboxSummary) -> String {
    let mut o = String::new();
    for d in &s.samples {
        let _ = writeln!(
            o,
            "row {}  entity {}  event {}  written {}  {} attempts  {} B",
            d.id,
            d.entity_id,
            opt(&d.event_id),
            time(d.created_at_ms),
            d.attempts,
            d.event_bytes
        );
        let _ = writeln!(o, "    {}", d.last_error);
    }
    let by: Vec<String> = s.by_class.iter().map(|c| format!("{} {}", c.class, c.count)).collect();
    let _ = writeln!(
        o,
        "{} dead letter(s){}{}; {} row(s) pending.",
        s.dead_letters,
        if by.is_empty() { String::new() } else { format!(": {}", by.join(", ")) },
        s.oldest_dead_letter_ms.map_or_else(String::new, |t| format!(", the oldest written {}", time(t))),
        s.pending
    );
    for a in &s.audit {
        let _ = writeln!(o, "re-driven: row {} by {} at {}: {}", a.outbox_id, a.actor, time(a.at_ms), a.note);
    }
    o
}

/// What an outbox re-drive did (or would do).
pub fn outbox_redrive(r: &crate::outbox::dead_letter::OutboxRedriveReport) -> String {
    let ids: Vec<String> = r.ids.iter().map(i64::to_string).collect();
    format!(
        "{} row(s) {}{}{}\n",
        r.ids.len(),
        if r.dry_run { "would be re-driven (dry run: nothing changed)" } else { "re-driven, by " },
        if r.dry_run { String::new() } else { r.actor.clone() },
        if ids.is_empty() { String::new() } else { format!(": {}", ids.join(", ")) }
    )
}

/// What a re-drive did (or would do).
pub fn redrive(r: &RedriveReport) -> String {
    let mut o = String::new();
    let verb = if r.dry_run { "would re-drive" } else { "re-driven" };
    for it in &r.items {
        match &it.skipped {
            Some(why) => {
                let _ = writeln!(o, "{}/{}  {:<19}  skipped: {why}", it.dlq_partition, it.dlq_offset, it.class);
            }
            None => {
                let to = it.to_partition.map_or_else(|| "by key".to_owned(), |p| format!("partition {p}"));
                let _ = writeln!(
                    o,
                    "{}/{}  {:<19}  key {}  {verb} to {to}",
                    it.dlq_partition,
                    it.dlq_offset,
                    it.class,
                    opt(&it.key)
                );
            }
        }
    }
    let _ = writeln!(
        o,
        "{} {verb}, {} skipped{}.",
        r.sent,
        r.skipped,
        if r.dry_run { " (dry run: nothing sent)" } else { "" }
    );
    o
}

/// The replay summary.
pub fn replay(s: &ReplaySummary) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Replayed into {}", s.state_dir);
    let _ = writeln!(o, "  events       {} in {} ({:.0}/s)", s.events, age(s.duration_ms as i64), s.events_per_sec);
    let by: Vec<String> = s.by_disposition.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(o, "  accounted    {}", by.join(", "));
    let _ = writeln!(o, "  verdicts     {}", s.verdicts);
    let _ = writeln!(o, "  anomalies    {}", s.anomalies);
    let _ = writeln!(o, "  dead letters {}", s.dead_letters);
    let _ = writeln!(
        o,
        "  state        {} operations, {} entities, digest {}",
        s.digest.operations, s.digest.entities, s.digest.digest
    );
    match &s.output_topics {
        Some(t) => {
            let _ = writeln!(o, "  outputs      {}, {}, {}, {}", t.verdicts, t.anomalies, t.dlq, t.commands);
        }
        None => {
            let _ = writeln!(o, "  outputs      discarded (no --output-prefix)");
        }
    }
    if let Some(d) = &s.diff {
        let _ = writeln!(
            o,
            "  diff         live {} / replayed {}: {} equal, {} differing, {} missing, {} extra",
            d.live, d.replayed, d.equal, d.differing, d.missing, d.extra
        );
        for (what, ids) in [("differing", &d.differing_ids), ("missing", &d.missing_ids), ("extra", &d.extra_ids)] {
            if !ids.is_empty() {
                let _ = writeln!(o, "    {what}: {}", ids.join(", "));
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations() {
        assert_eq!(time(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(parse_duration("10m"), Ok(600_000));
        assert_eq!(parse_duration("2h"), Ok(7_200_000));
        assert_eq!(parse_duration("3d"), Ok(259_200_000));
        assert_eq!(parse_duration("250ms"), Ok(250));
        assert_eq!(parse_duration("45"), Ok(45_000));
        assert!(parse_duration("10 minutes").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("m").is_err());
        assert_eq!(age(7_500_000), "2h 5m");
        assert_eq!(age(90_000), "1m 30s");
    }

    /// What `explain` prints (`CONFIRM`) is accepted back, in any case.
    #[test]
    fn decision_and_outcome_names_parse_in_any_case() {
        assert_eq!(parse_decision("CONFIRM"), Ok(Decision::Confirm));
        assert_eq!(parse_decision("compensate"), Ok(Decision::Compensate));
        assert_eq!(parse_outcome("duplicate_effect"), Ok(Outcome::DuplicateEffect));
        assert_eq!(parse_outcome("DIVERGENT"), Ok(Outcome::Divergent));
        let e = parse_outcome("bogus").unwrap_err();
        assert!(e.contains("MISSING") && e.contains("DUPLICATE_EFFECT") && !e.contains("Missing"), "{e}");
        assert!(parse_decision("approve").unwrap_err().contains("CONFIRM, REQUEUE, COMPENSATE, CLOSE"));
    }
}
