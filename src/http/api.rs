//! The operator API: JSON over the library functions of
//! [`crate::operator`] (explain, review, resolve). Reads run on tokio's
//! blocking pool (a review scans the store); a decision is published to the
//! input log, never written to the store.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{auth, AppState};
use crate::kafka::producer::Publisher;
use crate::operator::commands::parse_position;
use crate::operator::dlq::{self, DlqFilter};
use crate::operator::render::{parse_decision, parse_duration, parse_outcome, parse_waiting};
use crate::operator::{self, OperatorError, ResolveRequest, ReviewFilter};
use crate::store::StoreError;

/// `{"error": msg}` with `code`.
pub(super) fn error(code: StatusCode, msg: &str) -> Response {
    (code, Json(serde_json::json!({ "error": msg }))).into_response()
}

/// A failed request: status and message.
struct ApiError(StatusCode, String);

impl From<OperatorError> for ApiError {
    fn from(e: OperatorError) -> ApiError {
        let code = match &e {
            OperatorError::NotFound(_) => StatusCode::NOT_FOUND,
            OperatorError::Refused { .. } => StatusCode::CONFLICT,
            OperatorError::Invalid(_) => StatusCode::BAD_REQUEST,
            OperatorError::Kafka(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        OperatorError::from(e).into()
    }
}

/// Runs blocking work (store scans, Kafka round trips) off the runtime.
async fn blocking<T>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Response
where
    T: serde::Serialize + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(ApiError(code, msg))) => error(code, &msg),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("the request failed: {e}")),
    }
}

/// [`admit`] for a request made on someone's behalf (a decision, a
/// re-drive): the field `actor` picks becomes the acting person, as
/// [`auth::actor`] decides it.
fn admit_acting<T>(
    http: &crate::config::Http,
    headers: &HeaderMap,
    body: Result<Json<T>, JsonRejection>,
    shape: &str,
    actor: impl FnOnce(&mut T) -> &mut String,
) -> Result<T, Box<Response>> {
    let mut b = admit(http, headers, body, shape)?;
    let field = actor(&mut b);
    *field = auth::actor(http.actor_header.as_deref(), headers, field)?;
    Ok(b)
}

/// `?scope=`: `local` (default: the partitions this instance owns now) or
/// `fleet` (every live member, see [`super::fleet`]).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Scope {
    scope: Option<String>,
}

/// `GET /api/operations/{id}[?scope=fleet]`: state, evidence and timeline.
/// Locally, only of an operation in a partition this instance owns now.
pub(super) async fn operation(State(s): State<AppState>, Path(id): Path<String>, Query(q): Query<Scope>) -> Response {
    match super::fleet::wants_fleet(q.scope.as_deref()) {
        Ok(true) => return super::fleet::operation(&s, &id).await,
        Ok(false) => {}
        Err(r) => return *r,
    }
    blocking(move || {
        // Where it is before what it holds: a partition this instance does
        // not own (being restored, say) is not read, so whatever its state
        // the answer is "not owned".
        let partition = s.store.op_partition(&id)?.ok_or_else(|| OperatorError::NotFound(id.clone()))?;
        if !s.owns(partition) {
            return Err(ApiError(StatusCode::NOT_FOUND, not_owned(&id, partition)));
        }
        Ok(operator::explain::explain_in(&s.store, partition, &id)?
            .ok_or_else(|| OperatorError::NotFound(id.clone()))?)
    })
    .await
}

/// Why a case in the store is not answered for.
fn not_owned(id: &str, partition: i32) -> String {
    format!("operation {id} is in partition {partition}, which this instance does not own now (ask with ?scope=fleet)")
}

#[derive(Debug, Deserialize)]
pub(super) struct ReviewQuery {
    #[serde(rename = "type")]
    operation_type: Option<String>,
    outcome: Option<String>,
    /// `90s`, `15m`, `2h`, `7d`, or seconds (as `review --older-than`).
    older_than: Option<String>,
    /// `person` (the review queue, default) or `machine` (cases waiting
    /// for a PROBE or REQUEUE to be answered).
    waiting: Option<String>,
    /// `local` (default) or `fleet`.
    scope: Option<String>,
}

