//! Index functions: `object -> set of index values`.
//!
//! [`IndexSpec`] is the declarative form (as written in a plugin TOML: `{ label = "app" }`,
//! `{ annotation = "k" }`, `{ field = "spec.nodeName" }`, `{ owner = "uid" | "controller" }`);
//! [`IndexFunc`] is what an [`Indexer`](super::Indexer) runs, either compiled from a spec or a
//! custom closure. Index functions are pure: the same object always yields the same values.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::object::Object;

/// Name of the index every store has: object namespace (`""` for cluster-scoped objects).
pub const NAMESPACE_INDEX: &str = "namespace";

/// Which owner references an owner index reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerIndex {
    /// The UIDs of every owner reference.
    Uid,
    /// The UID of the controller owner reference only.
    Controller,
}

/// A declarative index definition.
///
/// ```
/// use wasmctrl_runtime::cache::IndexSpec;
/// let spec: IndexSpec = toml::from_str::<std::collections::BTreeMap<String, IndexSpec>>(
///     r#"by-node = { field = "spec.nodeName" }"#,
/// ).unwrap().remove("by-node").unwrap();
/// assert_eq!(spec, IndexSpec::Field("spec.nodeName".into()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexSpec {
    /// The object's namespace (`""` when cluster-scoped).
    Namespace,
    /// The value of a label key, when present.
    Label(String),
    /// The value of an annotation key, when present.
    Annotation(String),
    /// The value(s) at a dotted JSON path, e.g. `spec.nodeName` or `spec.containers.image`
    /// (arrays fan out: one value per element). Strings index as themselves, numbers and
    /// booleans by their JSON text; objects and null are not indexed. A segment may be
    /// bracketed to hold dots: `metadata.labels['app.kubernetes.io/name']`.
    Field(String),
    /// Owner reference UIDs.
    Owner(OwnerIndex),
}

impl fmt::Display for IndexSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexSpec::Namespace => f.write_str("namespace"),
            IndexSpec::Label(k) => write!(f, "label {k:?}"),
            IndexSpec::Annotation(k) => write!(f, "annotation {k:?}"),
            IndexSpec::Field(p) => write!(f, "field {p:?}"),
            IndexSpec::Owner(OwnerIndex::Uid) => f.write_str("owner uid"),
            IndexSpec::Owner(OwnerIndex::Controller) => f.write_str("controller owner uid"),
        }
    }
}

/// Why an index definition is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("invalid field path {path:?}: {reason}")]
    FieldPath { path: String, reason: String },
    #[error("index {0:?} does not exist")]
    UnknownIndex(String),
    #[error("index {name:?} is already defined differently ({existing}, requested {requested})")]
    Conflict { name: String, existing: String, requested: String },
}

type CustomFn = dyn Fn(&Object) -> Vec<String> + Send + Sync;

/// A runnable index function.
#[derive(Clone)]
pub struct IndexFunc {
    kind: FuncKind,
}

#[derive(Clone)]
enum FuncKind {
    Spec(IndexSpec, Arc<[String]>),
    Custom(Arc<CustomFn>),
}

impl fmt::Debug for IndexFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FuncKind::Spec(s, _) => write!(f, "IndexFunc({s})"),
            FuncKind::Custom(_) => f.write_str("IndexFunc(custom)"),
        }
    }
}

impl IndexFunc {
    /// Compiles a declarative spec (field paths are validated here).
    pub fn from_spec(spec: IndexSpec) -> Result<Self, IndexError> {
        let segments: Arc<[String]> = match &spec {
            IndexSpec::Field(p) => parse_field_path(p)?.into(),
            _ => Arc::from(Vec::new()),
        };
        Ok(Self { kind: FuncKind::Spec(spec, segments) })
    }

    /// The namespace index function.
    pub fn namespace() -> Self {
        Self { kind: FuncKind::Spec(IndexSpec::Namespace, Arc::from(Vec::new())) }
    }

    /// A custom index function.
    ///
    /// ```
    /// use wasmctrl_runtime::cache::IndexFunc;
    /// let by_name_len = IndexFunc::custom(|o| vec![o.name().len().to_string()]);
    /// # let _ = by_name_len;
    /// ```
    pub fn custom(f: impl Fn(&Object) -> Vec<String> + Send + Sync + 'static) -> Self {
        Self { kind: FuncKind::Custom(Arc::new(f)) }
    }

    /// The declarative spec this function came from, if any.
    pub fn spec(&self) -> Option<&IndexSpec> {
        match &self.kind {
            FuncKind::Spec(s, _) => Some(s),
            FuncKind::Custom(_) => None,
        }
    }

