//! OpenAPI v3: `/openapi/v3` (one entry per group/version, with a hash) and the document of
//! each group/version: its paths with the query parameters each operation accepts (kubectl
//! reads `fieldValidation` support from them) and a schema for every kind it serves, in the
//! shape `kubectl explain` and client-side validation look for: under `components.schemas`,
//! named as the API server names them (`io.k8s.api.core.v1.ConfigMap`), the kinds carrying
//! `x-kubernetes-group-version-kind`, nested types referenced through `allOf: [{$ref}]`.
//!
//! The built-in kinds' schemas (with the API's field descriptions) come from k8s-openapi's
//! `schemars` implementations; a custom resource's is its CRD's `openAPIV3Schema` for that
//! version, with `metadata` referring to ObjectMeta, as the API server publishes it.
//!
//! Invariants:
//! - Everything is computed from the store at request time, so kinds and schemas that CRDs
//!   add, change or remove show up (and the index's hashes change) without a restart.
//! - A group/version that serves nothing answers 404, as the API server does.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Response;
use http::StatusCode;
use k8s_openapi::api::{apps, coordination, core, events};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use super::discovery::resource_list;
use super::{AppState, KUBE_VERSION, value_response};
use crate::error::ApiError;
use crate::resources::{GroupResource, ResourceInfo};
use crate::store::Store;

/// `GET /openapi/v3`.
pub(super) async fn index(State(st): State<Arc<AppState>>) -> Response {
    value_response(StatusCode::OK, &openapi_index(&st.store))
}

/// `GET /openapi/v3/api/{version}`.
pub(super) async fn core_doc(
    State(st): State<Arc<AppState>>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    let doc = document(&st.store, "", &version).ok_or_else(ApiError::path_not_found)?;
    Ok(value_response(StatusCode::OK, &doc))
}

/// `GET /openapi/v3/apis/{group}/{version}`.
pub(super) async fn group_doc(
    State(st): State<Arc<AppState>>,
    Path((group, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let doc = document(&st.store, &group, &version).ok_or_else(ApiError::path_not_found)?;
    Ok(value_response(StatusCode::OK, &doc))
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

/// `/openapi/v3`: one entry per group/version, its URL carrying a hash of what the document
/// is made of (the resources served and, for custom resources, their CRDs), so OpenAPI
/// clients refetch when CRDs change it.
fn openapi_index(store: &Store) -> Value {
    use std::hash::{Hash, Hasher};
    let registry = store.registry();
    let mut paths = Map::new();
    for (g, v) in group_versions(store) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        resource_list(store, &g, &v).to_string().hash(&mut h);
        for info in registry.all().filter(|i| i.custom && i.gr.group == g) {
            crd(store, info).map(|c| c.to_string()).hash(&mut h);
        }
        let key = if g.is_empty() { format!("api/{v}") } else { format!("apis/{g}/{v}") };
        let url = format!("/openapi/v3/{key}?hash={:016X}", h.finish());
        paths.insert(key, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// The CustomResourceDefinition that defines a custom resource.
fn crd(store: &Store, info: &ResourceInfo) -> Option<Value> {
    let crds =
        GroupResource { group: "apiextensions.k8s.io".into(), resource: "customresourcedefinitions".into() };
    serde_json::from_slice(&store.get(&crds, "", &info.gr.to_string()).ok()?).ok()
}

/// The document of one group/version, or `None` if it serves nothing.
fn document(store: &Store, group: &str, version: &str) -> Option<Value> {
    let registry = store.registry();
    let infos: Vec<Arc<ResourceInfo>> = registry
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .cloned()
        .collect();
    if infos.is_empty() {
        return None;
    }
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut custom = Vec::new();
    for info in infos.iter() {
        if info.custom {
            custom.extend(custom_schema(store, info, version, &mut generator));
        } else {
            add_builtin(group, version, &info.kind, &mut generator);
        }
    }
    let mut schemas = generator.take_definitions(true);
    schemas.extend(custom);
    for (name, schema) in schemas.iter_mut() {
        tidy(schema);
        if let Some(info) = infos.iter().find(|i| name_of(group, version, &i.kind) == *name) {
            schema["x-kubernetes-group-version-kind"] =
                json!([{"group": group, "version": version, "kind": info.kind}]);
            // k8s-openapi makes `spec` a required Rust field of every kind that has one; the
            // API requires it of CustomResourceDefinitions only, and `kubectl explain` shows
            // what is required.
            if info.kind != "CustomResourceDefinition"
                && let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut)
            {
                required.retain(|r| r != "spec");
                if required.is_empty() {
                    schema.as_object_mut().map(|m| m.remove("required"));
                }
            }
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1)},
        "paths": paths(group, version, &infos),
        "components": {"schemas": schemas},
    }))
}

/// The name the API server gives a kind's schema in a group/version of custom resources
/// (`com.example.v1.Widget`); the built-in kinds are named by their k8s-openapi schemas.
fn name_of(group: &str, version: &str, kind: &str) -> String {
    match builtin_name(group, kind) {
        Some(name) => name.to_string(),
        None => {
            let reversed: Vec<&str> = group.split('.').rev().collect();
            format!("{}.{version}.{kind}", reversed.join("."))
        }
    }
}

fn builtin_name(group: &str, kind: &str) -> Option<std::borrow::Cow<'static, str>> {
    Some(match (group, kind) {
        ("", "Namespace") => core::v1::Namespace::schema_name(),
        ("", "ConfigMap") => core::v1::ConfigMap::schema_name(),
        ("", "Secret") => core::v1::Secret::schema_name(),
        ("", "Service") => core::v1::Service::schema_name(),
        ("", "Pod") => core::v1::Pod::schema_name(),
        ("", "Node") => core::v1::Node::schema_name(),
        ("", "Event") => core::v1::Event::schema_name(),
        ("events.k8s.io", "Event") => events::v1::Event::schema_name(),
        ("apps", "Deployment") => apps::v1::Deployment::schema_name(),
        ("coordination.k8s.io", "Lease") => coordination::v1::Lease::schema_name(),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            apiextensions::v1::CustomResourceDefinition::schema_name()
        }
        _ => return None,
    })
}

