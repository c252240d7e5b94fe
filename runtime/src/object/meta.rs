//! The metadata strings an [`Object`](super::Object) keeps (uid, resourceVersion,
//! deletionTimestamp, labels, annotations), stored as ranges of the object's own JSON bytes.
//!
//! Why: the cache holds every object of a kind, and copying each of these strings into an
//! allocation of its own adds, per string, an allocation header and pointers beside the copy
//! itself: for a small object with a few labels and annotations, a sizeable fraction of its
//! JSON. JSON spells almost every such string without escapes, so its bytes in the object's
//! JSON *are* the string: a range of 8 bytes replaces the copy. (`cargo bench -p wasmctrl
//! --bench informer` measures the cache's bytes per object against the JSON size.)
//!
//! Invariants:
//! - A [`Span`] addresses either the object's JSON bytes or [`Meta`]'s side buffer (strings
//!   the JSON spells with escapes, decoded); a span over the JSON never covers an escape, so
//!   its bytes are the decoded string.
//! - Spans over the JSON are valid for the bytes the object finally keeps: when those bytes
//!   are edited after parsing (type meta inserted, managedFields or an annotation cut out),
//!   [`MetaBuilder::finish`] moves each span by the edits before it; no kept string lies in an
//!   edited range.
//! - Labels and annotations are sorted by key, one pair per key (the last one, as Go's JSON
//!   decoding keeps), `null` values left out.
//! - Reading a span never panics: a range that does not resolve (impossible by the above)
//!   reads as the empty string.

use std::borrow::Cow;

use serde::Deserialize;
#[cfg(test)]
use serde_json::value::RawValue;

use super::ObjectError;

/// One string: `len` bytes from `start`, in the side buffer when `start`'s top bit is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

const IN_EXTRA: u32 = 1 << 31;

impl Span {
    const EMPTY: Span = Span { start: 0, len: 0 };

    fn in_extra(self) -> bool {
        self.start & IN_EXTRA != 0
    }
}

/// Fixed positions in [`Meta::spans`]; label pairs follow, then annotation pairs.
const UID: usize = 0;
const RESOURCE_VERSION: usize = 1;
const DELETION_TIMESTAMP: usize = 2;
const PAIRS: usize = 3;

/// The stored metadata strings of one object.
#[derive(Debug, Default)]
pub(super) struct Meta {
    spans: Box<[Span]>,
    /// Strings the JSON spells with escapes, decoded (empty, and unallocated, when none).
    extra: Box<str>,
    /// Number of label pairs (the annotation pairs are the rest).
    labels: u32,
    has_deletion_timestamp: bool,
}

impl Meta {
    fn resolve<'a>(&'a self, raw: &'a [u8], span: Span) -> &'a str {
        let (bytes, start) =
            if span.in_extra() { (self.extra.as_bytes(), span.start & !IN_EXTRA) } else { (raw, span.start) };
        let (start, len) = (start as usize, span.len as usize);
        bytes.get(start..start + len).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or("")
    }

    /// Bytes of metadata copied out of the JSON (escaped strings only).
    #[cfg(test)]
    pub fn copied_bytes(&self) -> usize {
        self.extra.len()
    }

    fn at<'a>(&'a self, raw: &'a [u8], i: usize) -> &'a str {
        self.resolve(raw, self.spans.get(i).copied().unwrap_or(Span::EMPTY))
    }

    pub fn uid<'a>(&'a self, raw: &'a [u8]) -> &'a str {
        self.at(raw, UID)
    }

    pub fn resource_version<'a>(&'a self, raw: &'a [u8]) -> &'a str {
        self.at(raw, RESOURCE_VERSION)
    }

    pub fn deletion_timestamp<'a>(&'a self, raw: &'a [u8]) -> Option<&'a str> {
        self.has_deletion_timestamp.then(|| self.at(raw, DELETION_TIMESTAMP))
    }

    fn pairs(&self, labels: bool) -> &[Span] {
        let split = PAIRS + 2 * self.labels as usize;
        let range = if labels { PAIRS..split } else { split..self.spans.len() };
        self.spans.get(range).unwrap_or_default()
    }

