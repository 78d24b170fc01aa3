//! Asking the members of the fleet over their HTTP APIs: the review queue
//! merged across them, and the member that owns an operation. Shared by
//! the HTTP server (`?scope=fleet`) and the CLI (`--fleet`).

use futures::future::join_all;
use serde::Serialize;
use serde_json::Value;

use super::Member;

/// What one member answered.
#[derive(Debug, Clone, Serialize)]
pub struct Reached {
    /// The member.
    pub url: String,
    /// The partitions it announced.
    pub owned: Vec<i32>,
    /// Cases it listed (`None`: it could not be asked).
    pub cases: Option<usize>,
    /// Why it could not be asked.
    pub error: Option<String>,
}

/// The review queue of the whole fleet.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReview {
    /// Every member's cases, each with the `instance` that owns it, oldest
    /// first.
    pub cases: Vec<Value>,
    /// Who was asked and what came back.
    pub members: Vec<Reached>,
}

/// The client that asks the members (a member that does not answer within
/// 10 s counts as unreachable), sending `authorization` (see
/// [`crate::config::Http::read_authorization`]) with every request: the
/// members' reads require it when a token is configured.
pub fn http_client(authorization: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(mut value) = authorization.and_then(|a| reqwest::header::HeaderValue::from_str(a).ok()) {
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .default_headers(headers)
        .build()
        .expect("an HTTP client with default settings builds")
}

/// `GET url`: the status and the JSON body.
pub async fn get_json(http: &reqwest::Client, url: &str) -> Result<(u16, Value), String> {
    let r = http.get(url).send().await.map_err(|e| e.to_string())?;
    answer(url, r).await
}

/// `POST url` with a JSON body and, when given, the caller's
/// `Authorization` header passed through, and the `(header, name)` that
/// identifies the caller (`[http] actor_header`).
pub async fn post_json(
    http: &reqwest::Client,
    url: &str,
    authorization: Option<&str>,
    caller: Option<(&str, &str)>,
    body: &Value,
) -> Result<(u16, Value), String> {
    let mut req = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body).expect("JSON serializes"));
    if let Some(a) = authorization {
        req = req.header(reqwest::header::AUTHORIZATION, a);
    }
    if let Some((header, name)) = caller {
        req = req.header(header, name);
    }
    let r = req.send().await.map_err(|e| e.to_string())?;
    answer(url, r).await
}

async fn answer(url: &str, r: reqwest::Response) -> Result<(u16, Value), String> {
    let status = r.status().as_u16();
    let bytes = r.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    let body = serde_json::from_slice(&bytes).map_err(|e| format!("{url}: not JSON: {e}"))?;
    Ok((status, body))
}

/// Every member's own review queue (`query`: the query string of
/// `/api/review`, without `scope`), merged oldest first.
pub async fn review(http: &reqwest::Client, members: &[Member], query: &str) -> FleetReview {
    let asks = members.iter().map(|m| async move {
        let url = format!("{}/api/review?{query}", m.url);
        (m, get_json(http, &url).await)
    });
    let mut cases = Vec::new();
    let mut reached = Vec::new();
    for (m, answer) in join_all(asks).await {
        let mut r = Reached { url: m.url.clone(), owned: m.owned.clone(), cases: None, error: None };
        match answer {
            Ok((200, Value::Array(items))) => {
                r.cases = Some(items.len());
                for mut it in items {
                    if let Value::Object(o) = &mut it {
                        o.insert("instance".into(), Value::String(m.url.clone()));
                    }
                    cases.push(it);
                }
            }
            Ok((status, body)) => r.error = Some(format!("HTTP {status}: {body}")),
            Err(e) => r.error = Some(e),
        }
        reached.push(r);
    }
    let key =
        |v: &Value| (v["since"].as_i64().unwrap_or(i64::MAX), v["operation_id"].as_str().unwrap_or("").to_owned());
    cases.sort_by_key(key);
    FleetReview { cases, members: reached }
}

/// The member whose own API explains `operation_id` (it owns the
/// operation's partition now), with its answer.
pub async fn find(http: &reqwest::Client, members: &[Member], operation_id: &str) -> Option<(String, Value)> {
    let id = percent_encoding::utf8_percent_encode(operation_id, percent_encoding::NON_ALPHANUMERIC).to_string();
    let asks = members.iter().map(|m| {
        let url = format!("{}/api/operations/{id}", m.url);
        async move { (m.url.clone(), get_json(http, &url).await) }
    });
    join_all(asks).await.into_iter().find_map(|(url, a)| match a {
        Ok((200, mut body)) => {
            if let Value::Object(o) = &mut body {
                o.insert("instance".into(), Value::String(url.clone()));
            }
            Some((url, body))
        }
        _ => None,
    })
}
