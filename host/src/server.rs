//! The host's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`, `/readyz` and
//! `/plugins` (per-plugin status as JSON).
//!
//! The server reads state through [`StatusSource`], so it knows nothing of how plugins are
//! managed; it never blocks on the managers (each probe is one cheap snapshot).
//!
//! `/readyz` answers 200 (`ok`) when the source says ready and 503 (`not ready`) otherwise;
//! either way the body lists the source's details, one per line.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

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

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
}

/// The router, separate from binding so tests can drive it directly.
pub fn router(metrics: Arc<Metrics>, status: Arc<dyn StatusSource>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/plugins", get(plugins))
        .with_state(AppState { metrics, status })
}

/// Binds `address` and serves until `shutdown` is cancelled. Returns the bound address
/// (useful with port 0) once listening.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    status: Arc<dyn StatusSource>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let app = router(metrics, status);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
    });
    Ok((bound, task))
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
    for d in &r.details {
        body.push_str(d);
        body.push('\n');
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
