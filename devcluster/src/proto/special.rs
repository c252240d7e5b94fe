//! The messages whose JSON form is not an object of their fields: times, quantities,
//! int-or-string, raw JSON and the CRD schema's either-or types. Written by hand because each
//! has its own Go `MarshalJSON`; `cargo xtask gen-proto-json` skips them.

use k8s_openapi::jiff::Timestamp;
use k8s_pb as pb;
use serde_json::Value;

use super::json::ToJson;

use pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as ext;
use pb::apimachinery::pkg::apis::meta::v1 as meta;

/// A timestamp, or `None` for Go's zero time (which Go's protobuf encoding writes as an
/// empty message and its JSON encoding as `null`).
fn timestamp(seconds: Option<i64>, nanos: Option<i32>) -> Option<Timestamp> {
    let (s, n) = (seconds.unwrap_or(0), nanos.unwrap_or(0));
    if s == 0 && n == 0 {
        return None;
    }
    Timestamp::new(s, n).ok()
}

impl ToJson for meta::Time {
    /// RFC 3339 in seconds, as `metav1.Time` marshals.
    fn value(&self) -> Value {
        timestamp(self.seconds, self.nanos)
            .map_or(Value::Null, |t| Value::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
    }
    fn omitted(&self) -> bool {
        timestamp(self.seconds, self.nanos).is_none()
    }
}

impl ToJson for meta::MicroTime {
    /// RFC 3339 with microseconds, as `metav1.MicroTime` marshals.
    fn value(&self) -> Value {
        timestamp(self.seconds, self.nanos).map_or(Value::Null, |t| {
            let micros = t.subsec_nanosecond() / 1000;
            Value::String(format!("{}.{micros:06}Z", t.strftime("%Y-%m-%dT%H:%M:%S")))
        })
    }
    fn omitted(&self) -> bool {
        timestamp(self.seconds, self.nanos).is_none()
    }
}

impl ToJson for meta::FieldsV1 {
    fn value(&self) -> Value {
        raw_json(self.raw.as_deref())
    }
}

impl ToJson for pb::apimachinery::pkg::runtime::RawExtension {
    fn value(&self) -> Value {
        raw_json(self.raw.as_deref())
    }
}

impl ToJson for ext::Json {
    fn value(&self) -> Value {
        raw_json(self.raw.as_deref())
    }
}

/// Embedded JSON bytes as a value (`null` when empty or not JSON, as Go writes an empty one).
fn raw_json(raw: Option<&[u8]>) -> Value {
    raw.and_then(|r| serde_json::from_slice(r).ok()).unwrap_or(Value::Null)
}

impl ToJson for pb::apimachinery::pkg::util::intstr::IntOrString {
    /// `type` 1 is a string, anything else an integer.
    fn value(&self) -> Value {
        if self.r#type == Some(1) {
            Value::String(self.str_val.clone().unwrap_or_default())
        } else {
            Value::from(self.int_val.unwrap_or(0))
        }
    }
}

impl ToJson for pb::apimachinery::pkg::api::resource::Quantity {
    fn value(&self) -> Value {
        Value::String(self.string.clone().unwrap_or_default())
    }
}

impl ToJson for ext::JsonSchemaPropsOrArray {
    fn value(&self) -> Value {
        match &self.schema {
            Some(s) => s.value(),
            None => self.j_son_schemas.value(),
        }
    }
}

impl ToJson for ext::JsonSchemaPropsOrBool {
    fn value(&self) -> Value {
        match &self.schema {
            Some(s) => s.value(),
            None => Value::Bool(self.allows.unwrap_or(false)),
        }
    }
}

impl ToJson for ext::JsonSchemaPropsOrStringArray {
    fn value(&self) -> Value {
        match &self.schema {
            Some(s) => s.value(),
            None => self.property.value(),
        }
    }
}
