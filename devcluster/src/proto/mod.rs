//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`): kubectl's typed
//! generators (`create deployment|service|configmap|secret|namespace`, ...) send them, as does
//! any client-go client left at its default content type. Responses are always JSON (clients
//! ask for protobuf with a JSON fallback).
//!
//! A body is the `k8s\0` magic and a `runtime.Unknown` envelope naming the object's
//! apiVersion and kind, around the typed message. Both are decoded with k8s-pb's prost
//! messages; the typed message is then written as the JSON the store keeps by the impls of
//! [`messages`], generated from k8s-pb and k8s-openapi (`cargo xtask gen-proto-json`), and the
//! hand-written [`special`] ones.
//!
//! Invariants:
//! - Every built-in kind the server serves is decoded; any other kind (custom resources have
//!   no protobuf form), and an envelope with a content encoding, get 415, as a server that
//!   does not speak protobuf for a type answers. Malformed bytes get 400, never a panic.

mod json;
mod messages;
mod special;

use k8s_pb as pb;
use prost::Message;
use serde_json::{Map, Value};

use self::json::ToJson;
use crate::error::ApiError;

const MAGIC: &[u8] = b"k8s\0";
const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

fn bad(what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("malformed protobuf body: {what}"))
}

/// Decodes the typed message `M` and renders it as a JSON object.
fn typed<M: Message + Default + ToJson>(raw: &[u8]) -> Result<Value, ApiError> {
    let message = M::decode(raw).map_err(bad)?;
    Ok(message.value())
}

/// Decodes a protobuf body of a built-in kind into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    use pb::api::{apps, coordination, core, events};
    use pb::apiextensions_apiserver::pkg::apis::apiextensions;
    let unsupported = || ApiError::unsupported_media_type(MEDIA_TYPE);
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| bad("missing k8s magic"))?;
    let unknown = pb::apimachinery::pkg::runtime::Unknown::decode(envelope).map_err(bad)?;
    if unknown.content_encoding.as_deref().is_some_and(|e| !e.is_empty()) {
        return Err(unsupported());
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let mut object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => typed::<core::v1::Namespace>(&raw)?,
        ("v1", "ConfigMap") => typed::<core::v1::ConfigMap>(&raw)?,
        ("v1", "Secret") => typed::<core::v1::Secret>(&raw)?,
        ("v1", "Service") => typed::<core::v1::Service>(&raw)?,
        ("v1", "Pod") => typed::<core::v1::Pod>(&raw)?,
        ("v1", "Node") => typed::<core::v1::Node>(&raw)?,
        ("v1", "Event") => typed::<core::v1::Event>(&raw)?,
        ("events.k8s.io/v1", "Event") => typed::<events::v1::Event>(&raw)?,
        ("apps/v1", "Deployment") => typed::<apps::v1::Deployment>(&raw)?,
        ("coordination.k8s.io/v1", "Lease") => typed::<coordination::v1::Lease>(&raw)?,
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            typed::<apiextensions::v1::CustomResourceDefinition>(&raw)?
        }
        _ => return Err(unsupported()),
    };
    let map: &mut Map<String, Value> = object.as_object_mut().ok_or_else(|| bad("not a message"))?;
    map.insert("apiVersion".into(), Value::String(api_version));
    map.insert("kind".into(), Value::String(kind));
    map.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    Ok(object)
}

#[cfg(test)]
mod tests;
