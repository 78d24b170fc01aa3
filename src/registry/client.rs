//! A client of the schema registry's REST API, as the Confluent serializers
//! use it: four calls.
//!
//! - `GET /schemas/ids/{id}`: the schema a record names.
//! - `POST /subjects/{subject}/versions`: register a schema (idempotent:
//!   the same schema gets its existing id); the registry refuses one its
//!   compatibility rule forbids with 409.
//! - `POST /subjects/{subject}`: look a schema up without registering it.
//!
//! Served by Confluent Schema Registry, Apicurio Registry (its `ccompat`
//! API) and Karapace alike. Blocking: the run loop that needs it is.

use std::time::Duration;

use reqwest::blocking::Client;
use reqwest::StatusCode;
use serde::Deserialize;

use crate::config::{RegistryAuth, SchemaRegistryConfig};

/// The media type of the registry's API.
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The client could not be built (a bad CA file, a credential missing).
    #[error("schema registry client: {0}")]
    Setup(String),
    /// No answer, or a server error: worth retrying.
    #[error("schema registry {url} cannot be reached: {detail}")]
    Unreachable {
        /// The URL called.
        url: String,
        /// The transport error or the status.
        detail: String,
    },
    /// The registry says the id, subject or schema does not exist.
    #[error("schema registry: not found ({code}): {message}")]
    NotFound {
        /// The registry's error code (40401 subject, 40402 version, 40403
        /// schema).
        code: i64,
        /// Its message.
        message: String,
    },
    /// The registry refuses the schema under the subject's compatibility
    /// rule (409).
    #[error("schema registry refuses the schema under subject {subject:?} as incompatible: {message}")]
    Incompatible {
        /// The subject.
        subject: String,
        /// The registry's message.
        message: String,
    },
    /// Any other refusal (401, 403, 422, ...): a person has to act.
    #[error("schema registry {url} refused the call with {status}: {message}")]
    Refused {
        /// The URL called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The registry's message.
        message: String,
    },
}

impl RegistryError {
    /// Whether waiting may cure it (an outage), as opposed to an answer.
    pub fn is_outage(&self) -> bool {
        matches!(self, RegistryError::Unreachable { .. })
    }
}

/// The registry's error body.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// The registry's answers with a schema or an id.
#[derive(Deserialize)]
struct SchemaBody {
    schema: String,
}

#[derive(Deserialize)]
struct IdBody {
    id: u32,
}

/// A schema registry at one base URL.
pub struct RegistryClient {
    base: String,
    http: Client,
    auth: RegistryAuth,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient").field("base", &self.base).field("auth", &self.auth).finish()
    }
}

impl RegistryClient {
    /// A client of `cfg.url`, with its credentials and CA read now.
    pub fn new(cfg: &SchemaRegistryConfig) -> Result<RegistryClient, RegistryError> {
        let auth = cfg.auth().map_err(|e| RegistryError::Setup(e.to_string()))?;
        let mut builder = Client::builder().timeout(Duration::from_millis(cfg.timeout_ms));
        if let Some(pem) = cfg.ca_pem().map_err(|e| RegistryError::Setup(e.to_string()))? {
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| RegistryError::Setup(format!("schema_registry.ca_file: {e}")))?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder.build().map_err(|e| RegistryError::Setup(e.to_string()))?;
        Ok(RegistryClient { base: cfg.url.trim().trim_end_matches('/').to_owned(), http, auth })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The text of the schema with id `id`.
    pub fn schema_by_id(&self, id: u32) -> Result<String, RegistryError> {
        let url = format!("{}/schemas/ids/{id}", self.base);
        let body: SchemaBody = self.call(self.http.get(&url), &url, None)?;
        Ok(body.schema)
    }

    /// Registers `schema` under `subject` (its existing id when it is there
    /// already).
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let url = format!("{}/subjects/{}/versions", self.base, encode(subject));
        let body = serde_json::json!({ "schema": schema }).to_string();
        let id: IdBody = self.call(self.http.post(&url).body(body), &url, Some(subject))?;
        Ok(id.id)
    }

