//! kubectl as a real client of the dev cluster. Each test writes a kubeconfig to a tempdir and
//! runs `kubectl --kubeconfig ...`; tests skip (with a message) only if kubectl is absent.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use wasmctrl_devcluster::DevCluster;

use super::cluster;

struct Kubectl {
    cluster: DevCluster,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn kubectl_present() -> bool {
    let ok = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: kubectl is not installed; kubectl compatibility tests did not run");
    }
    ok
}

impl Kubectl {
    async fn new() -> Option<Self> {
        if !kubectl_present() {
            return None;
        }
        let cluster = cluster().await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig).unwrap();
        Some(Self { cluster, dir, kubeconfig })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl; returns (success, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.command(args).output().await.expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs kubectl and requires success; returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\nstdout: {out}\nstderr: {err}");
        out
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a).await).expect("kubectl prints JSON")
    }

    fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        path_str(&p)
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

const CM: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  labels:\n    app: demo\ndata:\n  a: \"1\"\n";

#[tokio::test]
async fn kubectl_create_get_list_json_and_table() {
    let Some(k) = Kubectl::new().await else { return };
    let f = k.file("cm.yaml", CM);
    assert!(k.ok(&["create", "-f", &f]).await.contains("configmap/demo created"));
    let (ok, _, err) = k.run(&["create", "-f", &f]).await;
    assert!(!ok && err.contains("AlreadyExists"), "{err}");
    let one = k.json(&["get", "configmap", "demo"]).await;
    assert_eq!(one["data"]["a"], "1");
    assert_eq!(one["metadata"]["namespace"], "default");
    let list = k.json(&["get", "configmaps", "-l", "app=demo"]).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let none = k.json(&["get", "configmaps", "-l", "app=other"]).await;
    assert!(none["items"].as_array().unwrap().is_empty());
    let table = k.ok(&["get", "cm"]).await;
    assert!(table.starts_with("NAME") && table.contains("AGE") && table.contains("demo"), "{table}");
    let all = k.ok(&["get", "namespaces", "-o", "name"]).await;
    assert!(all.contains("namespace/default"), "{all}");
    let (ok, _, err) = k.run(&["get", "cm", "missing"]).await;
    assert!(!ok && err.contains("NotFound") && err.contains("\"missing\" not found"), "{err}");
}

#[tokio::test]
async fn kubectl_create_generators_send_protobuf() {
    let Some(k) = Kubectl::new().await else { return };
    k.ok(&["create", "namespace", "team-a"]).await;
    k.ok(&["create", "configmap", "lit", "-n", "team-a", "--from-literal=x=1", "--from-literal=y=2"]).await;
    k.ok(&["create", "secret", "generic", "s", "-n", "team-a", "--from-literal=password=hunter2"]).await;
    let cm = k.json(&["get", "cm", "lit", "-n", "team-a"]).await;
    assert_eq!(cm["data"], serde_json::json!({"x": "1", "y": "2"}));
    let secret = k.json(&["get", "secret", "s", "-n", "team-a"]).await;
    assert_eq!(secret["data"]["password"], "aHVudGVyMg==");
    assert_eq!(secret["type"], "Opaque");
    let ns = k.json(&["get", "namespace", "team-a"]).await;
    assert_eq!(ns["status"]["phase"], "Active");
}

#[tokio::test]
async fn kubectl_create_deployment_and_service_send_protobuf() {
    let Some(k) = Kubectl::new().await else { return };
    k.ok(&["create", "deployment", "web", "--image=nginx", "--replicas=2", "--port=80"]).await;
    let d = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web");
    assert_eq!(d["spec"]["template"]["metadata"]["labels"]["app"], "web");
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "nginx");
    assert_eq!(container["image"], "nginx");
    assert_eq!(container["ports"][0]["containerPort"], 80);
    assert_eq!(d["metadata"]["generation"], 1);
    k.ok(&["create", "service", "clusterip", "web", "--tcp=80:8080"]).await;
    let svc = k.json(&["get", "service", "web"]).await;
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080, "an int-or-string holding an int");
}

