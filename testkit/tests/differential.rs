//! Differential tests of the dev cluster: the same request sequences, through kube-rs (raw
//! requests, so status codes and bodies are seen as sent) and through kubectl, against the dev
//! cluster and a real kube-apiserver. Responses are compared after normalising what
//! legitimately differs (uid, timestamps, resourceVersion values, continue tokens, the test's
//! namespace name, Status messages); watch streams are compared as sequences of (type, name).
//!
//! Every difference must be listed in [`KNOWN_GAPS`] (and in `docs/dev-cluster.md`, with the
//! reason); the test fails on a new difference and on a listed gap that no longer shows, so
//! the list stays true.
//!
//! Runs only when the real backend is selected (`WASMCTRL_TEST_BACKEND=real`, as in the second
//! half of `cargo xtask test`); otherwise it says it is skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use wasmctrl_devcluster::DevClusterConfig;
use wasmctrl_testkit::{Backend, TestCluster};

/// Steps whose responses differ between the dev cluster and the real API server, with why.
/// Keep in sync with `docs/dev-cluster.md`.
const KNOWN_GAPS: &[(&str, &str)] = &[
    ("apply-conflict", "the apply-conflict Status also names group, kind and name in its details"),
    ("gc-Background-delete", "an immediate delete answers with the deleted object, not a Status Success"),
    ("gc-Foreground-delete", "empty maps (data: {}, labels: {}) are kept; the API server omits them"),
    ("gc-Orphan-delete", "empty maps (data: {}, labels: {}) are kept; the API server omits them"),
    ("list-page-1", "list items of built-in kinds carry apiVersion/kind; empty maps are kept"),
    ("list-page-2", "list items of built-in kinds carry apiVersion/kind; empty maps are kept"),
    ("list-selector", "list items of built-in kinds carry apiVersion/kind; empty maps are kept"),
    ("list-set-selector", "list items of built-in kinds carry apiVersion/kind; empty maps are kept"),
    ("kubectl-apply-server-side", "server-side apply over a client-side-applied object fails"),
    ("kubectl-get", "follows from kubectl-apply-server-side"),
    ("kubectl-label", "follows from kubectl-apply-server-side"),
    ("kubectl-diff-changed", "empty maps are kept: `annotations: {}` shows once kubectl hides last-applied"),
];

/// One response, normalised.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    code: u16,
    body: Value,
}

/// Replaces what legitimately differs between two servers by placeholders.
fn normalize(value: &mut Value, ns: &str) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match key.as_str() {
                    "uid" | "creationTimestamp" | "deletionTimestamp" | "resourceVersion" | "time"
                    | "continue" | "lastTransitionTime" | "lastUpdateTime" | "lastHeartbeatTime"
                        if v.is_string() && v.as_str() != Some("") =>
                    {
                        *v = json!(format!("<{key}>"));
                    }
                    _ => normalize(v, ns),
                }
            }
            // Known gap: the dev cluster's fieldsV1 lacks the "." and "v:" entries (see
            // docs/dev-cluster.md); ownership itself is compared through apply conflicts.
            map.remove("managedFields");
            // Status messages are prose; codes, reasons and details are compared.
            if map.get("kind").and_then(Value::as_str) == Some("Status") {
                map.remove("message");
            }
            if let Some(Value::Array(causes)) = map.get_mut("causes") {
                causes.iter_mut().filter_map(Value::as_object_mut).for_each(|c| {
                    c.remove("message");
                });
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, ns)),
        Value::String(s) if s.contains(ns) => *s = s.replace(ns, "<ns>"),
        _ => {}
    }
}

/// Keeps only the given JSON pointers of a body (for kinds the dev cluster does not default).
fn project(body: &Value, pointers: &[&str]) -> Value {
    let mut out = serde_json::Map::new();
    for p in pointers {
        out.insert((*p).to_owned(), body.pointer(p).cloned().unwrap_or(Value::Null));
    }
    Value::Object(out)
}

