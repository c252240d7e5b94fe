//! The host's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/readyz` and
//! `/plugins` (per-plugin status as JSON).
//!
//! The server reads state through [`StatusSource`], so it knows nothing of how plugins are
//! managed; it never blocks on the managers (each probe is one cheap snapshot).
//!
//! `/readyz` answers 200 (`ok`) when the source says ready and 503 (`not ready`) otherwise;
//! with [`Access::Open`] the body lists the source's details, one per line.
//!
//! Who may read what ([`Access`]):
//! - [`Access::Open`]: plain HTTP, every path to whoever can connect. The default, on
//!   `127.0.0.1`; served on any other address, a warning says so at start.
//! - [`Access::Kubernetes`]: HTTPS; `/metrics` and `/plugins` only for a bearer token the API
//!   server authenticates and authorizes for `get` on the path ([`auth`]); `/healthz` and
//!   `/readyz` stay open for the kubelet's probes and say only `ok` / `not ready`, since their
//!   details carry plugins' errors (what a guest wrote to stderr among them), which are for
//!   `/plugins` readers only.

mod auth;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use auth::{
    ALLOW_TTL, AUTHENTICATION_TTL, DENY_TTL, Decision, KubernetesAuth, MAX_CACHED, ReviewError, User,
    bearer_token,
};
pub use tls::{ServerTls, TlsError};

use crate::metrics::Metrics;

/// Whether the host is ready, and why not.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Readiness {
    /// True when every plugin has a running version (see the plugins' status board).
    pub ready: bool,
    /// One line per thing that is not ready (or a rejected reload), for humans.
    pub details: Vec<String>,
}

/// What the endpoint reports on.
pub trait StatusSource: Send + Sync + 'static {
    fn readiness(&self) -> Readiness;
    /// Per-plugin status (name, version, state, last error) as JSON.
    fn plugins(&self) -> serde_json::Value;
}

/// Who may read the endpoint.
#[derive(Clone, Debug)]
pub enum Access {
    /// Plain HTTP; every path to whoever can connect.
    Open,
    /// HTTPS with `tls`; `/metrics` and `/plugins` only for requests `auth` allows.
    Kubernetes { auth: Arc<KubernetesAuth>, tls: ServerTls },
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
    /// Whether `/readyz` lists its details.
    details: bool,
}

/// The router with every path open, separate from binding so tests can drive it directly.
pub fn router(metrics: Arc<Metrics>, status: Arc<dyn StatusSource>) -> Router {
    router_with(metrics, status, None)
}

/// The router; with `auth`, `/metrics` and `/plugins` pass it first and `/readyz` gives no
/// details.
fn router_with(
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
    auth: Option<Arc<KubernetesAuth>>,
) -> Router {
    let state = AppState { metrics, status, details: auth.is_none() };
    let mut guarded = Router::new().route("/metrics", get(metrics_handler)).route("/plugins", get(plugins));
    if let Some(auth) = auth {
        guarded = guarded.route_layer(middleware::from_fn_with_state(auth, authorize));
    }
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(guarded)
        .with_state(state)
}

/// Binds `address` and serves every path openly until `shutdown` is cancelled. Returns the
/// bound address (useful with port 0) once listening.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    serve_with(address, Access::Open, metrics, status, shutdown).await
}

/// Binds `address` and serves with `access` until `shutdown` is cancelled. Returns the bound
/// address once listening.
pub async fn serve_with(
    address: SocketAddr,
    access: Access,
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let task = match access {
        Access::Open => {
            if !bound.ip().is_loopback() {
                tracing::warn!(address = %bound,
                    "serving /metrics and /plugins without authentication on a non-loopback address; \
                     set `[server] auth = \"kubernetes\"` to require an authorized token");
            }
            let app = router_with(metrics, status, None);
            tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { shutdown.cancelled().await })
                    .await
            })
        }
        Access::Kubernetes { auth, tls } => {
            let app = router_with(metrics, status, Some(auth));
            tokio::spawn(serve_tls(listener, tokio_rustls::TlsAcceptor::from(tls.config), app, shutdown))
        }
    };
    Ok((bound, task))
}

