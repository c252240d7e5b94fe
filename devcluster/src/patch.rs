//! Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902, via `json-patch`) and
//! strategic merge patch as far as kubectl uses it on the built-in kinds.
//!
//! Strategic merge differs from a merge patch in that some lists merge by a key (containers by
//! `name`, container ports by `containerPort`, ...) or as sets (finalizers), and in its
//! directives: `$patch: replace|delete|merge`, `$retainKeys`, `$deleteFromPrimitiveList/<f>`
//! and `$setElementOrder/<f>`. Lists without a known merge key are replaced, as for types
//! without patch metadata.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Which patch format a request uses (from its Content-Type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchType {
    /// From a Content-Type header value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        Some(match base {
            "application/merge-patch+json" => Self::Merge,
            "application/json-patch+json" => Self::Json,
            "application/strategic-merge-patch+json" => Self::Strategic,
            "application/apply-patch+yaml"
            | "application/apply-patch+json"
            | "application/apply-patch+cbor" => Self::Apply,
            _ => return None,
        })
    }
}

/// Applies a JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies a JSON patch document. On an error `target` is left part-patched: callers patch a
/// copy and drop it on error.
///
/// `json_patch::patch` (which undoes what it applied when an operation fails) panics when its
/// undo fails, which a `move` whose target is invalid makes it do (found by fuzzing); the
/// undo is not needed on a copy, so the operations are applied without one.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch_unsafe(target, &p).map_err(|e| {
        ApiError::invalid(
            "",
            "",
            "",
            format!("the server rejected our request due to an error in our request: {e}"),
        )
    })
}

/// The merge key of list field `field` (under parent field `parent`), if the built-in types
/// declare one; `Some("")` marks a list of primitives merged as a set.
fn merge_key(parent: Option<&str>, field: &str) -> Option<&'static str> {
    Some(match field {
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" | "imagePullSecrets" => {
            "name"
        }
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" if parent == Some("containers") || parent == Some("initContainers") => "containerPort",
        "ports" => "port",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "finalizers" => "",
        _ => return None,
    })
}

/// Applies a strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Some(p) = patch.as_object() else {
        return Err(ApiError::bad_request("a strategic merge patch must be a JSON object"));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    merge_map(target, p, None);
    Ok(())
}

fn merge_map(target: &mut Value, patch: &Map<String, Value>, parent: Option<&str>) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch.clone();
        p.remove("$patch");
        *target = strip_directives(&Value::Object(p));
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else { return };
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(del)) = (t.get_mut(field).and_then(Value::as_array_mut), pv.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        match pv {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                    continue;
                }
                let entry = t.entry(k.clone()).or_insert(Value::Null);
                merge_map(entry, pm, Some(k));
            }
            Value::Array(pa) => {
                let key = merge_key(parent, k);
                match (key, t.get_mut(k)) {
                    (Some(key), Some(Value::Array(ta))) => merge_list(ta, pa, key, k),
                    _ => {
                        let cleaned: Vec<Value> = pa
                            .iter()
                            .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                            .map(strip_directives)
                            .collect();
                        t.insert(k.clone(), Value::Array(cleaned));
                    }
                }
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value], key: &str, field: &str) {
    if patch.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace")) {
        *target = patch.iter().filter(|i| i.get("$patch").is_none()).map(strip_directives).collect();
        return;
    }
    if key.is_empty() {
        for p in patch {
            if !target.contains(p) {
                target.push(p.clone());
            }
        }
        return;
    }
    for p in patch {
        let Some(pm) = p.as_object() else {
            target.push(p.clone());
            continue;
        };
        let id = pm.get(key);
        let pos = id.and_then(|id| target.iter().position(|t| t.get(key) == Some(id)));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(pos) = pos {
                target.remove(pos);
            }
            continue;
        }
        match pos {
            Some(pos) => merge_map(&mut target[pos], pm, Some(field)),
            None => target.push(strip_directives(p)),
        }
    }
}

/// Removes `$`-directives from a patch fragment that is inserted as-is.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merges_containers_by_name() {
        let mut t =
            json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}});
        let p = json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}], "containers": [{"name": "b", "image": "2"}]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(t["spec"]["containers"][1]["image"], "2");
        assert_eq!(t["spec"]["containers"][0]["image"], "1");
        let p = json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(t["spec"]["containers"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn strategic_directives() {
        let mut t =
            json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}});
        let p = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}}, "data": {"$patch": "replace", "n": "m"}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(t["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(t["data"], json!({"n": "m"}));
        let p = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn json_patch_errors_are_invalid() {
        let mut t = json!({"a": 1});
        json_patch(&mut t, &json!([{"op": "replace", "path": "/a", "value": 2}])).unwrap();
        assert_eq!(t["a"], 2);
        assert_eq!(
            json_patch(&mut t, &json!([{"op": "test", "path": "/a", "value": 3}])).unwrap_err().code,
            422
        );
        assert_eq!(json_patch(&mut t, &json!({"op": "x"})).unwrap_err().code, 400);
    }

    /// Found by the `devcluster_http` fuzz target: `json_patch::patch` panicked undoing a
    /// failed `move` (its source already removed, the undo of the `add` before it failed).
    #[test]
    fn a_failed_move_after_other_operations_is_an_error_not_a_panic() {
        let mut t = json!({"data": {"k": "v"}});
        let p = json!([
            {"op": "add", "path": "/data/z", "value": "1"},
            {"op": "test", "path": "/data/z", "value": "1"},
            {"op": "move", "from": "/data/z", "path": "/datA/y"},
        ]);
        assert_eq!(json_patch(&mut t, &p).unwrap_err().code, 422);
    }
}
