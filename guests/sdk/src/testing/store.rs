//! The test host's object stores: one for the informer cache, one for the API server, and
//! the write semantics of the fake API server.
//!
//! Invariants:
//! - Objects are keyed by kind, namespace (empty for cluster-scoped) and name; every stored
//!   object has `apiVersion`, `kind` and `metadata.name`.
//! - Each server write gives the object a new `metadata.resourceVersion` from one counter;
//!   a write carrying a `resourceVersion` that differs from the stored one is a conflict.
//! - Deleting an object with finalizers only sets `deletionTimestamp`; removing the last
//!   finalizer of such an object deletes it.
//!
//! What the fake does not model (use `wasmctrl test`, which runs against a real API server,
//! for these): field ownership of server-side apply (an apply merges the applied fields
//! into the stored object, as a JSON merge patch would, and never conflicts), strategic
//! merge patch (refused as invalid), garbage collection of dependents, admission and
//! defaulting.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::{Error, Gvk};

/// Where an object lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectKey {
    pub kind: Gvk,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub(crate) fn new(kind: &Gvk, namespace: Option<&str>, name: &str) -> Self {
        ObjectKey {
            kind: kind.clone(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: name.to_owned(),
        }
    }

    /// The key of `object` (which must carry `apiVersion`, `kind` and `metadata.name`).
    pub(crate) fn of(object: &Value) -> Result<Self, Error> {
        let text = |v: &Value| v.as_str().map(str::to_owned);
        let api_version =
            text(&object["apiVersion"]).ok_or_else(|| invalid("the object has no apiVersion"))?;
        let kind = text(&object["kind"]).ok_or_else(|| invalid("the object has no kind"))?;
        let name =
            text(&object["metadata"]["name"]).ok_or_else(|| invalid("the object has no metadata.name"))?;
        let namespace = text(&object["metadata"]["namespace"]).unwrap_or_default();
        Ok(ObjectKey { kind: Gvk::new(api_version, kind), namespace, name })
    }

    fn shown(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::Invalid(message.into())
}

/// Objects by key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Store {
    pub objects: BTreeMap<ObjectKey, Value>,
}

impl Store {
    pub(crate) fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    pub(crate) fn put(&mut self, object: Value) -> Result<(), Error> {
        let key = ObjectKey::of(&object)?;
        self.objects.insert(key, object);
        Ok(())
    }

    /// Objects of `kind`, optionally only in `namespace`, in key order.
    pub(crate) fn of_kind<'a>(
        &'a self,
        kind: &'a Gvk,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Value> {
        self.objects
            .iter()
            .filter(move |(k, _)| &k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v)
    }
}

/// The fake API server: a store plus the resourceVersion and UID counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct Server {
    pub store: Store,
    next_version: u64,
    next_uid: u64,
}

/// Sets `metadata.<field>` (objects only; keys were validated before).
fn set_meta(object: &mut Value, field: &str, value: Value) {
    if let Value::Object(root) = object {
        let meta = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        if let Value::Object(m) = meta {
            m.insert(field.to_owned(), value);
        }
    }
}

/// Removes `metadata.<field>`.
fn remove_meta(object: &mut Value, field: &str) {
    if let Some(Value::Object(m)) = object.get_mut("metadata") {
        m.remove(field);
    }
}

fn resource_version(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"].as_str()
}

