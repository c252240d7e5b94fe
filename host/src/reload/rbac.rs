//! `wasmctrl rbac`: the RBAC objects the host's ServiceAccount needs to run a set of plugins.
//!
//! Rules are the union over all plugins of:
//! - `get`, `list`, `watch` on every kind a plugin caches (`for`, `owns`, `watches`,
//!   `permissions.read`);
//! - `create`, `update`, `patch`, `delete` (and `get`, for live reads before a write) on
//!   every kind in `permissions.write`, plus `update`/`patch` on its `status` subresource;
//! - `update` on the `finalizers` subresource of each `for` kind whose plugin owns objects
//!   (setting `blockOwnerDeletion` on an owner reference requires it);
//! - `create`/`patch` on Events (core and `events.k8s.io`), which plugins may publish about
//!   what they may read;
//! - with leader election on, `get`/`create`/`update`/`patch` on the host's Lease, as a Role in
//!   the Lease's namespace;
//! - with sharding on, the Leases of the ring (every replica's shard Lease and the
//!   assignment Lease: `get`, `list`, `watch`, `create`, `update`, `patch`, and `delete` for
//!   the assignment role's clean-up), as a Role in the ring's namespace; in label mode also
//!   `patch` on every `for` kind (the assignment role labels those objects);
//! - with `[server] auth = "kubernetes"`, `create` on TokenReviews and SubjectAccessReviews (the
//!   endpoint asks the API server who may read it), as a ClusterRole `<name>-endpoint-auth`.
//! - when the host writes webhook configurations and a plugin admits, `get`/`create`/
//!   `patch`/`update`/`delete` on Validating/MutatingWebhookConfigurations, as a ClusterRole
//!   of its own (they are cluster-scoped).
//!
//! When every plugin is limited to namespaces ([`PluginConfig::namespaces`]: its
//! `permissions.namespaces`, or `[for]`'s namespace), the rules follow the limits: one `Role`
//! (and `RoleBinding`) per namespace, granting there what the plugins limited to it need of
//! namespaced kinds, and a `ClusterRole` only for the cluster-scoped kinds they read (a
//! plugin limited to namespaces writes no cluster-scoped kind). Otherwise one `ClusterRole`
//! holds the union (or, with `cluster_scope = Some(false)`, a Role in the ServiceAccount's
//! namespace).
//!
//! Invariants: output is deterministic (rules sorted by group then resource, verbs sorted;
//! Roles by namespace) so it can be committed and diffed; a namespace-limited plugin is
//! granted nothing outside its namespaces but reads of cluster-scoped kinds it declared.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{
    KindResolver, LeaderElectionConfig, PluginConfig, ShardingConfig, ShardingMode, resolve_or_guess,
};
use crate::plugin::spec::Gvk;

/// Who gets the permissions and how the objects are named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbacOptions {
    /// The host's ServiceAccount.
    pub service_account: String,
    /// The ServiceAccount's namespace.
    pub service_account_namespace: String,
    /// Name of the (Cluster)Role and its binding.
    pub name: String,
    /// `None`: Roles in the plugins' namespaces when every plugin is limited to some (and a
    /// ClusterRole for the cluster-scoped kinds they read), else a ClusterRole.
    /// `Some(true)`: always one ClusterRole. `Some(false)`: Roles as with `None`, and a Role
    /// in the ServiceAccount's namespace instead of the ClusterRole of plugins that are not
    /// limited to namespaces.
    pub cluster_scope: Option<bool>,
    /// Adds a Role for the Lease when set.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Adds a Role for the ring's Leases (and, in label mode, `patch` on `for` kinds) when set.
    pub sharding: Option<ShardingConfig>,
    /// Adds a ClusterRole for the endpoint's token and access reviews when set.
    pub endpoint_auth: bool,
    /// The host writes the admitting plugins' webhook configurations (`[admission]
    /// manage-configurations`): adds a ClusterRole for them when a plugin admits.
    pub webhook_configurations: bool,
}

