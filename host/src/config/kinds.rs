//! Checking the kinds a configuration names: the shape of `apiVersion` / `Kind` strings,
//! whether a cluster serves them ([`KindResolver`]), and a built-in catalog of the
//! Kubernetes kinds every cluster serves, used offline (`wasmctrl check`, `wasmctrl rbac`).
//!
//! Invariants: the built-in catalog only answers for API groups it knows completely; for
//! any other group it says "unknown group" rather than guessing that a kind is missing.

use crate::plugin::spec::Gvk;

/// What the cluster (or the built-in catalog) knows about a kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedKind {
    /// The resource name in URLs and RBAC rules (`configmaps`).
    pub plural: String,
    /// Whether objects of the kind live in namespaces.
    pub namespaced: bool,
}

/// Why a kind could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindLookupError {
    /// The group/version is served but has no such kind; `known_kinds` lists its kinds.
    UnknownKind { known_kinds: Vec<String> },
    /// The group/version is not served at all; `known_versions` lists served versions of
    /// the same group, if any.
    UnknownApiVersion { known_versions: Vec<String> },
    /// The resolver cannot tell (e.g. offline and not a built-in group).
    Unknown,
    /// Asking failed (network, permissions).
    Unavailable(String),
}

/// Maps `apiVersion` + `kind` to a resource. Implemented by the host's discovery client and
/// by [`BuiltinKinds`] for offline use.
pub trait KindResolver: Send + Sync {
    fn resolve(&self, kind: &Gvk) -> Result<ResolvedKind, KindLookupError>;
}

/// The kinds of Kubernetes' built-in API groups (as of 1.34), for offline checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuiltinKinds;

/// (apiVersion, kind, plural, namespaced)
const BUILTIN: &[(&str, &str, &str, bool)] = &[
    ("v1", "Binding", "bindings", true),
    ("v1", "ConfigMap", "configmaps", true),
    ("v1", "Endpoints", "endpoints", true),
    ("v1", "Event", "events", true),
    ("v1", "LimitRange", "limitranges", true),
    ("v1", "Namespace", "namespaces", false),
    ("v1", "Node", "nodes", false),
    ("v1", "PersistentVolume", "persistentvolumes", false),
    ("v1", "PersistentVolumeClaim", "persistentvolumeclaims", true),
    ("v1", "Pod", "pods", true),
    ("v1", "PodTemplate", "podtemplates", true),
    ("v1", "ReplicationController", "replicationcontrollers", true),
    ("v1", "ResourceQuota", "resourcequotas", true),
    ("v1", "Secret", "secrets", true),
    ("v1", "Service", "services", true),
    ("v1", "ServiceAccount", "serviceaccounts", true),
    ("apps/v1", "ControllerRevision", "controllerrevisions", true),
    ("apps/v1", "DaemonSet", "daemonsets", true),
    ("apps/v1", "Deployment", "deployments", true),
    ("apps/v1", "ReplicaSet", "replicasets", true),
    ("apps/v1", "StatefulSet", "statefulsets", true),
    ("batch/v1", "CronJob", "cronjobs", true),
    ("batch/v1", "Job", "jobs", true),
    ("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
    ("autoscaling/v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true),
    ("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", true),
    ("networking.k8s.io/v1", "Ingress", "ingresses", true),
    ("networking.k8s.io/v1", "IngressClass", "ingressclasses", false),
    ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", true),
    ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", true),
    ("coordination.k8s.io/v1", "Lease", "leases", true),
    ("events.k8s.io/v1", "Event", "events", true),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", false),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", false),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", true),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", true),
    ("storage.k8s.io/v1", "StorageClass", "storageclasses", false),
    ("storage.k8s.io/v1", "CSIDriver", "csidrivers", false),
    ("storage.k8s.io/v1", "VolumeAttachment", "volumeattachments", false),
    ("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", false),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", false),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
    ),
    ("certificates.k8s.io/v1", "CertificateSigningRequest", "certificatesigningrequests", false),
    ("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", false),
];

/// Groups the catalog knows completely (a kind missing from them is really unknown).
fn builtin_group(group: &str) -> bool {
    BUILTIN.iter().any(|(av, ..)| Gvk::new(*av, "").group() == group)
}

impl KindResolver for BuiltinKinds {
    fn resolve(&self, kind: &Gvk) -> Result<ResolvedKind, KindLookupError> {
        if let Some((_, _, plural, namespaced)) =
            BUILTIN.iter().find(|(av, k, ..)| *av == kind.api_version && *k == kind.kind)
        {
            return Ok(ResolvedKind { plural: (*plural).to_owned(), namespaced: *namespaced });
        }
        let group = kind.group();
        if !builtin_group(group) {
            return Err(KindLookupError::Unknown);
        }
        let known_kinds: Vec<String> = BUILTIN
            .iter()
            .filter(|(av, ..)| *av == kind.api_version)
            .map(|(_, k, ..)| (*k).to_owned())
            .collect();
        if known_kinds.is_empty() {
            let mut known_versions: Vec<String> = BUILTIN
                .iter()
                .filter(|(av, ..)| Gvk::new(*av, "").group() == group)
                .map(|(av, ..)| (*av).to_owned())
                .collect();
            known_versions.dedup();
            return Err(KindLookupError::UnknownApiVersion { known_versions });
        }
        Err(KindLookupError::UnknownKind { known_kinds })
    }
}