    /// The id of `schema` under `subject`, `None` when it is not registered
    /// there.
    pub fn lookup(&self, subject: &str, schema: &str) -> Result<Option<u32>, RegistryError> {
        let url = format!("{}/subjects/{}", self.base, encode(subject));
        let body = serde_json::json!({ "schema": schema }).to_string();
        match self.call::<IdBody>(self.http.post(&url).body(body), &url, Some(subject)) {
            Ok(id) => Ok(Some(id.id)),
            Err(RegistryError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends `req` with the credentials and reads the answer.
    fn call<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::blocking::RequestBuilder,
        url: &str,
        subject: Option<&str>,
    ) -> Result<T, RegistryError> {
        let req = req.header(reqwest::header::ACCEPT, MEDIA_TYPE).header(reqwest::header::CONTENT_TYPE, MEDIA_TYPE);
        let req = match &self.auth {
            RegistryAuth::None => req,
            RegistryAuth::Basic { username, password } => req.basic_auth(username, Some(password)),
            RegistryAuth::Bearer(token) => req.bearer_auth(token),
        };
        let unreachable = |detail: String| RegistryError::Unreachable { url: url.to_owned(), detail };
        let resp = req.send().map_err(|e| unreachable(error_chain(&e)))?;
        let status = resp.status();
        let text = resp.text().map_err(|e| unreachable(error_chain(&e)))?;
        if status.is_success() {
            return serde_json::from_str(&text).map_err(|e| RegistryError::Refused {
                url: url.to_owned(),
                status: status.as_u16(),
                message: format!("an answer that is not the registry API's ({e}): {}", excerpt(&text)),
            });
        }
        let err: ErrorBody =
            serde_json::from_str(&text).unwrap_or(ErrorBody { error_code: 0, message: excerpt(&text) });
        match status {
            StatusCode::NOT_FOUND => Err(RegistryError::NotFound { code: err.error_code, message: err.message }),
            StatusCode::CONFLICT => Err(RegistryError::Incompatible {
                subject: subject.unwrap_or_default().to_owned(),
                message: err.message,
            }),
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::REQUEST_TIMEOUT => {
                Err(unreachable(format!("{s}: {}", err.message)))
            }
            s => Err(RegistryError::Refused { url: url.to_owned(), status: s.as_u16(), message: err.message }),
        }
    }
}

/// What a path segment must escape: everything but RFC 3986's unreserved
/// characters (subjects are often `<topic>-value`, topics dotted).
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A subject as one path segment.
fn encode(subject: &str) -> String {
    percent_encoding::utf8_percent_encode(subject, SEGMENT).to_string()
}

/// An error with its causes (reqwest's own message hides the transport's).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// The start of a body, for an error message.
fn excerpt(text: &str) -> String {
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// Answers each request on a local port with the next of `answers`
    /// (status, body) and hands back what each request was (request line,
    /// headers in lower case, body).
    fn server(answers: Vec<(u16, &'static str)>) -> (String, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for (status, body) in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                    request.push_str(&line.to_ascii_lowercase());
                }
                let mut content = vec![0; length];
                reader.read_exact(&mut content).unwrap();
                request.push_str(&String::from_utf8(content).unwrap());
                seen.push(request);
                let mut stream = stream;
                write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/vnd.schemaregistry.v1+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
            seen
        });
        (url, handle)
    }

    fn client(url: &str, edit: impl FnOnce(&mut SchemaRegistryConfig)) -> RegistryClient {
        let mut cfg = SchemaRegistryConfig { url: url.to_owned(), timeout_ms: 5_000, ..Default::default() };
        edit(&mut cfg);
        RegistryClient::new(&cfg).unwrap()
    }

    #[test]
    fn basic_auth_from_the_environment_goes_with_every_call_and_answers_are_typed() {
        std::env::set_var("RECONCILER_TEST_REGISTRY_USER", "ana");
        std::env::set_var("RECONCILER_TEST_REGISTRY_PASSWORD", "s3cret");
        let (url, seen) = server(vec![
            (200, r#"{"schema":"\"string\""}"#),
            (200, r#"{"id":42}"#),
            (404, r#"{"error_code":40403,"message":"Schema 7 not found."}"#),
            (409, r#"{"error_code":409,"message":"Incompatible artifact"}"#),
            (401, r#"{"error_code":401,"message":"Unauthorized"}"#),
            (503, "down for maintenance"),
        ]);
        let c = client(&url, |c| {
            c.username_env = "RECONCILER_TEST_REGISTRY_USER".into();
            c.password_env = "RECONCILER_TEST_REGISTRY_PASSWORD".into();
        });
        assert_eq!(c.schema_by_id(1).unwrap(), "\"string\"");
        assert_eq!(c.register("ops.verdicts-value", "{}").unwrap(), 42);
        assert!(matches!(c.schema_by_id(7), Err(RegistryError::NotFound { code: 40403, .. })));
        let e = c.register("a/b", "{}").unwrap_err();
        assert!(matches!(&e, RegistryError::Incompatible { subject, .. } if subject == "a/b"), "{e}");
        let e = c.schema_by_id(2).unwrap_err();
        assert!(matches!(e, RegistryError::Refused { status: 401, .. }) && !e.is_outage());
        assert!(c.schema_by_id(3).unwrap_err().is_outage());
        let seen = seen.join().unwrap();
        // "ana:s3cret" in base64.
        assert!(seen.iter().all(|r| r.contains("authorization: basic yw5honmzy3jlda==")), "{seen:#?}");
        assert!(seen[0].starts_with("get /schemas/ids/1 "), "{}", seen[0]);
        assert!(seen[1].starts_with("post /subjects/ops.verdicts-value/versions "), "{}", seen[1]);
        assert!(seen[1].ends_with(r#"{"schema":"{}"}"#), "{}", seen[1]);
        assert!(seen[3].starts_with("post /subjects/a%2fb/versions "), "the subject is one path segment: {}", seen[3]);
    }

    #[test]
    fn a_bearer_token_goes_as_such_and_an_unreachable_registry_is_an_outage() {
        std::env::set_var("RECONCILER_TEST_REGISTRY_TOKEN", "t0ken");
        let (url, seen) = server(vec![(200, r#"{"subject":"s","version":1,"id":5,"schema":"{}"}"#)]);
        let c = client(&url, |c| c.token_env = "RECONCILER_TEST_REGISTRY_TOKEN".into());
        assert_eq!(c.lookup("s", "{}").unwrap(), Some(5));
        assert!(seen.join().unwrap()[0].contains("authorization: bearer t0ken"));
        // Nothing listens there any more.
        let e = client(&url, |_| ()).schema_by_id(1).unwrap_err();
        assert!(e.is_outage(), "{e}");
    }
}
