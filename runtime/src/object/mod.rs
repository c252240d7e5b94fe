//! The cached form of a Kubernetes object, shared by every stage of the host.
//!
//! Invariants:
//! - An [`Object`] is immutable once built; every reader shares it through an `Arc`.
//! - `raw` is the object's JSON exactly as it will be handed to plugins; the metadata
//!   fields kept beside it were parsed from that same JSON, so the two never disagree.
//! - The key is `namespace/name`, or `name` for cluster-scoped objects.
//! - The other metadata strings are ranges of `raw` itself where the JSON spells them without
//!   escapes ([`meta`]), so caching an object costs little beyond its JSON.

mod meta;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use meta::{MetaBuilder, Pairs, Text};

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

/// The kubectl annotation holding the whole last-applied object (often larger than the object).
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What to drop from objects before they are cached (client-go `TransformFunc`).
///
/// The default drops `metadata.managedFields` only: it is often most of an object's bytes,
/// and the API server keeps it when an update leaves it out. The kubectl last-applied
/// annotation is kept by default: a plugin that reads an object from the cache and writes it
/// back whole (`client.replace`) would otherwise remove it from the live object, and the next
/// `kubectl apply` would compute its patch from nothing. Dropping it is opt-in
/// (`[transform] strip-last-applied = true` in a plugin's TOML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transform {
    /// Drop `metadata.managedFields`.
    pub strip_managed_fields: bool,
    /// Drop the `kubectl.kubernetes.io/last-applied-configuration` annotation.
    pub strip_last_applied: bool,
}

impl Default for Transform {
    fn default() -> Self {
        Self { strip_managed_fields: true, strip_last_applied: false }
    }
}

impl Transform {
    /// Keep objects exactly as received.
    pub const NONE: Transform = Transform { strip_managed_fields: false, strip_last_applied: false };
}

/// The top level of an object: only whether the type meta is there, and its metadata,
/// decoded in the same pass (every other member is skipped, validated, never copied).
#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    kind: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    metadata: Option<RawMetadata<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMetadata<'a> {
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    namespace: Option<Text<'a>>,
    #[serde(borrow, default)]
    uid: Option<Text<'a>>,
    #[serde(borrow, default)]
    resource_version: Option<Text<'a>>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(borrow, default)]
    deletion_timestamp: Option<Text<'a>>,
    #[serde(borrow, default)]
    labels: Option<Pairs<'a>>,
    #[serde(borrow, default)]
    annotations: Option<Pairs<'a>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerRef>>,
    #[serde(borrow, default)]
    managed_fields: Option<&'a RawValue>,
}

/// Which of `apiVersion` / `kind` an object's JSON has.
struct TypeMetaPresent {
    api_version: bool,
    kind: bool,
}

