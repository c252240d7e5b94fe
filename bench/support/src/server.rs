//! A fake API server on 127.0.0.1 that serves a [`Corpus`]: discovery for the core group,
//! the list of every ConfigMap, then one watch that streams the updates, flat out or paced.
//!
//! Invariants:
//! - Listens on loopback only; every accepted socket has TCP_NODELAY set, as a real API
//!   server's (Go sets it by default): without it Nagle's algorithm holds small watch writes
//!   back until the client's delayed ACK, tens of milliseconds.
//! - A list (with or without `limit`) returns every object in one response, as a real server
//!   does for `resourceVersion=0`; no `continue` token is ever set.
//! - The list and the watch speak JSON or Kubernetes protobuf, chosen from `Accept` as the API
//!   server chooses (`crate::negotiate`; 406 with a `Status` when neither is acceptable), with
//!   the API server's `Content-Type`s: `application/json` for a JSON list and watch,
//!   `application/vnd.kubernetes.protobuf` for a protobuf list and
//!   `application/vnd.kubernetes.protobuf;stream=watch` for a protobuf watch (framing in
//!   `crate::protobuf`). Both carry the same objects and stamps. Discovery is JSON only (what
//!   every consumer here accepts for it).
//! - Exactly one watch streams the updates: the first one from the list's resourceVersion.
//!   Any other watch (a reconnect, another resourceVersion) stays open and sends nothing, so a
//!   consumer never sees an update twice. After the last update the stream stays open too.
//! - With [`StreamConfig::expire_first_watch`], the first watch from the list's
//!   resourceVersion instead waits that long, sends one `ERROR` event (410 Expired, what a
//!   real server sends when the watch cache no longer holds the version) and ends, so the
//!   client relists; the next watch from the list's resourceVersion streams the updates.
//! - Each object's [`SENT_ANNOTATION`](crate::SENT_ANNOTATION) is stamped with the wall
//!   clock when the server generates it, just before handing it to the response stream.
//!   Paced, an update is generated at its due time (`warmup + u / rate` after the watch
//!   request, in batches of what is due at each timer tick, ~1 ms); the queue between
//!   generator and socket is unbounded, so a consumer that falls behind shows up as latency
//!   instead of slowing the generator down. Flat out, the queue is bounded (64 KiB chunks)
//!   and the consumer's reading speed sets the pace.
//!
//! Hand-written on axum because no crate fakes a Kubernetes watch at this speed with
//! stamps taken at write time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;

use crate::Corpus;
use crate::clock::unix_nanos;
use crate::negotiate::{Encoding, OFFERED, negotiate};
use crate::protobuf;

/// How fast the watch sends the updates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// As fast as the consumer reads.
    Flat,
    /// `rate` updates per second, starting `warmup` after the watch request (so the
    /// consumer's work on the initial list is done before the clock starts).
    PerSecond { rate: u32, warmup: Duration },
}

/// What to serve.
#[derive(Clone, Copy, Debug)]
pub struct StreamConfig {
    /// Objects in the initial list.
    pub objects: usize,
    /// Updates in the watch stream (0 when `objects` is 0).
    pub updates: u64,
    pub pace: Pace,
    /// End the first watch with 410 Expired after this long (forcing one relist).
    pub expire_first_watch: Option<Duration>,
}

/// A running server; stops when dropped.
pub struct StreamServer {
    url: String,
    json_bytes_per_object: f64,
    task: tokio::task::JoinHandle<()>,
}

