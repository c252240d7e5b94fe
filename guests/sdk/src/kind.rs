//! Mapping Rust types to Kubernetes kinds, and objects as JSON.
//!
//! [`Kind`] ties a Rust type to its `apiVersion` + `kind` and its `metadata`. Every
//! k8s-openapi type gets it for free; a CRD type implements it by hand or with
//! [`impl_kind!`](crate::impl_kind). [`RawObject`] is an object as the host hands it over
//! (JSON bytes), parsed only when asked.
//!
//! Invariant: [`to_json`] always emits `apiVersion` and `kind`, so a CRD struct does not
//! need to carry them as fields.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// A kind as written in a manifest: `apiVersion` + `kind`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    /// `v1`, `apps/v1`, `example.com/v1`.
    pub api_version: String,
    /// `ConfigMap`, `Deployment`, `Website`.
    pub kind: String,
}

impl Gvk {
    /// A kind from its `apiVersion` and `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Gvk { api_version: api_version.into(), kind: kind.into() }
    }

    /// The kind of the Rust type `K`.
    pub fn of<K: Kind>() -> Self {
        Gvk::new(K::API_VERSION, K::KIND)
    }

    /// Whether this is the kind of `K` (for dispatching in `map`, `filter` and the
    /// notification hooks, which are called for every watched kind).
    pub fn is<K: Kind>(&self) -> bool {
        self.api_version == K::API_VERSION && self.kind == K::KIND
    }

    /// The API group: `""` for the core group.
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }
}

impl std::fmt::Display for Gvk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// A Rust type that is a Kubernetes kind with standard object metadata.
///
/// Implemented for every k8s-openapi resource type. For a custom resource, implement it
/// (or use [`impl_kind!`](crate::impl_kind)) on a serde struct with a `metadata` field:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
///
/// #[derive(Clone, Debug, Default, Serialize, Deserialize)]
/// pub struct Website {
///     #[serde(default)]
///     pub metadata: ObjectMeta,
///     pub spec: WebsiteSpec,
/// }
/// #[derive(Clone, Debug, Default, Serialize, Deserialize)]
/// pub struct WebsiteSpec {
///     pub replicas: i32,
/// }
///
/// wasmctrl_guest::impl_kind!(Website, "example.com/v1", "Website");
///
/// assert_eq!(wasmctrl_guest::Gvk::of::<Website>().to_string(), "example.com/v1/Website");
/// ```
pub trait Kind: Serialize + DeserializeOwned {
    /// `apiVersion`, e.g. `apps/v1`.
    const API_VERSION: &'static str;
    /// `kind`, e.g. `Deployment`.
    const KIND: &'static str;

