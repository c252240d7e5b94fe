//! `pod-node-policy`: a policy plugin that checks every Pod and reports violations.
//!
//! Rules:
//! - `MissingRequiredLabel`: the Pod lacks a label listed in `[settings] required-labels`
//!   (default `["team"]`);
//! - `NodeSelectorMismatch`: the Pod is bound to a Node (`spec.nodeName`) whose labels do
//!   not satisfy the Pod's `spec.nodeSelector`;
//! - `NodeNotFound`: the Pod is bound to a Node that does not exist (in the cache).
//!
//! The verdict is written to the Pod's annotation [`VIOLATIONS_ANNOTATION`] (removed
//! when the Pod complies), and each change of verdict is recorded as Events on the Pod:
//! one Warning per violation, or Normal `Compliant` when the last one is fixed. Writing
//! only on a change keeps Events meaningful and the steady state write-free.
//!
//! The `by-node` index (Pods by `spec.nodeName`, declared in the TOML) lets the
//! `[[watches]]` of Nodes find every Pod on a Node whose labels changed, without
//! scanning all Pods.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_json::json;
use wasmctrl_guest::k8s_openapi::api::core::v1::{Node, Pod};
use wasmctrl_guest::prelude::*;

/// Annotation holding the Pod's current violations, `; `-separated.
pub const VIOLATIONS_ANNOTATION: &str = "policy.example.com/violations";
/// The index of Pods by `spec.nodeName`.
pub const BY_NODE_INDEX: &str = "by-node";

/// `[settings]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct PolicySettings {
    /// Labels every Pod must carry.
    pub required_labels: Vec<String>,
    /// Namespaces whose Pods are not checked.
    pub exempt_namespaces: Vec<String>,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings { required_labels: vec!["team".into()], exempt_namespaces: vec!["kube-system".into()] }
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// CamelCase reason, used as the Event reason.
    pub reason: &'static str,
    /// What exactly is wrong.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.reason, self.detail)
    }
}

/// The rules applied to `pod`, given the Node it is bound to as the cache has it (pure).
/// `node` is only consulted when the Pod has a `spec.nodeName`; `None` then means the
/// Node does not exist.
pub fn violations(pod: &Pod, node: Option<&Node>, settings: &PolicySettings) -> Vec<Violation> {
    let mut found = Vec::new();
    for label in &settings.required_labels {
        if pod.label(label).is_none() {
            found.push(Violation { reason: "MissingRequiredLabel", detail: label.clone() });
        }
    }
    let spec = pod.spec.as_ref();
    let node_name = spec.and_then(|s| s.node_name.as_deref());
    let selector = spec.and_then(|s| s.node_selector.as_ref());
    match (node_name, node) {
        (None, _) => {}
        (Some(node_name), None) => {
            found.push(Violation { reason: "NodeNotFound", detail: node_name.to_owned() })
        }
        (Some(node_name), Some(node)) => {
            for (key, want) in selector.into_iter().flatten() {
                let have = node.label(key);
                if have != Some(want.as_str()) {
                    found.push(Violation {
                        reason: "NodeSelectorMismatch",
                        detail: format!("{key}={want} on node {node_name}: {}", have.unwrap_or("<unset>")),
                    });
                }
            }
        }
    }
    found.sort();
    found
}