    /// Whether two functions are the same definition (equal specs, or the same closure).
    pub fn same_as(&self, other: &IndexFunc) -> bool {
        match (&self.kind, &other.kind) {
            (FuncKind::Spec(a, _), FuncKind::Spec(b, _)) => a == b,
            (FuncKind::Custom(a), FuncKind::Custom(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The index values of `obj`, deduplicated.
    pub fn values(&self, obj: &Object) -> Vec<String> {
        self.values_of(obj).iter().map(str::to_owned).collect()
    }

    /// [`IndexFunc::values`], borrowed from `obj` for the specs that have at most one value
    /// (namespace, label, annotation, controller owner): the store computes the values of
    /// two objects on every update, and these need no allocation.
    pub(crate) fn values_of<'a>(&self, obj: &'a Object) -> Values<'a> {
        let one = |v: Option<&'a str>| Values { one: v, many: Vec::new() };
        match &self.kind {
            FuncKind::Spec(IndexSpec::Namespace, _) => one(Some(obj.namespace().unwrap_or_default())),
            FuncKind::Spec(IndexSpec::Label(k), _) => one(obj.label(k)),
            FuncKind::Spec(IndexSpec::Annotation(k), _) => one(obj.annotation(k)),
            FuncKind::Spec(IndexSpec::Owner(OwnerIndex::Controller), _) => {
                one(obj.controller_owner().map(|o| &*o.uid))
            }
            _ => Values { one: None, many: self.owned_values(obj) },
        }
    }

    fn owned_values(&self, obj: &Object) -> Vec<String> {
        let mut out = match &self.kind {
            FuncKind::Custom(f) => f(obj),
            FuncKind::Spec(spec, segments) => match spec {
                IndexSpec::Namespace => vec![obj.namespace().unwrap_or_default().to_owned()],
                IndexSpec::Label(k) => obj.label(k).map(str::to_owned).into_iter().collect(),
                IndexSpec::Annotation(k) => obj.annotation(k).map(str::to_owned).into_iter().collect(),
                IndexSpec::Owner(OwnerIndex::Uid) => {
                    obj.owner_references().iter().map(|o| o.uid.to_string()).collect()
                }
                IndexSpec::Owner(OwnerIndex::Controller) => {
                    obj.controller_owner().map(|o| o.uid.to_string()).into_iter().collect()
                }
                IndexSpec::Field(_) => {
                    let mut out = Vec::new();
                    if let Ok(raw) = serde_json::from_slice::<&RawValue>(obj.json()) {
                        collect_path(raw, segments, &mut out);
                    }
                    out
                }
            },
        };
        if out.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
        out
    }
}

/// The index values of one object (see [`IndexFunc::values_of`]): at most one borrowed, or
/// several computed.
pub(crate) struct Values<'a> {
    one: Option<&'a str>,
    many: Vec<String>,
}

impl Values<'_> {
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.one.into_iter().chain(self.many.iter().map(String::as_str))
    }

    pub fn contains(&self, v: &str) -> bool {
        self.iter().any(|x| x == v)
    }
}

