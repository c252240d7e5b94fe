//! What a body may be, and the defaults the API server sets, before a write is committed.
//!
//! Invariants:
//! - Everything here only reads the store: a rejected write leaves no trace (no RV taken, no
//!   index or registry change).
//! - The error texts are the API server's (kubectl and client libraries match on them).
//! - Defaults are applied the same way on every path that creates an object (create, and
//!   server-side apply creating a missing object).

use serde_json::{Map, Value, json};

use super::{Inner, crd_gr, namespaces_gr};
use crate::error::ApiError;
use crate::resources::{GroupResource, ResourceInfo, crd_resource, split_api_version};
use crate::util::{meta_mut, now_rfc3339};

/// The API server's checks of `metadata.ownerReferences`: apiVersion, kind, name and uid are
/// required, and at most one reference is the controller.
pub(super) fn validate_owner_references(
    gr: &GroupResource,
    info: &ResourceInfo,
    name: &str,
    obj: &Value,
) -> Result<(), ApiError> {
    let Some(refs) = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array) else {
        return Ok(());
    };
    let invalid = |why: String| ApiError::invalid(&gr.group, &info.kind, name, why);
    let mut controllers = 0;
    for r in refs {
        let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        for (key, what) in [("apiVersion", "version"), ("kind", "kind"), ("name", "name"), ("uid", "uid")] {
            if field(key).is_empty() {
                let shown = if key == "apiVersion" { "apiVersion" } else { key };
                return Err(invalid(format!(
                    "metadata.ownerReferences.{shown}: Invalid value: \"\": {what} must not be empty"
                )));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        return Err(invalid(
            "metadata.ownerReferences: Invalid value: []v1.OwnerReference: Only one reference can have Controller set to true"
                .into(),
        ));
    }
    Ok(())
}

/// Whether objects of a resource carry `metadata.generation`. The API server sets it only where
/// a strategy tracks spec changes: custom resources, CRDs and the workload kinds (of those
/// served here, Deployments); ConfigMaps, Secrets, Services, Pods, Namespaces, Leases and
/// Events have none.
pub(super) fn tracks_generation(gr: &GroupResource, info: &ResourceInfo) -> bool {
    info.custom || *gr == crd_gr() || gr.group == "apps"
}

/// Everything outside `metadata` (and `status` when it is a subresource), for the
/// generation rule.
pub(super) fn spec_part(v: &Value, status_sub: bool) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "apiVersion", "kind"] {
        m.remove(k);
    }
    if status_sub {
        m.remove("status");
    }
    m
}

impl Inner {
    pub(super) fn validate_crd(&self, obj: &Value, name: &str) -> Result<ResourceInfo, ApiError> {
        let info = crd_resource(obj)
            .map_err(|e| ApiError::invalid("apiextensions.k8s.io", "CustomResourceDefinition", name, e))?;
        if let Some(existing) = self.registry.by_gr(&info.gr)
            && !existing.custom
        {
            return Err(ApiError::invalid(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                name,
                format!("spec.group: {} is served by a built-in resource", info.gr),
            ));
        }
        Ok(info)
    }

    pub(super) fn check_namespace(&self, ns: &str) -> Result<(), ApiError> {
        if ns.is_empty() {
            return Err(ApiError::bad_request("a namespace is required for a namespaced resource"));
        }
        let nsb = self.bucket(&namespaces_gr())?;
        match nsb.objects.get(&(String::new(), ns.to_string())) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s) if s.meta.deleting => Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))),
            Some(_) => Ok(()),
        }
    }
}

/// Rejects a body whose `kind`/`apiVersion` name another resource.
pub(super) fn check_kind(obj: &Value, info: &ResourceInfo) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != info.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the object ({kind}) does not match the resource ({})",
            info.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
    {
        let (g, v) = split_api_version(av);
        if g != info.gr.group || !info.versions.iter().any(|x| x == v) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                info.api_version(info.storage_version())
            )));
        }
    }
    Ok(())
}

/// Folds a Secret's write-only `stringData` into `data` (base64), as the API server does.
pub(super) fn fold_string_data(gr: &GroupResource, obj: &mut Value) {
    if gr.group.is_empty()
        && gr.resource == "secrets"
        && let Some(m) = obj.as_object_mut()
        && let Some(Value::Object(sd)) = m.remove("stringData")
    {
        use base64::Engine;
        let data = m.entry("data").or_insert_with(|| json!({}));
        if !data.is_object() {
            *data = json!({});
        }
        if let Some(d) = data.as_object_mut() {
            for (k, v) in sd {
                let s = v.as_str().unwrap_or_default();
                d.insert(k, Value::String(base64::engine::general_purpose::STANDARD.encode(s)));
            }
        }
    }
}

/// Server-side defaults a real API server sets on create.
pub(super) fn default_object(gr: &GroupResource, obj: &mut Value, name: &str) {
    if gr.group.is_empty()
        && gr.resource == "secrets"
        && obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty)
    {
        obj["type"] = json!("Opaque");
    }
    if *gr == namespaces_gr() {
        let m = meta_mut(obj);
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), Value::String(name.into()));
        }
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        obj["status"] = json!({"phase": "Active"});
    }
}

/// A CRD's status as the apiextensions controller would set it once established.
pub(super) fn set_crd_status(obj: &mut Value, info: &ResourceInfo) {
    let names = obj.pointer("/spec/names").cloned().unwrap_or_default();
    let mut accepted = names.clone();
    if accepted.get("singular").is_none() {
        accepted["singular"] = Value::String(info.singular.clone());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = Value::String(info.list_kind());
    }
    let now = now_rfc3339();
    obj["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": [info.storage_version()],
    });
}