/// `GET /api/review?type=&outcome=&older_than=&waiting=&scope=`: the
/// queue, oldest first: of the partitions this instance owns now, or with
/// `scope=fleet` of every live member (`{cases, members}`).
pub(super) async fn review(
    State(s): State<AppState>,
    Query(q): Query<ReviewQuery>,
    RawQuery(raw): RawQuery,
) -> Response {
    match super::fleet::wants_fleet(q.scope.as_deref()) {
        Ok(true) => {
            let rest: Vec<&str> = raw
                .as_deref()
                .unwrap_or("")
                .split('&')
                .filter(|kv| !kv.is_empty() && !kv.starts_with("scope="))
                .collect();
            return super::fleet::review(&s, &rest.join("&")).await;
        }
        Ok(false) => {}
        Err(r) => return *r,
    }
    let empty = |v: Option<String>| v.filter(|s| !s.is_empty());
    let outcome = match empty(q.outcome).map(|o| parse_outcome(&o)).transpose() {
        Ok(o) => o,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let older_than_ms = match empty(q.older_than) {
        None => None,
        Some(d) => match parse_duration(&d) {
            Ok(ms) => Some(ms),
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("older_than: {e}")),
        },
    };
    let waiting = match empty(q.waiting).map(|w| parse_waiting(&w)).transpose() {
        Ok(w) => w.unwrap_or_default(),
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let filter = ReviewFilter { operation_type: empty(q.operation_type), outcome, older_than_ms, waiting };
    let now = (s.clock)();
    blocking(move || {
        let mut cases = operator::review(&s.store, &filter, now)?;
        cases.retain(|c| s.owns(c.partition));
        Ok(cases)
    })
    .await
}

/// The body of a request that changes state, once it came from a
/// same-origin page or no browser at all and carries the token; else the
/// refusal (`shape` names the body's fields in the error). A body over the
/// limit keeps its 413.
fn admit<T>(
    http: &crate::config::Http,
    headers: &HeaderMap,
    body: Result<Json<T>, JsonRejection>,
    shape: &str,
) -> Result<T, Box<Response>> {
    if let Some(r) = auth::cross_site(headers, http.advertised_url.as_deref()) {
        return Err(Box::new(r));
    }
    if let Some(r) = auth::refusal(http, headers) {
        return Err(Box::new(r));
    }
    body.map(|Json(b)| b).map_err(|e| {
        let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE { e.status() } else { StatusCode::BAD_REQUEST };
        Box::new(error(code, &format!("expected {shape}: {e}")))
    })
}

/// The body of a resolve request.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolveBody {
    /// CONFIRM, REQUEUE, COMPENSATE or CLOSE, in any case (as the CLI).
    decision: String,
    actor: String,
    note: String,
    #[serde(default)]
    evidence_checked: Vec<String>,
}

