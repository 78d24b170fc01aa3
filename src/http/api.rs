//! The operator API: JSON over the library functions of
//! [`crate::operator`] (explain, review, resolve, DLQ re-drive).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{auth, AppState};

/// `{"error": msg}` with `code`.
pub(super) fn error(code: StatusCode, msg: &str) -> Response {
    (code, Json(serde_json::json!({ "error": msg }))).into_response()
}

/// `GET /api/operations/{id}`.
pub(super) async fn operation(State(_s): State<AppState>, Path(_id): Path<String>) -> Response {
    error(StatusCode::NOT_IMPLEMENTED, "explain is not wired yet")
}

/// `GET /api/review?type=&outcome=&older_than=`.
pub(super) async fn review(State(_s): State<AppState>) -> Response {
    error(StatusCode::NOT_IMPLEMENTED, "review is not wired yet")
}

/// `POST /api/operations/{id}/resolve`.
pub(super) async fn resolve(State(s): State<AppState>, headers: HeaderMap, Path(_id): Path<String>) -> Response {
    if let Some(r) = auth::refusal(s.cfg.http.token.as_deref(), &headers) {
        return r;
    }
    error(StatusCode::NOT_IMPLEMENTED, "resolve is not wired yet")
}

/// `POST /api/dlq/redrive`.
pub(super) async fn redrive(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = auth::refusal(s.cfg.http.token.as_deref(), &headers) {
        return r;
    }
    error(StatusCode::NOT_IMPLEMENTED, "redrive is not wired yet")
}
