//! The three example plugins end to end: a cluster of either test backend (the dev cluster or
//! a real kube-apiserver, see `wasmctrl-testkit`) seeded with the plugin's files of
//! `examples/seed`, the plugins manager running `examples/plugins`, and the cluster state
//! `examples/EXPECTED.md` describes — after the seed, then after creates, updates and
//! deletes.
//!
//! The real server is shared by the tests, so each test renames what the seed and the
//! plugin's settings name (namespaces, Nodes) to names unique to the test; the behaviour
//! checked is the same.
//!
//! Needs the example plugins built next to their TOMLs: `cargo xtask build-guests`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use wasmctrl::admission::AdmissionSettings;
use wasmctrl_testkit::TestCluster;

#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

/// Bound on every wait for the plugins to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The seed files each example plugin works on.
fn seed_files(plugin: &str) -> &'static [&'static str] {
    match plugin {
        "configmap-mirror" => &["00-namespaces.yaml", "10-configmap-mirror.yaml"],
        "website-operator" => &["00-namespaces.yaml", "20-website-crd.yaml", "21-websites.yaml"],
        "pod-node-policy" => &["00-namespaces.yaml", "30-nodes-and-pods.yaml"],
        other => panic!("no seed files listed for {other}"),
    }
}

/// The names the seed and the plugins' settings use, each renamed to one unique to the test.
const RENAMED: &[&str] = &["team-a", "team-b", "kube-system", "node-1", "node-2", "node-9"];

struct Demo {
    cluster: TestCluster,
    client: kube::Client,
    /// The test's name for `default` (the source namespace of configmap-mirror).
    default_ns: String,
    host: TestHost,
}

impl Demo {
    /// The cluster with the plugin's seed files applied (names renamed, see [`Demo::name`]),
    /// and the manager running `plugin` from a copy of `examples/plugins` holding only that
    /// plugin, its settings renamed the same way.
    async fn start(plugin: &str) -> Demo {
        let cluster = TestCluster::start().await.expect("test cluster");
        let default_ns = cluster.namespace_named("default").await.expect("namespace");
        cluster.namespace_named("kube-system").await.expect("namespace");
        let rename = |text: &str| {
            let text = text.replace("namespace: default", &format!("namespace: {default_ns}"));
            RENAMED.iter().fold(text, |text, name| text.replace(name, &cluster.unique(name)))
        };
        for file in seed_files(plugin) {
            let seed = examples().join("seed").join(file);
            let yaml = std::fs::read_to_string(&seed).expect("seed");
            cluster.apply_yaml(&rename(&yaml)).await.unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
        }
        let client = cluster.client();
        // Webhooks are cluster-wide: on the shared real server they select the test's
        // namespaces only.
        let selector = format!(
            "[[admission]]\nnamespace-selector = \"kubernetes.io/metadata.name in ({}, {}, {default_ns})\"\n",
            cluster.unique("team-a"),
            cluster.unique("team-b")
        );
        let plugins = PluginsDir::new();
        plugins.install_from(&examples().join("plugins"), plugin, |toml| {
            rename(&toml).replace("[[admission]]\n", &selector)
        });
        // The real API server calls webhooks: the host writes their configurations there.
        let setup = HostSetup {
            admission: Some(AdmissionSettings {
                address: "127.0.0.1:0".parse().expect("address"),
                manage_configurations: cluster.backend() == wasmctrl_testkit::Backend::Real,
                configuration_prefix: cluster.unique("wasmctrl-examples"),
                ..AdmissionSettings::default()
            }),
            ..HostSetup::new("wasmctrl-examples", PATIENCE)
        };
        let host = TestHost::start(client.clone(), plugins, setup).await;
        host.assert_loaded(plugin);
        Demo { cluster, client, default_ns, host }
    }

    /// The test's name for a namespace or Node the seed names.
    fn name(&self, seed_name: &str) -> String {
        match seed_name {
            "default" => self.default_ns.clone(),
            other if RENAMED.contains(&other) => self.cluster.unique(other),
            other => other.to_owned(),
        }
    }

    async fn stop(self) {
        // The webhook configurations go with the test (the real server is shared).
        for plugin in ["website-operator", "configmap-mirror", "pod-node-policy"] {
            self.host.admission().router.remove(plugin).await;
        }
        self.host.stop().await;
        drop(self.cluster);
    }
}

/// Polls `check` until it passes (returns `Ok`), or fails with its last complaint.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    host::eventually(what, PATIENCE, check).await;
}

async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map_err(|e| e.to_string())
}

