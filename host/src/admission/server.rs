//! The HTTPS server the API server posts admission reviews to: TLS by rustls (the
//! certificate of [`super::tls`], resolved at each handshake), HTTP/2 and HTTP/1.1 by hyper,
//! each review handed to a [`ReviewService`] (the [`super::AdmissionRouter`]; a benchmark's
//! native handler).
//!
//! Invariants:
//! - Only `POST` with a body of at most [`MAX_BODY`] bytes reaches the service; anything
//!   else is answered here (405, 413) without reading more.
//! - A handshake that does not finish within [`HANDSHAKE_TIMEOUT`] is dropped, so idle
//!   connections cannot pile up before TLS.
//! - On shutdown the listener closes at once and connections finish the requests they are
//!   serving (bounded by [`DRAIN_TIMEOUT`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The largest review body read: the API server's own request limit (3 MiB) holds the object,
/// and a review carries it and the old object besides.
pub const MAX_BODY: usize = 8 << 20;

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connections may take to finish their requests after shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A response to one review request.
pub struct ReviewReply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl ReviewReply {
    /// An `AdmissionReview` response.
    pub fn json(body: Vec<u8>) -> Self {
        ReviewReply { status: StatusCode::OK, content_type: "application/json", body }
    }

    /// An error that is not a review (unknown webhook, bad method).
    pub fn text(status: StatusCode, message: String) -> Self {
        ReviewReply { status, content_type: "text/plain; charset=utf-8", body: message.into_bytes() }
    }
}

/// What answers the reviews posted to the server.
pub trait ReviewService: Send + Sync + 'static {
    /// Answers the review `body` posted to `path`.
    fn review<'a>(&'a self, path: &'a str, body: Bytes) -> BoxFuture<'a, ReviewReply>;
}

/// A running admission server.
pub struct AdmissionServer {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl AdmissionServer {
    /// Serves `listener` with TLS `config` until `shutdown` is cancelled.
    pub fn start(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        service: Arc<dyn ReviewService>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let address = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(accept_loop(listener, acceptor, service, shutdown));
        Ok(AdmissionServer { address, task })
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits until the server stopped (after its shutdown token was cancelled and its
    /// connections drained).
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    service: Arc<dyn ReviewService>,
    shutdown: CancellationToken,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "admission server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "admission server: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "admission server: TLS handshake timed out");
                    return;
                }
            };
            let hyper_service = hyper::service::service_fn(move |req| {
                let service = service.clone();
                async move { Ok::<_, std::convert::Infallible>(serve(&*service, req).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tls), hyper_service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "admission server: connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("admission server: connections still open after the drain timeout; dropping them");
    }
}

async fn serve(service: &dyn ReviewService, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::POST {
        return reply(ReviewReply::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "admission reviews are POSTed".into(),
        ));
    }
    let path = req.uri().path().to_owned();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let too_large = e.downcast_ref::<http_body_util::LengthLimitError>().is_some();
            return reply(if too_large {
                ReviewReply::text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a review may be at most {MAX_BODY} bytes"),
                )
            } else {
                ReviewReply::text(StatusCode::BAD_REQUEST, format!("reading the request body: {e}"))
            });
        }
    };
    reply(service.review(&path, body).await)
}

fn reply(r: ReviewReply) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(r.body)));
    *response.status_mut() = r.status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(r.content_type));
    response
}
