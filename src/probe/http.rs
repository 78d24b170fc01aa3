//! `kind = "http"`: a GET (or another method) on a URL built from the
//! command, a JSON answer read through JSON pointers.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::config::{expand_env, placeholders, ConfigError, DestinationConfig};
use crate::core::event::ProbeErrorClass;
use crate::core::RepairCommand;

use super::destination::{check_judgeable, param, Answer, Finding, ProbeError};

/// Longest answer body read (a lookup answer is small; a destination that
/// streams megabytes is answering something else).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// An HTTP destination.
pub struct HttpDestination {
    client: reqwest::Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    absent_status: Vec<u16>,
    remote_id: Option<String>,
    version: Option<String>,
    fingerprint: Option<String>,
}

fn invalid(field: String, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field, reason: reason.into() }
}

impl HttpDestination {
    /// The destination `name` of `cfg` (validated), with its header secrets
    /// read from the environment.
    pub fn new(name: &str, cfg: &DestinationConfig) -> Result<HttpDestination, ConfigError> {
        let field = |f: &str| format!("destinations.{name}.{f}");
        let method = Method::from_bytes(cfg.method.as_bytes())
            .map_err(|_| invalid(field("method"), format!("{:?} is not an HTTP method", cfg.method)))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &cfg.headers {
            let f = field(&format!("headers.{k}"));
            let value = expand_env(v, &f)?;
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| invalid(f.clone(), e.to_string()))?;
            let mut value = HeaderValue::from_str(&value).map_err(|e| invalid(f, e.to_string()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.timeout_ms))
            .pool_max_idle_per_host(cfg.concurrency)
            .build()
            .map_err(|e| invalid(field("kind"), format!("the HTTP client cannot be built: {e}")))?;
        Ok(HttpDestination {
            client,
            method,
            url: cfg.url.clone().unwrap_or_default(),
            headers,
            absent_status: cfg.absent_status.clone(),
            remote_id: cfg.remote_id_pointer.clone(),
            version: cfg.version_pointer.clone(),
            fingerprint: cfg.fingerprint_pointer.clone(),
        })
    }

    /// The URL for `cmd`: each placeholder replaced by the command's value,
    /// percent-encoded. A placeholder the command has no value for is a
    /// refused query (asking with a blank would find something else).
    fn url(&self, cmd: &RepairCommand) -> Result<reqwest::Url, ProbeError> {
        let mut url = self.url.clone();
        for p in placeholders(&self.url) {
            let value = param(cmd, p).ok_or_else(|| {
                ProbeError::new(ProbeErrorClass::Rejected, format!("the command has no {p} for the URL template"))
            })?;
            let encoded = percent_encoding::utf8_percent_encode(&value, percent_encoding::NON_ALPHANUMERIC).to_string();
            url = url.replace(&format!("{{{p}}}"), &encoded);
        }
        reqwest::Url::parse(&url)
            .map_err(|e| ProbeError::new(ProbeErrorClass::Rejected, format!("the URL {url:?} is invalid: {e}")))
    }

    /// Asks the destination about `cmd`'s operation.
    pub async fn query(&self, cmd: &RepairCommand) -> Result<Answer, ProbeError> {
        let url = self.url(cmd)?;
        let shown = shown_url(&url);
        let response = self
            .client
            .request(self.method.clone(), url)
            .headers(self.headers.clone())
            .send()
            .await
            .map_err(|e| transport_error(&shown, &e))?;
        let status = response.status();
        let query = format!("{} {shown} -> {}", self.method, status.as_u16());
        if self.absent_status.contains(&status.as_u16()) {
            return Ok(Answer { finding: Finding::Absent, query });
        }
        if !status.is_success() {
            return Err(status_error(&query, status, response.headers().get(RETRY_AFTER)));
        }
        let body = response.bytes().await.map_err(|e| transport_error(&shown, &e))?;
        if body.len() > MAX_BODY_BYTES {
            return Err(ProbeError::new(
                ProbeErrorClass::MalformedAnswer,
                format!("{query}: an answer of {} bytes (at most {MAX_BODY_BYTES})", body.len()),
            ));
        }
        let json: Value = serde_json::from_slice(&body).map_err(|e| {
            ProbeError::new(ProbeErrorClass::MalformedAnswer, format!("{query}: the answer is not JSON: {e}"))
        })?;
        let finding = self.read(cmd, &json).map_err(|mut e| {
            e.detail = format!("{query}: {}", e.detail);
            e
        })?;
        Ok(Answer { finding, query })
    }