/// Accepts TLS connections and serves `app` on each until `shutdown`; then closes them.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                // E.g. out of file descriptors: wait a little instead of spinning.
                tracing::warn!(%error, "endpoint: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        connections.spawn(async move {
            // A client that never finishes its handshake holds only this task, not the loop.
            let handshake =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp)).await;
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "endpoint: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "endpoint: TLS handshake timed out");
                    return;
                }
            };
            if let Err(error) =
                auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), service).await
            {
                tracing::debug!(%peer, %error, "endpoint: connection ended with an error");
            }
        });
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Lets a request through only when `auth` allows its verb on its path.
async fn authorize(State(auth): State<Arc<KubernetesAuth>>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let verb = request.method().as_str().to_ascii_lowercase();
    let path = request.uri().path().to_owned();
    match auth.decide(authorization, &verb, &path).await {
        Ok(Decision::Allow) => next.run(request).await,
        Ok(Decision::Unauthenticated) => {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "Unauthorized\n")
                .into_response()
        }
        Ok(Decision::Forbidden { user }) => {
            tracing::debug!(%user, %verb, %path, "endpoint: request denied");
            (StatusCode::FORBIDDEN, format!("Authorization denied for user {user}\n")).into_response()
        }
        Err(error) => {
            tracing::warn!(%error, %path, "endpoint: cannot check a request");
            (StatusCode::INTERNAL_SERVER_ERROR, "Authentication failed\n").into_response()
        }
    }
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.encode(),
    )
        .into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let r = state.status.readiness();
    let mut body = if r.ready { String::from("ok\n") } else { String::from("not ready\n") };
    if state.details {
        for d in &r.details {
            body.push_str(d);
            body.push('\n');
        }
    }
    let code = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, body).into_response()
}

async fn plugins(State(state): State<AppState>) -> Response {
    axum::Json(state.status.plugins()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(bool);
    impl StatusSource for Fixed {
        fn readiness(&self) -> Readiness {
            Readiness { ready: self.0, details: vec!["plugin mirror: informers syncing".into()] }
        }
        fn plugins(&self) -> serde_json::Value {
            serde_json::json!([{ "name": "mirror" }])
        }
    }

    async fn get_text(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let code = out[9..12].parse().unwrap();
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (code, body)
    }

    #[tokio::test]
    async fn readyz_reports_not_ready_with_details_and_metrics_are_exposed() {
        let metrics = Metrics::new();
        metrics.workqueue_adds.get_or_create(&crate::metrics::QueueLabels { name: "mirror".into() }).inc();
        metrics
            .reconcile_time_seconds
            .get_or_create(&crate::metrics::ControllerLabels { controller: "mirror".into() })
            .observe(0.002);
        let token = CancellationToken::new();
        let (addr, task) =
            serve("127.0.0.1:0".parse().unwrap(), metrics, Arc::new(Fixed(false)), token.clone())
                .await
                .unwrap();
        let (code, body) = get_text(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("informers syncing"), "{body}");
        let (code, body) = get_text(addr, "/healthz").await;
        assert_eq!((code, body.trim()), (200, "ok"));
        let (_, body) = get_text(addr, "/metrics").await;
        assert!(body.contains("workqueue_adds_total{name=\"mirror\"} 1"), "{body}");
        assert!(
            body.contains("controller_runtime_reconcile_time_seconds_count{controller=\"mirror\"} 1"),
            "{body}"
        );
        let (code, body) = get_text(addr, "/plugins").await;
        assert_eq!(code, 200);
        assert!(body.contains("\"mirror\""), "{body}");
        token.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn readyz_is_ok_when_ready() {
        let token = CancellationToken::new();
        let (addr, _task) =
            serve("127.0.0.1:0".parse().unwrap(), Metrics::new(), Arc::new(Fixed(true)), token.clone())
                .await
                .unwrap();
        let (code, _) = get_text(addr, "/readyz").await;
        assert_eq!(code, 200);
        token.cancel();
    }
}
