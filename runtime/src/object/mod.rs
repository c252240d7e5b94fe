//! The cached form of a Kubernetes object, shared by every stage of the machinery.
//!
//! - `mod.rs`: [`Object`] and what its readers use (key, metadata, owner references),
//!   [`DeletedObject`], cache keys and resourceVersion order.
//! - `decode.rs`: reading an object's metadata from its JSON in one pass.
//! - `transform.rs`: what is dropped from an object before it is cached ([`Transform`]), by
//!   editing its bytes.
//! - `meta.rs`: the metadata strings kept as ranges of the object's own bytes.
//!
//! Invariants:
//! - An [`Object`] is immutable once built; every reader shares it through an `Arc`.
//! - `raw` is the object's JSON exactly as it will be handed to plugins; the metadata
//!   fields kept beside it were parsed from that same JSON, so the two never disagree.
//! - The key is `namespace/name`, or `name` for cluster-scoped objects.
//! - The other metadata strings are ranges of `raw` itself where the JSON spells them without
//!   escapes ([`meta`]), so caching an object costs little beyond its JSON.

mod decode;
mod meta;
mod transform;

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

pub(crate) use decode::{FromMap, find_member};
use decode::{MetaFields, parse_envelope};
pub use transform::{LAST_APPLIED_ANNOTATION, Transform};

/// Why bytes could not be turned into an [`Object`].
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("object has no metadata.name")]
    MissingName,
    #[error("object of {0} bytes is too large (the limit is 2 GiB)")]
    TooLarge(usize),
}

/// An owner reference, as the controller and garbage collector read it.
///
/// Decoded as leniently as Go's typed decoding: a missing or `null` field reads as empty
/// (API servers that do not validate owner references, or objects written before a field
/// existed, must not make an object undecodable).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    #[serde(default, deserialize_with = "null_as_default")]
    pub api_version: Box<str>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub kind: Box<str>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: Box<str>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub uid: Box<str>,
    #[serde(default)]
    pub controller: Option<bool>,
}

/// `null` as the type's default (Go decodes `null` into a zero value).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl OwnerRef {
    /// Whether this reference is the object's managing controller.
    pub fn is_controller(&self) -> bool {
        self.controller == Some(true)
    }
}

/// One cached object: its raw JSON plus the metadata that keys, indexes and predicates read.
#[derive(Debug)]
pub struct Object {
    raw: Bytes,
    key: Box<str>,
    /// Length of the namespace prefix of `key` (0 for cluster-scoped objects).
    namespace_len: usize,
    generation: Option<i64>,
    /// uid, resourceVersion, deletionTimestamp, labels and annotations, over `raw`.
    meta: meta::Meta,
    owner_references: Box<[OwnerRef]>,
}

impl Object {
    /// Builds an object from its JSON. The bytes are kept as they are.
    ///
    /// ```
    /// let obj = wasmctrl_runtime::object::Object::from_json(
    ///     br#"{"metadata":{"name":"a","namespace":"ns","labels":{"app":"web"}}}"#.to_vec().into(),
    /// ).unwrap();
    /// assert_eq!(obj.key(), "ns/a");
    /// assert_eq!(obj.label("app"), Some("web"));
    /// ```
    pub fn from_json(raw: Bytes) -> Result<Self, ObjectError> {
        let (_, m) = parse_envelope(&raw)?;
        let fields = MetaFields::from_raw(&raw, m, false, &[])?;
        Ok(fields.into_object(raw.clone()))
    }

    /// The object's JSON, as handed to plugins.
    pub fn json(&self) -> &Bytes {
        &self.raw
    }

