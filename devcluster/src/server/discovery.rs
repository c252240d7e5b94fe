//! Discovery: `/version`, `/api`, `/apis` and the per-group/version resource lists kubectl
//! reads before it acts (the OpenAPI documents are in `openapi.rs`).
//!
//! Invariants:
//! - Everything here is computed from the store's registry at request time, so kinds added or
//!   removed by CRDs show up without a restart.
//! - A group or group/version that serves nothing answers 404, as the API server does.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::{AppState, KUBE_VERSION, value_response};
use crate::error::ApiError;
use crate::store::Store;

/// `GET /version`.
pub(super) async fn version() -> Response {
    value_response(StatusCode::OK, &version_info())
}

/// `GET /api`: the core group's versions.
pub(super) async fn core_versions(State(st): State<Arc<AppState>>) -> Response {
    value_response(
        StatusCode::OK,
        &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": st.address}]}),
    )
}

/// `GET /api/{version}`: the core group's resources (only `v1` exists).
pub(super) async fn core_resources(
    State(st): State<Arc<AppState>>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    if version != "v1" {
        return Err(ApiError::path_not_found());
    }
    Ok(value_response(StatusCode::OK, &resource_list(&st.store, "", "v1")))
}

/// `GET /apis`: every group.
pub(super) async fn groups(State(st): State<Arc<AppState>>) -> Response {
    value_response(StatusCode::OK, &group_list(&st.store))
}

/// `GET /apis/{group}`: one group's versions.
pub(super) async fn group(
    State(st): State<Arc<AppState>>,
    Path(group): Path<String>,
) -> Result<Response, ApiError> {
    group_list(&st.store)["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|x| x["name"] == *group).cloned())
        .map(|mut v| {
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            value_response(StatusCode::OK, &v)
        })
        .ok_or_else(ApiError::path_not_found)
}

/// `GET /apis/{group}/{version}`: one group/version's resources.
pub(super) async fn group_resources(
    State(st): State<Arc<AppState>>,
    Path((group, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let list = resource_list(&st.store, &group, &version);
    if list["resources"].as_array().is_none_or(|r| r.is_empty()) {
        return Err(ApiError::path_not_found());
    }
    Ok(value_response(StatusCode::OK, &list))
}

fn version_info() -> Value {
    json!({
        "major": KUBE_VERSION.0,
        "minor": KUBE_VERSION.1,
        "gitVersion": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1),
        "gitCommit": "wasmctrl-devcluster",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_list(store: &Store) -> Value {
    let groups: Vec<Value> = store
        .registry()
        .groups()
        .into_iter()
        .map(|(name, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            let preferred = vs.first().cloned().unwrap_or_default();
            json!({"name": name, "versions": vs, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The `APIResourceList` of one group/version.
pub(super) fn resource_list(store: &Store, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = store
        .registry()
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .flat_map(|i| i.discovery_entries())
        .collect();
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}
