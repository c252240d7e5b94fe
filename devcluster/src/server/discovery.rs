//! Discovery: `/version`, `/api`, `/apis`, the per-group/version resource lists and the
//! OpenAPI v3 index and documents kubectl reads before it acts.
//!
//! Invariants:
//! - Everything here is computed from the store's registry at request time, so kinds added or
//!   removed by CRDs show up (and the OpenAPI hashes change) without a restart.
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

/// `GET /openapi/v3`.
pub(super) async fn openapi(State(st): State<Arc<AppState>>) -> Response {
    value_response(StatusCode::OK, &openapi_index(&st.store))
}

/// `GET /openapi/v3/api/{version}`.
pub(super) async fn openapi_core(
    State(st): State<Arc<AppState>>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    openapi_doc(&st.store, "", &version)
}

/// `GET /openapi/v3/apis/{group}/{version}`.
pub(super) async fn openapi_group(
    State(st): State<Arc<AppState>>,
    Path((group, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    openapi_doc(&st.store, &group, &version)
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

/// Group/versions served, as `(group, version)` with core first.
fn group_versions(store: &Store) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), "v1".to_string())];
    for (g, vs) in store.registry().groups() {
        for v in vs {
            out.push((g.clone(), v));
        }
    }
    out
}

/// A hash of what a group/version serves, so OpenAPI clients refetch when CRDs change it.
fn gv_hash(store: &Store, group: &str, version: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource_list(store, group, version).to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `/openapi/v3`: one entry per group/version.
fn openapi_index(store: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in group_versions(store) {
        let key = if g.is_empty() { format!("api/{v}") } else { format!("apis/{g}/{v}") };
        let hash = gv_hash(store, &g, &v);
        paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
    }
    json!({"paths": paths})
}

/// `/openapi/v3/{gv}`: a document with each resource's operations and the query
/// parameters they accept (kubectl reads `fieldValidation` support from it and then leaves
/// validation to the server). Schemas are not published: storage is schemaless.
fn openapi_doc(store: &Store, group: &str, version: &str) -> Result<Response, ApiError> {
    let registry = store.registry();
    let infos: Vec<_> = registry
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .cloned()
        .collect();
    if infos.is_empty() {
        return Err(ApiError::path_not_found());
    }
    let prefix =
        if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let param =
        |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": true});
    let write_params = json!([param("dryRun"), param("fieldManager"), param("fieldValidation")]);
    let mut paths = serde_json::Map::new();
    for info in infos {
        let gvk = json!({"group": group, "version": version, "kind": info.kind});
        let op = |action: &str| {
            json!({
                "parameters": write_params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        let base = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", info.gr.resource)
        } else {
            format!("{prefix}/{}", info.gr.resource)
        };
        paths.insert(base.clone(), json!({"post": op("post"), "get": op("list")}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"patch": op("patch"), "put": op("put"), "get": op("get"), "delete": op("delete")}),
        );
        if info.status_subresource {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"patch": op("patch"), "put": op("put"), "get": op("get")}),
            );
        }
    }
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    });
    Ok(value_response(StatusCode::OK, &doc))
}

fn resource_list(store: &Store, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = store
        .registry()
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .flat_map(|i| i.discovery_entries())
        .collect();
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}