    /// Parses the JSON into a typed value (k8s-openapi types, `serde_json::Value`, ...).
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.raw)
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn namespace(&self) -> Option<&str> {
        (self.namespace_len > 0).then(|| &self.key[..self.namespace_len])
    }

    pub fn name(&self) -> &str {
        if self.namespace_len > 0 { &self.key[self.namespace_len + 1..] } else { &self.key }
    }

    pub fn uid(&self) -> &str {
        self.meta.uid(&self.raw)
    }

    pub fn resource_version(&self) -> &str {
        self.meta.resource_version(&self.raw)
    }

    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    pub fn deletion_timestamp(&self) -> Option<&str> {
        self.meta.deletion_timestamp(&self.raw)
    }

    /// Labels, sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.meta.iter(&self.raw, true)
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.meta.get(&self.raw, true, key)
    }

    /// Annotations, sorted by key.
    pub fn annotations(&self) -> impl Iterator<Item = (&str, &str)> {
        self.meta.iter(&self.raw, false)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.meta.get(&self.raw, false, key)
    }

    pub fn owner_references(&self) -> &[OwnerRef] {
        &self.owner_references
    }

    /// The owner reference with `controller: true`, if any.
    pub fn controller_owner(&self) -> Option<&OwnerRef> {
        self.owner_references.iter().find(|o| o.is_controller())
    }
}

/// Builds the cache key for `namespace` + `name`.
pub fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        // Joined by hand: `format!` runs the formatting machinery, far more work than two
        // copies, on the path of every cache read a plugin makes (`cargo bench -p wasmctrl
        // --bench plugin` times that read).
        Some(ns) if !ns.is_empty() => {
            let mut key = String::with_capacity(ns.len() + 1 + name.len());
            key.push_str(ns);
            key.push('/');
            key.push_str(name);
            key
        }
        _ => name.to_owned(),
    }
}

/// Orders two resourceVersions of one resource, as Kubernetes ≥ 1.35 defines it (KEP-5504,
/// client-go `resourceversion.CompareResourceVersion`): decimal integers without leading
/// zeros, of any length. `None` if either is not one (an older or non-etcd server), in which
/// case a caller must treat them as opaque, as client-go did before.
pub fn compare_resource_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    fn well_formed(rv: &str) -> bool {
        !rv.is_empty() && rv.bytes().all(|c| c.is_ascii_digit()) && (rv == "0" || !rv.starts_with('0'))
    }
    if !well_formed(a) || !well_formed(b) {
        return None;
    }
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// What a delete notification carries.
#[derive(Clone, Debug)]
pub enum DeletedObject {
    /// The object as it was when the watch reported it deleted.
    Known(Arc<Object>),
    /// A delete missed while the watch was down, found on relist: the last state the
    /// cache knew (client-go's `DeletedFinalStateUnknown`).
    FinalStateUnknown { key: Arc<str>, last_known: Arc<Object> },
}

impl DeletedObject {
    /// The last known state of the object, whichever way the delete was learned.
    pub fn object(&self) -> &Arc<Object> {
        match self {
            DeletedObject::Known(o) => o,
            DeletedObject::FinalStateUnknown { last_known, .. } => last_known,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            DeletedObject::Known(o) => o.key(),
            DeletedObject::FinalStateUnknown { key, .. } => key,
        }
    }

    pub fn is_final_state_unknown(&self) -> bool {
        matches!(self, DeletedObject::FinalStateUnknown { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_of_joins_namespace_and_name_as_client_go_meta_namespace_key_func() {
        assert_eq!(key_of(Some("default"), "app-config"), "default/app-config");
        assert_eq!(key_of(None, "node-1"), "node-1");
        assert_eq!(key_of(Some(""), "node-1"), "node-1");
    }

    #[test]
    fn resource_versions_compare_as_integers_of_any_length() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_resource_versions("9", "10"), Some(Less));
        assert_eq!(compare_resource_versions("123", "123"), Some(Equal));
        assert_eq!(compare_resource_versions("1000000000000000000000000000001", "999"), Some(Greater));
        assert_eq!(compare_resource_versions("0", "1"), Some(Less));
        for bad in ["", "01", "-1", "1a", " 1", "abc"] {
            assert_eq!(compare_resource_versions(bad, "1"), None, "{bad:?}");
            assert_eq!(compare_resource_versions("1", bad), None, "{bad:?}");
        }
    }

    #[test]
    fn owner_references_decode_leniently() {
        let input = r#"{"metadata":{"name":"x","ownerReferences":[{"apiVersion":"v1","kind":"K","name":"o"},{"apiVersion":"v1","kind":"K","name":"p","uid":null,"controller":true}]}}"#;
        let o = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
        assert_eq!(o.owner_references().len(), 2);
        assert_eq!(&*o.owner_references()[0].uid, "");
        assert_eq!(o.controller_owner().map(|r| &*r.name), Some("p"));
    }
}
