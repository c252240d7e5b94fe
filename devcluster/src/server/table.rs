//! Output rendering: the requested API version, `Table` (kubectl get) and
//! `PartialObjectMetadata`, for single objects and lists.
//!
//! Invariants:
//! - Objects in the storage version and full format go out as the stored bytes, unparsed;
//!   lists splice those bytes into the list envelope.
//! - A Table's columns are Name, the resource's printer columns, then Age.

use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::StatusCode;
use serde_json::{Value, json};

use super::json_response;
use super::request::{Ctx, Format, ResReq};
use crate::error::ApiError;
use crate::util::meta_str;

/// Rewrites one object for the requested version / format.
pub(super) fn convert(req: &ResReq, format: Format, obj: &Bytes) -> Result<Bytes, ApiError> {
    if format == Format::Full && req.version == req.info.storage_version() {
        return Ok(obj.clone());
    }
    let mut v: Value = serde_json::from_slice(obj).map_err(|e| ApiError::internal(e.to_string()))?;
    v["apiVersion"] = Value::String(req.info.api_version(&req.version));
    let v = match format {
        Format::Full => v,
        Format::Metadata => partial_metadata(&v),
        Format::Table => table(req, std::slice::from_ref(&v), true, None),
    };
    Ok(Bytes::from(serde_json::to_vec(&v).unwrap_or_default()))
}

fn partial_metadata(v: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": v.get("metadata").cloned().unwrap_or_default()})
}

pub(super) fn render_one(
    ctx: &Ctx<'_>,
    req: &ResReq,
    code: StatusCode,
    obj: Bytes,
) -> Result<Response, ApiError> {
    Ok(json_response(code, convert(req, ctx.format(), &obj)?))
}

/// Evaluates a simple JSONPath (`.a.b`, `.a[0].b`) of a printer column.
fn json_path(v: &Value, path: &str) -> Value {
    let mut cur = v;
    for seg in path.trim_start_matches('.').split('.') {
        if seg.is_empty() {
            continue;
        }
        let (field, idx) = match seg.split_once('[') {
            Some((f, rest)) => (f, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        cur = match cur.get(field) {
            Some(x) => x,
            None => return Value::Null,
        };
        if let Some(i) = idx {
            cur = match cur.get(i) {
                Some(x) => x,
                None => return Value::Null,
            };
        }
    }
    cur.clone()
}

pub(super) fn table(req: &ResReq, items: &[Value], headers: bool, list_meta: Option<Value>) -> Value {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for (name, ty, _) in &req.info.printer_columns {
        cols.push(json!({"name": name, "type": ty, "format": "", "description": "", "priority": 0}));
    }
    cols.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    let rows: Vec<Value> = items
        .iter()
        .map(|v| {
            let mut cells = vec![json!(meta_str(v, "name"))];
            for (_, _, path) in &req.info.printer_columns {
                cells.push(json_path(v, path));
            }
            cells.push(json!(crate::util::age(meta_str(v, "creationTimestamp"))));
            json!({"cells": cells, "object": partial_metadata(v)})
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "rows": rows,
    });
    if headers {
        t["columnDefinitions"] = Value::Array(cols);
    } else {
        t["columnDefinitions"] = json!([]);
    }
    t
}

pub(super) fn render_list(
    ctx: &Ctx<'_>,
    req: &ResReq,
    format: Format,
    items: &[Bytes],
    rv: u64,
    next: Option<String>,
    remaining: usize,
) -> Result<Bytes, ApiError> {
    let _ = ctx;
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = next {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    match format {
        Format::Table => {
            let parsed: Vec<Value> = items
                .iter()
                .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(e.to_string())))
                .collect::<Result<_, _>>()?;
            Ok(Bytes::from(serde_json::to_vec(&table(req, &parsed, true, Some(meta))).unwrap_or_default()))
        }
        Format::Full | Format::Metadata => {
            let (kind, api_version) = if format == Format::Full {
                (req.info.list_kind(), req.info.api_version(&req.version))
            } else {
                ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1".to_string())
            };
            let head = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
            let mut buf = BytesMut::with_capacity(items.iter().map(|i| i.len() + 1).sum::<usize>() + 256);
            let head = serde_json::to_vec(&head).unwrap_or_default();
            // `{...}` minus the closing brace, then the items array.
            buf.put_slice(&head[..head.len() - 1]);
            buf.put_slice(b",\"items\":[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.put_u8(b',');
                }
                let item = convert(req, format, item)?;
                buf.put_slice(&item);
            }
            buf.put_slice(b"]}");
            Ok(buf.freeze())
        }
    }
}