fn patch_json(value: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_mirror_copies_updates_and_cleans_up() {
    let demo = Demo::start("configmap-mirror").await;
    let ns = |n: &str| Api::<ConfigMap>::namespaced(demo.client.clone(), &demo.name(n));
    let source_data = |cm: &ConfigMap| cm.data.clone().unwrap_or_default();
    let source_key = format!("{}/app-config", demo.name("default"));
    let copies_match = || async {
        let source = get(&ns("default"), "app-config").await?.ok_or("source gone")?;
        if !source
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .contains(&"mirror.example.com/cleanup".to_owned())
        {
            return Err("source has no finalizer".to_owned());
        }
        for team in ["team-a", "team-b"] {
            let copy = get(&ns(team), "app-config").await?.ok_or(format!("no copy in {team}"))?;
            if copy.data != Some(source_data(&source)) {
                return Err(format!("{team} copy has {:?}", copy.data));
            }
            let labels = copy.metadata.labels.clone().unwrap_or_default();
            let annotations = copy.metadata.annotations.clone().unwrap_or_default();
            if labels.get("app.kubernetes.io/managed-by").map(String::as_str) != Some("configmap-mirror")
                || labels.contains_key("mirror")
                || annotations.get("mirror.example.com/source") != Some(&source_key)
            {
                return Err(format!("{team} copy metadata: {:?}", copy.metadata));
            }
        }
        Ok(())
    };
    eventually("copies after the seed", copies_match).await;
    assert!(get(&ns("team-a"), "local-only").await.unwrap().is_none());

    // Update: a changed and a removed key reach both copies.
    ns("default")
        .patch(
            "app-config",
            &PatchParams::default(),
            &patch_json(serde_json::json!({"data": {"log-level": "debug", "feature-flags": null}})),
        )
        .await
        .unwrap();
    eventually("copies follow the source", || async {
        copies_match().await?;
        let copy = get(&ns("team-b"), "app-config").await?.ok_or("no copy")?;
        match copy.data.unwrap_or_default().get("log-level").map(String::as_str) {
            Some("debug") => Ok(()),
            other => Err(format!("log-level {other:?}")),
        }
    })
    .await;

    // A deleted copy is re-created.
    ns("team-a").delete("app-config", &DeleteParams::default()).await.unwrap();
    eventually("the deleted copy comes back", copies_match).await;

    // Deleting the source deletes the copies, then the source goes.
    ns("default").delete("app-config", &DeleteParams::default()).await.unwrap();
    eventually("source and copies are gone", || async {
        for team in ["default", "team-a", "team-b"] {
            if get(&ns(team), "app-config").await?.is_some() {
                return Err(format!("{team}/app-config still exists"));
            }
        }
        Ok(())
    })
    .await;
    demo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn website_operator_builds_updates_and_deletes_children() {
    let demo = Demo::start("website-operator").await;
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Website");
    let team_a = demo.name("team-a");
    let websites: Api<DynamicObject> = Api::namespaced_with(
        demo.client.clone(),
        &team_a,
        &ApiResource::from_gvk_with_plural(&gvk, "websites"),
    );
    let deployments: Api<Deployment> = Api::namespaced(demo.client.clone(), &team_a);
    let services: Api<Service> = Api::namespaced(demo.client.clone(), &team_a);
    let configmaps: Api<ConfigMap> = Api::namespaced(demo.client.clone(), &team_a);

    let children_match = |replicas: i32| {
        let (websites, deployments, services, configmaps) =
            (websites.clone(), deployments.clone(), services.clone(), configmaps.clone());
        async move {
            let site = get(&websites, "blog").await?.ok_or("website gone")?;
            let uid = site.metadata.uid.clone().unwrap_or_default();
            let content = site.data["spec"]["content"].as_str().unwrap_or_default().to_owned();
            let deployment = get(&deployments, "blog").await?.ok_or("no deployment")?;
            let spec_replicas = deployment.spec.replicas;
            if spec_replicas != Some(replicas) {
                return Err(format!("deployment replicas {spec_replicas:?}"));
            }
            let service = get(&services, "blog").await?.ok_or("no service")?;
            let cm = get(&configmaps, "blog-content").await?.ok_or("no content configmap")?;
            if cm.data.unwrap_or_default().get("index.html") != Some(&content) {
                return Err("content configmap differs from spec.content".into());
            }
            for owners in [&deployment.metadata.owner_references, &service.metadata.owner_references] {
                let owners = owners.clone().unwrap_or_default();
                if owners.len() != 1 || owners[0].uid != uid || owners[0].controller != Some(true) {
                    return Err(format!("owner references {owners:?}"));
                }
            }
            let ready = site.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if !ready || site.data["status"]["observedGeneration"].as_i64() != site.metadata.generation {
                return Err(format!("status {}", site.data["status"]));
            }
            Ok(())
        }
    };
    eventually("children after the seed", || children_match(2)).await;

    websites
        .patch("blog", &PatchParams::default(), &patch_json(serde_json::json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    eventually("the deployment follows spec.replicas", || children_match(3)).await;

    services.delete("blog", &DeleteParams::default()).await.unwrap();
    eventually("the deleted service comes back", || children_match(3)).await;

    websites.delete("blog", &DeleteParams::default()).await.unwrap();
    eventually("the website and its children are gone", || async {
        if get(&websites, "blog").await?.is_some() {
            return Err("website still there".into());
        }
        if get(&deployments, "blog").await?.is_some() || get(&services, "blog").await?.is_some() {
            return Err("children still there".into());
        }
        Ok(())
    })
    .await;
    demo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_node_policy_flags_and_clears_violations() {
    let demo = Demo::start("pod-node-policy").await;
    const ANNOTATION: &str = "policy.example.com/violations";
    let pods = |ns: &str| Api::<Pod>::namespaced(demo.client.clone(), &demo.name(ns));
    let nodes: Api<Node> = Api::all(demo.client.clone());
    let (node_2, node_9) = (demo.name("node-2"), demo.name("node-9"));
    let verdict = |ns: &'static str, name: &'static str, want: Option<String>| {
        let api = pods(ns);
        async move {
            let want = want.as_deref();
            let pod = get(&api, name).await?.ok_or(format!("{ns}/{name} gone"))?;
            let got = pod.metadata.annotations.unwrap_or_default().get(ANNOTATION).cloned();
            if got.as_deref() == want { Ok(()) } else { Err(format!("{ns}/{name}: {got:?}, want {want:?}")) }
        }
    };
    eventually("verdicts after the seed", || async {
        verdict("team-a", "web-2", Some("MissingRequiredLabel(team)".into())).await?;
        let mismatch = format!("NodeSelectorMismatch(disktype=ssd on node {node_2}: hdd)");
        verdict("team-b", "db-1", Some(mismatch)).await?;
        verdict("team-b", "batch-1", Some(format!("NodeNotFound({node_9})"))).await?;
        verdict("team-a", "web-1", None).await?;
        verdict("kube-system", "agent-1", None).await
    })
    .await;

    // Node change → `watches` + `map` → the Pods on it are checked again.
    nodes
        .patch(
            &node_2,
            &PatchParams::default(),
            &patch_json(serde_json::json!({"metadata": {"labels": {"disktype": "ssd"}}})),
        )
        .await
        .unwrap();
    eventually("db-1 complies once node-2 is ssd", || verdict("team-b", "db-1", None)).await;

    // Pod changes: adding the label clears, removing it flags.
    pods("team-a")
        .patch(
            "web-2",
            &PatchParams::default(),
            &patch_json(serde_json::json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    pods("team-a")
        .patch(
            "web-1",
            &PatchParams::default(),
            &patch_json(serde_json::json!({"metadata": {"labels": {"team": null}}})),
        )
        .await
        .unwrap();
    eventually("web-2 clears and web-1 is flagged", || async {
        verdict("team-a", "web-2", None).await?;
        verdict("team-a", "web-1", Some("MissingRequiredLabel(team)".into())).await
    })
    .await;

    // A created Node resolves NodeNotFound.
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node_9}
    }))
    .unwrap();
    nodes.create(&Default::default(), &node).await.unwrap();
    eventually("batch-1 complies once node-9 exists", || verdict("team-b", "batch-1", None)).await;
    demo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn website_operator_defaults_and_validates_websites_through_the_api_server() {
    let demo = Demo::start("website-operator").await;
    if demo.cluster.backend() != wasmctrl_testkit::Backend::Real {
        eprintln!(
            "website admission: skipped on the dev cluster: it does not call admission webhooks (the fixture of guests/examples/website-operator runs the same webhooks there)"
        );
        return demo.stop().await;
    }
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Website");
    let websites: Api<DynamicObject> = Api::namespaced_with(
        demo.client.clone(),
        &demo.name("team-a"),
        &ApiResource::from_gvk_with_plural(&gvk, "websites"),
    );
    let website = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Website",
            "metadata": {"name": name, "namespace": demo.name("team-a")},
            "spec": spec,
        }))
        .unwrap()
    };
    let post = kube::api::PostParams::default();
    // The API server's webhook informer picks the configurations up: wait until a Website
    // the validating webhook refuses is refused (a dry run, so nothing is stored).
    let dry = kube::api::PostParams { dry_run: true, ..kube::api::PostParams::default() };
    eventually("the webhooks are called", || async {
        match websites.create(&dry, &website("probe", serde_json::json!({"replicas": 11}))).await {
            Err(kube::Error::Api(s)) if s.message.contains("spec.replicas") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let e = websites.create(&post, &website("huge", serde_json::json!({"replicas": 11}))).await.unwrap_err();
    let kube::Error::Api(status) = e else { panic!("{e}") };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("spec.replicas: Invalid value: 11: must be between 0 and 10"),
        "{status:?}"
    );
    // Defaulted: the page names the site.
    let stored = websites.create(&post, &website("bare", serde_json::json!({}))).await.expect("admitted");
    assert_eq!(stored.data["spec"]["content"], "<h1>bare</h1>", "{:?}", stored.data);
    // A host another Website serves, from the operator's cache.
    websites
        .create(&post, &website("one", serde_json::json!({"host": "blog.example.com"})))
        .await
        .expect("admitted");
    eventually("a taken host is refused", || async {
        match websites.create(&dry, &website("two", serde_json::json!({"host": "blog.example.com"}))).await {
            Err(kube::Error::Api(s)) if s.message.contains("website one already serves it") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    demo.stop().await;
}