impl StreamServer {
    /// Generates the corpus and starts serving it on a free loopback port.
    pub async fn start(config: StreamConfig) -> std::io::Result<Self> {
        let corpus = Corpus::new(config.objects);
        let json_bytes_per_object = corpus.json_bytes_per_object();
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            corpus,
            config,
            watch_started: AtomicBool::new(false),
            watch_expired: AtomicBool::new(false),
            addr,
        });
        let app = axum::Router::new()
            .route("/api", axum::routing::get(api_versions))
            .route("/apis", axum::routing::get(api_groups))
            .route("/api/v1", axum::routing::get(core_resources))
            .route("/version", axum::routing::get(version))
            .route_layer(axum::middleware::from_fn(json_only))
            .route("/api/v1/configmaps", axum::routing::get(configmaps))
            .with_state(shared);
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(StreamServer { url: format!("http://{addr}"), json_bytes_per_object, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Mean JSON size of one listed object.
    pub fn json_bytes_per_object(&self) -> f64 {
        self.json_bytes_per_object
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    corpus: Corpus,
    config: StreamConfig,
    watch_started: AtomicBool,
    watch_expired: AtomicBool,
    addr: SocketAddr,
}

fn json(body: impl Into<Body>) -> Response {
    with_type(body, "application/json")
}

fn with_type(body: impl Into<Body>, content_type: &'static str) -> Response {
    let mut response = Response::new(body.into());
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    response
}

/// The API server's answer to an `Accept` it cannot serve.
fn not_acceptable(accept: &str) -> Response {
    let message =
        format!("the server was unable to respond with a content type that the client supports ({accept})");
    let mut response = json(
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "NotAcceptable", "code": 406,
        })
        .to_string(),
    );
    *response.status_mut() = http::StatusCode::NOT_ACCEPTABLE;
    response
}

/// Discovery and version: 406 unless the client accepts JSON.
async fn json_only(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let header = accept(request.headers()).map(str::to_owned);
    if negotiate(header.as_deref(), false, &[Encoding::Json]).is_none() {
        return not_acceptable(header.as_deref().unwrap_or(""));
    }
    next.run(request).await
}

fn accept(headers: &http::HeaderMap) -> Option<&str> {
    headers.get(http::header::ACCEPT).and_then(|v| v.to_str().ok())
}

async fn api_versions(State(s): State<Arc<Shared>>) -> Response {
    json(
        serde_json::json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": s.addr.to_string()}],
        })
        .to_string(),
    )
}

async fn api_groups() -> Response {
    json(r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#)
}

async fn core_resources() -> Response {
    json(concat!(
        r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","#,
        r#""singularName":"configmap","namespaced":true,"kind":"ConfigMap","#,
        r#""verbs":["get","list","watch"],"shortNames":["cm"]}]}"#
    ))
}

async fn version() -> Response {
    json(concat!(
        r#"{"major":"1","minor":"37","gitVersion":"v1.37.0-bench","gitCommit":"","#,
        r#""gitTreeState":"clean","buildDate":"2026-11-22T00:00:00Z","goVersion":"","#,
        r#""compiler":"","platform":"linux/amd64"}"#
    ))
}

async fn configmaps(
    State(s): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    headers: http::HeaderMap,
) -> Response {
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let Some(encoding) = negotiate(accept(&headers), watching, OFFERED) else {
        return not_acceptable(accept(&headers).unwrap_or(""));
    };
    if !watching {
        return match encoding {
            Encoding::Json => json(s.corpus.list_body(unix_nanos())),
            Encoding::Protobuf => with_type(s.corpus.list_body_protobuf(unix_nanos()), protobuf::PROTOBUF),
        };
    }
    let watch_response = |body: Body| match encoding {
        Encoding::Json => json(body),
        Encoding::Protobuf => with_type(body, protobuf::PROTOBUF_WATCH),
    };
    let from_list = q.get("resourceVersion").is_some_and(|rv| *rv == s.corpus.list_rv().to_string());
    if let Some(after) = s.config.expire_first_watch
        && from_list
        && !s.watch_expired.swap(true, Ordering::SeqCst)
    {
        let message =
            format!("too old resource version: {} ({})", s.corpus.list_rv(), s.corpus.list_rv() + 1);
        let expired = match encoding {
            Encoding::Json => {
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": message, "reason": "Expired", "code": 410,
                });
                format!("{{\"type\":\"ERROR\",\"object\":{status}}}\n").into_bytes()
            }
            Encoding::Protobuf => {
                let mut frame = Vec::new();
                protobuf::write_watch_frame(
                    &mut frame,
                    "ERROR",
                    protobuf::status_body("Expired", &message, 410),
                );
                frame
            }
        };
        let event = futures::stream::once(async move {
            tokio::time::sleep(after).await;
            Ok::<_, std::io::Error>(Bytes::from(expired))
        });
        return watch_response(Body::from_stream(event));
    }
    let first = from_list && !s.watch_started.swap(true, Ordering::SeqCst);
    if !first || s.corpus.objects() == 0 {
        return watch_response(
            Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()),
        );
    }
    let updates = match s.config.pace {
        Pace::Flat => flat(s.clone(), encoding),
        Pace::PerSecond { rate, warmup } => paced(s.clone(), encoding, rate.max(1), warmup),
    };
    let endless = updates.map(Ok::<_, std::io::Error>).chain(futures::stream::pending());
    watch_response(Body::from_stream(endless))
}

