//! The checks of the fuzz targets over what the API server sends: `object_meta` (the object
//! metadata scanner), `watch_stream` (the watch line splitter and event decoder) and
//! `list_body` (the list body splitter), each against a full parse of the same bytes.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::cache::{IndexFunc, IndexSpec};
use crate::object::{LAST_APPLIED_ANNOTATION, Object, Transform};
use crate::source::fuzzing::{
    DecodedEvent, ListBodyError, ListBodySplitter, WatchLines, WatchLinesError, decode_watch_event,
};

/// The caps the splitter checks pick from.
const CAPS: [usize; 4] = [16, 256, 4096, 1 << 20];

/// Whether any object in the JSON text `json` has a member twice.
fn has_duplicate_members(json: &[u8]) -> bool {
    struct Check(bool);
    impl<'de> serde::de::Visitor<'de> for &mut Check {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = BTreeSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key) {
                    self.0 = true;
                }
                map.next_value_seed(&mut *self)?;
            }
            Ok(())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(&mut *self)?.is_some() {}
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    impl<'de> serde::de::DeserializeSeed<'de> for &mut Check {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    let mut check = Check(false);
    let mut de = serde_json::Deserializer::from_slice(json);
    serde::de::DeserializeSeed::deserialize(&mut check, &mut de).is_ok() && check.0
}

/// The string pairs of `metadata.<field>`, `null` values left out.
fn pairs(meta: &Map<String, Value>, field: &str) -> BTreeMap<String, String> {
    match meta.get(field) {
        Some(Value::Object(m)) => {
            m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect()
        }
        _ => BTreeMap::new(),
    }
}

fn text<'a>(meta: &'a Map<String, Value>, field: &str) -> &'a str {
    meta.get(field).and_then(Value::as_str).unwrap_or("")
}

/// `Object::from_api_json` (one pass over an object's JSON that keeps its metadata strings as
/// ranges of the bytes, with the type meta inserted and managedFields / the last-applied
/// annotation cut out by splicing bytes), against a full parse of the same JSON:
/// - the bytes kept are JSON equal to the input with exactly those edits (the slow path's
///   semantics), and add no duplicate member the input did not have (checked when the input
///   is JSON to a full parse: the scanner, like Go's decoder, accepts invalid UTF-8 in the
///   strings it skips);
/// - name, namespace, uid, resourceVersion, labels and annotations read back as the full
///   parse says;
/// - building an object from the bytes kept gives the same bytes (the edits are idempotent);
/// - a field index over the object (a dotted path from the input) never panics.
///
/// Input: byte 0 picks the transform and whether list-item type meta is given, byte 1 the
/// length of an index path that follows, the rest is the object's JSON.
pub fn object_meta(data: &[u8]) {
    let (Some(&flags), Some(&path_len)) = (data.first(), data.get(1)) else { return };
    let rest = &data[2..];
    let (path, raw) = rest.split_at(usize::from(path_len).min(rest.len()));
    let transform = Transform { strip_managed_fields: flags & 1 != 0, strip_last_applied: flags & 2 != 0 };
    let type_meta = (flags & 4 != 0).then_some(("v1", "ConfigMap"));

    let Ok(obj) = Object::from_api_json(raw, type_meta, transform) else { return };
    let kept = obj.json();

    // Bytes that are not JSON to a full parse (invalid UTF-8 in a string the scanner skips,
    // which it accepts as Go's decoder does) are only checked for idempotence below.
    if let Ok(Value::Object(mut want)) = serde_json::from_slice::<Value>(raw) {
        let kept_value: Value =
            serde_json::from_slice(kept).expect("the bytes kept of a JSON object are JSON");
        if let Some((api_version, kind)) = type_meta {
            want.entry("apiVersion").or_insert_with(|| api_version.into());
            want.entry("kind").or_insert_with(|| kind.into());
        }
        if let Some(Value::Object(meta)) = want.get_mut("metadata") {
            if transform.strip_managed_fields {
                meta.remove("managedFields");
            }
            if transform.strip_last_applied
                && let Some(Value::Object(a)) = meta.get_mut("annotations")
            {
                a.remove(LAST_APPLIED_ANNOTATION);
            }
        }
        assert_eq!(kept_value, Value::Object(want.clone()), "kept {:?}", String::from_utf8_lossy(kept));
        if !has_duplicate_members(raw) {
            assert!(
                !has_duplicate_members(kept),
                "the edits duplicated a member: {:?}",
                String::from_utf8_lossy(kept)
            );
        }

        let meta = want.get("metadata").and_then(Value::as_object).expect("an object has metadata");
        assert_eq!(obj.name(), text(meta, "name"));
        let namespace = text(meta, "namespace");
        assert_eq!(obj.namespace().unwrap_or(""), namespace);
        assert_eq!(
            obj.key(),
            if namespace.is_empty() { obj.name().to_owned() } else { format!("{namespace}/{}", obj.name()) }
        );
        assert_eq!(obj.uid(), text(meta, "uid"));
        assert_eq!(obj.resource_version(), text(meta, "resourceVersion"));
        assert_eq!(obj.deletion_timestamp(), meta.get("deletionTimestamp").and_then(Value::as_str));
        let labels: BTreeMap<String, String> =
            obj.labels().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        assert_eq!(labels, pairs(meta, "labels"));
        let annotations: BTreeMap<String, String> =
            obj.annotations().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        assert_eq!(annotations, pairs(meta, "annotations"));
        for (k, v) in &labels {
            assert_eq!(obj.label(k), Some(v.as_str()));
        }
    }

    let again = Object::from_api_json(kept, type_meta, transform).expect("the bytes kept build an object");
    assert_eq!(again.json(), kept, "building from the bytes kept changes them");

    if let Ok(path) = std::str::from_utf8(path)
        && let Ok(index) = IndexFunc::from_spec(IndexSpec::Field(path.to_owned()))
    {
        let _ = index.values(&obj);
    }
    let _ = obj.owner_references();
    let _ = obj.controller_owner();
    let _ = obj.generation();
}