impl Default for RbacOptions {
    fn default() -> Self {
        RbacOptions {
            service_account: "wasmctrl".into(),
            service_account_namespace: "wasmctrl-system".into(),
            name: "wasmctrl".into(),
            cluster_scope: None,
            leader_election: None,
            sharding: None,
            endpoint_auth: false,
            webhook_configurations: false,
        }
    }
}

/// One RBAC object, ready to print.
#[derive(Clone, Debug, PartialEq)]
pub enum RbacObject {
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
}

/// The objects `wasmctrl rbac` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct RbacManifests {
    pub objects: Vec<RbacObject>,
}

impl RbacManifests {
    /// Multi-document YAML, as `kubectl apply -f -` takes it.
    pub fn to_yaml(&self) -> Result<String, serde_norway::Error> {
        let mut out = String::new();
        for obj in &self.objects {
            out.push_str("---\n");
            out.push_str(&match obj {
                RbacObject::ClusterRole(o) => serde_norway::to_string(o)?,
                RbacObject::ClusterRoleBinding(o) => serde_norway::to_string(o)?,
                RbacObject::Role(o) => serde_norway::to_string(o)?,
                RbacObject::RoleBinding(o) => serde_norway::to_string(o)?,
            });
        }
        Ok(out)
    }
}

/// `(api group, resource)` → verbs.
type RuleSet = BTreeMap<(String, String), BTreeSet<&'static str>>;

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "get", "patch", "update"];

fn add(rules: &mut RuleSet, group: &str, resource: &str, verbs: &[&'static str]) {
    rules.entry((group.to_owned(), resource.to_owned())).or_default().extend(verbs.iter().copied());
}

/// The rules `plugins` need: namespaced kinds in `namespaced`, cluster-scoped ones in
/// `cluster`. Events always go to `namespaced`.
fn rules_of<'a>(
    plugins: impl IntoIterator<Item = &'a PluginConfig>,
    resolver: &dyn KindResolver,
    label_mode: bool,
    namespaced: &mut RuleSet,
    cluster: &mut RuleSet,
) {
    let mut note_kind = |kind: &Gvk, verbs: &[&'static str], sub: Option<(&str, &[&'static str])>| {
        let r = resolve_or_guess(resolver, kind);
        let rules = if r.namespaced { &mut *namespaced } else { &mut *cluster };
        add(rules, kind.group(), &r.plural, verbs);
        if let Some((sub, sub_verbs)) = sub {
            add(rules, kind.group(), &format!("{}/{sub}", r.plural), sub_verbs);
        }
    };
    for p in plugins {
        for kind in p.cached_kinds() {
            note_kind(kind, READ, None);
        }
        for kind in &p.write {
            note_kind(kind, WRITE, Some(("status", &["patch", "update"])));
        }
        if !p.owns.is_empty() {
            note_kind(&p.for_source.kind, READ, Some(("finalizers", &["update"])));
        }
        if label_mode {
            // The assignment role labels the `for` objects with their shard.
            note_kind(&p.for_source.kind, &["patch"], None);
        }
    }
    add(namespaced, "", "events", &["create", "patch"]);
    add(namespaced, "events.k8s.io", "events", &["create", "patch"]);
}

fn policy_rules(rules: RuleSet) -> Vec<PolicyRule> {
    rules
        .into_iter()
        .map(|((group, resource), verbs)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(vec![resource]),
            verbs: verbs.into_iter().map(str::to_owned).collect(),
            ..Default::default()
        })
        .collect()
}