/// The annotation value for `violations` (`None`: remove the annotation).
pub fn annotation_value(violations: &[Violation]) -> Option<String> {
    (!violations.is_empty())
        .then(|| violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
}

/// The plugin.
pub struct PodNodePolicy {
    settings: PolicySettings,
}

impl Plugin for PodNodePolicy {
    type For = Pod;

    fn init(settings: Settings) -> Result<Self, InitError> {
        Ok(PodNodePolicy { settings: settings.parse()? })
    }

    fn reconcile(&self, target: Target<Pod>) -> Result<Action, ReconcileError> {
        let pod = match target {
            Target::Present(pod) => pod,
            Target::Gone(request) => {
                log::debug!("pod {} is gone", request);
                return Ok(Action::Done);
            }
        };
        let request = Request::for_object(&pod);
        let ns = request.namespace.as_deref();
        if ns.is_some_and(|ns| self.settings.exempt_namespaces.iter().any(|e| e == ns))
            || pod.is_being_deleted()
        {
            return Ok(Action::Done);
        }
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let node = match &node_name {
            Some(name) => cache::get::<Node>(None, name)?,
            None => None,
        };
        let found = violations(&pod, node.as_ref(), &self.settings);
        let want = annotation_value(&found);
        let have = pod.annotation(VIOLATIONS_ANNOTATION).map(str::to_owned);
        let pods_on_node = match &node_name {
            // Raw: only counted, so no need to parse the Pods.
            Some(name) => cache::by_index_raw(&Gvk::of::<Pod>(), BY_NODE_INDEX, name)?.len(),
            None => 0,
        };

        if want != have {
            let patch = json!({"metadata": {"annotations": {VIOLATIONS_ANNOTATION: want}}});
            client::patch_merge::<Pod>(ns, &request.name, &patch).context("annotating pod")?;
            if found.is_empty() {
                events::normal(&pod, "Compliant", "Check", "the pod now satisfies every policy rule")?;
            }
            for v in &found {
                let note = match v.reason {
                    "MissingRequiredLabel" => format!("the pod has no `{}` label", v.detail),
                    "NodeNotFound" => format!("the pod is bound to node {} which does not exist", v.detail),
                    _ => format!("nodeSelector {}", v.detail),
                };
                events::warning(&pod, v.reason, "Check", &note)?;
            }
        }
        log::info!("checked pod {}", request;
            violations = want.as_deref().unwrap_or("none"),
            node = node_name.as_deref().unwrap_or("<unscheduled>"),
            pods_on_node = pods_on_node,
            changed = want != have);
        Ok(Action::Done)
    }
}

impl Map for PodNodePolicy {
    /// A Node changed: re-check every Pod bound to it (found through the `by-node` index).
    fn map(&self, kind: &Gvk, object: RawObject) -> Vec<Request> {
        if !kind.is::<Node>() {
            return Vec::new();
        }
        let Some(node) = object.meta().ok().and_then(|m| m.name) else { return Vec::new() };
        // Only names are needed: parse each Pod's metadata, not its whole spec.
        match cache::by_index_raw(&Gvk::of::<Pod>(), BY_NODE_INDEX, &node) {
            Ok(pods) => pods
                .iter()
                .filter_map(|pod| pod.meta().ok())
                .map(|meta| Request { namespace: meta.namespace, name: meta.name.unwrap_or_default() })
                .collect(),
            Err(e) => {
                log::warn!("looking up pods on a node failed"; node = node, error = e);
                Vec::new()
            }
        }
    }
}

/// Labels as a map, for tests and callers building Pods.
pub fn label_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

wasmctrl_guest::export_plugin!(PodNodePolicy);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmctrl_guest::events::EventType;
    use wasmctrl_guest::k8s_openapi::api::core::v1::PodSpec;
    use wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use wasmctrl_guest::testing::{Patch, TestHost, Write};

    fn pod(labels: &[(&str, &str)], node: Option<&str>, selector: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("team-a".into()),
                labels: Some(label_map(labels)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                node_selector: (!selector.is_empty()).then(|| label_map(selector)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                labels: Some(label_map(labels)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn compliant_pod_has_no_violations() {
        let p = pod(&[("team", "a")], Some("node-1"), &[("disktype", "ssd")]);
        let found = violations(&p, Some(&node(&[("disktype", "ssd")])), &PolicySettings::default());
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(annotation_value(&found), None);
    }

    #[test]
    fn missing_team_label() {
        let found = violations(&pod(&[], None, &[]), None, &PolicySettings::default());
        assert_eq!(found, vec![Violation { reason: "MissingRequiredLabel", detail: "team".into() }]);
        assert_eq!(annotation_value(&found).as_deref(), Some("MissingRequiredLabel(team)"));
    }

    #[test]
    fn node_selector_mismatch_and_missing_node() {
        let p = pod(&[("team", "a")], Some("node-1"), &[("disktype", "ssd"), ("zone", "z1")]);
        let found =
            violations(&p, Some(&node(&[("disktype", "hdd"), ("zone", "z1")])), &PolicySettings::default());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].reason, "NodeSelectorMismatch");
        assert_eq!(found[0].detail, "disktype=ssd on node node-1: hdd");
        let found = violations(&p, None, &PolicySettings::default());
        assert_eq!(found, vec![Violation { reason: "NodeNotFound", detail: "node-1".into() }]);
        // Even without a nodeSelector a Pod bound to a missing Node is flagged.
        let found = violations(&pod(&[("team", "a")], Some("node-9"), &[]), None, &PolicySettings::default());
        assert_eq!(found, vec![Violation { reason: "NodeNotFound", detail: "node-9".into() }]);
    }

    #[test]
    fn unscheduled_pod_skips_node_rules() {
        let p = pod(&[("team", "a")], None, &[("disktype", "ssd")]);
        assert!(violations(&p, None, &PolicySettings::default()).is_empty());
    }

    #[test]
    fn violations_are_sorted_so_the_annotation_is_stable() {
        let p = pod(&[], Some("node-1"), &[("disktype", "ssd")]);
        let settings =
            PolicySettings { required_labels: vec!["team".into(), "app".into()], ..Default::default() };
        let found = violations(&p, Some(&node(&[])), &settings);
        assert_eq!(
            annotation_value(&found).unwrap(),
            "MissingRequiredLabel(app); MissingRequiredLabel(team); NodeSelectorMismatch(disktype=ssd on node node-1: <unset>)"
        );
    }

    #[test]
    fn settings_defaults_and_validation() {
        let s: PolicySettings = Settings::from_json(b"{}".to_vec()).parse().unwrap();
        assert_eq!(s, PolicySettings::default());
        assert!(PodNodePolicy::init(Settings::from_json(br#"{"required-label":["x"]}"#.to_vec())).is_err());
    }

    /// A host with the TOML's `by-node` index.
    fn host() -> TestHost {
        let host = TestHost::new();
        host.add_index::<Pod>(BY_NODE_INDEX, |p| {
            p.spec.as_ref().and_then(|s| s.node_name.clone()).into_iter().collect()
        });
        host
    }

    #[test]
    fn reconcile_annotates_once_and_maps_node_changes_to_its_pods() {
        let host = host();
        let mut n = node(&[("disktype", "ssd")]);
        n.metadata.name = Some("node-1".into());
        host.add(&n).unwrap();
        let mut good = pod(&[("team", "a")], Some("node-1"), &[("disktype", "ssd")]);
        good.metadata.name = Some("good".into());
        let mut bad = pod(&[], Some("node-1"), &[]);
        bad.metadata.name = Some("bad".into());
        host.add(&good).unwrap();
        host.add(&bad).unwrap();
        let plugin = host.init::<PodNodePolicy>().unwrap();

        assert_eq!(plugin.reconcile_object(&good), Ok(Action::Done));
        assert!(host.writes().is_empty());
        assert_eq!(plugin.reconcile_object(&bad), Ok(Action::Done));
        let writes = host.take_writes();
        let Some(Write::Patch { name, patch: Patch::Merge(body), .. }) = writes.first() else {
            panic!("{writes:?}")
        };
        assert_eq!(name, "bad");
        assert_eq!(body["metadata"]["annotations"][VIOLATIONS_ANNOTATION], "MissingRequiredLabel(team)");
        let events = host.take_events();
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].event_type, events[0].reason.as_str()),
            (EventType::Warning, "MissingRequiredLabel")
        );

        // Unchanged verdict: no write, no Event.
        host.sync_cache();
        assert_eq!(plugin.reconcile_object(&bad), Ok(Action::Done));
        assert!(host.writes().is_empty() && host.events().is_empty());

        // A Node change re-checks the Pods bound to it.
        let mut mapped = plugin.map(&n).unwrap();
        mapped.sort();
        let names: Vec<String> = mapped.iter().map(Request::key).collect();
        assert_eq!(names, ["team-a/bad", "team-a/good"]);
    }

    #[test]
    fn gone_pods_are_ignored() {
        let host = host();
        let plugin = host.init::<PodNodePolicy>().unwrap();
        assert_eq!(plugin.reconcile(Request::new(Some("default"), "nope")), Ok(Action::Done));
        assert!(host.writes().is_empty());
        assert_eq!(plugin.hooks(), wasmctrl_guest::Hooks::MAP);
    }
}
