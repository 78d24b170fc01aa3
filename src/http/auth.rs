//! The checks of the API: the bearer token of the endpoints that read and
//! of those that change state, the origin of the request (CSRF) and who
//! the caller is (the actor of a decision).

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::api::error;
use crate::config::Http;
use crate::signature::same_secret;

/// The token of `Authorization: Bearer <token>`, if the request has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
}

/// `None` when a read may go ahead: no token is configured (reads are
/// open), or `headers` carry `http.token` or `http.read_token`; else the
/// 401 to send.
pub(super) fn read_refusal(http: &Http, headers: &HeaderMap) -> Option<Response> {
    let accepted: Vec<&str> = [http.token.as_deref(), http.read_token.as_deref()].into_iter().flatten().collect();
    if accepted.is_empty() {
        return None;
    }
    match bearer(headers) {
        Some(t) if accepted.iter().any(|a| same_secret(t.as_bytes(), a.as_bytes())) => None,
        Some(_) => Some(unauthorized("wrong bearer token")),
        None => {
            Some(unauthorized("missing bearer token: reads need Authorization: Bearer <http.read_token or http.token>"))
        }
    }
}

/// `None` when `headers` carry `Authorization: Bearer <configured>`; else
/// the refusal to send: 403 when no token is configured (the endpoints are
/// off), 401 when the token is missing or wrong.
/// The read token is refused here with 403: it grants reads only.
pub(super) fn refusal(http: &Http, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = http.token.as_deref() else {
        return Some(error(
            StatusCode::FORBIDDEN,
            "this endpoint changes state and is disabled: no http.token is configured (set it, or RECONCILER_HTTP__TOKEN)",
        ));
    };
    let reads_only = |t: &str| http.read_token.as_deref().is_some_and(|r| same_secret(t.as_bytes(), r.as_bytes()));
    match bearer(headers) {
        Some(t) if same_secret(t.as_bytes(), expected.as_bytes()) => None,
        Some(t) if reads_only(t) => Some(error(
            StatusCode::FORBIDDEN,
            "this token (http.read_token) grants reads only: changing state needs http.token",
        )),
        Some(_) => Some(unauthorized("wrong bearer token")),
        None => Some(unauthorized("missing bearer token: send Authorization: Bearer <http.token>")),
    }
}

fn unauthorized(msg: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, msg).into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    r
}

/// `None` when a request that changes state comes from this API's own
/// origin (the panel), or from no browser at all (the CLI, curl, another
/// instance: no `Origin`, no `Sec-Fetch-Site`); else the 403 to send. The
/// panel keeps its token in sessionStorage, not in a cookie, so a foreign
/// page has no credentials to ride on; this refuses its requests before
/// the token is even looked at (defence in depth, and against a page that
/// asks its visitor for the token). `advertised` is the instance's public
/// URL, an origin besides the `Host` the request names.
pub(super) fn cross_site(headers: &HeaderMap, advertised: Option<&str>) -> Option<Response> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match get("sec-fetch-site") {
        // Set by the browser, never by a page's script: the panel's own
        // request, whatever a proxy did to Host on the way.
        Some("same-origin") => return None,
        Some(site) if site != "none" => {
            return Some(error(
                StatusCode::FORBIDDEN,
                &format!(
                "refused: a {site} request may not change state here (CSRF); use the panel of this instance or the CLI"
            ),
            ))
        }
        _ => {}
    }
    let origin = get(header::ORIGIN.as_str())?;
    let own = [get(header::HOST.as_str()).map(authority), advertised.map(|a| authority(&url_authority(a)))];
    if own.iter().flatten().any(|o| *o == authority(&url_authority(origin))) {
        return None;
    }
    Some(error(
        StatusCode::FORBIDDEN,
        &format!("refused: a request from origin {origin} may not change state here (CSRF); use the panel of this instance or the CLI"),
    ))
}

/// The `host[:port]` of URL `url` (scheme and path dropped).
fn url_authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or_default().to_owned()
}

/// A `host[:port]` as compared here: without case and without a default
/// port (a `Host` header and an `Origin` may each leave it out, and TLS may
/// end at a proxy in front, so the scheme says nothing about it).
fn authority(hostport: &str) -> String {
    let h = hostport.to_ascii_lowercase();
    for default in [":80", ":443"] {
        if let Some(bare) = h.strip_suffix(default) {
            return bare.to_owned();
        }
    }
    h
}