struct Side {
    cluster: TestCluster,
    client: kube::Client,
    ns: String,
}

impl Side {
    async fn start(backend: Backend) -> Side {
        // HTTPS on the dev side too, so kubectl (which sends no token over plain HTTP) works.
        let cluster = TestCluster::start_backend(backend, DevClusterConfig::default())
            .await
            .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        let client = cluster.client();
        let ns = cluster.namespace_named("diff").await.unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        Side { cluster, client, ns }
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (u16, Vec<u8>) {
        let path = path.replace("{ns}", &self.ns);
        let body = body.map(|b| {
            serde_json::to_vec(&b.to_string().replace("{ns}", &self.ns).parse::<Value>().unwrap()).unwrap()
        });
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(body.unwrap_or_default())
            .unwrap();
        let response = self.client.send(request.map(Into::into)).await.unwrap_or_else(|e| panic!("{e}"));
        let code = response.status().as_u16();
        let bytes = response.into_body().collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
        (code, bytes)
    }

    async fn call(&self, method: &str, path: &str, content_type: &str, body: Option<&Value>) -> Answer {
        let (code, bytes) = self.raw(method, path, content_type, body).await;
        let mut body =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)));
        normalize(&mut body, &self.ns);
        Answer { code, body }
    }

    /// A watch that ends after `timeoutSeconds`: its events as (type, name), bookmarks apart.
    async fn watch(&self, path: &str) -> Answer {
        let (code, bytes) = self.raw("GET", path, "application/json", None).await;
        let mut events = Vec::new();
        for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.trim().is_empty()) {
            let mut event: Value = serde_json::from_str(line).unwrap_or_else(|_| json!(line));
            normalize(&mut event, &self.ns);
            let kind = event["type"].as_str().unwrap_or_default().to_owned();
            match kind.as_str() {
                "BOOKMARK" => {}
                "ERROR" => events.push(json!([kind, event["object"]["code"], event["object"]["reason"]])),
                _ => events.push(json!([kind, event["object"]["metadata"]["name"]])),
            }
        }
        Answer { code, body: Value::Array(events) }
    }

    /// Polls GET `path` until `done` holds (bounded), returning the last answer.
    async fn until(&self, path: &str, done: impl Fn(&Answer) -> bool) -> Answer {
        let mut last = self.call("GET", path, "application/json", None).await;
        for _ in 0..600 {
            if done(&last) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            last = self.call("GET", path, "application/json", None).await;
        }
        last
    }

    /// Runs kubectl; returns its exit status and stdout.
    fn kubectl_raw(&self, args: &[&str], stdin: Option<&str>) -> (u16, String) {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let args: Vec<String> = args.iter().map(|a| a.replace("{ns}", &self.ns)).collect();
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig_path())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("kubectl: {e}"));
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.replace("{ns}", &self.ns).as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (out.status.code().unwrap_or(-1) as u16, String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs kubectl; its exit status and its output, as normalised JSON where it is JSON.
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Answer {
        let (code, stdout) = self.kubectl_raw(args, stdin);
        let mut body = serde_json::from_str(&stdout).unwrap_or_else(|_| json!(stdout.trim()));
        normalize(&mut body, &self.ns);
        // kubectl's error text quotes the server's message: only whether it failed is compared.
        Answer { code, body }
    }

    /// `kubectl explain`: its exit status and the outline of what it shows (headers, and each
    /// field with its type and whether it is required). The descriptions are left out: they
    /// are the API's prose, of the Kubernetes version each side's schemas come from.
    fn explain(&self, what: &str) -> Answer {
        let (code, stdout) = self.kubectl_raw(&["explain", what], None);
        let outline: Vec<&str> = stdout
            .lines()
            .filter(|l| {
                ["KIND:", "VERSION:", "GROUP:", "FIELD:"].iter().any(|h| l.starts_with(h))
                    || l.starts_with("  ") && !l.starts_with("   ") && l.contains('\t')
            })
            .collect();
        Answer { code, body: json!(outline) }
    }

    /// `kubectl get -w`, until its first event: the event's type and object name.
    fn watch_first_event(&self, args: &[&str]) -> Answer {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let args: Vec<String> = args.iter().map(|a| a.replace("{ns}", &self.ns)).collect();
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig_path())
            // Bounds the watch if no event ever comes: kubectl then exits.
            .arg("--request-timeout=60s")
            .args(&args)
            .args(["-w", "--output-watch-events", "-o", "jsonpath={.type} {.object.metadata.name}{\"\\n\"}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("kubectl: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        Answer { code: 0, body: json!(line.trim()) }
    }
}

/// The recorded answers of one side, by step name.
type Transcript = BTreeMap<String, Answer>;

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

fn cm(name: &str, labels: Value, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "{ns}", "labels": labels}, "data": data})
}