    /// The values at the configured pointers.
    fn read(&self, cmd: &RepairCommand, json: &Value) -> Result<Finding, ProbeError> {
        let at = |pointer: &Option<String>| -> Result<Option<&Value>, ProbeError> {
            let Some(p) = pointer else { return Ok(None) };
            match json.pointer(p) {
                Some(v) => Ok(Some(v)),
                None => {
                    Err(ProbeError::new(ProbeErrorClass::MalformedAnswer, format!("the answer has nothing at {p}")))
                }
            }
        };
        let wrong = |p: &Option<String>, want: &str, got: &Value| {
            ProbeError::new(
                ProbeErrorClass::MalformedAnswer,
                format!("{} is {got}, not {want}", p.as_deref().unwrap_or_default()),
            )
        };
        let remote_id = match at(&self.remote_id)? {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            Some(v) => return Err(wrong(&self.remote_id, "a string or an integer", v)),
        };
        let version = match at(&self.version)? {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.is_i64() => n.as_i64(),
            Some(v) => return Err(wrong(&self.version, "an integer", v)),
        };
        let fingerprint = match at(&self.fingerprint)? {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => return Err(wrong(&self.fingerprint, "a string", v)),
        };
        check_judgeable(cmd, version.is_some(), fingerprint.is_some())?;
        Ok(Finding::Present { remote_id, version, fingerprint })
    }
}

/// The URL as evidence shows it: no user info, no query string (either may
/// carry a credential).
fn shown_url(url: &reqwest::Url) -> String {
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{}://{}{port}{}", url.scheme(), url.host_str().unwrap_or_default(), url.path())
}

fn transport_error(shown: &str, e: &reqwest::Error) -> ProbeError {
    let class = if e.is_timeout() { ProbeErrorClass::Timeout } else { ProbeErrorClass::Unavailable };
    // The source chain says "connection refused" where the top says "error sending request".
    let mut detail = format!("{shown}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail.push_str(&format!(": {s}"));
        source = s.source();
    }
    ProbeError::new(class, detail)
}

fn status_error(query: &str, status: StatusCode, retry_after: Option<&HeaderValue>) -> ProbeError {
    let class = match status.as_u16() {
        429 => ProbeErrorClass::Throttled,
        408 | 500..=599 => ProbeErrorClass::Unavailable,
        _ => ProbeErrorClass::Rejected,
    };
    let mut e = ProbeError::new(class, format!("{query} ({})", status.canonical_reason().unwrap_or("no reason")));
    // Retry-After in seconds; the HTTP-date form is rare for APIs and is
    // treated as absent (the back-off applies).
    e.retry_after = retry_after.and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok()).map(Duration::from_secs);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(version: Option<&str>) -> HttpDestination {
        let cfg = DestinationConfig {
            remote_id_pointer: Some("/id".into()),
            version_pointer: version.map(Into::into),
            ..DestinationConfig::http("http://crm.test:8080/syncs/{idempotency_key}?v={expected_version}")
        };
        HttpDestination::new("crm", &cfg).unwrap()
    }

    fn cmd(key: Option<&str>) -> RepairCommand {
        RepairCommand {
            command_id: "c".into(),
            verdict_id: "v".into(),
            operation_id: "op".into(),
            entity_id: "e".into(),
            operation_type: "t".into(),
            action: crate::core::RepairAction::Probe,
            idempotency_key: key.map(Into::into),
            destination: "crm".into(),
            expected_version: Some(7),
            expected_fingerprint: None,
            issued_at: 0,
        }
    }

    #[test]
    fn url_values_are_encoded_and_missing_ones_refused() {
        let d = dest(Some("/version"));
        assert_eq!(d.url(&cmd(Some("a/b c"))).unwrap().as_str(), "http://crm.test:8080/syncs/a%2Fb%20c?v=7");
        assert_eq!(d.url(&cmd(None)).unwrap_err().class, ProbeErrorClass::Rejected);
        let shown = shown_url(&reqwest::Url::parse("http://u:p@h:1/x?token=t").unwrap());
        assert_eq!(shown, "http://h:1/x");
    }

    #[test]
    fn answers_are_read_or_called_malformed() {
        let d = dest(Some("/version"));
        let c = cmd(Some("k"));
        let ok = d.read(&c, &serde_json::json!({"id": 42, "version": 7})).unwrap();
        assert_eq!(ok, Finding::Present { remote_id: Some("42".into()), version: Some(7), fingerprint: None });
        for bad in [serde_json::json!({"id": "x"}), serde_json::json!({"id": "x", "version": "7"})] {
            assert_eq!(d.read(&c, &bad).unwrap_err().class, ProbeErrorClass::MalformedAnswer, "{bad}");
        }
        // Without a version pointer an operation that expects a version cannot be judged.
        let e = dest(None).read(&c, &serde_json::json!({"id": "x"})).unwrap_err();
        assert_eq!(e.class, ProbeErrorClass::MalformedAnswer);
    }

    #[test]
    fn statuses_are_classified() {
        let ra = HeaderValue::from_static("3");
        let e = status_error("q", StatusCode::TOO_MANY_REQUESTS, Some(&ra));
        assert_eq!((e.class, e.retry_after), (ProbeErrorClass::Throttled, Some(Duration::from_secs(3))));
        assert_eq!(status_error("q", StatusCode::SERVICE_UNAVAILABLE, None).class, ProbeErrorClass::Unavailable);
        assert_eq!(status_error("q", StatusCode::FORBIDDEN, None).class, ProbeErrorClass::Rejected);
        assert!(!status_error("q", StatusCode::FORBIDDEN, None).retriable());
    }
}
