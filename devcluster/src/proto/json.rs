//! The JSON form of prost's field types, as Go's `encoding/json` writes the Kubernetes types.
//!
//! Invariants:
//! - A field is left out where Go's `omitempty` leaves it out: an absent or empty string, a
//!   zero number, `false`, an empty list or map. The Go clients' protobuf encoding writes
//!   every non-pointer field, zero or not, and does not say which fields are pointers, so an
//!   explicit `0` or `false` in a pointer field reads as unset (documented in
//!   `docs/dev-cluster.md`).
//! - A message that is present is kept, even when empty (`emptyDir: {}` selects a volume
//!   source); list items and map values are kept whatever their value.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Map, Value};

/// A prost field type (or message) rendered as JSON.
pub(crate) trait ToJson {
    /// The JSON value.
    fn value(&self) -> Value;
    /// Whether Go's `omitempty` leaves the field out.
    fn omitted(&self) -> bool {
        false
    }
}

impl ToJson for String {
    fn value(&self) -> Value {
        Value::String(self.clone())
    }
    fn omitted(&self) -> bool {
        self.is_empty()
    }
}

impl ToJson for bool {
    fn value(&self) -> Value {
        Value::Bool(*self)
    }
    fn omitted(&self) -> bool {
        !*self
    }
}

impl ToJson for i32 {
    fn value(&self) -> Value {
        Value::from(*self)
    }
    fn omitted(&self) -> bool {
        *self == 0
    }
}

impl ToJson for i64 {
    fn value(&self) -> Value {
        Value::from(*self)
    }
    fn omitted(&self) -> bool {
        *self == 0
    }
}

impl ToJson for f64 {
    fn value(&self) -> Value {
        serde_json::Number::from_f64(*self).map_or(Value::Null, Value::Number)
    }
    fn omitted(&self) -> bool {
        *self == 0.0
    }
}

impl<T: ToJson> ToJson for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, T::value)
    }
    fn omitted(&self) -> bool {
        self.as_ref().is_none_or(T::omitted)
    }
}

impl<T: ToJson> ToJson for Box<T> {
    fn value(&self) -> Value {
        T::value(self)
    }
    fn omitted(&self) -> bool {
        T::omitted(self)
    }
}

impl<T: ToJson> ToJson for Vec<T> {
    fn value(&self) -> Value {
        Value::Array(self.iter().map(T::value).collect())
    }
    fn omitted(&self) -> bool {
        self.is_empty()
    }
}

impl<T: ToJson> ToJson for BTreeMap<String, T> {
    fn value(&self) -> Value {
        Value::Object(self.iter().map(|(k, v)| (k.clone(), v.value())).collect())
    }
    fn omitted(&self) -> bool {
        self.is_empty()
    }
}

fn base64(bytes: &[u8]) -> Value {
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Sets `name` unless the value is omitted.
pub(crate) fn put<T: ToJson>(m: &mut Map<String, Value>, name: &str, v: &T) {
    if !v.omitted() {
        m.insert(name.to_owned(), v.value());
    }
}

/// A `bytes` field: base64, as Go writes `[]byte`.
pub(crate) fn put_bytes(m: &mut Map<String, Value>, name: &str, v: &Option<Vec<u8>>) {
    if let Some(b) = v.as_ref().filter(|b| !b.is_empty()) {
        m.insert(name.to_owned(), base64(b));
    }
}

/// A `map<string, bytes>` field (Secret and ConfigMap data): base64 values.
pub(crate) fn put_bytes_map(m: &mut Map<String, Value>, name: &str, v: &BTreeMap<String, Vec<u8>>) {
    if !v.is_empty() {
        m.insert(name.to_owned(), Value::Object(v.iter().map(|(k, b)| (k.clone(), base64(b))).collect()));
    }
}

/// A Go struct embedded in another: its fields go inline into the outer object.
pub(crate) fn put_inline<T: ToJson>(m: &mut Map<String, Value>, v: &Option<T>) {
    if let Some(Value::Object(inner)) = v.as_ref().map(T::value) {
        m.extend(inner);
    }
}