/// Decodes the envelope and metadata of an object in one pass over its bytes.
///
/// A JSON syntax error anywhere wins over a data error met first inside the metadata (the
/// reflector tells a broken list body, which fails the list, from an undecodable object,
/// which is skipped); checking that costs a second pass on the error path only.
///
/// Bytes that are valid UTF-8 as a whole (as an API server's always are) are parsed as a
/// `str`: one validation pass over the object instead of one call per string the parser
/// borrows (serde_json's slice reader checks each of the ~30 metadata strings on its own,
/// which cost more than the whole pass). Other bytes are parsed as bytes, as before (invalid
/// UTF-8 in a skipped string is no error).
fn parse_envelope(raw: &[u8]) -> Result<(TypeMetaPresent, RawMetadata<'_>), ObjectError> {
    let parsed = match std::str::from_utf8(raw) {
        Ok(text) => serde_json::from_str::<RawEnvelope<'_>>(text),
        Err(_) => serde_json::from_slice::<RawEnvelope<'_>>(raw),
    };
    match parsed {
        Ok(env) => {
            let present =
                TypeMetaPresent { api_version: env.api_version.is_some(), kind: env.kind.is_some() };
            Ok((present, env.metadata.ok_or(ObjectError::MissingName)?))
        }
        Err(e) if e.is_data() => match serde_json::from_slice::<serde::de::IgnoredAny>(raw) {
            Err(syntax) if !syntax.is_data() => Err(syntax.into()),
            _ => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// The metadata an [`Object`] keeps, read from its raw form; both constructors go through it.
struct MetaFields {
    key: Box<str>,
    namespace_len: usize,
    generation: Option<i64>,
    meta: meta::Meta,
    owner_references: Box<[OwnerRef]>,
}

impl MetaFields {
    /// `m` was parsed from `raw`; `edits` (sorted `(start, end, inserted length)`) turn `raw`
    /// into the bytes the object keeps; `drop_last_applied` leaves that annotation out.
    fn from_raw(
        raw: &[u8],
        m: RawMetadata<'_>,
        drop_last_applied: bool,
        edits: &[(usize, usize, usize)],
    ) -> Result<Self, ObjectError> {
        let name = &m.name.as_ref().ok_or(ObjectError::MissingName)?.0;
        let (key, namespace_len) = match m.namespace.as_ref().map(|n| &*n.0) {
            Some(ns) if !ns.is_empty() => {
                let mut key = String::with_capacity(ns.len() + 1 + name.len());
                key.push_str(ns);
                key.push('/');
                key.push_str(name);
                (key, ns.len())
            }
            _ => (name.to_string(), 0),
        };
        let labels = m.labels.map(Pairs::sorted).unwrap_or_default();
        let mut annotations = m.annotations.map(Pairs::sorted).unwrap_or_default();
        if drop_last_applied {
            annotations.retain(|(k, _)| k.0 != LAST_APPLIED_ANNOTATION);
        }
        let meta = MetaBuilder::new(raw)?.finish(
            m.uid.as_ref(),
            m.resource_version.as_ref(),
            m.deletion_timestamp.as_ref(),
            &labels,
            &annotations,
            edits,
        )?;
        Ok(MetaFields {
            key: key.into_boxed_str(),
            namespace_len,
            generation: m.generation,
            meta,
            owner_references: m.owner_references.unwrap_or_default().into_boxed_slice(),
        })
    }

    fn into_object(self, raw: Bytes) -> Object {
        Object {
            raw,
            key: self.key,
            namespace_len: self.namespace_len,
            generation: self.generation,
            meta: self.meta,
            owner_references: self.owner_references,
        }
    }
}

/// Byte offset of `inner` (a sub-slice of `outer`) within `outer`.
fn offset_in(outer: &[u8], inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

/// The byte span to cut to remove the member `"key": <value>` whose value occupies
/// `buf[vstart..vend]`, including one adjoining comma. `None` if the bytes before the value
/// are not exactly that key (e.g. an escaped spelling).
fn member_span(buf: &[u8], vstart: usize, vend: usize, key: &str) -> Option<(usize, usize)> {
    if vstart > vend || vend > buf.len() {
        return None;
    }
    let ws = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut i = vstart;
    while i > 0 && ws(buf[i - 1]) {
        i -= 1;
    }
    if i == 0 || buf[i - 1] != b':' {
        return None;
    }
    i -= 1;
    while i > 0 && ws(buf[i - 1]) {
        i -= 1;
    }
    // `"key"` ends at `i`.
    let kstart = i.checked_sub(key.len() + 2)?;
    if buf[kstart] != b'"' || buf[i - 1] != b'"' || &buf[kstart + 1..i - 1] != key.as_bytes() {
        return None;
    }
    // Prefer eating the comma before the member; if it is the first member, the one after.
    let mut j = kstart;
    while j > 0 && ws(buf[j - 1]) {
        j -= 1;
    }
    if j > 0 && buf[j - 1] == b',' {
        return Some((j - 1, vend));
    }
    let mut k = vend;
    while k < buf.len() && ws(buf[k]) {
        k += 1;
    }
    if k < buf.len() && buf[k] == b',' {
        return Some((kstart, k + 1));
    }
    Some((kstart, vend))
}

/// The byte span to cut to remove the member whose key `key` (a sub-slice of `buf`, so spelled
/// without escapes) is followed by a string value, as [`member_span`]. `buf` was validated
/// as JSON; anything unexpected gives `None` (the caller falls back to re-serialising).
fn string_member_span(buf: &[u8], key: &str) -> Option<(usize, usize)> {
    let ws = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut i = offset_in(buf, key)? + key.len();
    if buf.get(i) != Some(&b'"') {
        return None;
    }
    i += 1;
    while buf.get(i).is_some_and(|b| ws(*b)) {
        i += 1;
    }
    if buf.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    while buf.get(i).is_some_and(|b| ws(*b)) {
        i += 1;
    }
    if buf.get(i) != Some(&b'"') {
        return None;
    }
    let vstart = i;
    i += 1;
    // The closing quote is the first one not escaped by a backslash.
    loop {
        let at = i + memchr::memchr2(b'"', b'\\', buf.get(i..)?)?;
        if buf[at] == b'"' {
            return member_span(buf, vstart, at + 1, key);
        }
        i = at + 2;
    }
}

impl Object {
    /// Builds an object from JSON received from the API server: applies `transform` and, when
    /// the JSON lacks them (list items do), inserts `apiVersion` / `kind` from `type_meta`.
    /// The result owns an exact-size copy of the (edited) bytes, so it never pins a larger
    /// network buffer; edits splice bytes and never re-serialise the object.
    ///
    /// ```
    /// use wasmctrl_runtime::object::{Object, Transform};
    /// let raw = br#"{"metadata":{"name":"a","managedFields":[{"manager":"x"}],"uid":"u"},"data":{}}"#;
    /// let obj = Object::from_api_json(raw, Some(("v1", "ConfigMap")), Transform::default()).unwrap();
    /// assert_eq!(
    ///     std::str::from_utf8(obj.json()).unwrap(),
    ///     r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","uid":"u"},"data":{}}"#
    /// );
    /// ```
    pub fn from_api_json(
        raw: &[u8],
        type_meta: Option<(&str, &str)>,
        transform: Transform,
    ) -> Result<Self, ObjectError> {
        let (present, m) = parse_envelope(raw)?;

        // (start, end, replacement) edits, applied in order of position.
        let mut edits: Vec<(usize, usize, String)> = Vec::new();
        let mut needs_fallback = false;
        if let Some((api_version, kind)) = type_meta {
            let mut insert = String::new();
            if !present.api_version {
                insert.push_str("\"apiVersion\":");
                insert.push_str(&serde_json::Value::from(api_version).to_string());
                insert.push(',');
            }
            if !present.kind {
                insert.push_str("\"kind\":");
                insert.push_str(&serde_json::Value::from(kind).to_string());
                insert.push(',');
            }
            if !insert.is_empty() {
                let open = raw.iter().position(|b| *b == b'{').ok_or(ObjectError::MissingName)?;
                edits.push((open + 1, open + 1, insert));
            }
        }
        if transform.strip_managed_fields
            && let Some(mf) = m.managed_fields
        {
            match offset_in(raw, mf.get())
                .and_then(|at| member_span(raw, at, at + mf.get().len(), "managedFields"))
            {
                Some((s, e)) => edits.push((s, e, String::new())),
                None => needs_fallback = true,
            }
        }
        let mut drop_last_applied = false;
        if transform.strip_last_applied
            && let Some(a) = &m.annotations
        {
            match a.count_key(LAST_APPLIED_ANNOTATION) {
                0 => {}
                // Cut from the bytes by the position of its key (its value is usually escaped
                // JSON, decoded into a buffer of its own); a duplicate key is left to the
                // general path, which removes every spelling.
                1 => match a.key_text(LAST_APPLIED_ANNOTATION).and_then(|k| string_member_span(raw, k)) {
                    Some((s, e)) => {
                        edits.push((s, e, String::new()));
                        drop_last_applied = true;
                    }
                    None => needs_fallback = true,
                },
                _ => needs_fallback = true,
            }
        }

        if needs_fallback {
            // Re-serialised: the spans are read again from the bytes kept.
            return Object::from_json(rewrite_slow(raw, type_meta, transform)?);
        }
        let bytes = if edits.is_empty() {
            Bytes::copy_from_slice(raw)
        } else {
            edits.sort_by_key(|e| e.0);
            let removed: usize = edits.iter().map(|(s, e, _)| e - s).sum();
            let added: usize = edits.iter().map(|(_, _, r)| r.len()).sum();
            let mut out = Vec::with_capacity(raw.len() - removed + added);
            let mut pos = 0;
            for (s, e, r) in &edits {
                out.extend_from_slice(&raw[pos..*s]);
                out.extend_from_slice(r.as_bytes());
                pos = *e;
            }
            out.extend_from_slice(&raw[pos..]);
            Bytes::from(out)
        };

        let moves: Vec<(usize, usize, usize)> = edits.iter().map(|(s, e, r)| (*s, *e, r.len())).collect();
        Ok(MetaFields::from_raw(raw, m, drop_last_applied, &moves)?.into_object(bytes))
    }
}

/// Finds one member of a JSON object without building the whole map.
pub(crate) fn find_member<'a>(object: &'a str, name: &str) -> Option<&'a RawValue> {
    struct Finder<'n>(&'n str);
    impl<'de> serde::de::DeserializeSeed<'de> for Finder<'_> {
        type Value = Option<&'de RawValue>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> serde::de::Visitor<'de> for Finder<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if found.is_none() && key == self.0 {
                    found = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object);
    serde::de::DeserializeSeed::deserialize(Finder(name), &mut de).ok().flatten()
}

/// The general (slower) path: parse, edit the tree, serialise.
fn rewrite_slow(
    raw: &[u8],
    type_meta: Option<(&str, &str)>,
    transform: Transform,
) -> Result<Bytes, ObjectError> {
    let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(raw)?;
    if let Some((api_version, kind)) = type_meta {
        v.entry("apiVersion").or_insert_with(|| api_version.into());
        v.entry("kind").or_insert_with(|| kind.into());
    }
    if let Some(serde_json::Value::Object(meta)) = v.get_mut("metadata") {
        if transform.strip_managed_fields {
            meta.remove("managedFields");
        }
        if transform.strip_last_applied
            && let Some(serde_json::Value::Object(a)) = meta.get_mut("annotations")
        {
            a.remove(LAST_APPLIED_ANNOTATION);
        }
    }
    Ok(Bytes::from(serde_json::to_vec(&v)?))
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

    fn text(o: &Object) -> &str {
        std::str::from_utf8(o.json()).unwrap()
    }

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
    fn api_json_strips_managed_fields_in_any_position() {
        let cases = [
            (r#"{"metadata":{"managedFields":[{"a":1}],"name":"x"}}"#, r#"{"metadata":{"name":"x"}}"#),
            (r#"{"metadata":{"name":"x","managedFields":[{"a":1}]}}"#, r#"{"metadata":{"name":"x"}}"#),
            (
                r#"{"metadata":{"name":"x", "managedFields" : [ {"a":"]"} ] , "uid":"u"}}"#,
                r#"{"metadata":{"name":"x" , "uid":"u"}}"#,
            ),
            (
                "{\n  \"metadata\": {\n    \"managedFields\": [],\n    \"name\": \"x\"\n  }\n}",
                "{\n  \"metadata\": {\n    \n    \"name\": \"x\"\n  }\n}",
            ),
        ];
        for (input, want) in cases {
            let o = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
            assert_eq!(text(&o), want, "{input}");
            let _: serde_json::Value = o.parse().unwrap();
        }
    }

    #[test]
    fn api_json_keeps_last_applied_annotation_by_default() {
        let input = r#"{"metadata":{"name":"x","annotations":{"keep":"1","kubectl.kubernetes.io/last-applied-configuration":"{\"big\":true}\n"},"managedFields":[]}}"#;
        let o = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
        assert_eq!(o.annotation(LAST_APPLIED_ANNOTATION), Some("{\"big\":true}\n"));
        let v: serde_json::Value = o.parse().unwrap();
        assert!(v["metadata"]["annotations"].get(LAST_APPLIED_ANNOTATION).is_some());
        assert!(v["metadata"].get("managedFields").is_none(), "managedFields are still dropped");
    }

    #[test]
    fn owner_references_decode_leniently() {
        let input = r#"{"metadata":{"name":"x","ownerReferences":[{"apiVersion":"v1","kind":"K","name":"o"},{"apiVersion":"v1","kind":"K","name":"p","uid":null,"controller":true}]}}"#;
        let o = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
        assert_eq!(o.owner_references().len(), 2);
        assert_eq!(&*o.owner_references()[0].uid, "");
        assert_eq!(o.controller_owner().map(|r| &*r.name), Some("p"));
    }

    #[test]
    fn api_json_strips_last_applied_annotation_when_asked() {
        let input = r#"{"metadata":{"name":"x","annotations":{"keep":"1","kubectl.kubernetes.io/last-applied-configuration":"{\"big\":true}\n"}}}"#;
        let strip = Transform { strip_last_applied: true, ..Transform::default() };
        let o = Object::from_api_json(input.as_bytes(), None, strip).unwrap();
        assert_eq!(text(&o), r#"{"metadata":{"name":"x","annotations":{"keep":"1"}}}"#);
        assert_eq!(o.annotations().collect::<Vec<_>>(), [("keep", "1")]);
        assert_eq!(o.annotation(LAST_APPLIED_ANNOTATION), None);

        let kept = Object::from_api_json(input.as_bytes(), None, Transform::NONE).unwrap();
        assert_eq!(text(&kept), input, "Transform::NONE keeps bytes as received");
        assert!(kept.annotation(LAST_APPLIED_ANNOTATION).is_some());
    }

    #[test]
    fn api_json_injects_missing_type_meta_only() {
        let o = Object::from_api_json(
            br#"{"metadata":{"name":"x"}}"#,
            Some(("apps/v1", "Deployment")),
            Transform::NONE,
        )
        .unwrap();
        assert_eq!(text(&o), r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"}}"#);
        let o = Object::from_api_json(
            br#"{"kind":"Other","metadata":{"name":"x"}}"#,
            Some(("v1", "ConfigMap")),
            Transform::NONE,
        )
        .unwrap();
        assert_eq!(text(&o), r#"{"apiVersion":"v1","kind":"Other","metadata":{"name":"x"}}"#);
    }

    #[test]
    fn api_json_escaped_key_falls_back_to_reserialising() {
        // "managedFields" spelled with an escape: found by the parser, not by byte matching.
        let input = r#"{"metadata":{"name":"x","managed\u0046ields":[1]},"data":{"a":"b"}}"#;
        let o = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
        let v: serde_json::Value = o.parse().unwrap();
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["data"]["a"], "b");
    }

    #[test]
    fn api_json_metadata_matches_from_json() {
        let input = r#"{"metadata":{"name":"n","namespace":"ns","uid":"u","resourceVersion":"7","generation":3,
            "deletionTimestamp":"2026-01-01T00:00:00Z","labels":{"b":"2","a":"1"},
            "ownerReferences":[{"apiVersion":"v1","kind":"K","name":"o","uid":"ou","controller":true}]}}"#;
        let a = Object::from_api_json(input.as_bytes(), None, Transform::default()).unwrap();
        let b = Object::from_json(Bytes::from(input)).unwrap();
        assert_eq!(a.key(), "ns/n");
        assert_eq!((a.name(), a.namespace()), (b.name(), b.namespace()));
        assert_eq!(
            (a.uid(), a.resource_version(), a.generation()),
            (b.uid(), b.resource_version(), b.generation())
        );
        assert_eq!(a.deletion_timestamp(), b.deletion_timestamp());
        assert_eq!(a.labels().collect::<Vec<_>>(), [("a", "1"), ("b", "2")]);
        assert_eq!(a.controller_owner().map(|o| &*o.uid), Some("ou"));
    }

    #[test]
    fn metadata_strings_are_read_from_the_kept_bytes_after_edits() {
        let input = r#"{"metadata":{"managedFields":[{"m":1}],"name":"n","namespace":"ns","uid":"u-1","resourceVersion":"42",
            "labels":{"tier":"web","app":"x"},"annotations":{"b":"2","kubectl.kubernetes.io/last-applied-configuration":"{}","a":"esc\"aped"}}}"#;
        let strip = Transform { strip_last_applied: true, ..Transform::default() };
        let o = Object::from_api_json(input.as_bytes(), Some(("v1", "ConfigMap")), strip).unwrap();
        assert!(text(&o).starts_with(r#"{"apiVersion":"v1","kind":"ConfigMap","#), "{}", text(&o));
        assert_eq!((o.uid(), o.resource_version()), ("u-1", "42"));
        assert_eq!(o.labels().collect::<Vec<_>>(), [("app", "x"), ("tier", "web")]);
        assert_eq!(o.annotations().collect::<Vec<_>>(), [("a", "esc\"aped"), ("b", "2")]);
        assert_eq!(o.meta.copied_bytes(), "esc\"aped".len(), "only the escaped value is copied");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_judged_as_bytes() {
        // Invalid UTF-8 inside a string nobody reads is kept, as serde_json's byte parser does;
        // inside a metadata string the object is rejected.
        let skipped = b"{\"metadata\":{\"name\":\"a\"},\"data\":{\"x\":\"\xff\"}}";
        let o = Object::from_api_json(skipped, None, Transform::default()).unwrap();
        assert_eq!((o.name(), &o.json()[..]), ("a", &skipped[..]));
        let read = b"{\"metadata\":{\"name\":\"\xff\"}}";
        assert!(Object::from_api_json(read, None, Transform::default()).is_err());
    }

    #[test]
    fn a_syntax_error_wins_over_a_metadata_type_error_met_first() {
        // The metadata is decoded in the same pass as the rest: a data error inside it comes
        // first, but the object is not even JSON, which callers must be told.
        let input = br#"{"metadata":{"name":1},"data":{"a":"b"]}"#;
        let Err(ObjectError::Json(e)) = Object::from_api_json(input, None, Transform::default()) else {
            panic!("must fail as JSON")
        };
        assert!(e.is_syntax(), "{e}");
        let Err(ObjectError::Json(e)) = Object::from_json(Bytes::from_static(br#"{"metadata":{"name":1}}"#))
        else {
            panic!("must fail as JSON")
        };
        assert!(e.is_data(), "{e}");
    }

    #[test]
    fn last_applied_is_stripped_whatever_its_spelling() {
        let strip = Transform { strip_last_applied: true, ..Transform::default() };
        let cases = [
            // First member, escaped value with quotes and a backslash pair.
            (
                r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration" : "{\"a\":\"\\\\\"}","b":"2"},"name":"x"}}"#,
                r#"{"metadata":{"annotations":{"b":"2"},"name":"x"}}"#,
            ),
            // Only member.
            (
                r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":""},"name":"x"}}"#,
                r#"{"metadata":{"annotations":{},"name":"x"}}"#,
            ),
        ];
        for (input, want) in cases {
            let o = Object::from_api_json(input.as_bytes(), None, strip).unwrap();
            assert_eq!(text(&o), want);
            assert_eq!(o.annotations().collect::<Vec<_>>().len(), want.matches("\"b\"").count());
        }
        // A duplicate key and an escaped key spelling go the general way: every copy is gone.
        for input in [
            r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"1","b":"2","kubectl.kubernetes.io/last-applied-configuration":"3"},"name":"x"}}"#,
            r#"{"metadata":{"annotations":{"kubectl.kubernetes.io\/last-applied-configuration":"1","b":"2"},"name":"x"}}"#,
        ] {
            let o = Object::from_api_json(input.as_bytes(), None, strip).unwrap();
            assert!(!text(&o).contains("last-applied"), "{}", text(&o));
            assert_eq!(o.annotations().collect::<Vec<_>>(), [("b", "2")]);
            assert_eq!(o.name(), "x");
        }
    }

    #[test]
    fn api_json_rejects_garbage_without_panicking() {
        for bad in
            [&b"not json"[..], b"{}", b"{\"metadata\":{}}", b"[1,2]", b"{\"metadata\":{\"name\":1}}", b""]
        {
            assert!(Object::from_api_json(bad, Some(("v1", "X")), Transform::default()).is_err());
        }
    }
}