#[tokio::test]
async fn kubectl_explain_reads_the_openapi_schemas() {
    let Some(k) = Kubectl::new().await else { return };
    let cm = k.ok(&["explain", "configmap"]).await;
    assert!(cm.contains("KIND:       ConfigMap") && cm.contains("FIELDS:"), "{cm}");
    assert!(cm.contains("  data\t<map[string]string>"), "{cm}");
    assert!(!cm.contains("-required-"), "nothing of a ConfigMap is required: {cm}");
    let replicas = k.ok(&["explain", "deployment.spec.replicas"]).await;
    assert!(replicas.contains("FIELD: replicas <integer>"), "{replicas}");
    assert!(replicas.contains("Number of desired pods"), "{replicas}");
    let containers = k.ok(&["explain", "pod.spec.containers"]).await;
    assert!(
        containers.contains("<[]Container>") && containers.contains("name\t<string> -required-"),
        "{containers}"
    );
    // A custom resource's schema is its CRD's; applying the CRD passes kubectl's validation.
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: gadgets.example.com\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: gadgets, singular: gadget, kind: Gadget}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec:\n            type: object\n            description: What the gadget should be.\n            properties:\n              size: {type: integer, description: How big the gadget is.}\n";
    k.ok(&["apply", "-f", &k.file("crd.yaml", crd)]).await;
    k.ok(&["wait", "--for=condition=Established", "crd/gadgets.example.com", "--timeout=30s"]).await;
    let spec = k.ok(&["explain", "gadget.spec"]).await;
    assert!(spec.contains("What the gadget should be.") && spec.contains("size\t<integer>"), "{spec}");
    assert!(spec.contains("How big the gadget is."), "{spec}");
    // A changed schema changes the document's hash, so kubectl's cache refetches it.
    k.ok(&["apply", "-f", &k.file("crd.yaml", &crd.replace("How big the gadget is.", "Its size in cm."))])
        .await;
    let spec = k.ok(&["explain", "gadget.spec"]).await;
    assert!(spec.contains("Its size in cm."), "{spec}");
    let (ok, _, err) = k.run(&["explain", "gadget.nothing"]).await;
    assert!(!ok && err.contains("nothing"), "{err}");
}

#[tokio::test]
async fn kubectl_apply_client_and_server_side() {
    let Some(k) = Kubectl::new().await else { return };
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: main\n        image: nginx:1\n        env:\n        - {name: A, value: \"1\"}\n";
    let f = k.file("deploy.yaml", deploy);
    assert!(k.ok(&["apply", "-f", &f]).await.contains("deployment.apps/web created"));
    let f = k.file(
        "deploy.yaml",
        &deploy.replace("replicas: 1", "replicas: 3").replace("value: \"1\"", "value: \"2\""),
    );
    assert!(k.ok(&["apply", "-f", &f]).await.contains("configured"));
    let d = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["generation"], 2);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"], "2");
    assert!(d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());
    // Unchanged apply is a no-op.
    assert!(k.ok(&["apply", "-f", &f]).await.contains("unchanged"));

    let cm = k.file("cm.yaml", CM);
    assert!(k.ok(&["apply", "--server-side", "-f", &cm]).await.contains("serverside-applied"));
    let got = k.json(&["get", "cm", "demo", "--show-managed-fields"]).await;
    assert_eq!(got["metadata"]["managedFields"][0]["manager"], "kubectl");
    assert_eq!(got["metadata"]["managedFields"][0]["operation"], "Apply");
    // Another manager's conflicting apply fails, and succeeds with --force-conflicts.
    let other = k.file("cm2.yaml", &CM.replace("a: \"1\"", "a: \"2\""));
    let (ok, _, err) = k.run(&["apply", "--server-side", "--field-manager", "other", "-f", &other]).await;
    assert!(!ok && err.contains("conflict"), "{err}");
    k.ok(&["apply", "--server-side", "--field-manager", "other", "--force-conflicts", "-f", &other]).await;
    assert_eq!(k.json(&["get", "cm", "demo"]).await["data"]["a"], "2");
}

