//! The REST verbs on a resolved resource path: get, list, watch, create, update, patch,
//! delete and deletecollection, mapped onto the store.
//!
//! Invariants:
//! - Bodies are rewritten to the storage version before they reach the store (all served
//!   versions share one storage), and rendered back in the version of the request.
//! - A method the path does not support answers 405 with a `Status`, like the API server.

use http::{Method, StatusCode};
use serde_json::Value;

use super::json_response;
use super::list::{list_handler, list_opts};
use super::patch::patch_handler;
use super::request::{Ctx, Format, ResReq};
use super::table::{render_list, render_one};
use super::watch::watch_handler;
use crate::error::ApiError;
use crate::resources::ResourceInfo;
use crate::store::{DeleteOpts, Subresource, WriteOpts};
use axum::response::Response;

pub(super) fn dispatch(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let ns = req.namespace.as_deref().unwrap_or("");
    let gr = &req.info.gr;
    let watch = req.watch_path || ctx.flag("watch");
    match (ctx.method.clone(), &req.name) {
        (Method::GET, None) if watch => watch_handler(ctx, req),
        (Method::GET, None) => list_handler(ctx, req),
        (Method::GET, Some(name)) if watch => {
            // Legacy /watch/.../name: a watch of one object.
            let mut q = ctx.query.clone();
            q.insert("fieldSelector".into(), format!("metadata.name={name}"));
            let sub_ctx = Ctx { query: &q, body: ctx.body.clone(), ..*ctx };
            watch_handler(&sub_ctx, &ResReq { name: None, ..req.clone_shallow() })
        }
        (Method::GET, Some(name)) => {
            let obj = ctx.st.store.get(gr, ns, name)?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::POST, None) => {
            let body = ctx.body_json()?;
            let opts = WriteOpts { dry_run: ctx.dry_run(), manager: Some(ctx.manager()) };
            let obj = ctx.st.store.create(gr, ns, to_storage(body, &req.info), &opts)?;
            render_one(ctx, req, StatusCode::CREATED, obj)
        }
        (Method::PUT, Some(name)) => {
            let body = ctx.body_json()?;
            let sub = if req.sub.is_some() { Subresource::Status } else { Subresource::Main };
            let opts = WriteOpts { dry_run: ctx.dry_run(), manager: Some(ctx.manager()) };
            let new = to_storage(body, &req.info);
            let (obj, _) = ctx.st.store.modify(gr, ns, name, sub, &opts, false, |_, _| Ok(new))?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::PATCH, Some(name)) => patch_handler(ctx, req, name),
        (Method::DELETE, Some(name)) => {
            let opts = delete_opts(ctx)?;
            let obj = ctx.st.store.delete(gr, ns, name, &opts)?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::DELETE, None) => {
            let opts = delete_opts(ctx)?;
            let list = list_opts(ctx, req)?;
            let items = ctx.st.store.delete_collection(gr, &list, &opts)?;
            let rv = ctx.st.store.current_rv();
            Ok(json_response(StatusCode::OK, render_list(ctx, req, Format::Full, &items, rv, None, 0)?))
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

/// Rewrites a body's apiVersion to the storage version (all versions share storage).
pub(super) fn to_storage(mut body: Value, info: &ResourceInfo) -> Value {
    if info.versions.len() > 1
        && let Some(o) = body.as_object_mut()
        && o.contains_key("apiVersion")
    {
        o.insert("apiVersion".into(), Value::String(info.api_version(info.storage_version())));
    }
    body
}

fn delete_opts(ctx: &Ctx<'_>) -> Result<DeleteOpts, ApiError> {
    let body: Value = if ctx.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
    let mut propagation = s("/propagationPolicy").or_else(|| ctx.q("propagationPolicy").map(str::to_string));
    let orphan = body
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| ctx.q("orphanDependents").map(|v| v == "true"));
    if propagation.is_none() && orphan == Some(true) {
        propagation = Some("Orphan".into());
    }
    let dry_run = ctx.dry_run()
        || body.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok(DeleteOpts {
        propagation,
        uid: s("/preconditions/uid"),
        resource_version: s("/preconditions/resourceVersion"),
        dry_run,
    })
}
