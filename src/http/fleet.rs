//! The fleet scope of the API (`?scope=fleet`, `/api/fleet`): any
//! instance answers for the whole fleet by asking each live member's own
//! API (which answers for the partitions that member owns now), see
//! [`crate::fleet`].

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::api::error;
use super::{AppState, FleetView};
use crate::fleet::{client, Member};

/// Whether a query asks for the fleet (`scope=fleet`); any other scope
/// than `fleet` or `local` is refused.
pub(super) fn wants_fleet(scope: Option<&str>) -> Result<bool, Box<Response>> {
    match scope {
        None | Some("") | Some("local") => Ok(false),
        Some("fleet") => Ok(true),
        Some(other) => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("scope {other:?}: expected \"local\" (this instance's partitions) or \"fleet\""),
        ))),
    }
}

/// This instance's fleet view and the live members, or why there is none.
fn live(s: &AppState) -> Result<(&FleetView, Vec<Member>), Box<Response>> {
    let Some(f) = s.fleet.get() else {
        return Err(Box::new(error(
            StatusCode::CONFLICT,
            "this instance is not in a fleet: [topics] fleet is off, or [http] advertised_url is not set and it listens on a wildcard address",
        )));
    };
    Ok((f, f.roster.live((s.clock)())))
}

/// `GET /api/fleet`: the members heard of, what they own and whether they
/// are live (`me` null and no members: this instance is not in a fleet).
pub(super) async fn members(State(s): State<AppState>) -> Response {
    let Some(f) = s.fleet.get() else {
        return Json(json!({ "me": null, "members": [] })).into_response();
    };
    let now = (s.clock)();
    let members: Vec<Value> = f
        .roster
        .all()
        .into_iter()
        .map(|m| json!({ "url": m.url, "owned": m.owned, "age_ms": now - m.at_ms, "live": m.live(now), "me": m.url == f.me }))
        .collect();
    Json(json!({ "me": f.me, "members": members })).into_response()
}

/// The review queue of every live member (`query`: the query string for
/// their own `/api/review`).
pub(super) async fn review(s: &AppState, query: &str) -> Response {
    let members = match live(s) {
        Ok((_, m)) => m,
        Err(r) => return *r,
    };
    Json(client::review(s.client(), &members, query).await).into_response()
}

/// The operation as its owner explains it, with the owner's URL as
/// `instance`.
pub(super) async fn operation(s: &AppState, id: &str) -> Response {
    let members = match live(s) {
        Ok((_, m)) => m,
        Err(r) => return *r,
    };
    match client::find(s.client(), &members, id).await {
        Some((_, body)) => Json(body).into_response(),
        None => error(StatusCode::NOT_FOUND, &format!("no live member of the fleet owns operation {id}")),
    }
}

/// A decision on an operation owned by another member: sent to the
/// owner's own resolve endpoint, with the caller's `Authorization`
/// header; the owner's answer, with its URL as `instance`.
pub(super) async fn resolve(
    s: &AppState,
    id: &str,
    authorization: Option<&str>,
    caller: Option<(&str, &str)>,
    body: &Value,
) -> Response {
    let members = match live(s) {
        Ok((_, m)) => m,
        Err(r) => return *r,
    };
    let Some((owner, _)) = client::find(s.client(), &members, id).await else {
        return error(StatusCode::NOT_FOUND, &format!("no live member of the fleet owns operation {id}"));
    };
    let encoded = percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC);
    let url = format!("{owner}/api/operations/{encoded}/resolve");
    match client::post_json(s.client(), &url, authorization, caller, body).await {
        Ok((status, mut answer)) => {
            if let Value::Object(o) = &mut answer {
                o.insert("instance".into(), Value::String(owner));
            }
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            (code, Json(answer)).into_response()
        }
        Err(e) => error(StatusCode::BAD_GATEWAY, &format!("the owner {owner} did not answer: {e}")),
    }
}