#[tokio::test]
async fn kubectl_patch_merge_and_json() {
    let Some(k) = Kubectl::new().await else { return };
    k.ok(&["create", "-f", &k.file("cm.yaml", CM)]).await;
    k.ok(&["patch", "cm", "demo", "--type", "merge", "-p", r#"{"data":{"b":"2"}}"#]).await;
    k.ok(&[
        "patch",
        "cm",
        "demo",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/data/a","value":"9"}]"#,
    ])
    .await;
    k.ok(&["patch", "cm", "demo", "-p", r#"{"metadata":{"labels":{"extra":"yes"}}}"#]).await;
    let got = k.json(&["get", "cm", "demo"]).await;
    assert_eq!(got["data"]["a"], "9");
    assert_eq!(got["data"]["b"], "2");
    assert_eq!(got["metadata"]["labels"]["extra"], "yes");
    let (ok, _, err) = k
        .run(&[
            "patch",
            "cm",
            "demo",
            "--type",
            "json",
            "-p",
            r#"[{"op":"test","path":"/data/a","value":"0"}]"#,
        ])
        .await;
    assert!(!ok, "{err}");
}

#[tokio::test]
async fn kubectl_delete_with_finalizers() {
    let Some(k) = Kubectl::new().await else { return };
    let with_fin = CM.replace("  labels:", "  finalizers: [example.com/hold]\n  labels:");
    k.ok(&["create", "-f", &k.file("cm.yaml", &with_fin)]).await;
    assert!(k.ok(&["delete", "cm", "demo", "--wait=false"]).await.contains("deleted"));
    let pending = k.json(&["get", "cm", "demo"]).await;
    assert!(pending["metadata"]["deletionTimestamp"].is_string());
    k.ok(&["patch", "cm", "demo", "--type", "merge", "-p", r#"{"metadata":{"finalizers":null}}"#]).await;
    let (ok, _, err) = k.run(&["get", "cm", "demo"]).await;
    assert!(!ok && err.contains("not found"), "{err}");
    // Plain delete waits for the object to go (kubectl watches until DELETED).
    k.ok(&["create", "-f", &k.file("cm2.yaml", CM)]).await;
    k.ok(&["delete", "cm", "demo"]).await;
    assert!(k.ok(&["get", "cm", "-o", "name"]).await.trim().is_empty());
}

#[tokio::test]
async fn kubectl_get_watch_receives_events() {
    let Some(k) = Kubectl::new().await else { return };
    let mut child = k
        .command(&["get", "configmaps", "--watch", "--output-watch-events", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let client = k.cluster.client().unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "default");
    let named = |n: &str| -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": n}})).unwrap()
    };
    // Events are JSON objects one after the other (one per line, or pretty-printed).
    let mut buf = String::new();
    let mut next_event = async || -> Value {
        loop {
            let line = lines.next_line().await.unwrap().expect("kubectl keeps watching");
            buf.push_str(&line);
            buf.push('\n');
            if let Ok(ev) = serde_json::from_str::<Value>(&buf) {
                buf.clear();
                return ev;
            }
        }
    };
    let guard = std::time::Duration::from_secs(60);
    let run = async {
        // A sentinel proves kubectl is listening (from its list or its watch) before the changes.
        api.create(&Default::default(), &named("sentinel")).await.unwrap();
        loop {
            let ev = next_event().await;
            if ev["object"]["metadata"]["name"] == "sentinel" {
                break;
            }
        }
        api.create(&Default::default(), &named("watched")).await.unwrap();
        api.patch(
            "watched",
            &Default::default(),
            &kube::api::Patch::Merge(serde_json::json!({"data": {"x": "1"}})),
        )
        .await
        .unwrap();
        api.delete("watched", &Default::default()).await.unwrap();
        let mut types = Vec::new();
        while types.len() < 3 {
            let ev = next_event().await;
            if ev["object"]["metadata"]["name"] == "watched" {
                types.push(ev["type"].as_str().unwrap().to_string());
            }
        }
        types
    };
    let types = tokio::time::timeout(guard, run).await.expect("kubectl reported the events");
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn kubectl_api_resources_and_crds() {
    let Some(k) = Kubectl::new().await else { return };
    let res = k.ok(&["api-resources"]).await;
    for r in ["configmaps", "deployments", "leases", "customresourcedefinitions", "namespaces"] {
        assert!(res.contains(r), "{r} missing in:\n{res}");
    }
    let crd = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wg]}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    subresources: {status: {}}\n    additionalPrinterColumns:\n    - {name: Size, type: integer, jsonPath: .spec.size}\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n";
    k.ok(&["create", "-f", &k.file("crd.yaml", crd)]).await;
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"]).await;
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n";
    k.ok(&["create", "-f", &k.file("w.yaml", widget)]).await;
    let got = k.json(&["get", "widgets", "w1"]).await;
    assert_eq!(got["spec"]["size"], 3);
    let table = k.ok(&["get", "wg"]).await;
    assert!(table.contains("SIZE") && table.contains("w1"), "{table}");
    // Client-side apply of a custom resource uses a JSON merge patch.
    k.ok(&["apply", "-f", &k.file("w.yaml", &widget.replace("size: 3", "size: 4"))]).await;
    assert_eq!(k.json(&["get", "widget", "w1"]).await["spec"]["size"], 4);
    let res = k.ok(&["api-resources", "--api-group", "example.com"]).await;
    assert!(res.contains("widgets") && res.contains("Widget"), "{res}");
    k.ok(&["delete", "crd", "widgets.example.com"]).await;
    let (ok, _, _) = k.run(&["get", "widgets.example.com"]).await;
    assert!(!ok, "the kind is no longer served");
}
