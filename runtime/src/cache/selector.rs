//! Kubernetes label selectors for the cache: the workspace's one selector implementation
//! (`wasmctrl-selectors`, which follows `k8s.io/apimachinery/pkg/labels`), read against
//! cached objects.
//!
//! Invariant: an [`Object`]'s labels are exactly what a selector sees; this module adds no
//! grammar of its own, so the host accepts a selector exactly when the dev cluster does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
pub use wasmctrl_selectors::{LabelSelector, Labels, Operator, Requirement, SelectorError};

use crate::object::Object;

impl Labels for Object {
    fn label(&self, key: &str) -> Option<&str> {
        Object::label(self, key)
    }
}

/// Builds a selector from the structured `metav1.LabelSelector` form.
///
/// ```
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
/// let sel = meta::LabelSelector {
///     match_labels: Some([("app".to_string(), "web".to_string())].into()),
///     match_expressions: None,
/// };
/// assert_eq!(wasmctrl_runtime::cache::selector_from_match(&sel).unwrap().to_string(), "app=web");
/// ```
pub fn selector_from_match(selector: &meta::LabelSelector) -> Result<LabelSelector, SelectorError> {
    let text = format!("{selector:?}");
    let labels = selector.match_labels.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()));
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|e| (e.key.as_str(), e.operator.as_str(), e.values.as_deref().unwrap_or_default()));
    LabelSelector::from_parts(&text, labels, expressions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(labels: &str) -> Object {
        Object::from_json(format!(r#"{{"metadata":{{"name":"o","labels":{{{labels}}}}}}}"#).into()).unwrap()
    }

    #[test]
    fn objects_are_label_sets() {
        let sel = LabelSelector::parse("app=web,tier>3").unwrap();
        assert!(sel.matches(&obj(r#""app":"web","tier":"4""#)));
        assert!(!sel.matches(&obj(r#""app":"web","tier":"3""#)));
        assert!(!sel.matches(&obj("")));
        let arc = std::sync::Arc::new(obj(r#""app":"web","tier":"9""#));
        assert!(sel.matches(&arc));
    }

    #[test]
    fn from_match_labels_and_expressions() {
        let sel = meta::LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![meta::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        let sel = selector_from_match(&sel).unwrap();
        assert_eq!(sel.to_string(), "app=web,tier notin (db)");
        assert!(sel.matches(&obj(r#""app":"web""#)));
        assert!(!sel.matches(&obj(r#""app":"web","tier":"db""#)));
    }
}