/// The actor of a decision: with `[http] actor_header` configured (set by
/// the authenticating proxy in front of the API), the caller that header
/// names, and a body naming someone else is refused; without it, the
/// body's `actor` (the bearer token says the caller may decide, not who
/// they are).
pub(super) fn actor(actor_header: Option<&str>, headers: &HeaderMap, claimed: &str) -> Result<String, Box<Response>> {
    let Some(name) = actor_header else { return Ok(claimed.to_owned()) };
    if headers.get_all(name).iter().count() > 1 {
        // A proxy that appends rather than replaces: the first value may
        // be the client's own.
        return Err(Box::new(error(StatusCode::BAD_REQUEST, &format!("header {name} is given more than once"))));
    }
    let caller = headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|c| !c.is_empty());
    let Some(caller) = caller else {
        return Err(Box::new(unauthorized(&format!(
            "no authenticated caller: header {name} (http.actor_header, set by the proxy in front of this API) is missing"
        ))));
    };
    if !claimed.trim().is_empty() && claimed.trim() != caller {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            &format!("the actor {claimed:?} is not the authenticated caller {caller:?}: leave actor empty or give your own name"),
        )));
    }
    Ok(caller.to_owned())
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

    fn with(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_same_origin_browsers_may_change_state() {
        let refused = |pairs: &[(&str, &str)], adv| cross_site(&with(pairs), adv).map(|r| r.status());
        assert_eq!(refused(&[("host", "127.0.0.1:9464")], None), None, "no browser: the CLI, curl");
        assert_eq!(refused(&[("host", "127.0.0.1:9464"), ("origin", "http://127.0.0.1:9464")], None), None);
        assert_eq!(
            refused(&[("host", "10.0.0.7:9464"), ("origin", "https://recon.example")], Some("https://recon.example/")),
            None
        );
        assert_eq!(
            refused(&[("host", "Recon.Example"), ("origin", "https://recon.example:443")], None),
            None,
            "case, default port"
        );
        let proxied =
            [("host", "internal:9464"), ("origin", "https://recon.example"), ("sec-fetch-site", "same-origin")];
        assert_eq!(refused(&proxied, None), None, "a proxy rewrote Host: the browser's same-origin stands");
        let evil = [("host", "127.0.0.1:9464"), ("origin", "https://evil.example")];
        assert_eq!(refused(&evil, None), Some(StatusCode::FORBIDDEN));
        assert_eq!(refused(&[("sec-fetch-site", "cross-site")], None), Some(StatusCode::FORBIDDEN));
        assert_eq!(
            refused(&[("sec-fetch-site", "same-origin"), ("host", "h:1"), ("origin", "http://h:1")], None),
            None
        );
    }

    #[test]
    fn the_actor_is_the_authenticated_caller_when_a_header_names_it() {
        let h = with(&[("x-forwarded-user", "ana")]);
        assert_eq!(actor(None, &h, "bob").unwrap(), "bob", "no header configured: the body says");
        assert_eq!(actor(Some("x-forwarded-user"), &h, "").unwrap(), "ana");
        assert_eq!(actor(Some("x-forwarded-user"), &h, "ana").unwrap(), "ana");
        assert_eq!(actor(Some("x-forwarded-user"), &h, "bob").unwrap_err().status(), StatusCode::FORBIDDEN);
        assert_eq!(
            actor(Some("x-forwarded-user"), &HeaderMap::new(), "ana").unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
        let mut twice = with(&[("x-forwarded-user", "ana")]);
        twice.append("x-forwarded-user", "mallory".parse().unwrap());
        assert_eq!(actor(Some("x-forwarded-user"), &twice, "").unwrap_err().status(), StatusCode::BAD_REQUEST);
    }

    fn http(token: Option<&str>, read_token: Option<&str>) -> Http {
        Http { token: token.map(str::to_owned), read_token: read_token.map(str::to_owned), ..Http::default() }
    }

    #[test]
    fn token_rules() {
        let check = |c: Option<&str>, h| refusal(&http(c, None), &h).map(|r| r.status());
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0k"))), None);
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0x"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(Some("Bearer t0"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(Some("Basic t0k"))), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(Some("t0k"), headers(None)), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(check(None, headers(Some("Bearer x"))), Some(StatusCode::FORBIDDEN));
        let both = http(Some("t0k"), Some("r3ad"));
        assert_eq!(refusal(&both, &headers(Some("Bearer r3ad"))).map(|r| r.status()), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn reads_need_either_token_once_one_is_configured() {
        let check = |h: &Http, auth| read_refusal(h, &headers(auth)).map(|r| r.status());
        assert_eq!(check(&http(None, None), None), None, "no token configured: reads are open");
        for configured in [http(Some("t0k"), None), http(None, Some("r3ad")), http(Some("t0k"), Some("r3ad"))] {
            assert_eq!(check(&configured, None), Some(StatusCode::UNAUTHORIZED));
            assert_eq!(check(&configured, Some("Bearer nope")), Some(StatusCode::UNAUTHORIZED));
        }
        let both = http(Some("t0k"), Some("r3ad"));
        assert_eq!(check(&both, Some("Bearer t0k")), None, "the token grants reads too");
        assert_eq!(check(&both, Some("Bearer r3ad")), None);
        assert_eq!(check(&http(Some("t0k"), None), Some("Bearer r3ad")), Some(StatusCode::UNAUTHORIZED));
    }
}