fn finalizers_empty(object: &Value) -> bool {
    object["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty)
}

impl Server {
    /// Stores `object` as seeded state: a UID and resourceVersion are added when missing.
    pub(crate) fn seed(&mut self, mut object: Value) -> Result<Value, Error> {
        if object["metadata"]["uid"].is_null() {
            let uid = self.uid();
            set_meta(&mut object, "uid", Value::String(uid));
        }
        if object["metadata"]["resourceVersion"].is_null() {
            let rv = self.version();
            set_meta(&mut object, "resourceVersion", Value::String(rv));
        }
        self.store.put(object.clone())?;
        Ok(object)
    }

    fn version(&mut self) -> String {
        self.next_version += 1;
        self.next_version.to_string()
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{:012}", self.next_uid)
    }

    pub(crate) fn get(&self, key: &ObjectKey) -> Result<Value, Error> {
        self.store.get(key).cloned().ok_or_else(|| Error::NotFound(format!("{} not found", key.shown())))
    }

    pub(crate) fn create(&mut self, mut object: Value, dry_run: bool) -> Result<Value, Error> {
        let key = ObjectKey::of(&object)?;
        if self.store.get(&key).is_some() {
            return Err(Error::AlreadyExists(format!("{} already exists", key.shown())));
        }
        let (uid, rv) = (self.uid(), self.version());
        set_meta(&mut object, "uid", Value::String(uid));
        set_meta(&mut object, "resourceVersion", Value::String(rv));
        set_meta(&mut object, "generation", Value::from(1));
        remove_meta(&mut object, "deletionTimestamp");
        if !dry_run {
            self.store.put(object.clone())?;
        }
        Ok(object)
    }

    /// Stores `object` over the existing one, checking its resourceVersion when it has one.
    /// With `status_only`, only `status` is taken from `object`; otherwise `status` is kept.
    pub(crate) fn replace(&mut self, object: Value, status_only: bool) -> Result<Value, Error> {
        let key = ObjectKey::of(&object)?;
        let existing = self.get(&key)?;
        if let Some(rv) = resource_version(&object)
            && Some(rv) != resource_version(&existing)
        {
            return Err(Error::Conflict(format!(
                "{}: the object has been modified (resourceVersion {rv} is stale)",
                key.shown()
            )));
        }
        let mut next = if status_only {
            let mut next = existing.clone();
            next["status"] = object["status"].clone();
            next
        } else {
            let mut next = object;
            // Identity and server-owned fields stay the server's.
            for field in ["uid", "creationTimestamp", "deletionTimestamp", "generation"] {
                match existing["metadata"].get(field) {
                    Some(v) => {
                        set_meta(&mut next, field, v.clone());
                    }
                    None => {
                        remove_meta(&mut next, field);
                    }
                }
            }
            if let Some(status) = existing.get("status") {
                next["status"] = status.clone();
            }
            next
        };
        self.commit(&key, &existing, &mut next)
    }

    /// Stores `next` as the new state of `key` (after a change from `existing`): bumps the
    /// resourceVersion (not for a no-op), bumps `generation` when `spec` changed, and deletes
    /// an object being deleted once its finalizers are gone.
    fn commit(&mut self, key: &ObjectKey, existing: &Value, next: &mut Value) -> Result<Value, Error> {
        let mut without_rv = next.clone();
        set_meta(&mut without_rv, "resourceVersion", existing["metadata"]["resourceVersion"].clone());
        if &without_rv == existing {
            return Ok(existing.clone());
        }
        let rv = self.version();
        if existing.get("spec") != next.get("spec") {
            let generation = existing["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            set_meta(next, "generation", Value::from(generation));
        }
        set_meta(next, "resourceVersion", Value::String(rv));
        if !next["metadata"]["deletionTimestamp"].is_null() && finalizers_empty(next) {
            self.store.objects.remove(key);
            return Ok(next.clone());
        }
        self.store.objects.insert(key.clone(), next.clone());
        Ok(next.clone())
    }

    /// Applies a merge or JSON patch to the object (or only to its `status`).
    pub(crate) fn patch(
        &mut self,
        key: &ObjectKey,
        patch: &PatchKind,
        status_only: bool,
    ) -> Result<Value, Error> {
        let existing = self.get(key)?;
        let mut next = existing.clone();
        match patch {
            PatchKind::Merge(p) => {
                if let Some(rv) = p["metadata"]["resourceVersion"].as_str()
                    && Some(rv) != resource_version(&existing)
                {
                    return Err(Error::Conflict(format!(
                        "{}: the object has been modified (resourceVersion {rv} is stale)",
                        key.shown()
                    )));
                }
                json_patch::merge(&mut next, p);
            }
            PatchKind::Json(p) => {
                let ops: json_patch::Patch = serde_json::from_value(p.clone())
                    .map_err(|e| invalid(format!("the JSON patch is not valid: {e}")))?;
                json_patch::patch(&mut next, &ops).map_err(|e| match e.kind {
                    json_patch::PatchErrorKind::TestFailed => {
                        Error::Conflict(format!("{}: {e}", key.shown()))
                    }
                    _ => invalid(format!("{}: {e}", key.shown())),
                })?;
            }
            PatchKind::Strategic(_) => {
                return Err(invalid(
                    "the test host does not implement strategic merge patch; use a merge patch, or \
                     `wasmctrl test` (which runs against a real API server)",
                ));
            }
        }
        if status_only {
            let status = next.get("status").cloned();
            next = existing.clone();
            match status {
                Some(s) => next["status"] = s,
                None => {
                    if let Value::Object(m) = &mut next {
                        m.remove("status");
                    }
                }
            }
        }
        // The patch may not move the object.
        if ObjectKey::of(&next)? != *key {
            return Err(invalid(format!(
                "{}: a patch may not change apiVersion, kind, namespace or name",
                key.shown()
            )));
        }
        self.commit(key, &existing, &mut next)
    }

    /// Server-side apply, approximated: creates the object, or merges the applied fields
    /// into it (see the module docs for what is not modelled).
    pub(crate) fn apply(&mut self, applied: Value, dry_run: bool) -> Result<Value, Error> {
        let key = ObjectKey::of(&applied)?;
        let Some(existing) = self.store.get(&key).cloned() else {
            return self.create(applied, dry_run);
        };
        let mut next = existing.clone();
        let mut patch = applied;
        if let Value::Object(m) = &mut patch {
            m.remove("status");
        }
        json_patch::merge(&mut next, &patch);
        if dry_run {
            return Ok(next);
        }
        self.commit(&key, &existing, &mut next)
    }

    /// Deletes, honouring UID and resourceVersion preconditions and finalizers.
    pub(crate) fn delete(
        &mut self,
        key: &ObjectKey,
        uid: Option<&str>,
        rv: Option<&str>,
    ) -> Result<(), Error> {
        let existing = self.get(key)?;
        if let Some(uid) = uid
            && existing["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(Error::Conflict(format!(
                "{}: precondition failed: UID {uid} does not match",
                key.shown()
            )));
        }
        if let Some(rv) = rv
            && resource_version(&existing) != Some(rv)
        {
            return Err(Error::Conflict(format!(
                "{}: precondition failed: resourceVersion {rv} does not match",
                key.shown()
            )));
        }
        if finalizers_empty(&existing) {
            self.store.objects.remove(key);
            return Ok(());
        }
        if existing["metadata"]["deletionTimestamp"].is_null() {
            let mut next = existing.clone();
            set_meta(
                &mut next,
                "deletionTimestamp",
                serde_json::to_value(crate::time::now()).unwrap_or(Value::Null),
            );
            self.commit(key, &existing, &mut next)?;
        }
        Ok(())
    }
}

