//! The manifests in `deploy/` are valid Kubernetes objects: each document parses into its
//! k8s-openapi type, and nothing is lost on the way (a misspelt field would be).

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;
use serde_json::Value;

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone()).expect("document parses into its type");
    serde_json::to_value(typed).expect("serialises")
}

/// Every field of `want` is in `got` with the same value (k8s-openapi drops unknown fields
/// and may add defaults, so compare one way).
fn assert_contains(want: &Value, got: &Value, path: &str) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let child = format!("{path}.{k}");
                let g = g.get(k).unwrap_or_else(|| panic!("{child} is not a field of this kind"));
                assert_contains(v, g, &child);
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            assert_eq!(w.len(), g.len(), "{path}");
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                assert_contains(w, g, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(want, got, "{path}"),
    }
}

fn check_file(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).expect("manifest readable");
    let mut n = 0;
    for doc in serde_norway::Deserializer::from_str(&text) {
        let doc = Value::deserialize(doc).expect("valid YAML");
        if doc.is_null() {
            continue;
        }
        let kind = doc["kind"].as_str().expect("kind").to_owned();
        let back = match kind.as_str() {
            "Namespace" => roundtrip::<Namespace>(&doc),
            "ServiceAccount" => roundtrip::<ServiceAccount>(&doc),
            "ConfigMap" => roundtrip::<ConfigMap>(&doc),
            "Deployment" => roundtrip::<Deployment>(&doc),
            "ClusterRole" => roundtrip::<ClusterRole>(&doc),
            "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(&doc),
            "Role" => roundtrip::<Role>(&doc),
            "RoleBinding" => roundtrip::<RoleBinding>(&doc),
            other => panic!("{}: unexpected kind {other}", path.display()),
        };
        assert_contains(&doc, &back, &format!("{}:{kind}", path.display()));
        n += 1;
    }
    n
}

#[test]
fn deploy_manifests_are_valid_kubernetes_objects() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut docs = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/kubernetes exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            docs += check_file(&path);
        }
    }
    assert!(docs >= 5, "expected Namespace, ServiceAccount, ConfigMap, Deployment and RBAC; found {docs}");
}

#[test]
fn deployment_probes_point_at_the_host_endpoints() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/wasmctrl.yaml"),
    )
    .unwrap();
    let deployment = serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    // Through the typed object, so the fields are the real ones, then read back as JSON.
    let d: Deployment = serde_json::from_value(deployment).unwrap();
    let d = serde_json::to_value(d).unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], true);
}

/// The manifest's endpoint leaves loopback, so it checks who reads it: the host TOML asks for
/// `auth = "kubernetes"`, the probes speak HTTPS, the host may create token and access
/// reviews, and a ClusterRole grants readers `/metrics` alone.
#[test]
fn the_endpoint_off_loopback_is_served_with_kubernetes_auth() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let text = std::fs::read_to_string(dir.join("wasmctrl.yaml")).unwrap();
    let docs: Vec<Value> =
        serde_norway::Deserializer::from_str(&text).map(|d| Value::deserialize(d).unwrap()).collect();
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap").expect("the host's ConfigMap");
    let toml = config["data"]["wasmctrl.toml"].as_str().expect("wasmctrl.toml");
    let host = wasmctrl::config::HostConfig::parse(Path::new("/etc/wasmctrl/wasmctrl.toml"), toml)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!host.server_address.ip().is_loopback());
    assert_eq!(host.server_auth, wasmctrl::config::ServerAuth::Kubernetes { tls: None });

    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let d: Deployment = serde_json::from_value(deployment.clone()).unwrap();
    let d = serde_json::to_value(d).unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    assert_eq!(d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"], "https");

    let reader = docs.iter().find(|d| d["kind"] == "ClusterRole").expect("the metrics reader role");
    let reader: ClusterRole = serde_json::from_value(reader.clone()).unwrap();
    let rules = reader.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].non_resource_urls.as_deref(), Some(&["/metrics".to_owned()][..]));
    assert_eq!(rules[0].verbs, ["get"]);

    let rbac = std::fs::read_to_string(dir.join("rbac.yaml")).unwrap();
    let roles: Vec<ClusterRole> = serde_norway::Deserializer::from_str(&rbac)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|d| d["kind"] == "ClusterRole")
        .map(|d| serde_json::from_value(d).unwrap())
        .collect();
    let granted = |group: &str, resource: &str| {
        roles.iter().flat_map(|r| r.rules.iter().flatten()).any(|rule| {
            rule.api_groups.as_deref().is_some_and(|g| g.iter().any(|g| g == group))
                && rule.resources.as_deref().is_some_and(|r| r.iter().any(|r| r == resource))
                && rule.verbs.iter().any(|v| v == "create")
        })
    };
    assert!(granted("authentication.k8s.io", "tokenreviews"));
    assert!(granted("authorization.k8s.io", "subjectaccessreviews"));
}

/// The ConfigMap-delivered plugins manifest: the host TOML's `plugins-dir` is where the
/// plugins ConfigMap is mounted (a whole-volume mount, which the kubelet updates), each
/// plugin TOML in it is valid and names its component on the code volume.
#[test]
fn plugin_tomls_from_a_configmap_are_valid_and_name_their_code_volume() {
    use wasmctrl::config::{HostConfig, PluginConfig, PluginDefaults};
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/wasmctrl-plugins-configmap.yaml"),
    )
    .unwrap();
    let docs: Vec<Value> =
        serde_norway::Deserializer::from_str(&text).map(|d| Value::deserialize(d).unwrap()).collect();
    let by_name = |name: &str| docs.iter().find(|d| d["metadata"]["name"] == name).expect(name).clone();
    let host = by_name("wasmctrl-config")["data"]["wasmctrl.toml"].as_str().unwrap().to_owned();
    let host = HostConfig::parse(Path::new("/etc/wasmctrl/wasmctrl.toml"), &host).expect("host TOML");
    let deployment: Deployment =
        serde_json::from_value(docs.iter().find(|d| d["kind"] == "Deployment").unwrap().clone()).unwrap();
    let spec = deployment.spec.template.spec.unwrap();
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    let plugins_mount = mounts.iter().find(|m| m.name == "plugins").expect("plugins mount");
    assert_eq!(Path::new(&plugins_mount.mount_path), host.plugins_dir);
    assert!(plugins_mount.sub_path.is_none(), "a subPath mount never sees the kubelet's updates");
    let volumes = spec.volumes.unwrap();
    let plugins_volume = volumes.iter().find(|v| v.name == "plugins").unwrap();
    assert_eq!(plugins_volume.config_map.as_ref().map(|c| c.name.as_str()), Some("wasmctrl-plugins"));
    let wasm_mount = mounts.iter().find(|m| m.name == "wasm").expect("code volume");
    let plugins = by_name("wasmctrl-plugins");
    let files = plugins["data"].as_object().unwrap();
    assert!(!files.is_empty());
    for (file, toml) in files {
        let path = host.plugins_dir.join(file);
        let config = PluginConfig::parse(&path, toml.as_str().unwrap(), &PluginDefaults::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            config.wasm_path.starts_with(&wasm_mount.mount_path),
            "{file}: {}",
            config.wasm_path.display()
        );
    }
}
