//! Label and field selectors as the API server parses them from `labelSelector` /
//! `fieldSelector` query parameters.
//!
//! The grammar and matching are the workspace's `wasmctrl-selectors` crate (the one the
//! host's `wasmctrl check` and cache use), so a selector the host accepts is one this server
//! accepts, and a refused one gets the same message here (as a 400) as there.
//!
//! Invariant: a filter matches exactly what the selectors match on the object's labels,
//! name, namespace, and (for other field paths) its JSON.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::ApiError;

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(wasmctrl_selectors::LabelSelector);

impl LabelSelector {
    /// Parses a selector string; a refused one is a 400.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        wasmctrl_selectors::LabelSelector::parse(s)
            .map(Self)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.0.is_everything()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.matches(labels)
    }
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(wasmctrl_selectors::FieldSelector);

impl FieldSelector {
    /// Parses a selector string; a refused one is a 400.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        wasmctrl_selectors::FieldSelector::parse(s)
            .map(Self)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the selector only uses `metadata.name` / `metadata.namespace`.
    pub fn only_metadata(&self) -> bool {
        self.0.only_metadata()
    }

    /// Matches using the object's name and namespace only; other fields are looked up in
    /// `object` (parsed lazily by the caller when [`Self::only_metadata`] is false).
    pub fn matches(&self, name: &str, namespace: &str, object: Option<&Value>) -> bool {
        self.0.matches_with(|path| match path {
            "metadata.name" => name.to_owned(),
            "metadata.namespace" => namespace.to_owned(),
            path => object.map(|o| field_value(o, path)).unwrap_or_default(),
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
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "4")]);
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
            ("n>3", true),
            ("n<4", false),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(LabelSelector::parse("a=(").is_err());
    }

    /// The 400 carries the same text `wasmctrl check` prints for the selector.
    #[test]
    fn refusals_read_like_the_host_check() {
        let err = LabelSelector::parse("tier>high").unwrap_err();
        let host = wasmctrl_selectors::LabelSelector::parse("tier>high").unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (400, host.to_string().as_str()));
        assert!(err.message.contains("must be an integer"), "{err}");
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