/// A patch body, decoded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PatchKind {
    Merge(Value),
    Json(Value),
    Strategic(Value),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}, "data": {"a": "1"}})
    }

    #[test]
    fn create_replace_patch_delete() {
        let mut s = Server::default();
        let created = s.create(cm("a"), false).unwrap();
        assert!(s.create(cm("a"), false).unwrap_err().is_already_exists());
        let key = ObjectKey::of(&created).unwrap();
        let mut stale = created.clone();
        stale["metadata"]["resourceVersion"] = json!("0");
        assert!(s.replace(stale, false).unwrap_err().is_conflict());
        let mut update = created.clone();
        update["data"]["a"] = json!("2");
        let replaced = s.replace(update, false).unwrap();
        assert_ne!(replaced["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);
        // A no-op keeps the resourceVersion.
        assert_eq!(s.replace(replaced.clone(), false).unwrap(), replaced);
        let patched = s.patch(&key, &PatchKind::Merge(json!({"data": {"b": "3"}})), false).unwrap();
        assert_eq!(patched["data"], json!({"a": "2", "b": "3"}));
        assert!(s.patch(&key, &PatchKind::Strategic(json!({})), false).unwrap_err().is_invalid());
        s.delete(&key, None, None).unwrap();
        assert!(s.get(&key).unwrap_err().is_not_found());
    }

    #[test]
    fn finalizers_hold_a_delete_until_removed() {
        let mut s = Server::default();
        let mut o = cm("f");
        o["metadata"]["finalizers"] = json!(["x/y"]);
        let created = s.create(o, false).unwrap();
        let key = ObjectKey::of(&created).unwrap();
        assert!(s.delete(&key, Some("wrong"), None).unwrap_err().is_conflict());
        s.delete(&key, None, None).unwrap();
        assert!(!s.get(&key).unwrap()["metadata"]["deletionTimestamp"].is_null());
        s.patch(&key, &PatchKind::Merge(json!({"metadata": {"finalizers": null}})), false).unwrap();
        assert!(s.get(&key).unwrap_err().is_not_found());
    }
}