/// Adds a built-in kind's schema (and its nested types') to the generator's definitions
/// (every built-in kind is served in `v1` only).
fn add_builtin(group: &str, version: &str, kind: &str, g: &mut SchemaGenerator) {
    if version != "v1" {
        return;
    }
    match (group, kind) {
        ("", "Namespace") => g.subschema_for::<core::v1::Namespace>(),
        ("", "ConfigMap") => g.subschema_for::<core::v1::ConfigMap>(),
        ("", "Secret") => g.subschema_for::<core::v1::Secret>(),
        ("", "Service") => g.subschema_for::<core::v1::Service>(),
        ("", "Pod") => g.subschema_for::<core::v1::Pod>(),
        ("", "Node") => g.subschema_for::<core::v1::Node>(),
        ("", "Event") => g.subschema_for::<core::v1::Event>(),
        ("events.k8s.io", "Event") => g.subschema_for::<events::v1::Event>(),
        ("apps", "Deployment") => g.subschema_for::<apps::v1::Deployment>(),
        ("coordination.k8s.io", "Lease") => g.subschema_for::<coordination::v1::Lease>(),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            g.subschema_for::<apiextensions::v1::CustomResourceDefinition>()
        }
        _ => return,
    };
}

/// A custom resource's schema: its CRD's `openAPIV3Schema` for `version` (an object that
/// allows anything where the CRD gives none), with the standard `apiVersion`, `kind` and
/// `metadata` fields.
fn custom_schema(
    store: &Store,
    info: &ResourceInfo,
    version: &str,
    generator: &mut SchemaGenerator,
) -> Option<(String, Value)> {
    let mut schema = crd(store, info)?
        .pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v["name"] == version)?
        .pointer("/schema/openAPIV3Schema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    let object_meta = generator.subschema_for::<ObjectMeta>().to_value();
    let properties = schema.as_object_mut()?.entry("properties").or_insert_with(|| json!({}));
    let standard = |what: &str| json!({"type": "string", "description": what});
    properties["apiVersion"] = standard(
        "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values.",
    );
    properties["kind"] = standard(
        "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase.",
    );
    properties["metadata"] = json!({
        "description": "Standard object's metadata.",
        "allOf": [object_meta],
    });
    Some((name_of(&info.gr.group, version, &info.kind), schema))
}

/// Puts a schema in the API server's shape: a `$ref` with siblings (schemars writes the
/// description beside it) becomes `allOf: [{$ref}]`, which is what kubectl follows, and
/// `metadata` is never required (k8s-openapi requires it of every kind; the API does not).
/// Walks only where schemas are (a `properties` map's keys are field names, and
/// JSONSchemaProps has fields called `$ref` and `required`).
fn tidy(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if map.len() > 1
        && let Some(reference) = map.remove("$ref")
    {
        map.insert("allOf".into(), json!([{"$ref": reference}]));
    }
    if let Some(Value::Array(required)) = map.get_mut("required") {
        required.retain(|r| r != "metadata");
        if required.is_empty() {
            map.remove("required");
        }
    }
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        properties.values_mut().for_each(tidy);
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = map.get_mut(key) {
            tidy(sub);
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(tidy);
        }
    }
}

/// The paths of a group/version: each resource's operations and the query parameters they
/// accept.
fn paths(group: &str, version: &str, infos: &[Arc<ResourceInfo>]) -> Value {
    let prefix =
        if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let param =
        |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": true});
    let write_params = json!([param("dryRun"), param("fieldManager"), param("fieldValidation")]);
    let mut paths = Map::new();
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
    Value::Object(paths)
}