/// The watch line splitter (`WatchLines`, with its cap) and the event decoder, with any body
/// cut into any frames:
/// - the lines handed on are exactly the body's `\n`-separated parts, whatever the frames;
/// - no line over the cap is handed on and no more than the cap is kept between frames; a
///   refusal comes exactly when a line grows past it;
/// - decoding never panics; the resourceVersion followed is the last change's.
///
/// Input: byte 0 is the frame size (0: one frame), byte 1 picks the cap, the rest is the body.
pub fn watch_stream(data: &[u8]) {
    let (Some(&frame), Some(&cap)) = (data.first(), data.get(1)) else { return };
    let body = &data[2..];
    let max = CAPS[usize::from(cap) % CAPS.len()];
    let frame = if frame == 0 { body.len().max(1) } else { usize::from(frame) };

    // What the splitter must do: the body's parts up to the first over the cap.
    let mut parts: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    let rest = parts.pop().unwrap_or_default();
    let first_long = parts.iter().position(|p| p.len() > max);

    let mut splitter = WatchLines::new(max);
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut rv = String::new();
    let mut refused = None;
    for piece in body.chunks(frame) {
        let pushed = splitter.push(piece, |line| {
            assert!(line.len() <= max, "a line over the cap was handed on");
            lines.push(line.to_vec());
            match decode_watch_event(line, "v1", "ConfigMap", Transform::default(), &mut rv) {
                Ok(DecodedEvent::Change(obj)) => {
                    assert_eq!(rv, obj.resource_version(), "the version follows the change");
                    let _ = obj.key();
                }
                Ok(DecodedEvent::Nothing) | Err(_) => {}
            }
            Ok::<(), ()>(())
        });
        assert!(splitter.rest().len() <= max, "more than the cap kept between frames");
        if let Err(e) = pushed {
            refused = Some(e);
            break;
        }
    }
    match refused {
        Some(WatchLinesError::TooLong { len, limit }) => {
            assert_eq!(limit, max);
            assert!(len > max);
            // Refused at the first line over the cap (complete or not), after every line before it.
            let want = first_long.unwrap_or(parts.len());
            assert_eq!(lines.len(), want, "lines handed on before the refusal");
            assert!(first_long.is_some() || rest.len() > max);
        }
        Some(WatchLinesError::Line(())) => unreachable!("the consumer accepts every line"),
        None => {
            assert!(first_long.is_none() && rest.len() <= max, "a line over the cap passed");
            assert_eq!(lines, parts, "the lines are the body's parts");
            assert_eq!(splitter.rest(), rest);
        }
    }
}

