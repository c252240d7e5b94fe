//! The registry of served resources: the built-in kinds plus the kinds that
//! CustomResourceDefinitions add. Each resource is stored once per group/resource
//! ([`GroupResource`]) whatever version it is read through (storage is schemaless, so
//! versions differ only in the `apiVersion` they report).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// Identifies a storage bucket: `(group, plural resource)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct GroupResource {
    /// API group, empty for core.
    pub group: String,
    /// Plural resource name, e.g. `configmaps`.
    pub resource: String,
}

impl std::fmt::Display for GroupResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// Everything the server knows about one resource (all its served versions).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceInfo {
    /// Group and plural.
    pub gr: GroupResource,
    /// Served versions, preferred (storage) first.
    pub versions: Vec<String>,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Singular lower-case name.
    pub singular: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories (e.g. `all`).
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource (status ignored on main-resource writes).
    pub status_subresource: bool,
    /// CRD `additionalPrinterColumns` per version: `(name, type, jsonPath)`.
    pub printer_columns: Vec<(String, String, String)>,
    /// Whether the resource comes from a CRD.
    pub custom: bool,
}

impl ResourceInfo {
    /// `apiVersion` string for `version` of this resource.
    pub fn api_version(&self, version: &str) -> String {
        if self.gr.group.is_empty() { version.to_string() } else { format!("{}/{}", self.gr.group, version) }
    }

    /// The storage version (the first served version).
    pub fn storage_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    /// The `List` kind.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The `APIResource` discovery entry for this resource (and its status subresource).
    pub fn discovery_entries(&self) -> Vec<Value> {
        let verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
        let mut main = json!({
            "name": self.gr.resource,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        if self.status_subresource {
            out.push(json!({
                "name": format!("{}/status", self.gr.resource),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }
}

/// Resources served now, indexed for path resolution and discovery.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    by_gr: BTreeMap<GroupResource, Arc<ResourceInfo>>,
}

impl Registry {
    /// The registry with the built-in kinds.
    pub fn builtin() -> Self {
        let mut r = Self::default();
        let b = |group: &str,
                 version: &str,
                 resource: &str,
                 kind: &str,
                 namespaced: bool,
                 short: &[&str],
                 status: bool| ResourceInfo {
            gr: GroupResource { group: group.into(), resource: resource.into() },
            versions: vec![version.into()],
            kind: kind.into(),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            status_subresource: status,
            printer_columns: Vec::new(),
            custom: false,
        };
        for info in [
            b("", "v1", "namespaces", "Namespace", false, &["ns"], true),
            b("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
            b("", "v1", "secrets", "Secret", true, &[], false),
            b("", "v1", "services", "Service", true, &["svc"], true),
            b("", "v1", "pods", "Pod", true, &["po"], true),
            b("", "v1", "nodes", "Node", false, &["no"], true),
            b("", "v1", "events", "Event", true, &["ev"], false),
            b("events.k8s.io", "v1", "events", "Event", true, &["ev"], false),
            b("apps", "v1", "deployments", "Deployment", true, &["deploy"], true),
            b("coordination.k8s.io", "v1", "leases", "Lease", true, &[], false),
            b(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                false,
                &["crd", "crds"],
                true,
            ),
        ] {
            let mut info = info;
            if matches!(info.kind.as_str(), "Pod" | "Service" | "Deployment") {
                info.categories = vec!["all".into()];
            }
            r.insert(info);
        }
        r
    }

    /// Adds or replaces a resource.
    pub fn insert(&mut self, info: ResourceInfo) {
        self.by_gr.insert(info.gr.clone(), Arc::new(info));
    }

    /// Removes a resource.
    pub fn remove(&mut self, gr: &GroupResource) -> Option<Arc<ResourceInfo>> {
        self.by_gr.remove(gr)
    }

    /// The resource `group/resource` if it serves `version`.
    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        let gr = GroupResource { group: group.into(), resource: resource.into() };
        self.by_gr.get(&gr).filter(|i| i.versions.iter().any(|v| v == version)).cloned()
    }

    /// The resource by group/resource, any version.
    pub fn by_gr(&self, gr: &GroupResource) -> Option<Arc<ResourceInfo>> {
        self.by_gr.get(gr).cloned()
    }

    /// The resource serving `kind` in `apiVersion`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<(Arc<ResourceInfo>, String)> {
        let (group, version) = split_api_version(api_version);
        self.by_gr
            .values()
            .find(|i| i.gr.group == group && i.kind == kind && i.versions.iter().any(|v| v == version))
            .map(|i| (i.clone(), version.to_string()))
    }

    /// All resources.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.by_gr.values()
    }

    /// Groups (excluding core) with their versions, preferred first, in a stable order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for info in self.by_gr.values() {
            if info.gr.group.is_empty() {
                continue;
            }
            let vs = groups.entry(info.gr.group.clone()).or_default();
            for v in &info.versions {
                if !vs.contains(v) {
                    vs.push(v.clone());
                }
            }
        }
        groups.into_iter().collect()
    }
}

/// Splits `group/version` (or `version` for core) into `(group, version)`.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Builds the [`ResourceInfo`] a CRD object defines, or explains why it is invalid.
pub fn crd_resource(crd: &Value) -> Result<ResourceInfo, String> {
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .filter(|g| !g.is_empty())
        .ok_or("spec.group: Required value")?;
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let plural = s(names, "plural").ok_or("spec.names.plural: Required value")?;
    let kind = s(names, "kind").ok_or("spec.names.kind: Required value")?;
    let singular = s(names, "singular").unwrap_or_else(|| kind.to_lowercase());
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
        ));
    }
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => return Err("spec.scope: Unsupported value: must be \"Namespaced\" or \"Cluster\"".into()),
    };
    let list = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let versions_json = spec
        .get("versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or("spec.versions: Required value")?;
    let mut versions = Vec::new();
    let mut status_subresource = false;
    let mut printer_columns = Vec::new();
    let mut storage_first = None;
    for v in versions_json {
        let vname = s(v, "name").ok_or("spec.versions[].name: Required value")?;
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage_first = Some(vname.clone());
            if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
                for c in cols {
                    if let (Some(n), Some(p)) = (s(c, "name"), s(c, "jsonPath")) {
                        printer_columns.push((n, s(c, "type").unwrap_or_else(|| "string".into()), p));
                    }
                }
            }
        }
        versions.push(vname);
    }
    if versions.is_empty() {
        return Err("spec.versions: must have at least one served version".into());
    }
    if let Some(sv) = storage_first
        && let Some(pos) = versions.iter().position(|v| *v == sv)
    {
        let v = versions.remove(pos);
        versions.insert(0, v);
    }
    Ok(ResourceInfo {
        gr: GroupResource { group: group.into(), resource: plural },
        versions,
        kind,
        singular,
        namespaced,
        short_names: list(names.get("shortNames")),
        categories: list(names.get("categories")),
        status_subresource,
        printer_columns,
        custom: true,
    })
}
