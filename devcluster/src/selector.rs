//! Label and field selectors as the API server parses them from `labelSelector` /
//! `fieldSelector` query parameters.
//!
//! Label selector grammar: comma-separated requirements `k=v`, `k==v`, `k!=v`,
//! `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist).
//! Field selector grammar: comma-separated `path=v`, `path==v`, `path!=v`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::ApiError;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

impl LabelSelector {
    /// Parses a selector string.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || ApiError::bad_request(format!("unable to parse requirement: {part:?}"));
            if let Some(key) = part.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(valid_key(key.trim()).ok_or_else(bad)?));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(LabelReq::NotIn(
                    valid_key(k.trim()).ok_or_else(bad)?,
                    vec![valid_value(v.trim()).ok_or_else(bad)?],
                ));
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                reqs.push(LabelReq::In(
                    valid_key(k.trim()).ok_or_else(bad)?,
                    vec![valid_value(v.trim()).ok_or_else(bad)?],
                ));
            } else if let Some((k, set)) = split_set_op(part, " notin ") {
                reqs.push(LabelReq::NotIn(valid_key(k).ok_or_else(bad)?, parse_set(set).ok_or_else(bad)?));
            } else if let Some((k, set)) = split_set_op(part, " in ") {
                reqs.push(LabelReq::In(valid_key(k).ok_or_else(bad)?, parse_set(set).ok_or_else(bad)?));
            } else {
                reqs.push(LabelReq::Exists(valid_key(part).ok_or_else(bad)?));
            }
        }
        Ok(Self { reqs })
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }
}

fn valid_key(k: &str) -> Option<String> {
    let ok =
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| k.to_string())
}

fn valid_value(v: &str) -> Option<String> {
    let ok = v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    ok.then(|| v.to_string())
}

fn split_set_op<'a>(part: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let idx = part.find(op)?;
    Some((part[..idx].trim(), part[idx + op.len()..].trim()))
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    inner.split(',').map(|v| valid_value(v.trim())).collect()
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// One field requirement: `path` equals (or not) `value`.
#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    path: String,
    value: String,
    equal: bool,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<FieldReq>,
}

impl FieldSelector {
    /// Parses a selector string.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (path, value, equal) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            reqs.push(FieldReq { path: path.trim().to_string(), value: value.trim().to_string(), equal });
        }
        Ok(Self { reqs })
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the selector only uses `metadata.name` / `metadata.namespace`.
    pub fn only_metadata(&self) -> bool {
        self.reqs.iter().all(|r| r.path == "metadata.name" || r.path == "metadata.namespace")
    }

    /// Matches using the object's name and namespace only; other fields are looked up in
    /// `object` (parsed lazily by the caller when [`Self::only_metadata`] is false).
    pub fn matches(&self, name: &str, namespace: &str, object: Option<&Value>) -> bool {
        self.reqs.iter().all(|r| {
            let actual: String = match r.path.as_str() {
                "metadata.name" => name.to_string(),
                "metadata.namespace" => namespace.to_string(),
                path => object.map(|o| field_value(o, path)).unwrap_or_default(),
            };
            (actual == r.value) == r.equal
        })
    }
}

/// The string form of the field at dotted `path` (empty when absent), as field selectors
/// compare it.
fn field_value(object: &Value, path: &str) -> String {
    let mut cur = object;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web,db)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=web,tier in (back)", false),
            ("missing!=x", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(LabelSelector::parse("a=(").is_err());
    }

    #[test]
    fn field_selector_metadata_and_nested() {
        let obj = serde_json::json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let s = FieldSelector::parse("metadata.name=a,spec.nodeName=n1").unwrap();
        assert!(!s.only_metadata());
        assert!(s.matches("a", "ns", Some(&obj)));
        assert!(!s.matches("b", "ns", Some(&obj)));
        let s = FieldSelector::parse("metadata.namespace!=kube-system").unwrap();
        assert!(s.only_metadata());
        assert!(s.matches("a", "default", None));
        assert!(!s.matches("a", "kube-system", None));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