/// Builds the RBAC objects for `plugins`. `resolver` gives plurals and scopes (discovery when
/// online, [`crate::config::BuiltinKinds`] offline; unknown kinds get the plural Kubernetes
/// would guess and are taken as namespaced).
pub fn rbac_for(
    plugins: &[PluginConfig],
    options: &RbacOptions,
    resolver: &dyn KindResolver,
) -> RbacManifests {
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: options.service_account.clone(),
        namespace: Some(options.service_account_namespace.clone()),
        api_group: None,
    };
    let labels = Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_owned(), "wasmctrl".to_owned())]));
    let meta = |name: &str, namespace: Option<String>| ObjectMeta {
        name: Some(name.to_owned()),
        namespace,
        labels: labels.clone(),
        ..Default::default()
    };
    // A Role named `name` in `namespace` and its binding to the service account.
    let named_role = |name: &str, namespace: &str, rules: Vec<PolicyRule>| {
        [
            RbacObject::Role(Role { metadata: meta(name, Some(namespace.to_owned())), rules: Some(rules) }),
            RbacObject::RoleBinding(RoleBinding {
                metadata: meta(name, Some(namespace.to_owned())),
                role_ref: RoleRef {
                    api_group: String::from("rbac.authorization.k8s.io").into(),
                    kind: "Role".into(),
                    name: name.to_owned(),
                },
                subjects: Some(vec![subject.clone()]),
            }),
        ]
    };
    let role = |namespace: &str, rules: RuleSet| named_role(&options.name, namespace, policy_rules(rules));
    let cluster_role = |rules: RuleSet| {
        [
            RbacObject::ClusterRole(ClusterRole {
                metadata: meta(&options.name, None),
                rules: Some(policy_rules(rules)),
                aggregation_rule: None,
            }),
            RbacObject::ClusterRoleBinding(ClusterRoleBinding {
                metadata: meta(&options.name, None),
                role_ref: RoleRef {
                    api_group: String::from("rbac.authorization.k8s.io").into(),
                    kind: "ClusterRole".into(),
                    name: options.name.clone(),
                },
                subjects: Some(vec![subject.clone()]),
            }),
        ]
    };

    let label_mode = options.sharding.as_ref().is_some_and(|s| s.mode == ShardingMode::Label);
    // Every plugin limited to namespaces: Roles where they work.
    let scopes: Option<Vec<&Vec<String>>> = plugins.iter().map(|p| p.namespaces.as_ref()).collect();
    let limited = scopes.filter(|_| !plugins.is_empty() && options.cluster_scope != Some(true));
    let mut objects = Vec::new();
    if let Some(scopes) = limited {
        let namespaces: BTreeSet<&String> = scopes.iter().flat_map(|s| s.iter()).collect();
        let mut cluster = RuleSet::new();
        for ns in namespaces {
            let mut rules = RuleSet::new();
            let here = plugins.iter().filter(|p| p.namespaces.as_ref().is_some_and(|s| s.contains(ns)));
            rules_of(here, resolver, label_mode, &mut rules, &mut cluster);
            objects.extend(role(ns, rules));
        }
        if !cluster.is_empty() {
            objects.extend(cluster_role(cluster));
        }
    } else {
        let (mut rules, mut cluster) = (RuleSet::new(), RuleSet::new());
        rules_of(plugins, resolver, label_mode, &mut rules, &mut cluster);
        rules.append(&mut cluster);
        if options.cluster_scope == Some(false) {
            objects.extend(role(&options.service_account_namespace, rules));
        } else {
            objects.extend(cluster_role(rules));
        }
    }
    if let Some(sharding) = &options.sharding {
        let name = format!("{}-sharding", options.name);
        objects.extend(named_role(
            &name,
            &sharding.namespace,
            vec![lease_rule(&["create", "delete", "get", "list", "patch", "update", "watch"])],
        ));
    }
    if let Some(le) = &options.leader_election {
        let name = format!("{}-leader-election", options.name);
        objects.extend(named_role(
            &name,
            &le.namespace,
            vec![lease_rule(&["create", "get", "patch", "update"])],
        ));
    }
    if options.endpoint_auth {
        let name = format!("{}-endpoint-auth", options.name);
        let create = |group: &str, resource: &str| PolicyRule {
            api_groups: Some(vec![group.into()]),
            resources: Some(vec![resource.into()]),
            verbs: vec!["create".into()],
            ..Default::default()
        };
        objects.push(RbacObject::ClusterRole(ClusterRole {
            metadata: meta(&name, None),
            rules: Some(vec![
                create("authentication.k8s.io", "tokenreviews"),
                create("authorization.k8s.io", "subjectaccessreviews"),
            ]),
            ..Default::default()
        }));
        objects.push(RbacObject::ClusterRoleBinding(ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: String::from("rbac.authorization.k8s.io").into(),
                kind: "ClusterRole".into(),
                name,
            },
            subjects: Some(vec![subject.clone()]),
        }));
    }
    if options.webhook_configurations && plugins.iter().any(|p| !p.admission.is_empty()) {
        let name = format!("{}-admission", options.name);
        objects.push(RbacObject::ClusterRole(ClusterRole {
            metadata: meta(&name, None),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["admissionregistration.k8s.io".into()]),
                resources: Some(vec![
                    "mutatingwebhookconfigurations".into(),
                    "validatingwebhookconfigurations".into(),
                ]),
                verbs: ["create", "delete", "get", "patch", "update"].map(str::to_owned).to_vec(),
                ..Default::default()
            }]),
            aggregation_rule: None,
        }));
        objects.push(RbacObject::ClusterRoleBinding(ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: String::from("rbac.authorization.k8s.io").into(),
                kind: "ClusterRole".into(),
                name,
            },
            subjects: Some(vec![subject]),
        }));
    }
    RbacManifests { objects }
}