impl BuiltinKinds {
    /// The apiVersion of a built-in kind written without one (`Deployment` → `apps/v1`),
    /// for hints.
    pub fn api_version_of(kind: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(_, k, ..)| k.eq_ignore_ascii_case(kind)).map(|(av, ..)| *av)
    }

    /// The properly cased name of a built-in kind written in another case (`configmap`).
    pub fn canonical_kind(kind: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(_, k, ..)| k.eq_ignore_ascii_case(kind)).map(|(_, k, ..)| *k)
    }
}

/// The resource name Kubernetes derives for a kind when nothing better is known
/// (`NetworkPolicy` → `networkpolicies`, `Ingress` → `ingresses`), as `kubectl` guesses it.
pub fn guess_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s') || lower.ends_with('x') || lower.ends_with("ch") || lower.ends_with("sh") {
        if lower.ends_with("ss") || !lower.ends_with('s') {
            return format!("{lower}es");
        }
        return lower;
    }
    if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    format!("{lower}s")
}

/// A resolver that asks `primary` and, where it cannot tell, falls back to guessing the
/// plural and assuming namespaced. Used by `wasmctrl rbac` offline for CRD kinds.
pub(crate) fn resolve_or_guess(resolver: &dyn KindResolver, kind: &Gvk) -> ResolvedKind {
    match resolver.resolve(kind) {
        Ok(r) => r,
        Err(_) => ResolvedKind { plural: guess_plural(&kind.kind), namespaced: true },
    }
}

/// Whether `api_version` looks like `v1` or `group.example.com/v1beta1`.
pub(crate) fn check_api_version(api_version: &str) -> Result<(), String> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (Some(g), v),
        None => (None, api_version),
    };
    let version_ok = version.starts_with('v')
        && version.len() > 1
        && version.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !version_ok {
        return Err(format!(
            "`{api_version}` is not an apiVersion: write `v1` for the core group or `<group>/<version>` such as `apps/v1`"
        ));
    }
    if let Some(g) = group
        && (g.is_empty() || !wasmctrl_selectors::is_dns_subdomain(g))
    {
        return Err(format!("`{g}` in `{api_version}` is not a valid API group"));
    }
    Ok(())
}

/// Whether `kind` looks like a Kubernetes kind (`ConfigMap`).
pub(crate) fn check_kind_name(kind: &str) -> Result<(), (String, Option<String>)> {
    let ok = kind.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        return Ok(());
    }
    let hint = BuiltinKinds::canonical_kind(kind)
        .map(|k| format!("kinds are written as in manifests: `{k}`"))
        .or_else(|| {
            (!kind.is_empty())
                .then(|| "kinds are CamelCase, as in manifests (`ConfigMap`, `Deployment`)".to_owned())
        });
    Err((format!("`{kind}` is not a kind name"), hint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_resolves_and_explains() {
        let r = BuiltinKinds.resolve(&Gvk::new("apps/v1", "Deployment"));
        assert_eq!(r, Ok(ResolvedKind { plural: "deployments".into(), namespaced: true }));
        match BuiltinKinds.resolve(&Gvk::new("v1", "ConfigMapp")) {
            Err(KindLookupError::UnknownKind { known_kinds }) => {
                assert!(known_kinds.contains(&"ConfigMap".to_owned()))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            BuiltinKinds.resolve(&Gvk::new("apps/v1beta9", "Deployment")),
            Err(KindLookupError::UnknownApiVersion { .. })
        ));
        assert_eq!(
            BuiltinKinds.resolve(&Gvk::new("example.com/v1", "Website")),
            Err(KindLookupError::Unknown)
        );
    }

    #[test]
    fn plurals_follow_kubernetes() {
        assert_eq!(guess_plural("Website"), "websites");
        assert_eq!(guess_plural("NetworkPolicy"), "networkpolicies");
        assert_eq!(guess_plural("Ingress"), "ingresses");
        assert_eq!(guess_plural("Gateway"), "gateways");
        assert_eq!(guess_plural("Box"), "boxes");
        assert_eq!(guess_plural("Endpoints"), "endpoints");
    }

    #[test]
    fn api_version_shapes() {
        assert!(check_api_version("v1").is_ok());
        assert!(check_api_version("apps/v1").is_ok());
        assert!(check_api_version("example.com/v1alpha1").is_ok());
        assert!(check_api_version("apps").is_err());
        assert!(check_api_version("/v1").is_err());
        assert!(check_api_version("Apps/v1").is_err());
    }
}
