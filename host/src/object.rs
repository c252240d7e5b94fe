//! The cached form of a Kubernetes object, shared by every stage of the host.
//!
//! Invariants:
//! - An [`Object`] is immutable once built; every reader shares it through an `Arc`.
//! - `raw` is the object's JSON exactly as it will be handed to plugins; the metadata
//!   fields kept beside it were parsed from that same JSON, so the two never disagree.
//! - The key is `namespace/name`, or `name` for cluster-scoped objects.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

/// Why bytes could not be turned into an [`Object`].
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("object has no metadata.name")]
    MissingName,
}

/// An owner reference, as the controller and garbage collector read it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRef {
    pub api_version: Box<str>,
    pub kind: Box<str>,
    pub name: Box<str>,
    pub uid: Box<str>,
    #[serde(default)]
    pub controller: Option<bool>,
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
    uid: Box<str>,
    resource_version: Box<str>,
    generation: Option<i64>,
    deletion_timestamp: Option<Box<str>>,
    labels: Box<[(Box<str>, Box<str>)]>,
    annotations: Box<[(Box<str>, Box<str>)]>,
    owner_references: Box<[OwnerRef]>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    metadata: Metadata<'a>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    uid: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    resource_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(borrow, default)]
    deletion_timestamp: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    labels: Option<std::collections::BTreeMap<Box<str>, Box<str>>>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<Box<str>, Box<str>>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerRef>>,
}

impl Object {
    /// Builds an object from its JSON. The bytes are kept as they are.
    ///
    /// ```
    /// let obj = wasmctrl::object::Object::from_json(
    ///     br#"{"metadata":{"name":"a","namespace":"ns","labels":{"app":"web"}}}"#.to_vec().into(),
    /// ).unwrap();
    /// assert_eq!(obj.key(), "ns/a");
    /// assert_eq!(obj.label("app"), Some("web"));
    /// ```
    pub fn from_json(raw: Bytes) -> Result<Self, ObjectError> {
        let env: Envelope<'_> = serde_json::from_slice(&raw)?;
        let m = env.metadata;
        let name = m.name.ok_or(ObjectError::MissingName)?;
        let (key, namespace_len) = match m.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => (format!("{ns}/{name}"), ns.len()),
            _ => (name.into_owned(), 0),
        };
        let pairs = |m: Option<std::collections::BTreeMap<Box<str>, Box<str>>>| {
            m.map(|m| m.into_iter().collect::<Vec<_>>().into_boxed_slice()).unwrap_or_default()
        };
        let obj = Object {
            key: key.into_boxed_str(),
            namespace_len,
            uid: m.uid.as_deref().unwrap_or_default().into(),
            resource_version: m.resource_version.as_deref().unwrap_or_default().into(),
            generation: m.generation,
            deletion_timestamp: m.deletion_timestamp.as_deref().map(Into::into),
            labels: pairs(m.labels),
            annotations: pairs(m.annotations),
            owner_references: m.owner_references.unwrap_or_default().into_boxed_slice(),
            raw: Bytes::new(),
        };
        Ok(Object { raw, ..obj })
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
        &self.uid
    }

    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    pub fn deletion_timestamp(&self) -> Option<&str> {
        self.deletion_timestamp.as_deref()
    }

    /// Labels, sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// Annotations, sorted by key.
    pub fn annotations(&self) -> impl Iterator<Item = (&str, &str)> {
        self.annotations.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    pub fn owner_references(&self) -> &[OwnerRef] {
        &self.owner_references
    }

    /// The owner reference with `controller: true`, if any.
    pub fn controller_owner(&self) -> Option<&OwnerRef> {
        self.owner_references.iter().find(|o| o.is_controller())
    }
}

fn lookup<'a>(pairs: &'a [(Box<str>, Box<str>)], key: &str) -> Option<&'a str> {
    pairs.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*pairs[i].1)
}

/// Builds the cache key for `namespace` + `name`.
pub fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
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
