//! `wasmctrl rbac`: the RBAC objects the host's ServiceAccount needs to run a set of plugins.
//!
//! Rules are the union over all plugins of:
//! - `get`, `list`, `watch` on every kind a plugin caches (`for`, `owns`, `watches`,
//!   `permissions.read`);
//! - `create`, `update`, `patch`, `delete` (and `get`, for live reads before a write) on
//!   every kind in `permissions.write`, plus `update`/`patch` on its `status` subresource;
//! - `update` on the `finalizers` subresource of each `for` kind whose plugin owns objects
//!   (setting `blockOwnerDeletion` on an owner reference requires it);
//! - `create`/`patch` on Events (core and `events.k8s.io`), which plugins may always publish;
//! - with leader election on, `get`/`create`/`update`/`patch` on the host's Lease, as a Role in
//!   the Lease's namespace;
//! - with `[server] auth = "kubernetes"`, `create` on TokenReviews and SubjectAccessReviews (the
//!   endpoint asks the API server who may read it), as a ClusterRole `<name>-endpoint-auth`.
//!
//! A namespaced `Role` is emitted instead of a `ClusterRole` when every plugin watches only one
//! and the same namespace and every kind involved is namespaced; the plugins' writes are then
//! granted in that namespace only (a plugin that writes elsewhere needs `cluster_scope = Some(true)`).
//!
//! Invariants: output is deterministic (rules sorted by group then resource, verbs sorted) so
//! it can be committed and diffed.

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
    /// `None`: a Role when everything is in one namespace, else a ClusterRole.
    /// `Some(true)`: always a ClusterRole. `Some(false)`: always a Role (in the plugins'
    /// namespace, or the ServiceAccount's namespace when they watch everywhere).
    pub cluster_scope: Option<bool>,
    /// Adds a Role for the Lease when set.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Adds a ClusterRole for the endpoint's token and access reviews when set.
    pub endpoint_auth: bool,
}

impl Default for RbacOptions {
    fn default() -> Self {
        RbacOptions {
            service_account: "wasmctrl".into(),
            service_account_namespace: "wasmctrl-system".into(),
            name: "wasmctrl".into(),
            cluster_scope: None,
            leader_election: None,
            endpoint_auth: false,
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

/// The single namespace every source of every plugin is limited to, if there is one.
fn common_namespace(plugins: &[PluginConfig]) -> Option<String> {
    let mut namespaces = plugins
        .iter()
        .flat_map(|p| std::iter::once(&p.for_source).chain(&p.owns).chain(&p.watches))
        .map(|s| s.namespace.clone());
    let first = namespaces.next()??;
    namespaces.all(|ns| ns.as_deref() == Some(&first)).then_some(first)
}

/// Builds the RBAC objects for `plugins`. `resolver` gives plurals and scopes (discovery when
/// online, [`crate::config::BuiltinKinds`] offline; unknown kinds get the plural Kubernetes
/// would guess and are taken as namespaced).
pub fn rbac_for(
    plugins: &[PluginConfig],
    options: &RbacOptions,
    resolver: &dyn KindResolver,
) -> RbacManifests {
    let mut rules = RuleSet::new();
    let mut all_namespaced = true;
    let mut note_kind =
        |rules: &mut RuleSet, kind: &Gvk, verbs: &[&'static str], sub: Option<(&str, &[&'static str])>| {
            let r = resolve_or_guess(resolver, kind);
            all_namespaced &= r.namespaced;
            add(rules, kind.group(), &r.plural, verbs);
            if let Some((sub, sub_verbs)) = sub {
                add(rules, kind.group(), &format!("{}/{sub}", r.plural), sub_verbs);
            }
        };
    for p in plugins {
        for kind in p.cached_kinds() {
            note_kind(&mut rules, kind, READ, None);
        }
        for kind in &p.write {
            note_kind(&mut rules, kind, WRITE, Some(("status", &["patch", "update"])));
        }
        if !p.owns.is_empty() {
            note_kind(&mut rules, &p.for_source.kind, READ, Some(("finalizers", &["update"])));
        }
    }
    add(&mut rules, "", "events", &["create", "patch"]);
    add(&mut rules, "events.k8s.io", "events", &["create", "patch"]);

    let policy_rules: Vec<PolicyRule> = rules
        .into_iter()
        .map(|((group, resource), verbs)| PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(vec![resource]),
            verbs: verbs.into_iter().map(str::to_owned).collect(),
            ..Default::default()
        })
        .collect();

    let common = common_namespace(plugins).filter(|_| all_namespaced);
    let namespaced = match options.cluster_scope {
        Some(cluster) => !cluster,
        None => common.is_some(),
    };
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

    let mut objects = Vec::new();
    if namespaced {
        let ns = common.unwrap_or_else(|| options.service_account_namespace.clone());
        objects.push(RbacObject::Role(Role {
            metadata: meta(&options.name, Some(ns.clone())),
            rules: Some(policy_rules),
        }));
        objects.push(RbacObject::RoleBinding(RoleBinding {
            metadata: meta(&options.name, Some(ns)),
            role_ref: RoleRef {
                api_group: String::from("rbac.authorization.k8s.io").into(),
                kind: "Role".into(),
                name: options.name.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        }));
    } else {
        objects.push(RbacObject::ClusterRole(ClusterRole {
            metadata: meta(&options.name, None),
            rules: Some(policy_rules),
            aggregation_rule: None,
        }));
        objects.push(RbacObject::ClusterRoleBinding(ClusterRoleBinding {
            metadata: meta(&options.name, None),
            role_ref: RoleRef {
                api_group: String::from("rbac.authorization.k8s.io").into(),
                kind: "ClusterRole".into(),
                name: options.name.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        }));
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
            subjects: Some(vec![subject]),
        }));
    }
    RbacManifests { objects }
}
