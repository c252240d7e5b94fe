//! What is dropped from an object before it is cached (client-go's `TransformFunc`), and the
//! type meta a list item lacks put in: the constructor of objects from what the API server
//! sent ([`Object::from_api_json`]).
//!
//! Invariants:
//! - The kept bytes are the received bytes with exactly the transform's members cut out and
//!   the missing `apiVersion` / `kind` inserted; the object is never re-serialised on this
//!   path, so every other byte (member order, spacing, number spelling) is as received.
//! - Where the bytes cannot be cut safely (an escaped key spelling, a duplicate key), the
//!   object is parsed, edited as a tree and serialised instead: the result is the same
//!   object, never one with the member left in.
//! - The metadata kept beside the bytes is read from the edited bytes' positions, so the
//!   two never disagree.

use bytes::Bytes;

use super::decode::{MetaFields, parse_envelope};
use super::meta::offset_in;
use super::{Object, ObjectError};

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

#[cfg(test)]
mod tests {
    use crate::object::{LAST_APPLIED_ANNOTATION, Object, Transform};

    fn text(o: &Object) -> &str {
        std::str::from_utf8(o.json()).unwrap()
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
            // A `null` value is a member all the same (found by fuzzing: it was kept).
            (r#"{"metadata":{"name":"x","managedFields":null}}"#, r#"{"metadata":{"name":"x"}}"#),
            (
                "{\"metadata\":{\"name\":\"x\",\n\"managedFields\"\n: \nnull\n}}",
                "{\"metadata\":{\"name\":\"x\"\n}}",
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
}
