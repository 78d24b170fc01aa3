//! The HTTP server inside `reconciler run`: `/metrics`,
//! `/healthz`, `/readyz`, the operator API under `/api/` and the exception
//! panel at `/`.
//!
//! It runs on a small tokio runtime in a thread of its own, beside the
//! blocking pipeline loop, and shares only read-mostly things with it: the
//! metrics, the readiness flag and the state store (RocksDB reads are safe
//! from any thread). Anything that changes state goes through the log, as a
//! `ManualDecision` event or a re-driven record, never into the store
//! directly; those endpoints require the bearer token of `[http]`. With a
//! token (or a read token) configured, the endpoints that read require one
//! too; the probes' and the scraper's endpoints and the panel's static
//! files stay open (see [`router`]).

mod api;
mod auth;
mod fleet;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Config;
use crate::fleet::Roster;
use crate::kafka::consumer::Ownership;
use crate::kafka::producer::Publisher;
use crate::metrics::{Metrics, RelayReadiness};
use crate::pipeline::Pipeline;
use crate::store::{Claims, Store};

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The address cannot be listened on (taken, not local, not permitted).
    #[error("HTTP server: cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why listening on it failed.
        source: std::io::Error,
    },
    /// The listener or the server's runtime could not be set up.
    #[error("HTTP server: {0}")]
    Runtime(std::io::Error),
}

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    /// The process's metrics: `/metrics` renders them, `/readyz` answers from
    /// them.
    pub metrics: Arc<Metrics>,
    /// The pipeline's state store: what `explain`, `review` and the resolve
    /// check read.
    pub store: Arc<Store>,
    /// The effective configuration: the token, the topics and the Kafka
    /// settings that decisions and re-drives are published with.
    pub cfg: Arc<Config>,
    /// Wall clock: ages in the review queue, the time stamped on decisions.
    pub clock: Clock,
    /// Publishes decisions to the input topic; created on first use.
    pub decisions: Arc<Mutex<Option<Publisher>>>,
    /// The pipeline's codec: decisions are written in the framing its
    /// input is read in.
    pub codec: crate::codec::Codec,
    /// The partitions the pipeline owns now: the API answers for those
    /// only, never for what the store still holds of partitions that moved
    /// away. `None`: no pipeline beside (everything the store holds).
    pub owned: Option<Ownership>,
    /// This instance in the fleet, once it is announced (see
    /// [`Fleet::start`]): `?scope=fleet` asks every member.
    pub fleet: Arc<OnceLock<FleetView>>,
    /// The client that asks the other members, made on first use: building
    /// it loads the system's TLS roots (about 50 ms), which held up the
    /// start of every pipeline, fleet or not.
    pub client: Arc<OnceLock<reqwest::Client>>,
    /// The partitions the pipeline writes (standby replicas write only the
    /// others).
    pub claims: Claims,
    /// The bounded pool of connections to the outbox's database, made on
    /// first use, or why there is none (no `[relay] connection_env`
    /// variable set).
    pub outbox: Arc<OnceLock<Result<deadpool_postgres::Pool, String>>>,
}

/// What the server knows of the fleet.
#[derive(Clone)]
pub struct FleetView {
    /// This instance's advertised URL.
    pub me: String,
    /// The members heard of on the fleet topic.
    pub roster: Roster,
}

impl AppState {
    /// The state of the server beside `pipeline`.
    pub fn of(pipeline: &Pipeline, cfg: Config, clock: Clock) -> AppState {
        AppState {
            metrics: pipeline.metrics(),
            store: pipeline.store(),
            cfg: Arc::new(cfg),
            clock,
            decisions: Arc::new(Mutex::new(None)),
            codec: pipeline.codec().clone(),
            owned: Some(pipeline.ownership()),
            claims: pipeline.claims(),
            fleet: Arc::new(OnceLock::new()),
            client: Arc::new(OnceLock::new()),
            outbox: Arc::new(OnceLock::new()),
        }
    }