/// The request sequences through kube-rs's client.
async fn api_sequence(s: &Side) -> Transcript {
    let mut t = Transcript::new();
    let cms = "/api/v1/namespaces/{ns}/configmaps";
    let a = format!("{cms}/a");

    // create, get, errors
    t.insert(
        "create".into(),
        s.call("POST", cms, JSON, Some(&cm("a", json!({"app": "x"}), json!({"k": "v"})))).await,
    );
    t.insert("create-again".into(), s.call("POST", cms, JSON, Some(&cm("a", json!({}), json!({})))).await);
    t.insert("get".into(), s.call("GET", &a, JSON, None).await);
    t.insert("get-missing".into(), s.call("GET", &format!("{cms}/missing"), JSON, None).await);
    t.insert(
        "create-invalid-name".into(),
        s.call("POST", cms, JSON, Some(&cm("Bad_Name", json!({}), json!({})))).await,
    );
    // Each dot-separated part of a subdomain name is a label: no empty part, none that starts
    // or ends with '-'.
    for (case, name) in [("create-name-empty-part", "a..b"), ("create-name-part-ends-with-dash", "a-.b")] {
        t.insert(case.into(), s.call("POST", cms, JSON, Some(&cm(name, json!({}), json!({})))).await);
    }
    // A namespace's name is a label: no dots.
    t.insert(
        "create-namespace-with-a-dot".into(),
        s.call(
            "POST",
            "/api/v1/namespaces",
            JSON,
            Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}})),
        )
        .await,
    );
    let other_ns =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "elsewhere"}});
    t.insert("create-namespace-mismatch".into(), s.call("POST", cms, JSON, Some(&other_ns)).await);
    t.insert(
        "get-unknown-resource".into(),
        s.call("GET", "/api/v1/namespaces/{ns}/widgets", JSON, None).await,
    );

    // list: selectors and pagination
    for (name, app) in [("b", "y"), ("c", "y"), ("d", "z")] {
        s.call("POST", cms, JSON, Some(&cm(name, json!({"app": app}), json!({})))).await;
    }
    t.insert(
        "list-selector".into(),
        s.call("GET", &format!("{cms}?labelSelector=app%3Dy"), JSON, None).await,
    );
    t.insert(
        "list-set-selector".into(),
        s.call("GET", &format!("{cms}?labelSelector=app+in+(x,z)"), JSON, None).await,
    );
    t.insert(
        "list-bad-selector".into(),
        s.call("GET", &format!("{cms}?labelSelector=app+in+(x"), JSON, None).await,
    );
    let page1 = s.call("GET", &format!("{cms}?limit=2"), JSON, None).await;
    t.insert("list-page-1".into(), page1);
    let (_, raw) = s.raw("GET", &format!("{cms}?limit=2"), JSON, None).await;
    let token = serde_json::from_slice::<Value>(&raw).unwrap()["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    t.insert(
        "list-page-2".into(),
        s.call("GET", &format!("{cms}?limit=2&continue={token}"), JSON, None).await,
    );

    // update conflicts
    let stale = json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "a", "namespace": "{ns}", "resourceVersion": "1"}, "data": {"k": "stale"}});
    t.insert("update-stale".into(), s.call("PUT", &a, JSON, Some(&stale)).await);
    let no_rv = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "{ns}"}, "data": {"k": "blind"}});
    t.insert("update-unconditional".into(), s.call("PUT", &a, JSON, Some(&no_rv)).await);

    // patches
    t.insert(
        "patch-merge".into(),
        s.call("PATCH", &a, MERGE, Some(&json!({"data": {"m": "1", "k": null}}))).await,
    );
    t.insert(
        "patch-json".into(),
        s.call("PATCH", &a, JSON_PATCH, Some(&json!([{"op": "add", "path": "/data/j", "value": "2"}]))).await,
    );
    t.insert(
        "patch-json-test-fails".into(),
        s.call("PATCH", &a, JSON_PATCH, Some(&json!([{"op": "test", "path": "/data/j", "value": "nope"}])))
            .await,
    );
    t.insert(
        "patch-strategic".into(),
        s.call("PATCH", &a, STRATEGIC, Some(&json!({"metadata": {"labels": {"s": "3"}}}))).await,
    );
    t.insert(
        "patch-missing".into(),
        s.call("PATCH", &format!("{cms}/missing"), MERGE, Some(&json!({"data": {}}))).await,
    );

    // server-side apply
    let applied = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa", "namespace": "{ns}"}, "data": {"owned": v}});
    t.insert(
        "apply-create".into(),
        s.call("PATCH", &format!("{cms}/ssa?fieldManager=one"), APPLY, Some(&applied("1"))).await,
    );
    t.insert(
        "apply-conflict".into(),
        s.call("PATCH", &format!("{cms}/ssa?fieldManager=two"), APPLY, Some(&applied("2"))).await,
    );
    t.insert(
        "apply-force".into(),
        s.call("PATCH", &format!("{cms}/ssa?fieldManager=two&force=true"), APPLY, Some(&applied("2"))).await,
    );
    t.insert(
        "apply-no-manager".into(),
        s.call("PATCH", &format!("{cms}/ssa"), APPLY, Some(&applied("3"))).await,
    );

    // owner references
    let no_uid = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orphan-ref", "namespace": "{ns}",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "a"}]}});
    t.insert("create-owner-ref-without-uid".into(), s.call("POST", cms, JSON, Some(&no_uid)).await);

    // finalizers
    let held = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "held", "namespace": "{ns}", "finalizers": ["example.com/hold"]}});
    s.call("POST", cms, JSON, Some(&held)).await;
    t.insert("delete-with-finalizer".into(), s.call("DELETE", &format!("{cms}/held"), JSON, None).await);
    t.insert("get-terminating".into(), s.call("GET", &format!("{cms}/held"), JSON, None).await);
    t.insert(
        "release-finalizer".into(),
        s.call("PATCH", &format!("{cms}/held"), MERGE, Some(&json!({"metadata": {"finalizers": null}})))
            .await,
    );
    t.insert("get-released".into(), s.call("GET", &format!("{cms}/held"), JSON, None).await);
    t.insert("delete-missing".into(), s.call("DELETE", &format!("{cms}/held"), JSON, None).await);

    // watch from a resourceVersion, with bookmarks allowed
    let (_, raw) = s.raw("GET", cms, JSON, None).await;
    let rv = serde_json::from_slice::<Value>(&raw).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    s.call("POST", cms, JSON, Some(&cm("w", json!({}), json!({})))).await;
    s.call("PATCH", &format!("{cms}/w"), MERGE, Some(&json!({"data": {"x": "1"}}))).await;
    s.call("DELETE", &format!("{cms}/w"), JSON, None).await;
    t.insert(
        "watch-from-rv".into(),
        s.watch(&format!("{cms}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"))
            .await,
    );
    // A watch from a too old resourceVersion is not compared: whether the real server's watch
    // cache still covers it depends on the server's age (see docs/dev-cluster.md).

    // status subresource (Deployments: the dev cluster does not default, so only these fields)
    let deploys = "/apis/apps/v1/namespaces/{ns}/deployments";
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "{ns}"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let fields = ["/metadata/generation", "/spec/replicas", "/status/observedGeneration", "/status/replicas"];
    let shown = |a: Answer| Answer { code: a.code, body: project(&a.body, &fields) };
    t.insert("deployment-create".into(), shown(s.call("POST", deploys, JSON, Some(&deploy)).await));
    let status = json!({"status": {"observedGeneration": 5, "replicas": 7}, "spec": {"replicas": 3}});
    t.insert(
        "status-patch".into(),
        shown(s.call("PATCH", &format!("{deploys}/web/status"), MERGE, Some(&status)).await),
    );
    t.insert(
        "main-patch-ignores-status".into(),
        shown(
            s.call(
                "PATCH",
                &format!("{deploys}/web"),
                MERGE,
                Some(&json!({"status": {"replicas": 9}, "spec": {"replicas": 2}})),
            )
            .await,
        ),
    );

    // garbage collection: background, foreground, orphan
    for policy in ["Background", "Foreground", "Orphan"] {
        let owner = format!("owner-{}", policy.to_lowercase());
        let created = s.call("POST", cms, JSON, Some(&cm(&owner, json!({}), json!({})))).await;
        let (_, raw) = s.raw("GET", &format!("{cms}/{owner}"), JSON, None).await;
        let uid = serde_json::from_slice::<Value>(&raw).unwrap()["metadata"]["uid"].clone();
        let dependent = format!("dependent-{}", policy.to_lowercase());
        let child = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": dependent, "namespace": "{ns}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": uid, "blockOwnerDeletion": true}]}});
        s.call("POST", cms, JSON, Some(&child)).await;
        assert_eq!(created.code, 201);
        let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy});
        t.insert(
            format!("gc-{policy}-delete"),
            s.call("DELETE", &format!("{cms}/{owner}"), JSON, Some(&body)).await,
        );
        let owner_gone = s.until(&format!("{cms}/{owner}"), |a| a.code == 404).await;
        t.insert(format!("gc-{policy}-owner"), Answer { code: owner_gone.code, body: json!(null) });
        let dependent_path = format!("{cms}/{dependent}");
        let settled = if policy == "Orphan" {
            s.until(&dependent_path, |a| a.body["metadata"].get("ownerReferences").is_none()).await
        } else {
            s.until(&dependent_path, |a| a.code == 404).await
        };
        t.insert(format!("gc-{policy}-dependent"), settled);
    }
    t
}