/// Appends update `u` in `encoding`.
fn write_update(corpus: &Corpus, encoding: Encoding, out: &mut Vec<u8>, u: u64) {
    match encoding {
        Encoding::Json => corpus.write_update_event(out, u, unix_nanos()),
        Encoding::Protobuf => corpus.write_update_frame(out, u, unix_nanos()),
    }
}

/// Chunk size of the flat-out stream.
const CHUNK: usize = 64 * 1024;

fn flat(s: Arc<Shared>, encoding: Encoding) -> futures::stream::BoxStream<'static, Bytes> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let mut buf = Vec::with_capacity(CHUNK + 4096);
        for u in 0..s.config.updates {
            write_update(&s.corpus, encoding, &mut buf, u);
            if buf.len() >= CHUNK {
                let chunk = Bytes::from(std::mem::replace(&mut buf, Vec::with_capacity(CHUNK + 4096)));
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
        if !buf.is_empty() {
            let _ = tx.send(Bytes::from(buf)).await;
        }
    });
    receiver_stream(rx)
}

fn paced(
    s: Arc<Shared>,
    encoding: Encoding,
    rate: u32,
    warmup: Duration,
) -> futures::stream::BoxStream<'static, Bytes> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        let start = Instant::now();
        let total = s.config.updates;
        let due_at = |u: u64| start + Duration::from_secs_f64(u as f64 / f64::from(rate));
        let mut next = 0u64;
        while next < total {
            let elapsed = start.elapsed().as_secs_f64();
            let due = ((elapsed * f64::from(rate)) as u64 + 1).min(total);
            if due > next {
                let mut buf = Vec::with_capacity((due - next) as usize * 2200);
                for u in next..due {
                    write_update(&s.corpus, encoding, &mut buf, u);
                }
                if tx.send(Bytes::from(buf)).is_err() {
                    return;
                }
                next = due;
            }
            tokio::time::sleep_until(due_at(next).into()).await;
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

fn receiver_stream(mut rx: tokio::sync::mpsc::Receiver<Bytes>) -> futures::stream::BoxStream<'static, Bytes> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}

/// A [`StreamServer`] on its own thread with its own single-threaded runtime, so that a
/// consumer in the same process does not share its runtime with the generator. Stops when
/// dropped.
pub struct BackgroundServer {
    url: String,
    json_bytes_per_object: f64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BackgroundServer {
    /// Starts the server and waits until it listens.
    pub fn start(config: StreamConfig) -> std::io::Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("stream-server".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            rt.block_on(async move {
                match StreamServer::start(config).await {
                    Ok(server) => {
                        let _ = ready_tx.send(Ok((server.url().to_owned(), server.json_bytes_per_object())));
                        let _ = stopped.await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
        let (url, json_bytes_per_object) = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the stream server thread ended before listening"))??;
        Ok(BackgroundServer { url, json_bytes_per_object, stop: Some(stop), thread: Some(thread) })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Mean JSON size of one listed object.
    pub fn json_bytes_per_object(&self) -> f64 {
        self.json_bytes_per_object
    }
}

impl Drop for BackgroundServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