    /// The object's metadata.
    fn meta(&self) -> &ObjectMeta;
    /// The object's metadata, mutably.
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

impl<T> Kind for T
where
    T: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned,
{
    const API_VERSION: &'static str = <T as k8s_openapi::Resource>::API_VERSION;
    const KIND: &'static str = <T as k8s_openapi::Resource>::KIND;

    fn meta(&self) -> &ObjectMeta {
        self.metadata()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.metadata_mut()
    }
}

/// Implements [`Kind`] for a struct with a `metadata: ObjectMeta` field.
///
/// `impl_kind!(Website, "example.com/v1", "Website");`
#[macro_export]
macro_rules! impl_kind {
    ($ty:ty, $api_version:expr, $kind:expr $(,)?) => {
        impl $crate::Kind for $ty {
            const API_VERSION: &'static str = $api_version;
            const KIND: &'static str = $kind;
            fn meta(&self) -> &$crate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut $crate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Accessors every [`Kind`] gets: the usual metadata fields without `Option` juggling.
pub trait KindExt: Kind {
    /// `metadata.name`, `""` when unset.
    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or("")
    }
    /// `metadata.namespace`, `None` for cluster-scoped objects.
    fn namespace(&self) -> Option<&str> {
        self.meta().namespace.as_deref()
    }
    /// `metadata.uid`, `None` before the object is created.
    fn uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }
    /// `metadata.generation`, 0 when unset.
    fn generation(&self) -> i64 {
        self.meta().generation.unwrap_or(0)
    }
    /// `metadata.resourceVersion`.
    fn resource_version(&self) -> Option<&str> {
        self.meta().resource_version.as_deref()
    }
    /// Whether deletion has been requested (`metadata.deletionTimestamp` is set).
    fn is_being_deleted(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }
    /// The value of label `key`.
    fn label(&self, key: &str) -> Option<&str> {
        self.meta().labels.as_ref()?.get(key).map(String::as_str)
    }
    /// The value of annotation `key`.
    fn annotation(&self, key: &str) -> Option<&str> {
        self.meta().annotations.as_ref()?.get(key).map(String::as_str)
    }
    /// `namespace/name` (or `name`), as the host's cache keys objects.
    fn key(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{ns}/{}", self.name()),
            None => self.name().to_owned(),
        }
    }
}

impl<K: Kind> KindExt for K {}

/// Serialises `object` to the JSON the host expects, with `apiVersion` and `kind` set
/// from `K` when the type does not emit them itself (CRD structs usually do not).
pub fn to_json<K: Kind>(object: &K) -> Result<Vec<u8>, Error> {
    let mut value =
        serde_json::to_value(object).map_err(|e| Error::json(&format!("encoding {}", K::KIND), e))?;
    if let serde_json::Value::Object(map) = &mut value {
        map.entry("apiVersion").or_insert_with(|| serde_json::Value::String(K::API_VERSION.to_owned()));
        map.entry("kind").or_insert_with(|| serde_json::Value::String(K::KIND.to_owned()));
    }
    serde_json::to_vec(&value).map_err(|e| Error::json(&format!("encoding {}", K::KIND), e))
}

/// Parses JSON from the host as `K`.
pub fn from_json<K: Kind>(json: &[u8]) -> Result<K, Error> {
    parse_json(json).map_err(|e| Error::json(&format!("decoding {}", K::KIND), e))
}

/// Parses a whole JSON text, checking that it is UTF-8 once and then parsing it as a `str`.
///
/// `serde_json::from_slice` checks every string it meets instead (each key and each value,
/// one call apiece); in Wasm those calls are a noticeable share of a typed parse, the one
/// pass over the text far less (`cargo bench -p wasmctrl --bench plugin` under callgrind
/// shows both). The same texts parse: outside its strings JSON is ASCII, so a byte sequence that
/// is not UTF-8 is an error either way (reported here with its byte offset). Every parse in
/// the SDK goes through here, so a plugin holds one copy of each type's decoding code (for
/// serde_json's `str` reader), not two.
pub(crate) fn parse_json<T: DeserializeOwned>(json: &[u8]) -> Result<T, serde_json::Error> {
    let text = utf8(json).map_err(|at| {
        <serde_json::Error as serde::de::Error>::custom(format_args!("not UTF-8 at byte {at}"))
    })?;
    serde_json::from_str(text)
}

/// `bytes` as text if they are UTF-8; otherwise the offset of the first byte that is not.
///
/// The ASCII prefix is checked first, 32 bytes per step ([`ascii_prefix`]); core's
/// validator takes the rest. On wasm32 core's ASCII fast path steps 8 bytes at a time (two
/// `usize` words), and JSON is nearly all ASCII, so the wider steps take a fraction of the
/// instructions `std::str::from_utf8` alone would (`cargo bench -p wasmctrl --bench plugin`
/// under callgrind shows both). A run of ASCII followed by valid UTF-8 is valid UTF-8, so
/// the answer is the same.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, usize> {
    let ascii = ascii_prefix(bytes);
    match std::str::from_utf8(&bytes[ascii..]) {
        // SAFETY: `bytes[..ascii]` is ASCII and `bytes[ascii..]` is UTF-8, so `bytes` is.
        Ok(_) => Ok(unsafe { std::str::from_utf8_unchecked(bytes) }),
        Err(e) => Err(ascii + e.valid_up_to()),
    }
}

/// The length of the longest prefix of `bytes` made of whole 32-byte blocks that are all
/// ASCII (so it may stop short of the first non-ASCII byte, never past it). The four words
/// of a block are written out: at opt-level "s" a loop over them stays a loop.
fn ascii_prefix(bytes: &[u8]) -> usize {
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let (words, _) = bytes.as_chunks::<8>();
    let mut at = 0;
    while at + 4 <= words.len() {
        let any = u64::from_ne_bytes(words[at])
            | u64::from_ne_bytes(words[at + 1])
            | u64::from_ne_bytes(words[at + 2])
            | u64::from_ne_bytes(words[at + 3]);
        if any & HIGH_BITS != 0 {
            break;
        }
        at += 4;
    }
    at * 8
}

/// An object as the host hands it over: JSON bytes, parsed only on demand.
///
/// Used where the kind is not known statically: the notification hooks, `map` and
/// `filter`, which the host calls for every kind the plugin watches.
#[derive(Clone, PartialEq, Eq)]
pub struct RawObject {
    json: Vec<u8>,
}

impl RawObject {
    /// Wraps JSON bytes.
    pub fn from_json(json: Vec<u8>) -> Self {
        RawObject { json }
    }
    /// The JSON bytes.
    pub fn json(&self) -> &[u8] {
        &self.json
    }
    /// The JSON bytes, owned.
    pub fn into_json(self) -> Vec<u8> {
        self.json
    }
    /// Parses the whole object as `K`.
    pub fn parse<K: Kind>(&self) -> Result<K, Error> {
        from_json(&self.json)
    }
    /// Parses the whole object as any deserialisable type (e.g. `serde_json::Value`).
    pub fn parse_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        parse_json(&self.json).map_err(|e| Error::json("decoding object", e))
    }
    /// Parses only `metadata` (the rest is skipped without allocating).
    pub fn meta(&self) -> Result<ObjectMeta, Error> {
        #[derive(serde::Deserialize)]
        struct MetaOnly {
            #[serde(default)]
            metadata: ObjectMeta,
        }
        parse_json::<MetaOnly>(&self.json)
            .map(|m| m.metadata)
            .map_err(|e| Error::json("decoding metadata", e))
    }
}

