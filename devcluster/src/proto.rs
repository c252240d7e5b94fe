//! Decoding of the Kubernetes protobuf wire format for the request bodies kubectl sends as
//! `application/vnd.kubernetes.protobuf` (its `create configmap|secret|namespace`
//! generators use the typed client, which defaults to protobuf). Responses are always JSON.
//!
//! Only these kinds (and the ObjectMeta fields a client sets on create) are decoded; any
//! other protobuf body is rejected with 415, which is what a server that does not speak
//! protobuf for a type answers.

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

const MAGIC: &[u8] = b"k8s\0";

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!("malformed protobuf body: {what}"))
}

/// One protobuf field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// Iterates the fields of a protobuf message.
struct Fields<'a> {
    buf: &'a [u8],
}

fn varint(buf: &mut &[u8]) -> Result<u64, ApiError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first().ok_or_else(|| bad("truncated varint"))?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint too long"))
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Field<'a>), ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let mut step = || -> Result<(u64, Field<'a>), ApiError> {
            let key = varint(&mut self.buf)?;
            let (num, wire) = (key >> 3, key & 7);
            match wire {
                0 => Ok((num, Field::Varint(varint(&mut self.buf)?))),
                2 => {
                    let len = usize::try_from(varint(&mut self.buf)?).map_err(|_| bad("length"))?;
                    if len > self.buf.len() {
                        return Err(bad("truncated field"));
                    }
                    let (data, rest) = self.buf.split_at(len);
                    self.buf = rest;
                    Ok((num, Field::Bytes(data)))
                }
                1 => {
                    let (_, rest) = self.buf.split_at_checked(8).ok_or_else(|| bad("truncated fixed64"))?;
                    self.buf = rest;
                    Ok((num, Field::Varint(0)))
                }
                5 => {
                    let (_, rest) = self.buf.split_at_checked(4).ok_or_else(|| bad("truncated fixed32"))?;
                    self.buf = rest;
                    Ok((num, Field::Varint(0)))
                }
                _ => Err(bad("unsupported wire type")),
            }
        };
        let r = step();
        if r.is_err() {
            self.buf = &[];
        }
        Some(r)
    }
}

fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf }
}

fn string(b: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad("invalid UTF-8"))
}

/// A `map<string, string|bytes>` entry (key = 1, value = 2).
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), ApiError> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(x)) => k = string(x)?,
            (2, Field::Bytes(x)) if bytes_value => {
                v = Value::String(base64::engine::general_purpose::STANDARD.encode(x));
            }
            (2, Field::Bytes(x)) => v = Value::String(string(x)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn owner_reference(b: &[u8]) -> Result<Value, ApiError> {
    let mut o = Map::new();
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(x)) => {
                o.insert("kind".into(), Value::String(string(x)?));
            }
            (3, Field::Bytes(x)) => {
                o.insert("name".into(), Value::String(string(x)?));
            }
            (4, Field::Bytes(x)) => {
                o.insert("uid".into(), Value::String(string(x)?));
            }
            (5, Field::Bytes(x)) => {
                o.insert("apiVersion".into(), Value::String(string(x)?));
            }
            (6, Field::Varint(v)) => {
                o.insert("controller".into(), Value::Bool(v != 0));
            }
            (7, Field::Varint(v)) => {
                o.insert("blockOwnerDeletion".into(), Value::Bool(v != 0));
            }
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    let mut owners = Vec::new();
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), Value::String(string(x)?));
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), Value::String(string(x)?));
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), Value::String(string(x)?));
            }
            (5, Field::Bytes(x)) => {
                m.insert("uid".into(), Value::String(string(x)?));
            }
            (6, Field::Bytes(x)) => {
                m.insert("resourceVersion".into(), Value::String(string(x)?));
            }
            (11, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                labels.insert(k, v);
            }
            (12, Field::Bytes(x)) => {
                let (k, v) = map_entry(x, false)?;
                annotations.insert(k, v);
            }
            (13, Field::Bytes(x)) => owners.push(owner_reference(x)?),
            (14, Field::Bytes(x)) => finalizers.push(Value::String(string(x)?)),
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(m))
}

/// Decodes a protobuf-encoded ConfigMap, Secret or Namespace into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let unsupported = || ApiError::unsupported_media_type("application/vnd.kubernetes.protobuf");
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| bad("missing k8s magic"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for f in fields(envelope) {
        match f? {
            (1, Field::Bytes(tm)) => {
                for t in fields(tm) {
                    match t? {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            (3, Field::Bytes(x)) if !x.is_empty() => return Err(unsupported()),
            _ => {}
        }
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version.clone()));
    obj.insert("kind".into(), Value::String(kind.clone()));
    let mut data = Map::new();
    let mut other = Map::new();
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "ConfigMap") => {
            for f in fields(raw) {
                match f? {
                    (1, Field::Bytes(x)) => {
                        obj.insert("metadata".into(), object_meta(x)?);
                    }
                    (2, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x, false)?;
                        data.insert(k, v);
                    }
                    (3, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x, true)?;
                        other.insert(k, v);
                    }
                    (4, Field::Varint(v)) => {
                        obj.insert("immutable".into(), Value::Bool(v != 0));
                    }
                    _ => {}
                }
            }
            if !data.is_empty() {
                obj.insert("data".into(), Value::Object(data));
            }
            if !other.is_empty() {
                obj.insert("binaryData".into(), Value::Object(other));
            }
        }
        ("v1", "Secret") => {
            for f in fields(raw) {
                match f? {
                    (1, Field::Bytes(x)) => {
                        obj.insert("metadata".into(), object_meta(x)?);
                    }
                    (2, Field::Bytes(x)) => {
                        let (k, v) = map_entry(x, true)?;
                        data.insert(k, v);
                    }
                    (3, Field::Bytes(x)) => {
                        obj.insert("type".into(), Value::String(string(x)?));
                    }
                    (4, Field::Bytes(x)) => {
                        // stringData is write-only: fold it into data like the API server.
                        let (k, v) = map_entry(x, false)?;
                        let encoded =
                            base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default());
                        other.insert(k, Value::String(encoded));
                    }
                    (5, Field::Varint(v)) => {
                        obj.insert("immutable".into(), Value::Bool(v != 0));
                    }
                    _ => {}
                }
            }
            data.extend(other);
            if !data.is_empty() {
                obj.insert("data".into(), Value::Object(data));
            }
        }
        ("v1", "Namespace") => {
            for f in fields(raw) {
                if let (1, Field::Bytes(x)) = f? {
                    obj.insert("metadata".into(), object_meta(x)?);
                }
            }
        }
        _ => return Err(unsupported()),
    }
    if !obj.contains_key("metadata") {
        obj.insert("metadata".into(), json!({}));
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, data: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, data.len() as u8];
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn decodes_a_configmap() {
        let meta = [
            field(1, b"demo"),
            field(3, b"default"),
            field(11, &[field(1, b"app"), field(2, b"x")].concat()),
        ]
        .concat();
        let raw = [field(1, &meta), field(2, &[field(1, b"k"), field(2, b"v")].concat())].concat();
        let tm = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo", "namespace": "default", "labels": {"app": "x"}}, "data": {"k": "v"}})
        );
        let tm = [field(1, b"apps/v1"), field(2, b"Deployment")].concat();
        let body = [MAGIC.to_vec(), field(1, &tm)].concat();
        assert_eq!(decode(&body).unwrap_err().code, 415);
        assert_eq!(decode(b"k8s\0\x0a\xff").unwrap_err().code, 400);
    }
}
