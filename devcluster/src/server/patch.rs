//! PATCH: JSON merge, JSON patch, strategic merge and server-side apply.
//!
//! Invariants:
//! - A patch is applied to the live object inside the store's read-modify-write, so it never
//!   works on a stale copy.
//! - Server-side apply needs a `fieldManager`, may create the object (201), and reports field
//!   conflicts as the API server does (409 with the conflicting fields as causes).

use axum::response::Response;
use http::{StatusCode, header};
use serde_json::{Value, json};

use super::request::{Ctx, ResReq};
use super::table::render_one;
use super::verbs::to_storage;
use crate::error::ApiError;
use crate::managed;
use crate::patch::{self, PatchType};
use crate::store::{Subresource, WriteOpts};

pub(super) fn patch_handler(ctx: &Ctx<'_>, req: &ResReq, name: &str) -> Result<Response, ApiError> {
    let ct = ctx.headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
    let pt = PatchType::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
    let patch_body: Value = match pt {
        PatchType::Apply => serde_norway::from_slice(&ctx.body)
            .or_else(|_| serde_json::from_slice(&ctx.body))
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        _ => serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
    };
    let ns = req.namespace.as_deref().unwrap_or("");
    let sub = if req.sub.is_some() { Subresource::Status } else { Subresource::Main };
    let dry_run = ctx.dry_run();
    let info = req.info.clone();
    let (obj, created) = if pt == PatchType::Apply {
        let manager = ctx.q("fieldManager").ok_or_else(|| {
            ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                "fieldManager: Required value: is required for apply patch",
            )
        })?;
        let force = ctx.flag("force");
        let applied = to_storage(patch_body, &info);
        let api_version = info.api_version(&req.version);
        let opts = WriteOpts { dry_run, manager: None };
        ctx.st.store.modify(&info.gr, ns, name, sub, &opts, true, |live, info| {
            if live.is_none() && sub == Subresource::Status {
                return Err(ApiError::not_found(&info.gr.group, &info.gr.resource, name));
            }
            let ignore_status = sub == Subresource::Main && info.status_subresource;
            let mut out = managed::apply(live, &applied, manager, force, &api_version, ignore_status).map_err(|mut e| {
                if e.code == 409 {
                    e.details = Some(json!({"name": name, "group": info.gr.group, "kind": info.gr.resource, "causes": e.details.as_ref().and_then(|d| d.get("causes")).cloned().unwrap_or_default()}));
                }
                e
            })?;
            if sub == Subresource::Status
                && let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut)
            {
                m.remove("resourceVersion");
            }
            Ok(out)
        })?
    } else {
        let opts = WriteOpts { dry_run, manager: Some(ctx.manager()) };
        ctx.st.store.modify(&info.gr, ns, name, sub, &opts, false, |live, _| {
            let mut v = live.unwrap_or_default();
            match pt {
                PatchType::Merge => patch::merge_patch(&mut v, &patch_body),
                PatchType::Json => patch::json_patch(&mut v, &patch_body)?,
                PatchType::Strategic => patch::strategic_merge(&mut v, &patch_body)?,
                PatchType::Apply => {}
            }
            Ok(to_storage(v, &info))
        })?
    };
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    render_one(ctx, req, code, obj)
}