    /// The client that asks the other members, with this instance's read
    /// credentials.
    pub fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| crate::fleet::client::http_client(self.cfg.http.read_authorization().as_deref()))
    }

    /// The pool of connections to the outbox's database (at most
    /// [`crate::outbox::POOL_SIZE`]), or why this instance cannot reach the
    /// outbox.
    pub fn outbox_pool(&self) -> Result<&deadpool_postgres::Pool, &str> {
        let pool = self.outbox.get_or_init(|| {
            let connection = self.cfg.relay.connection().map_err(|e| e.to_string())?;
            crate::outbox::pool(&connection, crate::outbox::POOL_SIZE).map_err(|e| e.to_string())
        });
        pool.as_ref().map_err(String::as_str)
    }

    /// Whether the pipeline owns `partition` now (always, without one).
    pub fn owns(&self, partition: i32) -> bool {
        self.owned.as_ref().is_none_or(|o| o.owned().contains(&partition))
    }
}

/// This instance's part in the fleet view: announcing itself and watching
/// the others (see [`crate::fleet`]). Stops with the flag it was started
/// with.
pub struct Fleet {
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Fleet {
    /// Announces the instance whose server is `server` (reachable at
    /// `url`) on the fleet topic of `state`'s config and watches the
    /// others; the server's `?scope=fleet` answers from then on.
    pub fn start(
        state: &AppState,
        url: String,
        shutdown: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Fleet, crate::kafka::KafkaError> {
        let cfg = &state.cfg;
        let Some(topic) = cfg.topics.fleet() else { return Ok(Fleet { handles: Vec::new() }) };
        crate::kafka::admin::ensure_compacted(&cfg.kafka, topic, 1, cfg.topics.replication_factor)?;
        let roster = Roster::default();
        let owned = state.owned.clone();
        let owned: crate::fleet::announce::Owned =
            Box::new(move || owned.as_ref().map(Ownership::owned).unwrap_or_default());
        let mut handles = vec![
            crate::fleet::watch::spawn(&cfg.kafka, topic, roster.clone(), shutdown.clone())?,
            crate::fleet::announce::spawn(&cfg.kafka, topic, url.clone(), owned, shutdown.clone())?,
        ];
        if let (n @ 1.., Some(changelog)) = (cfg.consumer.standby_replicas, cfg.topics.changelog()) {
            let partitions =
                crate::kafka::watermarks::Watermarks::partition_count_once(&cfg.kafka, &cfg.topics.events)?;
            let standby = crate::fleet::standby::StandbyConfig {
                kafka: cfg.kafka.clone(),
                topic: changelog.to_owned(),
                partitions: partitions as i32,
                replicas: n,
                me: url.clone(),
            };
            let (store, claims, metrics) = (state.store.clone(), state.claims.clone(), state.metrics.clone());
            handles.push(crate::fleet::standby::spawn(standby, store, claims, roster.clone(), metrics, shutdown)?);
        }
        let _ = state.fleet.set(FleetView { me: url, roster });
        Ok(Fleet { handles })
    }

    /// Waits for both threads (after the shutdown flag is set): the
    /// instance has left the fleet.
    pub fn join(self) {
        for h in self.handles {
            let _ = h.join();
        }
    }
}

/// A running server; stops when dropped (or on [`Server::stop`]).
pub struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` (port 0 picks a free one) and serves in a thread.
    pub fn start(addr: SocketAddr, state: AppState) -> Result<Server, HttpError> {
        if state.cfg.http.token.is_none() {
            info!("No http.token configured: resolve and redrive over HTTP are disabled");
        }
        let server = Server::serve(addr, router(state))?;
        info!(addr = %server.addr, "HTTP server listening (/metrics, /healthz, /readyz, /api, /)");
        Ok(server)
    }

    /// `/metrics` (the text of `registry`) and `/healthz` only: the server
    /// of a process without a pipeline (`reconciler probe`).
    pub fn metrics_only(addr: SocketAddr, registry: prometheus::Registry) -> Result<Server, HttpError> {
        let server = Server::serve(addr, metrics_router(registry))?;
        info!(addr = %server.addr, "HTTP server listening (/metrics, /healthz)");
        Ok(server)
    }

    /// The server of `reconciler relay`: [`Server::metrics_only`] and
    /// `/readyz`, red while the broker refuses every row for a reason that
    /// is not the row's (see [`RelayReadiness`]).
    pub fn relay(
        addr: SocketAddr,
        registry: prometheus::Registry,
        readiness: RelayReadiness,
    ) -> Result<Server, HttpError> {
        let readyz = move || async move {
            let refused = readiness.refused();
            let code = if refused.is_none() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            (code, Json(serde_json::json!({ "ready": refused.is_none(), "publish_refused": refused }))).into_response()
        };
        let server = Server::serve(addr, metrics_router(registry).route("/readyz", get(readyz)))?;
        info!(addr = %server.addr, "HTTP server listening (/metrics, /healthz, /readyz)");
        Ok(server)
    }

    fn serve(addr: SocketAddr, app: Router) -> Result<Server, HttpError> {
        // Bound here, synchronously, so that a taken port fails the start
        // with the address named.
        let listener = std::net::TcpListener::bind(addr).map_err(|source| HttpError::Bind { addr, source })?;
        listener.set_nonblocking(true).map_err(HttpError::Runtime)?;
        let addr = listener.local_addr().map_err(HttpError::Runtime)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(4)
            .thread_name("http-blocking")
            .build()
            .map_err(HttpError::Runtime)?;
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return warn!(error = %e, "HTTP server cannot use its socket"),
                    };
                    let stop = async {
                        let _ = rx.await;
                    };
                    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
                        warn!(error = %e, "HTTP server stopped");
                    }
                })
            })
            .map_err(HttpError::Runtime)?;
        Ok(Server { addr, shutdown: Some(tx), thread: Some(thread) })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, finishes requests in flight, joins the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `/metrics` (the text of `registry`) and `/healthz`.
fn metrics_router(registry: prometheus::Registry) -> Router {
    let render = move || async move {
        ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], crate::metrics::render(&registry)).into_response()
    };
    Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(healthz))
        .fallback(|| async { api::error(StatusCode::NOT_FOUND, "no such endpoint") })
}

/// The routes, by who may call them:
/// - open to anyone: `/healthz`, `/readyz` and `/metrics` (orchestrators'
///   probes and Prometheus' scraper carry no token) and the panel's static
///   page, script and style (they hold no data; the panel sends the token
///   with every request it makes for data);
/// - reads (`/api/review`, `/api/operations/{id}`, `/api/dlq`,
///   `/api/fleet`): with `[http] token` or `read_token` configured, either
///   of them (see [`auth::read_refusal`]);
/// - changes (resolve, re-drives): `[http] token` only, and same-origin.
fn router(state: AppState) -> Router {
    let reads = Router::new()
        .route("/api/operations/{id}", get(api::operation))
        .route("/api/review", get(api::review))
        .route("/api/dlq", get(api::dead_letters))
        .route("/api/fleet", get(fleet::members))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_read));
    Router::new()
        .route("/", get(panel_page))
        .route("/panel.js", get(panel_js))
        .route("/panel.css", get(panel_css))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(reads)
        .route("/api/operations/{id}/resolve", post(api::resolve))
        .route("/api/dlq/redrive", post(api::redrive))
        .route("/api/dlq/outbox/redrive", post(api::outbox_redrive))
        .fallback(|| async { api::error(StatusCode::NOT_FOUND, "no such endpoint") })
        // A decision or a re-drive request is a few hundred bytes: a body
        // past this is refused (413) before it is buffered.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Lets a read through only with the credentials [`auth::read_refusal`]
/// asks for.
async fn require_read(
    State(s): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match auth::read_refusal(&s.cfg.http, request.headers()) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// Largest request body the API reads (64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

const PANEL_HTML: &str = include_str!("panel/index.html");
const PANEL_JS: &str = include_str!("panel/panel.js");
const PANEL_CSS: &str = include_str!("panel/panel.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

async fn panel_page() -> Response {
    asset("text/html; charset=utf-8", PANEL_HTML)
}

async fn panel_js() -> Response {
    asset("text/javascript; charset=utf-8", PANEL_JS)
}

async fn panel_css() -> Response {
    asset("text/css; charset=utf-8", PANEL_CSS)
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], s.metrics.render()).into_response()
}

/// Liveness: the process answers.
async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Readiness: owned partitions restored, the outbox re-published,
/// publishing not refused and the broker answering.
async fn readyz(State(s): State<AppState>) -> Response {
    let r = s.metrics.readiness();
    let code = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(r)).into_response()
}
