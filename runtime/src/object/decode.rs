//! Reading an object's metadata from its JSON: one pass over the bytes decodes the envelope
//! (whether `apiVersion` / `kind` are there) and `metadata`, skipping every other member
//! without copying it; and finding one member of a JSON object without building the map.
//!
//! Invariants:
//! - Nothing but the metadata an [`Object`] keeps is copied out of the bytes; every other
//!   member is validated and skipped.
//! - A JSON syntax error anywhere wins over a data error met first inside the metadata, so
//!   the reflector can tell a broken list body from one undecodable object.
//! - Any input is an object or an [`ObjectError`], never a panic.

use std::fmt;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::meta::{self, MetaBuilder, Pairs, Text};
use super::{LAST_APPLIED_ANNOTATION, Object, ObjectError, OwnerRef};

/// The top level of an object: only whether the type meta is there, and its metadata,
/// decoded in the same pass (every other member is skipped, validated, never copied).
#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    kind: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    metadata: Option<FromMap<RawMetadata<'a>>>,
}

/// A derived struct decoded from a JSON object only. serde's derive also accepts an array
/// of the fields in declaration order (`"metadata": ["n"]` would read as the name `n`);
/// the API server never sends one and Go's decoder refuses it, so this does too.
pub(crate) struct FromMap<T>(pub(crate) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for FromMap<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapOnly<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for MapOnly<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(MapOnly(std::marker::PhantomData)).map(FromMap)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawMetadata<'a> {
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
    pub(super) annotations: Option<Pairs<'a>>,
    #[serde(default)]
    owner_references: Option<Vec<FromMap<OwnerRef>>>,
    /// Present (`null` included: it is cut out all the same) or not.
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) managed_fields: Option<&'a RawValue>,
}

/// A member's raw value whatever it is, `null` included (`Option<&RawValue>` alone reads a
/// `null` as absent, and a transform that cuts the member out would leave it in).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue as Deserialize<'de>>::deserialize(d).map(Some)
}

/// Which of `apiVersion` / `kind` an object's JSON has.
pub(super) struct TypeMetaPresent {
    pub(super) api_version: bool,
    pub(super) kind: bool,
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
pub(super) fn parse_envelope(raw: &[u8]) -> Result<(TypeMetaPresent, RawMetadata<'_>), ObjectError> {
    let parsed = match std::str::from_utf8(raw) {
        Ok(text) => serde_json::from_str::<FromMap<RawEnvelope<'_>>>(text),
        Err(_) => serde_json::from_slice::<FromMap<RawEnvelope<'_>>>(raw),
    };
    match parsed {
        Ok(FromMap(env)) => {
            let present =
                TypeMetaPresent { api_version: env.api_version.is_some(), kind: env.kind.is_some() };
            Ok((present, env.metadata.ok_or(ObjectError::MissingName)?.0))
        }
        Err(e) if e.is_data() => match serde_json::from_slice::<serde::de::IgnoredAny>(raw) {
            Err(syntax) if !syntax.is_data() => Err(syntax.into()),
            _ => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// The metadata an [`Object`] keeps, read from its raw form; both constructors go through it.
pub(super) struct MetaFields {
    key: Box<str>,
    namespace_len: usize,
    generation: Option<i64>,
    meta: meta::Meta,
    owner_references: Box<[OwnerRef]>,
}

impl MetaFields {
    /// `m` was parsed from `raw`; `edits` (sorted `(start, end, inserted length)`) turn `raw`
    /// into the bytes the object keeps; `drop_last_applied` leaves that annotation out.
    pub(super) fn from_raw(
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
            owner_references: m.owner_references.unwrap_or_default().into_iter().map(|r| r.0).collect(),
        })
    }

    pub(super) fn into_object(self, raw: Bytes) -> Object {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::object::{Object, ObjectError, Transform};

    fn text(o: &Object) -> &str {
        std::str::from_utf8(o.json()).unwrap()
    }

    #[test]
    fn metadata_and_objects_must_be_json_objects_not_arrays() {
        // serde's derive reads an array as a struct's fields in order; Go's decoder refuses
        // it, and so must the host (found by the `object_meta` fuzz target).
        for input in [
            r#"{ "metadata" : [ "n"   ]}"#,
            r#"[null, null, {"name":"n"}]"#,
            r#"{"metadata":{"name":"n","ownerReferences":[["v1","K","o","u",true]]}}"#,
        ] {
            let bytes = Bytes::copy_from_slice(input.as_bytes());
            let error = Object::from_json(bytes).expect_err(input).to_string();
            assert!(error.contains("expected a JSON object"), "{input}: {error}");
            let error = Object::from_api_json(input.as_bytes(), None, Transform::default())
                .expect_err(input)
                .to_string();
            assert!(error.contains("expected a JSON object"), "{input}: {error}");
        }
        let ok = Object::from_json(Bytes::from_static(
            br#"{"metadata":{"name":"n","ownerReferences":[{"apiVersion":"v1","kind":"K","name":"o","uid":"u"}]}}"#,
        ))
        .expect("an object");
        assert_eq!(&*ok.owner_references()[0].name, "o");
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
    fn api_json_rejects_garbage_without_panicking() {
        for bad in
            [&b"not json"[..], b"{}", b"{\"metadata\":{}}", b"[1,2]", b"{\"metadata\":{\"name\":1}}", b""]
        {
            assert!(Object::from_api_json(bad, Some(("v1", "X")), Transform::default()).is_err());
        }
    }
}
