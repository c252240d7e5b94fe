//! List options: selectors, paging (`limit`/`continue`) and resourceVersion semantics.
//!
//! Invariants:
//! - A continue token carries the RV of the first page, so every page of one list is served
//!   from the same point in history (or fails with 410 once that history is compacted).
//! - `resourceVersion` with `continue` is rejected, and an RV newer than the store's answers
//!   504 with a retry hint (`ResourceVersionTooLarge`), as the API server does.

use axum::response::Response;
use base64::Engine;
use http::StatusCode;
use serde_json::json;

use super::json_response;
use super::request::{Ctx, ResReq};
use super::table::render_list;
use crate::error::ApiError;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::ListOpts;

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    ns: String,
    name: String,
}

pub(super) fn list_opts(ctx: &Ctx<'_>, req: &ResReq) -> Result<ListOpts, ApiError> {
    let mut opts = ListOpts {
        namespace: req.namespace.clone(),
        labels: LabelSelector::parse(ctx.q("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(ctx.q("fieldSelector").unwrap_or(""))?,
        limit: match ctx.q("limit") {
            Some(l) => l.parse().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            None => 0,
        },
        ..Default::default()
    };
    if let Some(token) = ctx.q("continue") {
        if ctx.q("resourceVersion").is_some_and(|rv| rv != "0") {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| ApiError::bad_request("continue key is not valid: illegal base64 data"))?;
        let t: ContinueToken =
            serde_json::from_slice(&raw).map_err(|_| ApiError::bad_request("continue key is not valid"))?;
        opts.after = Some((t.ns, t.name));
        opts.continue_rv = Some(t.rv);
    } else if let Some(rv) = ctx.q("resourceVersion").filter(|rv| *rv != "0") {
        let n: u64 =
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
        match ctx.q("resourceVersionMatch") {
            Some("Exact") => opts.exact_rv = Some(n),
            None | Some("NotOlderThan") => {
                let current = ctx.st.store.current_rv();
                if n > current {
                    let mut e = ApiError::injected(504, Some(1));
                    e.reason = "Timeout";
                    e.message = format!("Too large resource version: {n}, current: {current}");
                    e.details = Some(
                        json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                    );
                    return Err(e);
                }
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!("invalid resourceVersionMatch: {other:?}")));
            }
        }
    }
    Ok(opts)
}

pub(super) fn list_handler(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let opts = list_opts(ctx, req)?;
    let result = ctx.st.store.list(&req.info.gr, &opts)?;
    let next = result.next.map(|(ns, name)| {
        let t = ContinueToken { v: "meta.k8s.io/v1".into(), rv: result.rv, ns, name };
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
    });
    let body = render_list(ctx, req, ctx.format(), &result.items, result.rv, next, result.remaining)?;
    Ok(json_response(StatusCode::OK, body))
}