/// `verbs` on Leases.
fn lease_rule(verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["coordination.k8s.io".into()]),
        resources: Some(vec!["leases".into()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{BuiltinKinds, HostConfig, PluginDefaults};

    fn plugin(text: &str) -> PluginConfig {
        PluginConfig::parse(Path::new("plugins/p.toml"), text, &PluginDefaults::default()).unwrap()
    }

    fn sharding(mode: &str) -> Option<ShardingConfig> {
        let text = format!("[sharding]\nenabled = true\nnamespace = \"ops\"\nmode = \"{mode}\"\n");
        HostConfig::parse(Path::new("h.toml"), &text).unwrap().sharding
    }

    fn rules_of(objects: &[RbacObject], name: &str) -> Vec<PolicyRule> {
        objects
            .iter()
            .find_map(|o| match o {
                RbacObject::Role(r) if r.metadata.name.as_deref() == Some(name) => r.rules.clone(),
                RbacObject::ClusterRole(r) if r.metadata.name.as_deref() == Some(name) => r.rules.clone(),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no role {name} in {objects:?}"))
    }

    fn verbs(rules: &[PolicyRule], resource: &str) -> Vec<String> {
        rules
            .iter()
            .find(|r| r.resources.as_deref() == Some(&[resource.to_owned()]))
            .map(|r| r.verbs.clone())
            .unwrap_or_default()
    }

    #[test]
    fn sharding_adds_the_rings_leases_and_in_label_mode_patch_on_for_kinds() {
        let p = plugin("[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n");
        let plain = rbac_for(std::slice::from_ref(&p), &RbacOptions::default(), &BuiltinKinds);
        assert_eq!(plain.objects.len(), 2, "no sharding, no extra Role");
        assert_eq!(verbs(&rules_of(&plain.objects, "wasmctrl"), "configmaps"), ["get", "list", "watch"]);

        for (mode, patch) in [("label", true), ("no-write", false)] {
            let options = RbacOptions { sharding: sharding(mode), ..RbacOptions::default() };
            let m = rbac_for(std::slice::from_ref(&p), &options, &BuiltinKinds);
            let leases = verbs(&rules_of(&m.objects, "wasmctrl-sharding"), "leases");
            assert_eq!(leases, ["create", "delete", "get", "list", "patch", "update", "watch"], "{mode}");
            let role = m.objects.iter().find_map(|o| match o {
                RbacObject::Role(r) if r.metadata.name.as_deref() == Some("wasmctrl-sharding") => Some(r),
                _ => None,
            });
            assert_eq!(role.and_then(|r| r.metadata.namespace.as_deref()), Some("ops"));
            assert!(m.objects.iter().any(|o| matches!(o, RbacObject::RoleBinding(b) if b.metadata.name.as_deref() == Some("wasmctrl-sharding"))));
            let cm = verbs(&rules_of(&m.objects, "wasmctrl"), "configmaps");
            assert_eq!(cm.contains(&"patch".to_owned()), patch, "{mode}: {cm:?}");
        }
    }
}
