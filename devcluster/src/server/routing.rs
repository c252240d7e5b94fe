//! Routing: which handler serves a path, and what every API request passes first.
//!
//! Invariants:
//! - `/healthz`, `/livez` and `/readyz` answer without a token; every other path, including
//!   unknown ones, first passes authentication (401; the token compared in constant time)
//!   and then fault injection.
//! - A failed request is logged once (debug, with method and path), after its handler.
//! - Discovery and OpenAPI paths are axum routes. The resources are two axum routes, one per
//!   prefix (`/api/{version}/…` and `/apis/{group}/{version}/…`), whose tail is resolved by
//!   [`resolve`] against the registry at request time: resources come and go with CRDs, so
//!   their names cannot be routes, and in the core group `namespaces/{name}/status` (and
//!   `/finalize`) is a Namespace subresource while in every other group the same shape is a
//!   namespaced resource called `status`, a distinction a path pattern cannot make.
//! - The tail is read from the raw path (not axum's percent-decoded captures), so object
//!   names reach the store exactly as the client sent them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use http::{HeaderValue, header};

use super::request::{Ctx, ResReq, parse_query};
use super::{AppState, discovery, error_response, openapi, review, verbs};
use crate::error::ApiError;

/// Largest request body accepted.
const MAX_BODY: usize = 64 << 20;

/// The axum router serving everything.
pub fn router(state: Arc<AppState>) -> axum::Router {
    let api = axum::Router::new()
        .route("/version", get(discovery::version).fallback(not_found))
        .route("/api", get(discovery::core_versions).fallback(not_found))
        .route("/api/{version}", get(discovery::core_resources).fallback(not_found))
        .route("/api/{version}/{*rest}", any(resource))
        .route("/apis", get(discovery::groups).fallback(not_found))
        .route("/apis/{group}", get(discovery::group).fallback(not_found))
        .route("/apis/{group}/{version}", get(discovery::group_resources).fallback(not_found))
        .route("/apis/authentication.k8s.io/v1/tokenreviews", post(review::token_review).fallback(not_found))
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(review::subject_access_review).fallback(not_found),
        )
        .route("/apis/{group}/{version}/{*rest}", any(resource))
        .route("/openapi/v3", get(openapi::index).fallback(not_found))
        .route("/openapi/v3/api/{version}", get(openapi::core_doc).fallback(not_found))
        .route("/openapi/v3/apis/{group}/{version}", get(openapi::group_doc).fallback(not_found))
        .fallback(not_found)
        .layer(middleware::from_fn(log_failures))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state);
    axum::Router::new()
        .route("/healthz", any(health))
        .route("/livez", any(health))
        .route("/readyz", any(health))
        .merge(api)
}

async fn health() -> Response {
    let mut r = Response::new(Body::from("ok"));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

async fn not_found() -> ApiError {
    ApiError::path_not_found()
}

/// The bearer token check, then fault injection (which sees every authenticated request).
async fn authenticate(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .is_some_and(|t| review::token_matches(t.trim(), &st.token));
    if !authorized {
        return error_response(&ApiError::unauthorized());
    }
    #[cfg(feature = "faults")]
    {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let query = parse_query(req.uri().query());
        let is_watch =
            query.get("watch").is_some_and(|w| w == "true" || w == "1") || path.contains("/watch/");
        if let Err(e) = st.faults.before(&method, &path, is_watch).await {
            return error_response(&e);
        }
    }
    next.run(req).await
}

/// Logs a request that ended in an error `Status` (the error is in the response's extensions).
async fn log_failures(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    if let Some(e) = resp.extensions().get::<ApiError>() {
        tracing::debug!(%method, %path, code = e.code, reason = e.reason, message = %e.message, "request failed");
    }
    resp
}

/// Everything under `/api/{version}/` and `/apis/{group}/{version}/`.
async fn resource(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading body: {e}")))?;
    let query = parse_query(parts.uri.query());
    let ctx = Ctx { st: &st, method: &parts.method, headers: &parts.headers, query: &query, body };
    let req = resolve(&ctx, parts.uri.path())?;
    verbs::dispatch(&ctx, &req)
}

/// Resolves a resource path (`/api/v1/...` or `/apis/{group}/{version}/...`, optionally with
/// the legacy `watch/` prefix) to the resource, namespace, name and subresource it names.
fn resolve(ctx: &Ctx<'_>, path: &str) -> Result<ResReq, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let registry = ctx.st.store.registry();
    let lookup = |r: &str| registry.get(group, version, r).ok_or_else(ApiError::path_not_found);
    let (resource, namespace, name, sub) = match rest {
        ["namespaces", ns, r, tail @ ..]
            if group.is_empty() && !matches!(*r, "status" | "finalize") || !group.is_empty() =>
        {
            let info = lookup(r)?;
            if !info.namespaced {
                return Err(ApiError::path_not_found());
            }
            match tail {
                [] => (info, Some(ns.to_string()), None, None),
                [n] => (info, Some(ns.to_string()), Some(n.to_string()), None),
                [n, s] => (info, Some(ns.to_string()), Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::path_not_found()),
            }
        }
        [r] => (lookup(r)?, None, None, None),
        [r, n] => {
            let info = lookup(r)?;
            if info.namespaced {
                return Err(ApiError::path_not_found());
            }
            (info, None, Some(n.to_string()), None)
        }
        [r, n, s] => {
            let info = lookup(r)?;
            if info.namespaced {
                return Err(ApiError::path_not_found());
            }
            (info, None, Some(n.to_string()), Some(s.to_string()))
        }
        _ => return Err(ApiError::path_not_found()),
    };
    if let Some(s) = &sub
        && !(s == "status" && resource.status_subresource
            || s == "finalize" && resource.gr.resource == "namespaces")
    {
        return Err(ApiError::path_not_found());
    }
    Ok(ResReq { info: resource, version: version.to_string(), namespace, name, sub, watch_path })
}