/// Splits `a.b['c.d'].e` into segments; `[]` / `[*]` (explicit array fan-out) are accepted
/// and ignored since arrays always fan out.
fn parse_field_path(path: &str) -> Result<Vec<String>, IndexError> {
    let err = |reason: &str| IndexError::FieldPath { path: path.to_owned(), reason: reason.to_owned() };
    let mut segments = Vec::new();
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    let mut current = String::new();
    while let Some(c) = rest.chars().next() {
        match c {
            '.' => {
                if current.is_empty() && !segments_ended_with_bracket(rest, path) {
                    return Err(err("empty segment"));
                }
                if !current.is_empty() {
                    segments.push(std::mem::take(&mut current));
                }
                rest = &rest[1..];
            }
            '[' => {
                if !current.is_empty() {
                    segments.push(std::mem::take(&mut current));
                }
                let close = rest.find(']').ok_or_else(|| err("unclosed '['"))?;
                let inner = &rest[1..close];
                match inner {
                    "" | "*" => {}
                    _ => {
                        let quoted = inner
                            .strip_prefix('\'')
                            .and_then(|s| s.strip_suffix('\''))
                            .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                            .ok_or_else(|| err("bracketed segment must be quoted, '[]' or '[*]'"))?;
                        if quoted.is_empty() {
                            return Err(err("empty bracketed segment"));
                        }
                        segments.push(quoted.to_owned());
                    }
                }
                rest = &rest[close + 1..];
            }
            _ => {
                current.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if !current.is_empty() {
        segments.push(current);
    } else if path.ends_with('.') {
        return Err(err("empty segment"));
    }
    if segments.is_empty() {
        return Err(err("empty path"));
    }
    Ok(segments)
}

/// A '.' right after a bracketed segment (`a['b'].c`) is a separator, not an empty segment.
fn segments_ended_with_bracket(rest: &str, path: &str) -> bool {
    let consumed = path.len() - rest.len();
    path[..consumed].ends_with(']')
}

fn collect_path(value: &RawValue, segments: &[String], out: &mut Vec<String>) {
    let text = value.get().trim_start();
    if text.starts_with('[') {
        if let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(value.get()) {
            for item in items {
                collect_path(item, segments, out);
            }
        }
        return;
    }
    let Some((first, rest)) = segments.split_first() else {
        match text.as_bytes().first() {
            Some(b'"') => {
                if let Ok(s) = serde_json::from_str::<String>(text) {
                    out.push(s);
                }
            }
            Some(b'{') | None => {}
            Some(b'n') => {} // null
            Some(_) => out.push(text.trim_end().to_owned()),
        }
        return;
    };
    if !text.starts_with('{') {
        return;
    }
    if let Some(child) = crate::object::find_member(value.get(), first) {
        collect_path(child, rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Object {
        Object::from_json(json.as_bytes().to_vec().into()).unwrap()
    }

    #[test]
    fn field_path_parsing() {
        assert_eq!(parse_field_path("spec.nodeName").unwrap(), ["spec", "nodeName"]);
        assert_eq!(parse_field_path(".spec.nodeName").unwrap(), ["spec", "nodeName"]);
        assert_eq!(parse_field_path("spec.containers[*].image").unwrap(), ["spec", "containers", "image"]);
        assert_eq!(
            parse_field_path("metadata.labels['app.kubernetes.io/name']").unwrap(),
            ["metadata", "labels", "app.kubernetes.io/name"]
        );
        for bad in ["", ".", "a..b", "a.", "a[b]", "a['x'", "a['']"] {
            assert!(parse_field_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn field_index_fans_out_over_arrays() {
        let o = obj(r#"{"metadata":{"name":"p","namespace":"n"},"spec":{"nodeName":"node-1","replicas":3,
            "on":true,"nil":null,
            "containers":[{"image":"a"},{"image":"b"},{"image":"a"},{"name":"x"}],
            "ports":[[80,443],[8080]]}}"#);
        let f = |p: &str| IndexFunc::from_spec(IndexSpec::Field(p.into())).unwrap().values(&o);
        assert_eq!(f("spec.nodeName"), ["node-1"]);
        assert_eq!(f("spec.replicas"), ["3"]);
        assert_eq!(f("spec.on"), ["true"]);
        assert!(f("spec.nil").is_empty());
        assert!(f("spec.missing").is_empty());
        assert!(f("spec").is_empty(), "objects are not indexed");
        assert_eq!(f("spec.containers.image"), ["a", "b"]);
        assert_eq!(f("spec.ports"), ["443", "80", "8080"]);
        assert_eq!(f("metadata.name"), ["p"]);
    }

    #[test]
    fn label_annotation_owner_namespace_indexes() {
        let o = obj(r#"{"metadata":{"name":"p","namespace":"n","labels":{"app":"web"},
            "annotations":{"team":"a"},
            "ownerReferences":[{"apiVersion":"v1","kind":"X","name":"o1","uid":"u1"},
            {"apiVersion":"v1","kind":"Y","name":"o2","uid":"u2","controller":true}]}}"#);
        let f = |s: IndexSpec| IndexFunc::from_spec(s).unwrap().values(&o);
        assert_eq!(f(IndexSpec::Namespace), ["n"]);
        assert_eq!(f(IndexSpec::Label("app".into())), ["web"]);
        assert!(f(IndexSpec::Label("nope".into())).is_empty());
        assert_eq!(f(IndexSpec::Annotation("team".into())), ["a"]);
        assert_eq!(f(IndexSpec::Owner(OwnerIndex::Uid)), ["u1", "u2"]);
        assert_eq!(f(IndexSpec::Owner(OwnerIndex::Controller)), ["u2"]);
        let cluster = obj(r#"{"metadata":{"name":"c"}}"#);
        assert_eq!(IndexFunc::namespace().values(&cluster), [""]);
    }
}
