//! Bearer-token check for the endpoints that change state.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::api::error;

/// `None` when `headers` carry `Authorization: Bearer <configured>`; else
/// the refusal to send: 403 when no token is configured (the endpoints are
/// off), 401 when the token is missing or wrong.
pub(super) fn refusal(configured: Option<&str>, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = configured else {
        return Some(error(
            StatusCode::FORBIDDEN,
            "this endpoint changes state and is disabled: no http.token is configured (set it, or RECONCILER_HTTP__TOKEN)",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    match given {
        Some(t) if same(t.as_bytes(), expected.as_bytes()) => None,
        Some(_) => Some(unauthorized("wrong bearer token")),
        None => Some(unauthorized("missing bearer token: send Authorization: Bearer <http.token>")),
    }
}

fn unauthorized(msg: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, msg).into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    r
}

/// Comparison whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn token_rules() {
        let check = |c, h| refusal(c, &h).map(|r| r.status());
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0k"))), None);
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0x"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(Some("Basic t0k"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(None)), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(None, headers(Some("Bearer x"))), Some(StatusCode::FORBIDDEN));
    }
}