/// `POST /api/operations/{id}/resolve`: publishes a ManualDecision event to
/// the operation's partition of the input topic; the pipeline applies it.
/// With `?scope=fleet`, an operation this instance does not own now is
/// resolved by the member that does (the request is sent on to it).
pub(super) async fn resolve(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Scope>,
    body: Result<Json<ResolveBody>, JsonRejection>,
) -> Response {
    let fleet = match super::fleet::wants_fleet(q.scope.as_deref()) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    let b =
        match admit_acting(&s.cfg.http, &headers, body, "{decision, actor, note, evidence_checked?}", |b| &mut b.actor)
        {
            Ok(b) => b,
            Err(r) => return *r,
        };
    // Only a fleet request asks where the operation is: the partition
    // is all it needs (not the explanation with its timeline).
    let here = fleet && {
        let (s, id) = (s.clone(), id.clone());
        tokio::task::spawn_blocking(move || s.store.op_partition(&id).ok().flatten().is_some_and(|p| s.owns(p)))
            .await
            .unwrap_or(false)
    };
    if fleet && !here {
        let authorization = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        // The actor is settled here (from the caller's identity, if one is
        // configured) and travels in the body; the owner checks it again
        // against the same header, passed on.
        let caller = s.cfg.http.actor_header.as_deref().map(|h| (h, b.actor.as_str()));
        let body = serde_json::to_value(&b).expect("a resolve body serializes");
        return super::fleet::resolve(&s, &id, authorization, caller, &body).await;
    }
    let decision = match parse_decision(&b.decision) {
        Ok(d) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let req = ResolveRequest {
        operation_id: id,
        decision,
        actor: b.actor,
        note: b.note,
        evidence_checked: b.evidence_checked,
    };
    let now = (s.clock)();
    blocking(move || {
        let prepared = operator::resolve::prepare(&s.store, &req, now)?;
        if !s.owns(prepared.partition) {
            return Err(ApiError(StatusCode::NOT_FOUND, not_owned(&req.operation_id, prepared.partition)));
        }
        // One decision at a time: the publisher's delivery accounting is per flush.
        let mut slot = s.decisions.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let p = Publisher::new(&s.cfg.kafka, s.cfg.consumer.max_record_bytes).map_err(OperatorError::from)?;
            *slot = Some(p);
        }
        let publisher = slot.as_ref().expect("set above");
        let keys = s.cfg.security.keys().map_err(OperatorError::from)?;
        operator::resolve::publish(publisher, &s.codec, &keys, &s.cfg.topics.events, &prepared)?;
        Ok(serde_json::json!({
            "published": true,
            "operation_id": prepared.event.operation_id,
            "entity_id": prepared.event.entity_id,
            "event_id": prepared.event.event_id,
            "partition": prepared.partition,
            "decision": req.decision.as_str(),
        }))
    })
    .await
}

/// The body of a re-drive request: what to select, as `dlq redrive` takes it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RedriveBody {
    class: Option<String>,
    /// Dead letters as `"PARTITION:OFFSET"`.
    #[serde(default)]
    positions: Vec<String>,
    limit: Option<usize>,
    #[serde(default)]
    dry_run: bool,
    /// Who re-drives (the authenticated caller with `[http] actor_header`).
    #[serde(default)]
    actor: String,
    /// What was fixed.
    #[serde(default)]
    note: String,
}

