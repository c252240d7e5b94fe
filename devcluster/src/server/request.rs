//! What a handler knows about one request: the shared state, method, headers, query, body,
//! and the resource the path names.
//!
//! Invariants:
//! - The body is read (bounded by the server's limit) before a handler runs; handlers never
//!   touch the connection.
//! - The output format comes from the Accept header alone; the storage encoding is only
//!   rewritten when the format or the requested version differs from the stored one.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, header};
use serde_json::Value;

use super::AppState;
use crate::error::ApiError;
use crate::patch::PatchType;
use crate::resources::ResourceInfo;

pub(super) struct Ctx<'a> {
    pub(super) st: &'a Arc<AppState>,
    pub(super) method: &'a Method,
    pub(super) headers: &'a HeaderMap,
    pub(super) query: &'a HashMap<String, String>,
    pub(super) body: Bytes,
}

impl Ctx<'_> {
    pub(super) fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    pub(super) fn flag(&self, k: &str) -> bool {
        self.q(k).is_some_and(|v| v == "true" || v == "1")
    }

    pub(super) fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }

    /// The field manager of a non-apply write: `fieldManager`, else the User-Agent's
    /// product token, as the API server derives it.
    pub(super) fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self.headers.get(header::USER_AGENT).and_then(|h| h.to_str().ok()).unwrap_or("unknown");
        let m = ua.split('/').next().unwrap_or(ua);
        m.chars().take(128).collect()
    }

    pub(super) fn format(&self) -> Format {
        let accept = self.headers.get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or("");
        for media in accept.split(',') {
            let media = media.trim();
            let mut parts = media.split(';').map(str::trim);
            let base = parts.next().unwrap_or("");
            if base != "application/json" && base != "*/*" && !base.is_empty() {
                continue;
            }
            let mut as_ = None;
            let mut group = None;
            for p in parts {
                if let Some(v) = p.strip_prefix("as=") {
                    as_ = Some(v);
                } else if let Some(v) = p.strip_prefix("g=") {
                    group = Some(v);
                }
            }
            match (as_, group) {
                (None, _) => return Format::Full,
                (Some("Table"), Some("meta.k8s.io")) => return Format::Table,
                (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                    return Format::Metadata;
                }
                _ => continue,
            }
        }
        Format::Full
    }

    pub(super) fn body_json(&self) -> Result<Value, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("application/json");
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/yaml" | "application/apply-patch+yaml" => {
                serde_norway::from_slice::<Value>(&self.body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
            }
            "application/vnd.kubernetes.protobuf" => crate::proto::decode(&self.body),
            "application/json" | "" | "*/*" => serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON body: {e}"))),
            _ if PatchType::from_content_type(base).is_some() => serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}"))),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// How objects are rendered, from the Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Full,
    Table,
    Metadata,
}

pub(super) fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// A resolved resource request.
pub(super) struct ResReq {
    pub(super) info: Arc<ResourceInfo>,
    pub(super) version: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
    pub(super) watch_path: bool,
}

impl ResReq {
    pub(super) fn clone_shallow(&self) -> ResReq {
        ResReq {
            info: self.info.clone(),
            version: self.version.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            sub: self.sub.clone(),
            watch_path: self.watch_path,
        }
    }
}