/// The list body splitter (`ListBodySplitter`, with its cap), with any body cut into any
/// pieces, checked against a full parse:
/// - when the body is a JSON object whose `items` is an array of objects, the items handed on
///   are exactly its items (as JSON) and the envelope is the body with `"items":[]`;
/// - no item and no envelope over the cap is handed on or kept; a body whose items and
///   envelope all fit is never refused for size;
/// - any other input: an error or a result, never a panic.
///
/// Input: byte 0 is the piece size (0: one piece), byte 1 picks the cap, the rest is the body.
pub fn list_body(data: &[u8]) {
    let (Some(&piece), Some(&cap)) = (data.first(), data.get(1)) else { return };
    let body = &data[2..];
    let max = CAPS[usize::from(cap) % CAPS.len()];
    let piece = if piece == 0 { body.len().max(1) } else { usize::from(piece) };

    let mut splitter = ListBodySplitter::new(max);
    let mut items: Vec<Vec<u8>> = Vec::new();
    let mut result = Ok(());
    for chunk in body.chunks(piece) {
        result = splitter.push(chunk, |item| {
            assert!(item.len() <= max, "an item over the cap was handed on");
            items.push(item.to_vec());
        });
        if result.is_err() {
            break;
        }
    }
    let envelope = result.and_then(|()| splitter.finish());
    if let Ok(envelope) = &envelope {
        assert!(envelope.len() <= max, "an envelope over the cap");
    }

    // The oracle: a full parse of a well-formed list.
    let Ok(Value::Object(mut list)) = serde_json::from_slice::<Value>(body) else { return };
    let Some(Value::Array(want)) = list.get("items").cloned() else { return };
    if !want.iter().all(Value::is_object) || !body_has_one_items_member(body) {
        return;
    }
    match envelope {
        Ok(envelope) => {
            let got: Vec<Value> =
                items.iter().map(|i| serde_json::from_slice(i).expect("an item is JSON")).collect();
            assert_eq!(got, want, "the items");
            list.insert("items".into(), Value::Array(Vec::new()));
            let envelope: Value = serde_json::from_slice(&envelope).expect("the envelope is JSON");
            assert_eq!(envelope, Value::Object(list), "the envelope");
        }
        Err(ListBodyError::TooLarge { len, limit, .. }) => {
            assert!(len > limit && limit == max);
        }
        Err(e) => panic!("a well-formed list is refused: {e}"),
    }
}

