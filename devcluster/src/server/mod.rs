//! HTTP layer of the dev cluster: authentication, fault injection, routing, discovery and the
//! REST verbs (get/list/watch/create/update/patch/delete/deletecollection) over the generic
//! store.
//!
//! Invariants:
//! - Every path but the health checks needs the bearer token; authentication and fault
//!   injection run before any handler (`routing`).
//! - Responses are JSON; objects go out as the bytes the store encoded (re-encoded only for
//!   another API version, Table or PartialObjectMetadata output, `table`).
//! - Every failure answers a Kubernetes `Status` with the API server's code and reason.
//!
//! One file per concept: `routing` (the axum router, authentication, the resource path
//! grammar), `discovery`, `verbs` (a resolved path onto the store), `list` (list options and
//! selectors), `table` (output formats), `patch`, `watch`, `review` (token and access reviews)
//! and `request` (what a handler knows about one request).

mod discovery;
mod list;
mod openapi;
mod patch;
mod request;
mod review;
mod routing;
mod table;
mod verbs;
mod watch;

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde_json::Value;

use crate::error::ApiError;
#[cfg(feature = "faults")]
use crate::faults::Faults;
use crate::store::Store;

pub use routing::router;

/// The Kubernetes version the server reports (kubectl picks its behaviour from it).
pub const KUBE_VERSION: (&str, &str) = ("1", "32");

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct AppState {
    /// The object store.
    pub store: Arc<Store>,
    /// The bearer token clients must present.
    pub token: String,
    /// Fault injection (the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: Faults,
    /// `host:port` for discovery's serverAddressByClientCIDRs.
    pub address: String,
}

fn json_response(code: StatusCode, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

/// The `Status` response of an error. The error rides along in the response's extensions so
/// the routing layer can log it with the request it belongs to.
fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, e.status_bytes());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r.extensions_mut().insert(e.clone());
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}