/// `POST /api/dlq/redrive`: re-publishes the selected dead letters to the
/// input topic (or, with `dry_run`, says what it would do).
pub(super) async fn redrive(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<RedriveBody>, JsonRejection>,
) -> Response {
    let b =
        match admit_acting(&s.cfg.http, &headers, body, "{class?, positions?, limit?, dry_run?, actor, note?}", |b| {
            &mut b.actor
        }) {
            Ok(b) => b,
            Err(r) => return *r,
        };
    let positions = match b.positions.iter().map(|p| parse_position(p)).collect::<Result<Vec<_>, _>>() {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let filter =
        DlqFilter { class: b.class.filter(|c| !c.is_empty()), positions, limit: b.limit, include_redriven: false };
    let who = dlq::Redriver { actor: b.actor, note: b.note, at_ms: (s.clock)() };
    blocking(move || {
        Ok(dlq::redrive(&s.cfg.kafka, &s.cfg.topics, &filter, s.cfg.consumer.max_record_bytes, &who, b.dry_run)?)
    })
    .await
}

/// How long a request waits for the outbox's database (it is the
/// services' database, not the reconciler's: it may be slow or away).
const OUTBOX_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// `?samples=N` of `GET /api/dlq`: how many dead letters and audit records
/// of each place to show (default 20, at most 500).
#[derive(Debug, Default, Deserialize)]
pub(super) struct DlqQuery {
    samples: Option<usize>,
}

/// `GET /api/dlq`: the dead-letter monitor, for both dead-letter places:
/// the DLQ topic (counts by class and age, the oldest waiting, samples
/// with their provenance headers, the latest re-drives) and the outbox's
/// dead_letter rows (the same, when this instance can reach the outbox:
/// the variable `[relay] connection_env` names is set).
pub(super) async fn dead_letters(State(s): State<AppState>, Query(q): Query<DlqQuery>) -> Response {
    let samples = q.samples.unwrap_or(20).min(500);
    let now_ms = (s.clock)();
    let cfg = s.cfg.clone();
    let kafka = tokio::task::spawn_blocking(move || {
        let all = DlqFilter { include_redriven: true, ..DlqFilter::default() };
        dlq::inspect(&cfg.kafka, &cfg.topics, &all).map(|letters| dlq::summary(letters, &cfg.topics, samples))
    })
    .await;
    let kafka = match kafka {
        Ok(Ok(summary)) => serde_json::to_value(summary).unwrap_or_default(),
        Ok(Err(e)) => serde_json::json!({ "error": e.to_string() }),
        Err(e) => serde_json::json!({ "error": format!("the request failed: {e}") }),
    };
    let outbox = match s.outbox_pool() {
        Err(reason) => serde_json::json!({ "available": false, "reason": reason }),
        Ok(pool) => {
            // Waiting for a free connection of the pool counts against the
            // patience too: a burst of requests queues, it does not open a
            // connection each.
            let read = async {
                let client = pool.get().await?;
                crate::outbox::dead_letter::summary(&**client, samples).await
            };
            match tokio::time::timeout(OUTBOX_PATIENCE, read).await {
                Ok(Ok(summary)) => {
                    let mut v = serde_json::to_value(summary).unwrap_or_default();
                    v["available"] = true.into();
                    v
                }
                Ok(Err(e)) => serde_json::json!({ "available": false, "reason": e.to_string() }),
                Err(_) => serde_json::json!({
                    "available": false,
                    "reason": format!("the outbox's database did not answer within {OUTBOX_PATIENCE:?}")
                }),
            }
        }
    };
    Json(serde_json::json!({ "now_ms": now_ms, "kafka": kafka, "outbox": outbox })).into_response()
}

/// The body of an outbox re-drive: row ids and/or an error class.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OutboxRedriveBody {
    #[serde(default)]
    ids: Vec<i64>,
    class: Option<String>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    actor: String,
    #[serde(default)]
    note: String,
}

/// `POST /api/dlq/outbox/redrive`: makes the chosen outbox dead letters
/// pending again, audited (or, with `dry_run`, says which it would).
pub(super) async fn outbox_redrive(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<OutboxRedriveBody>, JsonRejection>,
) -> Response {
    let b = match admit_acting(&s.cfg.http, &headers, body, "{ids?, class?, dry_run?, actor, note?}", |b| &mut b.actor)
    {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let connection = match s.cfg.relay.connection() {
        Ok(c) => c,
        Err(e) => {
            return error(StatusCode::SERVICE_UNAVAILABLE, &format!("the outbox is not reachable from here: {e}"))
        }
    };
    let sel = crate::outbox::dead_letter::OutboxSelection { ids: b.ids, class: b.class.filter(|c| !c.is_empty()) };
    let done = async {
        let mut client = crate::outbox::connect(&connection).await?;
        crate::outbox::dead_letter::redrive(&mut client, &sel, &b.actor, &b.note, b.dry_run).await
    };
    // A re-drive that takes longer (a relay's claim waiting for the broker)
    // is abandoned: its connection closes, and the server rolls back
    // whatever had not committed.
    match tokio::time::timeout(OUTBOX_PATIENCE, done).await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(crate::outbox::OutboxError::Invalid(m))) => error(StatusCode::BAD_REQUEST, &m),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        Err(_) => error(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("the re-drive did not finish within {OUTBOX_PATIENCE:?} and was abandoned; /api/dlq shows whether it was applied"),
        ),
    }
}
