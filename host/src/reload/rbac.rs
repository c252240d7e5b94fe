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

use crate::config::{KindResolver, LeaderElectionConfig, PluginConfig, resolve_or_guess};
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
    let role = |namespace: &str, rules: RuleSet| {
        [
            RbacObject::Role(Role {
                metadata: meta(&options.name, Some(namespace.to_owned())),
                rules: Some(policy_rules(rules)),
            }),
            RbacObject::RoleBinding(RoleBinding {
                metadata: meta(&options.name, Some(namespace.to_owned())),
                role_ref: RoleRef {
                    api_group: String::from("rbac.authorization.k8s.io").into(),
                    kind: "Role".into(),
                    name: options.name.clone(),
                },
                subjects: Some(vec![subject.clone()]),
            }),
        ]
    };
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
            rules_of(here, resolver, &mut rules, &mut cluster);
            objects.extend(role(ns, rules));
        }
        if !cluster.is_empty() {
            objects.extend(cluster_role(cluster));
        }
    } else {
        let (mut rules, mut cluster) = (RuleSet::new(), RuleSet::new());
        rules_of(plugins, resolver, &mut rules, &mut cluster);
        rules.append(&mut cluster);
        if options.cluster_scope == Some(false) {
            objects.extend(role(&options.service_account_namespace, rules));
        } else {
            objects.extend(cluster_role(rules));
        }
    }
    if let Some(le) = &options.leader_election {
        let name = format!("{}-leader-election", options.name);
        objects.push(RbacObject::Role(Role {
            metadata: meta(&name, Some(le.namespace.clone())),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                verbs: ["create", "get", "patch", "update"].map(str::to_owned).to_vec(),
                ..Default::default()
            }]),
        }));
        objects.push(RbacObject::RoleBinding(RoleBinding {
            metadata: meta(&name, Some(le.namespace.clone())),
            role_ref: RoleRef {
                api_group: String::from("rbac.authorization.k8s.io").into(),
                kind: "Role".into(),
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