    /// Labels (`labels`) or annotations, sorted by key.
    pub fn iter<'a>(&'a self, raw: &'a [u8], labels: bool) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.pairs(labels).chunks_exact(2).map(move |p| (self.resolve(raw, p[0]), self.resolve(raw, p[1])))
    }

    /// The value of the label (`labels`) or annotation `key`.
    pub fn get<'a>(&'a self, raw: &'a [u8], labels: bool, key: &str) -> Option<&'a str> {
        let pairs = self.pairs(labels);
        let n = pairs.len() / 2;
        // Binary search over the sorted keys.
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.resolve(raw, pairs[2 * mid]).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.resolve(raw, pairs[2 * mid + 1])),
            }
        }
        None
    }
}

/// A JSON string as the parser gave it: borrowed from the input when it has no escapes.
pub(super) struct Text<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// A JSON object of strings (labels or annotations) as read in document order, decoded in the
/// same pass as the rest of the metadata (serde_json's `Map` would copy every string).
pub(super) struct Pairs<'a>(Vec<(Text<'a>, Option<Text<'a>>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Pairs<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(k) = map.next_key::<Text<'a>>()? {
                    out.push((k, map.next_value::<Option<Text<'a>>>()?));
                }
                Ok(Pairs(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl<'a> Pairs<'a> {
    /// How many members have key `key` (duplicates and `null` values included).
    pub fn count_key(&self, key: &str) -> usize {
        self.0.iter().filter(|(k, _)| k.0 == key).count()
    }

    /// The key `key` as decoded (the first member spelled so).
    pub fn key_text(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k.0 == key).map(|(k, _)| &*k.0)
    }

    /// The pairs sorted by key, the last of duplicate keys kept, `null` values left out.
    pub fn sorted(self) -> Vec<(Text<'a>, Text<'a>)> {
        let mut pairs = self.0;
        // Stable sort, then keep the last of each run of equal keys.
        pairs.sort_by(|a, b| a.0.0.cmp(&b.0.0));
        pairs.dedup_by(|later, earlier| {
            let same = later.0.0 == earlier.0.0;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        // Same size and alignment: collected in place, no second allocation.
        pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect()
    }
}

/// Key/value pairs of a JSON object of strings, sorted by key, the last of duplicate keys
/// kept, `null` values left out.
#[cfg(test)]
pub(super) fn string_pairs(raw: &RawValue) -> Result<Vec<(Text<'_>, Text<'_>)>, serde_json::Error> {
    Ok(serde_json::from_str::<Option<Pairs<'_>>>(raw.get())?.map(Pairs::sorted).unwrap_or_default())
}

/// Collects spans over the bytes `raw` that were parsed (before any edit).
pub(super) struct MetaBuilder<'r> {
    raw: &'r [u8],
    spans: Vec<Span>,
    extra: String,
}

impl<'r> MetaBuilder<'r> {
    pub fn new(raw: &'r [u8]) -> Result<Self, ObjectError> {
        // Spans address up to 2 GiB (the top bit tells the buffers apart); the API server's
        // limit on an object is a few MiB.
        if raw.len() >= IN_EXTRA as usize {
            return Err(ObjectError::TooLarge(raw.len()));
        }
        Ok(MetaBuilder { raw, spans: Vec::new(), extra: String::new() })
    }

    fn span(&mut self, s: &str) -> Result<Span, ObjectError> {
        let len = u32::try_from(s.len()).map_err(|_| ObjectError::TooLarge(s.len()))?;
        if let Some(start) = offset_in(self.raw, s) {
            // Within `raw` (checked above to be < 2 GiB).
            return Ok(Span { start: start as u32, len });
        }
        let start = self.extra.len();
        if start + s.len() >= IN_EXTRA as usize {
            return Err(ObjectError::TooLarge(start + s.len()));
        }
        self.extra.push_str(s);
        Ok(Span { start: start as u32 | IN_EXTRA, len })
    }

    fn text(&mut self, t: Option<&Text<'_>>) -> Result<Span, ObjectError> {
        // An escaped string was decoded into a buffer of its own, not in `raw`: `span` copies it.
        t.map_or(Ok(Span::EMPTY), |t| self.span(&t.0))
    }

    /// The spans in their fixed order; `edits` are the `(start, end, inserted length)` edits
    /// (sorted, not overlapping) that turn the parsed bytes into the bytes the object keeps.
    pub fn finish(
        mut self,
        uid: Option<&Text<'_>>,
        resource_version: Option<&Text<'_>>,
        deletion_timestamp: Option<&Text<'_>>,
        labels: &[(Text<'_>, Text<'_>)],
        annotations: &[(Text<'_>, Text<'_>)],
        edits: &[(usize, usize, usize)],
    ) -> Result<Meta, ObjectError> {
        self.spans.reserve_exact(PAIRS + 2 * (labels.len() + annotations.len()));
        let fixed = [uid, resource_version, deletion_timestamp];
        for t in fixed {
            let s = self.text(t)?;
            self.spans.push(s);
        }
        for (k, v) in labels {
            let (k, v) = (self.text(Some(k))?, self.text(Some(v))?);
            self.spans.extend([k, v]);
        }
        for (k, v) in annotations {
            let (k, v) = (self.text(Some(k))?, self.text(Some(v))?);
            self.spans.extend([k, v]);
        }
        if !edits.is_empty() {
            for span in self.spans.iter_mut().filter(|s| !s.in_extra() && s.len > 0) {
                let at = span.start as usize;
                let mut moved = at as i64;
                for &(start, end, inserted) in edits {
                    if end <= at {
                        moved += inserted as i64 - (end - start) as i64;
                    }
                }
                span.start = u32::try_from(moved).map_err(|_| ObjectError::TooLarge(at))?;
            }
        }
        Ok(Meta {
            spans: self.spans.into_boxed_slice(),
            extra: self.extra.into_boxed_str(),
            labels: u32::try_from(labels.len()).map_err(|_| ObjectError::TooLarge(labels.len()))?,
            has_deletion_timestamp: deletion_timestamp.is_some(),
        })
    }
}

/// Byte offset of `inner` (a sub-slice of `outer`) within `outer`.
pub(super) fn offset_in(outer: &[u8], inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs_of(json: &str) -> Vec<(String, String)> {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        string_pairs(raw).unwrap().into_iter().map(|(k, v)| (k.0.into_owned(), v.0.into_owned())).collect()
    }

    #[test]
    fn pairs_are_sorted_deduplicated_keeping_the_last_and_skip_nulls() {
        let got = pairs_of(r#"{"b":"1","a":"2","b":"3","n":null,"e":"x\"y"}"#);
        let want = [("a", "2"), ("b", "3"), ("e", "x\"y")];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        assert!(pairs_of("null").is_empty());
    }

    #[test]
    fn escaped_strings_go_to_the_side_buffer_and_plain_ones_point_into_the_json() {
        let raw = br#"{"a":"plain","b":"esc\"aped"}"#;
        let v: std::collections::BTreeMap<&str, &RawValue> = serde_json::from_slice(raw).unwrap();
        let plain: Text<'_> = serde_json::from_str(v["a"].get()).unwrap();
        let escaped: Text<'_> = serde_json::from_str(v["b"].get()).unwrap();
        assert!(matches!(plain.0, Cow::Borrowed(_)));
        assert!(matches!(escaped.0, Cow::Owned(_)));
        let meta =
            MetaBuilder::new(raw).unwrap().finish(Some(&plain), Some(&escaped), None, &[], &[], &[]).unwrap();
        assert_eq!(meta.uid(raw), "plain");
        assert_eq!(meta.resource_version(raw), "esc\"aped");
        assert_eq!(&*meta.extra, "esc\"aped", "only the escaped string is copied");
        assert_eq!(meta.deletion_timestamp(raw), None);
    }

    #[test]
    fn spans_move_with_the_edits_before_them() {
        // "XX" inserted at 0, then 3 bytes cut at 4..7: a string at 10 moves to 10 + 2 - 3.
        let raw = br#"0123456789uid"#;
        let uid = Text(Cow::Borrowed(std::str::from_utf8(&raw[10..13]).unwrap()));
        let meta = MetaBuilder::new(raw)
            .unwrap()
            .finish(Some(&uid), None, None, &[], &[], &[(0, 0, 2), (4, 7, 0)])
            .unwrap();
        let edited = b"XX0123789uid";
        assert_eq!(meta.uid(edited), "uid");
    }

    #[test]
    fn lookups_binary_search_the_sorted_keys() {
        let raw = br#"{"c":"3","a":"1","b":"2"}"#;
        let rv: &RawValue = serde_json::from_slice(raw).unwrap();
        let labels = string_pairs(rv).unwrap();
        let meta = MetaBuilder::new(raw).unwrap().finish(None, None, None, &labels, &[], &[]).unwrap();
        for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
            assert_eq!(meta.get(raw, true, k), Some(v));
        }
        assert_eq!(meta.get(raw, true, "d"), None);
        assert_eq!(meta.get(raw, false, "a"), None);
        assert_eq!(meta.iter(raw, true).collect::<Vec<_>>(), [("a", "1"), ("b", "2"), ("c", "3")]);
    }
}