/// The same kind of sequence through kubectl.
fn kubectl_sequence(s: &Side) -> Transcript {
    let mut t = Transcript::new();
    let manifest =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: k\n  namespace: {ns}\ndata:\n  a: \"1\"\n";
    t.insert(
        "kubectl-create".into(),
        s.kubectl(&["create", "configmap", "made", "-n", "{ns}", "--from-literal=a=1", "-o", "json"], None),
    );
    t.insert(
        "kubectl-create-again".into(),
        s.kubectl(&["create", "configmap", "made", "-n", "{ns}", "--from-literal=a=1"], None),
    );
    t.insert("kubectl-apply".into(), s.kubectl(&["apply", "-f", "-", "-o", "json"], Some(manifest)));
    t.insert("kubectl-diff-unchanged".into(), s.kubectl(&["diff", "-f", "-"], Some(manifest)));
    t.insert(
        "kubectl-apply-server-side".into(),
        s.kubectl(
            &["apply", "--server-side", "-f", "-", "-o", "json"],
            Some(&manifest.replace("\"1\"", "\"2\"")),
        ),
    );
    t.insert("kubectl-get".into(), s.kubectl(&["get", "configmap", "k", "-n", "{ns}", "-o", "json"], None));
    t.insert(
        "kubectl-label".into(),
        s.kubectl(&["label", "configmap", "k", "-n", "{ns}", "x=y", "-o", "json"], None),
    );
    t.insert(
        "kubectl-get-selector".into(),
        s.kubectl(&["get", "configmaps", "-n", "{ns}", "-l", "x=y", "-o", "name"], None),
    );
    t.insert("kubectl-delete".into(), s.kubectl(&["delete", "configmap", "k", "-n", "{ns}"], None));
    t.insert("kubectl-get-missing".into(), s.kubectl(&["get", "configmap", "k", "-n", "{ns}"], None));
    t.insert(
        "kubectl-create-deployment".into(),
        s.kubectl(&["create", "deployment", "web", "-n", "{ns}", "--image=nginx", "-o", "name"], None),
    );
    // The API server defaults a Deployment (strategy, pod template fields) and the dev cluster
    // does not: what kubectl sent is compared.
    let sent = [
        "/metadata/name",
        "/metadata/labels",
        "/metadata/generation",
        "/spec/replicas",
        "/spec/selector",
        "/spec/template/metadata/labels",
        "/spec/template/spec/containers/0/name",
        "/spec/template/spec/containers/0/image",
        "/spec/template/spec/containers/0/ports/0/containerPort",
    ];
    let deployment = s.kubectl(&["get", "deployment", "web", "-n", "{ns}", "-o", "json"], None);
    t.insert(
        "kubectl-create-deployment-object".into(),
        Answer { code: deployment.code, body: project(&deployment.body, &sent) },
    );
    let replicated = s.kubectl(
        &[
            "create",
            "deployment",
            "api",
            "-n",
            "{ns}",
            "--image=nginx",
            "--replicas=3",
            "--port=8080",
            "-o",
            "json",
        ],
        None,
    );
    t.insert(
        "kubectl-create-deployment-replicas".into(),
        Answer { code: replicated.code, body: project(&replicated.body, &sent) },
    );
    t.insert(
        "kubectl-create-secret".into(),
        s.kubectl(
            &[
                "create",
                "secret",
                "generic",
                "creds",
                "-n",
                "{ns}",
                "--from-literal=user=admin",
                "-o",
                "json",
            ],
            None,
        ),
    );
    t.insert("kubectl-explain".into(), s.kubectl(&["explain", "configmap.data"], None));
    let explained = s.explain("configmap");
    assert!(explained.body.as_array().is_some_and(|l| l.len() > 3), "an outline: {:?}", explained.body);
    t.insert("kubectl-explain-configmap".into(), explained);
    t.insert("kubectl-explain-deployment-replicas".into(), s.explain("deployment.spec.replicas"));
    t.insert("kubectl-explain-unknown-field".into(), s.explain("deployment.spec.nothing"));

    // diff, patch, get -w and delete on an object made by `create configmap`.
    t.insert(
        "kubectl-create-for-patch".into(),
        s.kubectl(&["create", "configmap", "p", "-n", "{ns}", "--from-literal=a=1", "-o", "json"], None),
    );
    let changed =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: p\n  namespace: {ns}\ndata:\n  a: \"2\"\n";
    let (code, diff) = s.kubectl_raw(&["diff", "-f", "-"], Some(changed));
    // The changed lines; the header names temporary files.
    let changes: Vec<String> = diff
        .lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-')) && !l.starts_with("+++") && !l.starts_with("---")
        })
        .map(|l| l.replace(&s.ns, "<ns>"))
        .collect();
    t.insert("kubectl-diff-changed".into(), Answer { code, body: json!(changes) });
    t.insert(
        "kubectl-patch-merge".into(),
        s.kubectl(
            &[
                "patch",
                "configmap",
                "p",
                "-n",
                "{ns}",
                "--type",
                "merge",
                "-p",
                r#"{"data":{"b":"2"}}"#,
                "-o",
                "json",
            ],
            None,
        ),
    );
    t.insert(
        "kubectl-patch-json".into(),
        s.kubectl(
            &[
                "patch",
                "configmap",
                "p",
                "-n",
                "{ns}",
                "--type",
                "json",
                "-p",
                r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
                "-o",
                "json",
            ],
            None,
        ),
    );
    t.insert(
        "kubectl-patch-json-test-fails".into(),
        s.kubectl(
            &[
                "patch",
                "configmap",
                "p",
                "-n",
                "{ns}",
                "--type",
                "json",
                "-p",
                r#"[{"op":"test","path":"/data/a","value":"0"}]"#,
            ],
            None,
        ),
    );
    let watched = s.watch_first_event(&["get", "configmap", "p", "-n", "{ns}"]);
    assert_eq!(watched.body, "ADDED p", "kubectl get -w reports the object first");
    t.insert("kubectl-get-watch".into(), watched);
    t.insert("kubectl-delete-patched".into(), s.kubectl(&["delete", "configmap", "p", "-n", "{ns}"], None));
    t.insert(
        "kubectl-delete-deployment".into(),
        s.kubectl(&["delete", "deployment", "web", "-n", "{ns}"], None),
    );
    t
}