/// Whether the body's top level spells `items` once (a duplicate member is read
/// differently by a full parse, which keeps the last, and by the splitter).
fn body_has_one_items_member(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Top {
        #[allow(dead_code)]
        items: serde::de::IgnoredAny,
    }
    serde_json::from_slice::<Top>(body).is_ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fuzzing::seeds;

    #[test]
    fn the_seeds_pass_the_fuzz_checks() {
        seeds("object_meta").iter().for_each(|s| object_meta(s));
        seeds("watch_stream").iter().for_each(|s| watch_stream(s));
        seeds("list_body").iter().for_each(|s| list_body(s));
    }

    /// A short JSON string's contents, escapes and non-ASCII included.
    fn text() -> impl Strategy<Value = String> {
        proptest::string::string_regex(r#"([a-z0-9.\-/]|\\"|\\\\|\\u00e9|é){0,8}"#)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// An object's JSON text: metadata with some of its strings, maps, managedFields and the
    /// last-applied annotation, members in any order, sometimes given twice.
    fn object_json() -> impl Strategy<Value = String> {
        let member = prop_oneof![
            text().prop_map(|t| format!(r#""name":"{t}""#)),
            text().prop_map(|t| format!(r#""namespace":"{t}""#)),
            text().prop_map(|t| format!(r#""uid":"{t}""#)),
            text().prop_map(|t| format!(r#""resourceVersion":"{t}""#)),
            (text(), text()).prop_map(|(k, v)| format!(r#""labels":{{"{k}":"{v}","b":null}}"#)),
            (text(), text()).prop_map(|(k, v)| format!(
                r#""annotations":{{"{k}":"{v}","{LAST_APPLIED_ANNOTATION}":"{{}}"}}"#
            )),
            Just(r#""managedFields":[{"manager":"m","fieldsV1":{"f:data":{}}}]"#.to_owned()),
            Just(r#""deletionTimestamp":"2024-01-01T00:00:00Z""#.to_owned()),
            Just(r#""ownerReferences":[{"apiVersion":"v1","kind":"X","name":"o","uid":"u","controller":true}]"#.to_owned()),
        ];
        let top = prop_oneof![
            Just(r#""apiVersion":"v1""#.to_owned()),
            Just(r#""kind":"ConfigMap""#.to_owned()),
            text().prop_map(|t| format!(r#""data":{{"k":"{t}"}}"#)),
            Just(r#""spec":{"a":[1,2.5,true,null,{"b":"c"}]}"#.to_owned()),
        ];
        (proptest::collection::vec(member, 0..6), proptest::collection::vec(top, 0..3), any::<bool>())
            .prop_map(|(members, top, meta_first)| {
                let meta = format!(r#""metadata":{{{}}}"#, members.join(","));
                let mut parts = top;
                if meta_first {
                    parts.insert(0, meta);
                } else {
                    parts.push(meta);
                }
                format!("{{{}}}", parts.join(","))
            })
    }

    /// A watch body: event lines (changes, bookmarks, errors, garbage), `\n`-separated.
    fn watch_body() -> impl Strategy<Value = String> {
        let line = prop_oneof![
            (prop_oneof![Just("ADDED"), Just("MODIFIED"), Just("DELETED"), Just("BOOKMARK")], object_json())
                .prop_map(|(t, o)| format!(r#"{{"type":"{t}","object":{o}}}"#)),
            Just(r#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#.to_owned()),
            Just(String::new()),
            proptest::string::string_regex(r#"[{}":,a-zA-Z0-9 ]{0,300}"#).unwrap_or_else(|e| panic!("{e}")),
        ];
        (proptest::collection::vec(line, 0..5), any::<bool>()).prop_map(|(lines, newline)| {
            let mut body = lines.join("\n");
            if newline {
                body.push('\n');
            }
            body
        })
    }

    /// A list body: an envelope with `items` of objects among other members.
    fn list_text() -> impl Strategy<Value = String> {
        (proptest::collection::vec(object_json(), 0..4), any::<bool>(), text()).prop_map(
            |(items, items_first, rv)| {
                let items = format!(r#""items":[{}]"#, items.join(" , "));
                let meta = format!(r#""metadata":{{"resourceVersion":"{rv}","continue":""}}"#);
                if items_first {
                    format!(r#"{{{items},"kind":"ConfigMapList",{meta}}}"#)
                } else {
                    format!(r#"{{"apiVersion":"v1","kind":"ConfigMapList",{meta},{items}}}"#)
                }
            },
        )
    }

    fn with_header(a: u8, b: u8, rest: &[u8]) -> Vec<u8> {
        let mut data = vec![a, b];
        data.extend_from_slice(rest);
        data
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn generated_objects_pass_the_fuzz_check(flags in any::<u8>(), path in "[a-z.\\[\\]]{0,12}", json in object_json()) {
            let path_len = u8::try_from(path.len()).unwrap_or(u8::MAX);
            let mut rest = path.into_bytes();
            rest.extend_from_slice(json.as_bytes());
            object_meta(&with_header(flags, path_len, &rest));
        }

        #[test]
        fn generated_watch_bodies_pass_the_fuzz_check(frame in any::<u8>(), cap in any::<u8>(), body in watch_body()) {
            watch_stream(&with_header(frame, cap, body.as_bytes()));
        }

        #[test]
        fn generated_list_bodies_pass_the_fuzz_check(piece in any::<u8>(), cap in any::<u8>(), body in list_text()) {
            list_body(&with_header(piece, cap, body.as_bytes()));
        }

        #[test]
        fn any_bytes_pass_the_fuzz_checks(data in proptest::collection::vec(any::<u8>(), 0..96)) {
            object_meta(&data);
            watch_stream(&data);
            list_body(&data);
        }
    }
}