impl std::fmt::Debug for RawObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RawObject").field(&String::from_utf8_lossy(&self.json)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde::Deserialize;

    #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
    struct Widget {
        #[serde(default)]
        metadata: ObjectMeta,
        size: u32,
    }
    crate::impl_kind!(Widget, "example.com/v1", "Widget");

    #[test]
    fn k8s_openapi_types_are_kinds() {
        assert_eq!(Gvk::of::<ConfigMap>(), Gvk::new("v1", "ConfigMap"));
        assert_eq!(Gvk::of::<Deployment>(), Gvk::new("apps/v1", "Deployment"));
        assert!(Gvk::new("apps/v1", "Deployment").is::<Deployment>());
        assert!(!Gvk::new("v1", "Deployment").is::<Deployment>());
        assert_eq!(Gvk::of::<Deployment>().group(), "apps");
        assert_eq!(Gvk::of::<ConfigMap>().group(), "");
    }

    #[test]
    fn to_json_adds_api_version_and_kind_to_crd_structs() {
        let w = Widget { metadata: ObjectMeta { name: Some("w".into()), ..Default::default() }, size: 3 };
        let v: serde_json::Value = serde_json::from_slice(&to_json(&w).unwrap()).unwrap();
        assert_eq!(v["apiVersion"], "example.com/v1");
        assert_eq!(v["kind"], "Widget");
        assert_eq!(v["size"], 3);
        assert_eq!(from_json::<Widget>(&to_json(&w).unwrap()).unwrap(), w);
    }

    #[test]
    fn to_json_keeps_k8s_openapi_fields() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_slice(&to_json(&cm).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})
        );
    }

    #[test]
    fn raw_object_parses_metadata_only_and_whole() {
        let raw = RawObject::from_json(
            br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"b","labels":{"x":"y"}},"data":{"k":"v"}}"#.to_vec(),
        );
        let meta = raw.meta().unwrap();
        assert_eq!(meta.name.as_deref(), Some("a"));
        let cm: ConfigMap = raw.parse().unwrap();
        assert_eq!(cm.key(), "b/a");
        assert_eq!(cm.label("x"), Some("y"));
        assert!(raw.parse::<Widget>().unwrap_err().is_json());
    }

    #[test]
    fn utf8_agrees_with_core_wherever_the_first_non_ascii_byte_is() {
        // Every length to three blocks and a half; a valid two-byte character, a lone
        // continuation byte or a truncated sequence at every position.
        for n in 0..112 {
            let ascii: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            assert_eq!(utf8(&ascii), Ok(std::str::from_utf8(&ascii).unwrap()), "n={n}");
            for at in 0..n {
                for insert in [&b"\xc3\xa9"[..], b"\x80", b"\xe2\x9c"] {
                    let mut text = ascii.clone();
                    text.splice(at..at, insert.iter().copied());
                    let expected = std::str::from_utf8(&text).map_err(|e| e.valid_up_to());
                    assert_eq!(utf8(&text), expected, "n={n} at={at} insert={insert:?}");
                }
            }
        }
    }

    #[test]
    fn from_json_parses_utf8_text_and_names_the_first_byte_that_is_not() {
        let cm: ConfigMap =
            from_json(r#"{"metadata":{"name":"caf\u00e9"},"data":{"k":"é ✓"}}"#.as_bytes()).unwrap();
        assert_eq!(cm.name(), "café");
        assert_eq!(cm.data.unwrap()["k"], "é ✓");
        // A lone continuation byte inside a string value.
        let mut bad = br#"{"metadata":{},"data":{"k":"ab"}}"#.to_vec();
        bad[28] = 0x80;
        let err = from_json::<ConfigMap>(&bad).unwrap_err().to_string();
        assert!(err.contains("decoding ConfigMap") && err.contains("not UTF-8 at byte 28"), "{err}");
        // Outside strings it is a syntax error in any case.
        assert!(from_json::<ConfigMap>(b"{\"data\":{}}\xff").is_err());
    }

    #[test]
    fn kind_ext_reads_metadata() {
        let mut cm = ConfigMap::default();
        assert_eq!(cm.name(), "");
        assert_eq!(cm.key(), "");
        assert!(!cm.is_being_deleted());
        cm.meta_mut().name = Some("n".into());
        assert_eq!(cm.key(), "n");
    }
}