fn compare(dev: &Transcript, real: &Transcript) -> Vec<String> {
    let mut differences = Vec::new();
    for (step, real_answer) in real {
        let dev_answer = dev.get(step);
        if dev_answer != Some(real_answer) {
            differences.push(step.clone());
            eprintln!(
                "difference at {step}:\n  dev:  {}\n  real: {} {}",
                dev_answer.map(|a| format!("{} {}", a.code, a.body)).unwrap_or_default(),
                real_answer.code,
                real_answer.body
            );
        }
    }
    differences
}

fn check(differences: Vec<String>, steps: &Transcript) {
    let known: Vec<&str> = KNOWN_GAPS.iter().map(|(s, _)| *s).filter(|s| steps.contains_key(*s)).collect();
    let new: Vec<&String> = differences.iter().filter(|d| !known.contains(&d.as_str())).collect();
    let gone: Vec<&&str> = known.iter().filter(|k| !differences.iter().any(|d| d == **k)).collect();
    assert!(new.is_empty(), "differences not listed as known gaps: {new:?}");
    assert!(
        gone.is_empty(),
        "known gaps that no longer differ (remove them from KNOWN_GAPS and docs/dev-cluster.md): {gone:?}"
    );
}

fn real_selected() -> bool {
    if Backend::from_env().ok() == Some(Backend::Real) {
        return true;
    }
    eprintln!(
        "differential: skipped: needs the real API server (WASMCTRL_TEST_BACKEND=real, as `cargo xtask test` sets)"
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_requests_answer_as_the_real_api_server() {
    if !real_selected() {
        return;
    }
    let (dev, real) = (Side::start(Backend::Dev).await, Side::start(Backend::Real).await);
    let (dev_t, real_t) = (api_sequence(&dev).await, api_sequence(&real).await);
    check(compare(&dev_t, &real_t), &real_t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_the_dev_cluster_as_the_real_api_server() {
    if !real_selected() {
        return;
    }
    if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
        eprintln!("differential: kubectl half skipped: kubectl is not installed");
        return;
    }
    let (dev, real) = (Side::start(Backend::Dev).await, Side::start(Backend::Real).await);
    let (dev, real, dev_t, real_t) = tokio::task::spawn_blocking(move || {
        let (dev_t, real_t) = (kubectl_sequence(&dev), kubectl_sequence(&real));
        (dev, real, dev_t, real_t)
    })
    .await
    .unwrap();
    drop((dev, real));
    check(compare(&dev_t, &real_t), &real_t);
}
