//! Admission end to end: the host's HTTPS server answering `AdmissionReview`s with a Wasm
//! plugin (`guests/test-plugins/admission`), loaded by the plugins manager with its informer
//! caches, on either test backend.
//!
//! Two kinds of test:
//! - reviews posted straight to the host (what the API server sends, byte for byte the
//!   same JSON), on both backends: denials, patches, warnings, failure policies, cache
//!   reads, refused writes, hot reload under a stream of reviews, metrics;
//! - on the real kube-apiserver, the API server itself calling the host through the
//!   webhook configurations the host wrote: `kubectl apply` denied, mutations stored, dry
//!   runs, failure policies, hot reload under a stream of creates. The dev cluster does not
//!   call webhooks: those tests say they are skipped there.
//!
//! The real server is shared by every test: each test's plugin (so its configurations) has
//! a name unique to the test, and its webhooks select only the test's namespace.
//!
//! Needs the guest plugins built: `cargo xtask build-guests`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wasmctrl::admission::{Admission, AdmissionSettings, CertFiles};
use wasmctrl::plugin::{EngineConfig, PluginEngine};
use wasmctrl_testkit::{Backend, TestCluster};

#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

#[allow(dead_code)]
#[path = "common/process.rs"]
mod process;

use process::{HostProcess, WASMCTRL};

/// Bound on every wait for something to happen (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

fn guest(crate_name: &str) -> Vec<u8> {
    wasmctrl_testkit::guests::wasm(crate_name)
}

/// The plugin TOML of the test plugin: validating webhooks `validate` (failure policy
/// Fail) and `lenient` (Ignore), a mutating one `mutate`, and `effects` (side effects
/// except on dry runs), all on the namespace `ns` only.
fn admission_toml(ns: &str, stamp: &str) -> String {
    format!(
        r#"
[for]
api-version = "v1"
kind = "ConfigMap"
namespace = "{ns}"

[permissions]
write = ["v1/ConfigMap"]

[settings]
stamp = "{stamp}"

[[admission]]
name = "validate"
operations = ["CREATE", "UPDATE", "DELETE"]
namespace-selector = "kubernetes.io/metadata.name={ns}"
object-selector = "!lenient,!effects"
timeout = "2s"

[[admission]]
name = "lenient"
failure-policy = "Ignore"
namespace-selector = "kubernetes.io/metadata.name={ns}"
object-selector = "lenient"
timeout = "2s"

[[admission]]
name = "effects"
side-effects = "NoneOnDryRun"
namespace-selector = "kubernetes.io/metadata.name={ns}"
object-selector = "effects"

[[admission]]
name = "mutate"
mutating = true
namespace-selector = "kubernetes.io/metadata.name={ns}"
"#
    )
}

/// A host running the test plugin: cluster, admission server, plugins manager.
struct Host {
    cluster: TestCluster,
    ns: String,
    /// The plugin's name (unique to the test on the shared real server).
    plugin: String,
    host: TestHost,
}

/// The admission suite's host is the shared test host, running the test's plugin.
impl std::ops::Deref for Host {
    type Target = TestHost;
    fn deref(&self) -> &TestHost {
        &self.host
    }
}

impl Host {
    /// Starts everything with the test plugin at stamp `a`. The host writes webhook
    /// configurations when the backend calls webhooks (the real one).
    async fn start() -> Host {
        Host::start_with(|ns| admission_toml(ns, "a"), None).await
    }

    async fn start_with(toml: impl Fn(&str) -> String, certificate: Option<CertFiles>) -> Host {
        Host::start_plugin(guest("test-plugin-admission"), toml, certificate).await
    }

    /// Starts everything with `wasm` as the plugin and `toml(namespace)` as its TOML.
    async fn start_plugin(
        wasm: Vec<u8>,
        toml: impl Fn(&str) -> String,
        certificate: Option<CertFiles>,
    ) -> Host {
        let cluster = TestCluster::start().await.expect("test cluster");
        let ns = cluster.namespace().await.expect("namespace");
        let plugin = cluster.unique("admit");
        let plugins = PluginsDir::new();
        plugins.install(&plugin, &wasm, &toml(&ns));
        let setup = HostSetup {
            admission: Some(AdmissionSettings {
                address: "127.0.0.1:0".parse().expect("address"),
                certificate,
                manage_configurations: calls_webhooks(&cluster),
                configuration_prefix: cluster.unique("wasmctrl-test"),
                ..AdmissionSettings::default()
            }),
            ..HostSetup::new("wasmctrl-admission", PATIENCE)
        };
        let host = TestHost::start(cluster.client(), plugins, setup).await;
        host.assert_loaded(&plugin);
        Host { cluster, ns, plugin, host }
    }

    /// The webhook path of section `rule`.
    fn path(&self, rule: &str) -> String {
        format!("/admission/{}/{rule}", self.plugin)
    }

    /// Posts `review` to the webhook of section `rule`.
    async fn post(&self, rule: &str, review: &Value) -> (u16, Value) {
        let (status, body) =
            post_raw(self.admission(), &self.path(rule), review.to_string().into_bytes()).await;
        let value =
            serde_json::from_slice(&body).unwrap_or(Value::String(String::from_utf8_lossy(&body).into()));
        (status, value)
    }

    /// Posts `review` and returns its `response`, checking the envelope.
    async fn review(&self, rule: &str, review: &Value) -> Value {
        let (status, body) = self.post(rule, review).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1", "{body}");
        assert_eq!(body["response"]["uid"], review["request"]["uid"], "{body}");
        body["response"].clone()
    }

    /// Rewrites the plugin's TOML (a hidden file renamed into place) and waits until the
    /// manager reloaded it.
    async fn rewrite_toml(&self, text: &str) {
        let before = self.reloads(&self.plugin);
        self.plugins.write(&format!("{}.toml", self.plugin), text.as_bytes());
        self.until_reloaded(&self.plugin, before).await;
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn stop(self) {
        // The configurations go with the test (the real server is shared).
        self.admission().router.remove(&self.plugin).await;
        self.host.stop().await;
        drop(self.cluster);
    }
}

/// Whether the backend's API server calls admission webhooks (the real one does; the dev
/// cluster does not).
fn calls_webhooks(cluster: &TestCluster) -> bool {
    cluster.backend() == Backend::Real
}

/// Says so and returns false when the backend does not call webhooks.
fn needs_webhook_calls(host: &Host, test: &str) -> bool {
    if !calls_webhooks(&host.cluster) {
        eprintln!("{test}: skipped on the dev cluster: it does not call admission webhooks");
    }
    calls_webhooks(&host.cluster)
}

/// POSTs `body` to `path` on the admission server over TLS, trusting only its CA bundle.
async fn post_raw(admission: &Admission, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    post_to(admission.server.address(), &admission.cert.ca_bundle().expect("a CA bundle"), path, body).await
}

async fn tls_connect(
    address: SocketAddr,
    ca_pem: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA PEM")).expect("CA");
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(address).await.expect("connect");
    let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("TLS handshake")
}

async fn post_to(address: SocketAddr, ca_pem: &[u8], path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let tls = tls_connect(address, ca_pem).await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("HTTP handshake");
    tokio::spawn(conn);
    let request = http::Request::post(path)
        .header(http::header::HOST, address.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("body").to_bytes().to_vec();
    (status, body)
}

static UIDS: AtomicUsize = AtomicUsize::new(0);

/// An `AdmissionReview` as the API server sends it for a ConfigMap in `ns`.
fn review(ns: &str, operation: &str, object: Option<Value>, old: Option<Value>, dry_run: bool) -> Value {
    let name = object
        .as_ref()
        .or(old.as_ref())
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or("")
        .to_owned();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", UIDS.fetch_add(1, Ordering::Relaxed)),
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "requestKind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "requestResource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": name,
            "namespace": ns,
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    })
}

/// A ConfigMap `name` in `ns` with `data` (and labels).
fn configmap(ns: &str, name: &str, data: Value, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "data": data,
    })
}

fn create(ns: &str, name: &str, data: Value) -> Value {
    review(ns, "CREATE", Some(configmap(ns, name, data, json!({}))), None, false)
}

fn warnings(response: &Value) -> Vec<String> {
    response["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// The JSON patch of a response, decoded.
fn patch_of(response: &Value) -> Option<Value> {
    use base64::Engine as _;
    let encoded = response["patch"].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64 patch");
    Some(serde_json::from_slice(&bytes).expect("JSON patch"))
}

/// Polls `check` until it passes, or fails with its last complaint.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    host::eventually(what, PATIENCE, check).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_carry_the_plugins_message_code_and_warnings() {
    let host = Host::start().await;
    let ns = host.ns.clone();

    let allowed = host.review("validate", &create(&ns, "fine", json!({"k": "v"}))).await;
    assert_eq!(allowed["allowed"], true, "{allowed}");
    assert_eq!(warnings(&allowed), ["validated by a"]);

    let denied =
        host.review("validate", &create(&ns, "no", json!({"deny": "replicas must be at most 10"}))).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    assert_eq!(denied["status"]["message"], "replicas must be at most 10");
    assert_eq!(
        (denied["status"]["code"].as_u64(), denied["status"]["reason"].as_str()),
        (Some(403), Some("Forbidden"))
    );
    assert_eq!(warnings(&denied), ["validated by a"], "warnings go out with a denial too");

    let invalid = host.review("validate", &create(&ns, "bad", json!({"invalid": "x"}))).await;
    assert_eq!(
        (invalid["status"]["code"].as_u64(), invalid["status"]["reason"].as_str()),
        (Some(422), Some("Invalid"))
    );

    // Delete of a protected object: the old object reaches `validate_delete`.
    let protected = configmap(&ns, "keep", json!({}), json!({"protected": "yes"}));
    let delete = host.review("validate", &review(&ns, "DELETE", None, Some(protected), false)).await;
    assert_eq!(delete["allowed"], false, "{delete}");
    assert!(delete["status"]["message"].as_str().unwrap_or("").contains("is protected"), "{delete}");

    // A dry run reaches the plugin as one.
    let dry = host
        .review(
            "validate",
            &review(&ns, "CREATE", Some(configmap(&ns, "d", json!({}), json!({}))), None, true),
        )
        .await;
    assert!(warnings(&dry).contains(&"dry run".to_owned()), "{dry}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutation_is_a_json_patch_that_applies_to_the_object() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    let response = host.review("mutate", &create(&ns, "m", json!({"k": "v"}))).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let patch = patch_of(&response).expect("a patch");
    let mut object = configmap(&ns, "m", json!({"k": "v"}), json!({}));
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("RFC 6902");
    json_patch::patch(&mut object, &ops).expect("the patch applies");
    assert_eq!(object["metadata"]["labels"]["stamp"], "a", "{patch}");
    assert_eq!(warnings(&response), ["mutated by a"]);
    // An operation the section does not name never reaches the plugin (the API server
    // would not send it; the host checks anyway): the failure policy answers.
    let deleted = host
        .review(
            "mutate",
            &review(&ns, "DELETE", None, Some(configmap(&ns, "m", json!({}), json!({}))), false),
        )
        .await;
    assert_eq!(deleted["allowed"], false, "{deleted}");
    assert!(deleted["status"]["message"].as_str().unwrap_or("").contains("not for Delete"), "{deleted}");
    assert!(deleted.get("patch").is_none(), "{deleted}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_or_a_timeout_answers_as_the_failure_policy_says() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    let lenient = |name: &str, data: Value| {
        review(&ns, "CREATE", Some(configmap(&ns, name, data, json!({"lenient": "yes"}))), None, false)
    };

    // Fail: refused with code 500, naming the plugin and the cause.
    let trapped = host.review("validate", &create(&ns, "p", json!({"panic": "yes"}))).await;
    assert_eq!(trapped["allowed"], false, "{trapped}");
    assert_eq!(trapped["status"]["code"], 500);
    let message = trapped["status"]["message"].as_str().unwrap_or("").to_owned();
    for part in
        [host.plugin.as_str(), "failure policy Fail", "trapped in validate", "admission panic on purpose"]
    {
        assert!(message.contains(part), "{part:?} missing from {message}");
    }
    let looped = host.review("validate", &create(&ns, "l", json!({"loop": "yes"}))).await;
    assert_eq!(looped["allowed"], false, "{looped}");
    let message = looped["status"]["message"].as_str().unwrap_or("");
    assert!(message.contains("admission deadline") && message.contains("timeout 2s"), "{message}");

    // Ignore: admitted, with the cause as a warning.
    for data in [json!({"panic": "yes"}), json!({"loop": "yes"})] {
        let ignored = host.review("lenient", &lenient("i", data)).await;
        assert_eq!(ignored["allowed"], true, "{ignored}");
        let w = warnings(&ignored);
        assert!(w.iter().any(|w| w.contains("failure policy Ignore")), "{w:?}");
    }

    // The plugin answers again after its trapped instances were discarded.
    let fine = host.review("validate", &create(&ns, "after", json!({"k": "v"}))).await;
    assert_eq!(fine["allowed"], true, "{fine}");
    let metrics = host.metrics.encode();
    assert!(metrics.contains("controller_runtime_webhook_panics_total 4"), "{metrics}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_reads_the_informer_cache_reconciles_read() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    let first: ConfigMap =
        serde_json::from_value(configmap(&ns, "first", json!({"unique": "blue"}), json!({}))).unwrap();
    host.configmaps().create(&PostParams::default(), &first).await.expect("create");
    // Once the informer has it, a second object with the same value is refused.
    eventually("the cache shows the first object to admission", || async {
        let r = host.review("validate", &create(&ns, "second", json!({"unique": "blue"}))).await;
        match r["allowed"].as_bool() {
            Some(false) => {
                let m = r["status"]["message"].as_str().unwrap_or("");
                if m.contains(&format!("taken by {ns}/first")) {
                    Ok(())
                } else {
                    Err(format!("denied for another reason: {m}"))
                }
            }
            _ => Err("admitted".into()),
        }
    })
    .await;
    let other = host.review("validate", &create(&ns, "third", json!({"unique": "green"}))).await;
    assert_eq!(other["allowed"], true, "{other}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_refused_without_side_effects_and_on_dry_runs() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    // side-effects = "None": the plugin may not write at all while admitting.
    let none = host.review("validate", &create(&ns, "w1", json!({"write": "yes"}))).await;
    assert_eq!(none["allowed"], false, "{none}");
    let m = none["status"]["message"].as_str().unwrap_or("");
    assert!(m.contains("write refused") && m.contains("side-effects = \"None\""), "{m}");

    // "NoneOnDryRun": a dry run may not write either...
    let effects = |name: &str, dry_run: bool| {
        review(
            &ns,
            "CREATE",
            Some(configmap(&ns, name, json!({"write": "yes"}), json!({"effects": "yes"}))),
            None,
            dry_run,
        )
    };
    let dry = host.review("effects", &effects("w2", true)).await;
    assert_eq!(dry["allowed"], false, "{dry}");
    assert!(dry["status"]["message"].as_str().unwrap_or("").contains("dry run"), "{dry}");
    // ...but a real request may.
    let real = host.review("effects", &effects("w3", false)).await;
    assert_eq!(real["allowed"], true, "{real}");
    let side = host.configmaps().get_opt("w3-side-effect").await.expect("get");
    assert!(side.is_some(), "the side effect of a request that may have one happened");
    assert!(host.configmaps().get_opt("w1-side-effect").await.expect("get").is_none());
    assert!(host.configmaps().get_opt("w2-side-effect").await.expect("get").is_none());
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_admitted_kinds_reach_the_plugin() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    let mut secret = create(&ns, "s", json!({"k": "djE="}));
    secret["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Secret"});
    secret["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "secrets"});
    secret["request"]["object"]["kind"] = json!("Secret");
    let r = host.review("validate", &secret).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"].as_str().unwrap_or("").contains("admits v1/ConfigMap, not v1/Secret"),
        "{r}"
    );
    // The same through the section with failure policy Ignore is admitted untouched: the
    // plugin never saw it (its warning would say it validated).
    secret["request"]["object"]["metadata"]["labels"] = json!({"lenient": "yes"});
    let r = host.review("lenient", &secret).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(!warnings(&r).iter().any(|w| w.starts_with("validated by")), "{r}");

    // Not a webhook, not a review.
    let (status, _) = post_raw(host.admission(), "/admission/nobody/validate", b"{}".to_vec()).await;
    assert_eq!(status, 404);
    let (status, _) = post_raw(host.admission(), &host.path("nothing-here"), b"{}".to_vec()).await;
    assert_eq!(status, 404);
    let (status, body) = post_raw(host.admission(), &host.path("validate"), b"not json".to_vec()).await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_slice(&body).expect("a review");
    assert_eq!(body["response"]["allowed"], false, "{body}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_reload_under_a_stream_of_reviews_refuses_none_and_mixes_no_versions() {
    let host = Arc::new(Host::start().await);
    let ns = host.ns.clone();
    let stop = CancellationToken::new();
    let seen_b = Arc::new(tokio::sync::Notify::new());
    let mut streams = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let (host, ns, stop, seen_b) = (host.clone(), ns.clone(), stop.clone(), seen_b.clone());
        streams.spawn(async move {
            let mut answered = 0usize;
            let mut stamps = std::collections::BTreeSet::new();
            while !stop.is_cancelled() {
                let response =
                    host.review("mutate", &create(&ns, &format!("r{worker}-{answered}"), json!({}))).await;
                assert_eq!(response["allowed"], true, "refused during a reload: {response}");
                let patch = patch_of(&response).expect("a patch");
                let label = patch[0]["value"]["stamp"]
                    .as_str()
                    .or(patch[0]["value"].as_str())
                    .unwrap_or("")
                    .to_owned();
                let warned = warnings(&response);
                assert_eq!(warned, [format!("mutated by {label}")], "one review, one version: {response}");
                if label == "b" {
                    seen_b.notify_one();
                }
                stamps.insert(label);
                answered += 1;
            }
            (answered, stamps)
        });
    }
    host.rewrite_toml(&admission_toml(&ns, "b")).await;
    // The new version answers (an event the streams report), then back to the first.
    tokio::time::timeout(PATIENCE, seen_b.notified()).await.expect("the new version answers");
    host.rewrite_toml(&admission_toml(&ns, "a")).await;
    stop.cancel();
    let mut all = std::collections::BTreeSet::new();
    let mut total = 0;
    while let Some(r) = streams.join_next().await {
        let (answered, stamps) = r.expect("stream");
        total += answered;
        all.extend(stamps);
    }
    assert!(all.contains("a") && all.contains("b"), "both versions answered: {all:?}");
    assert!(total > 0);
    match Arc::try_unwrap(host) {
        Ok(host) => host.stop().await,
        Err(_) => panic!("host still shared"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_controller_runtimes_webhook_names() {
    let host = Host::start().await;
    let ns = host.ns.clone();
    host.review("validate", &create(&ns, "x", json!({}))).await;
    host.review("validate", &create(&ns, "y", json!({"deny": "no"}))).await;
    let text = host.metrics.encode();
    let path = host.path("validate");
    for line in [
        format!("controller_runtime_webhook_requests_total{{webhook=\"{path}\",code=\"200\"}} 2"),
        format!("controller_runtime_webhook_latency_seconds_count{{webhook=\"{path}\"}} 2"),
        format!("controller_runtime_webhook_requests_in_flight{{webhook=\"{path}\"}} 0"),
        format!("wasmctrl_admission_answers_total{{webhook=\"{path}\",answer=\"denied\"}} 1"),
    ] {
        assert!(text.contains(&line), "{line} missing from:\n{text}");
    }
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_are_served_and_reloaded_when_they_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_pem, first) = write_certificate(dir.path(), "first");
    let files = CertFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        ca: Some(dir.path().join("ca.crt")),
    };
    let host = Host::start_with(|ns| admission_toml(ns, "a"), Some(files)).await;
    assert_eq!(served_leaf(&host, &ca_pem).await, first);
    assert_eq!(host.admission().cert.ca_bundle().as_deref(), Some(ca_pem.as_bytes()));

    let reloads = host.admission().cert.reloads();
    let (ca_pem, second) = write_certificate(dir.path(), "second");
    eventually("the new certificate is loaded", || async {
        if reloads.get() >= 1 && host.admission().cert.leaf() == second {
            Ok(())
        } else {
            Err("not yet".into())
        }
    })
    .await;
    assert_eq!(served_leaf(&host, &ca_pem).await, second);
    if calls_webhooks(&host.cluster) {
        // The rotated CA goes into the webhook configurations.
        let name = format!("{}-{}", host.cluster.unique("wasmctrl-test"), host.plugin);
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(host.client.clone());
        eventually("the configurations carry the new CA", || async {
            let v = validating.get(&name).await.map_err(|e| e.to_string())?;
            let bundle =
                v.webhooks.unwrap_or_default()[0].client_config.ca_bundle.clone().unwrap_or_default();
            if bundle.0 == ca_pem.as_bytes() { Ok(()) } else { Err("the old CA".into()) }
        })
        .await;
    }
    let metrics = host.metrics.encode();
    assert!(metrics.contains("wasmctrl_admission_certificate_reloads_total"), "{metrics}");
    // Reviews are answered under the new certificate.
    let (status, _) = post_to(
        host.admission().server.address(),
        ca_pem.as_bytes(),
        &host.path("validate"),
        create(&host.ns, "c", json!({})).to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    host.stop().await;
}

/// Writes a CA, and a serving certificate for 127.0.0.1 it signed, as cert-manager does
/// (`ca.crt`, `tls.crt`, `tls.key`, each renamed into place); the CA PEM and the leaf DER.
fn write_certificate(dir: &Path, name: &str) -> (String, Vec<u8>) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();
    let put = |file: &str, text: String| {
        let tmp: PathBuf = dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(file)).unwrap();
    };
    put("ca.crt", ca.pem());
    put("tls.key", key.serialize_pem());
    put("tls.crt", cert.pem());
    (ca.pem(), cert.der().to_vec())
}

/// The leaf certificate the server presents to a client trusting `ca_pem`.
async fn served_leaf(host: &Host, ca_pem: &str) -> Vec<u8> {
    let tls = tls_connect(host.admission().server.address(), ca_pem.as_bytes()).await;
    let (_, session) = tls.get_ref();
    session.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec()).expect("a certificate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_0_2_0_loads_and_reconciles_unchanged() {
    let cluster = TestCluster::start().await.expect("test cluster");
    let ns = cluster.namespace().await.expect("namespace");
    let client = cluster.client();
    let wasm = guest("test-plugin-compat-0-2-0");
    let engine = PluginEngine::new(EngineConfig::default(), None).expect("engine");
    let report = wasmctrl::plugin::inspect_component(&engine, &wasm).expect("inspect");
    assert_eq!(report.world.as_deref(), Some("wasmctrl:controller/plugin@0.2.0"), "{report}");
    assert!(report.imports.iter().any(|i| i == "wasmctrl:controller/client@0.2.0"), "{report}");
    assert!(report.fits.is_ok(), "{report}");
    let plugins = PluginsDir::new();
    plugins.install(
        "compat",
        &wasm,
        &format!("[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n"),
    );
    let host = TestHost::start(client.clone(), plugins, HostSetup::new("wasmctrl-compat", PATIENCE)).await;
    host.assert_loaded("compat");
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let cm: ConfigMap =
        serde_json::from_value(configmap(&ns, "old-world", json!({"k": "v"}), json!({}))).unwrap();
    api.create(&PostParams::default(), &cm).await.expect("create");
    eventually("the 0.2.0 plugin labels the ConfigMap", || async {
        let cm = api.get("old-world").await.map_err(|e| e.to_string())?;
        match cm.metadata.labels.unwrap_or_default().get("compat") {
            Some(v) if v == "compat" => Ok(()),
            other => Err(format!("label {other:?}")),
        }
    })
    .await;
    host.stop().await;
}

// ---- The API server calling the host (real kube-apiserver) ----

/// Waits until the API server calls the plugin's validating webhook: a dry-run create the
/// plugin refuses is refused (the API server's webhook informer has the configuration).
async fn wait_webhooks_active(host: &Host) {
    let api = host.configmaps();
    let probe: ConfigMap =
        serde_json::from_value(configmap(&host.ns, "probe", json!({"deny": "probe"}), json!({}))).unwrap();
    let params = PostParams { dry_run: true, ..PostParams::default() };
    eventually("the API server calls the webhooks", || async {
        match api.create(&params, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("probe") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_writes_its_webhook_configurations_and_deletes_them_with_the_plugin() {
    let host = Host::start().await;
    if !needs_webhook_calls(&host, "webhook configurations") {
        return host.stop().await;
    }
    let name = format!("{}-{}", host.cluster.unique("wasmctrl-test"), host.plugin);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(host.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(host.client.clone());
    let v = validating.get(&name).await.expect("validating configuration");
    let hooks = v.webhooks.unwrap_or_default();
    assert_eq!(hooks.len(), 3, "validate, lenient, effects");
    let url = hooks[0].client_config.url.clone().unwrap_or_default();
    assert_eq!(url, format!("https://{}{}", host.admission().server.address(), host.path("validate")));
    assert!(hooks[0].client_config.ca_bundle.is_some());
    assert_eq!(
        mutating.get(&name).await.expect("mutating configuration").webhooks.unwrap_or_default().len(),
        1
    );
    // The plugin goes: its configurations go first.
    std::fs::remove_file(host.plugins.path().join(format!("{}.toml", host.plugin))).expect("remove");
    eventually("the configurations are deleted", || async {
        let v = validating.get_opt(&name).await.map_err(|e| e.to_string())?;
        let m = mutating.get_opt(&name).await.map_err(|e| e.to_string())?;
        if v.is_none() && m.is_none() { Ok(()) } else { Err("still there".into()) }
    })
    .await;
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_an_invalid_object_is_denied_with_the_plugins_message() {
    let host = Host::start().await;
    if !needs_webhook_calls(&host, "kubectl through webhooks") {
        return host.stop().await;
    }
    wait_webhooks_active(&host).await;
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: too-many\n  namespace: {}\ndata:\n  deny: spec.replicas must be at most 10\n",
        host.ns
    );
    let out = kubectl(&host, &["apply", "-f", "-"], &yaml);
    assert!(!out.status.success(), "kubectl apply succeeded: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("denied the request: spec.replicas must be at most 10"), "{stderr}");
    assert!(stderr.contains(&format!("validate.{}.wasmctrl.dev", host.plugin)), "{stderr}");
    // A valid object goes through, mutated.
    let ok = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n  namespace: {}\ndata:\n  k: v\n",
        host.ns
    );
    let out = kubectl(&host, &["apply", "-f", "-"], &ok);
    assert!(out.status.success(), "{out:?}");
    let stored = host.configmaps().get("fine").await.expect("stored");
    assert_eq!(stored.metadata.labels.unwrap_or_default().get("stamp").map(String::as_str), Some("a"));
    host.stop().await;
}

fn kubectl(host: &Host, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(host.cluster.kubeconfig_path())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("stdin");
    child.wait_with_output().expect("kubectl output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_api_server_mutations_are_stored_dry_runs_honoured_and_failures_follow_the_policy() {
    let host = Host::start().await;
    if !needs_webhook_calls(&host, "API server webhook calls") {
        return host.stop().await;
    }
    wait_webhooks_active(&host).await;
    let api = host.configmaps();
    let cm = |name: &str, data: Value, labels: Value| -> ConfigMap {
        serde_json::from_value(configmap(&host.ns, name, data, labels)).unwrap()
    };

    // Mutation: stored with the plugin's label.
    let stored = api
        .create(&PostParams::default(), &cm("mutated", json!({"k": "v"}), json!({})))
        .await
        .expect("create");
    assert_eq!(stored.metadata.labels.unwrap_or_default().get("stamp").map(String::as_str), Some("a"));

    // Dry run: the plugin is called as a dry run (its write refused), nothing stored.
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    let e = api
        .create(&dry, &cm("dry", json!({"write": "yes"}), json!({"effects": "yes"})))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("write refused"), "{e}");
    let created =
        api.create(&dry, &cm("dry-ok", json!({"k": "v"}), json!({}))).await.expect("dry-run create");
    assert_eq!(created.metadata.labels.unwrap_or_default().get("stamp").map(String::as_str), Some("a"));
    assert!(api.get_opt("dry-ok").await.expect("get").is_none(), "a dry run stores nothing");
    // Not a dry run: the side effect happens.
    api.create(&PostParams::default(), &cm("wet", json!({"write": "yes"}), json!({"effects": "yes"})))
        .await
        .expect("create");
    assert!(api.get_opt("wet-side-effect").await.expect("get").is_some());

    // A trap: refused (Fail), or admitted (Ignore).
    let e = api
        .create(&PostParams::default(), &cm("trap", json!({"panic": "yes"}), json!({})))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("trapped in validate"), "{e}");
    api.create(&PostParams::default(), &cm("trap-ok", json!({"panic": "yes"}), json!({"lenient": "yes"})))
        .await
        .expect("admitted");
    // A timeout, the same.
    let e = api
        .create(&PostParams::default(), &cm("slow", json!({"loop": "yes"}), json!({})))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("admission deadline"), "{e}");
    api.create(&PostParams::default(), &cm("slow-ok", json!({"loop": "yes"}), json!({"lenient": "yes"})))
        .await
        .expect("admitted");

    // Delete of a protected object is refused.
    api.create(&PostParams::default(), &cm("guarded", json!({}), json!({"protected": "yes"})))
        .await
        .expect("create");
    let e = api.delete("guarded", &DeleteParams::default()).await.expect_err("refused");
    assert!(e.to_string().contains("is protected"), "{e}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_reload_under_a_stream_of_creates_through_the_api_server_refuses_none() {
    let host = Arc::new(Host::start().await);
    if !needs_webhook_calls(&host, "API server webhook calls") {
        if let Ok(host) = Arc::try_unwrap(host) {
            host.stop().await;
        }
        return;
    }
    wait_webhooks_active(&host).await;
    let stop = CancellationToken::new();
    let seen_b = Arc::new(tokio::sync::Notify::new());
    let mut streams = tokio::task::JoinSet::new();
    for worker in 0..3 {
        let (host, stop, seen_b) = (host.clone(), stop.clone(), seen_b.clone());
        streams.spawn(async move {
            let api = host.configmaps();
            let mut n = 0usize;
            let mut stamps = std::collections::BTreeSet::new();
            while !stop.is_cancelled() {
                let cm: ConfigMap = serde_json::from_value(configmap(
                    &host.ns,
                    &format!("s{worker}-{n}"),
                    json!({"k": "v"}),
                    json!({}),
                ))
                .unwrap();
                let stored = api
                    .create(&PostParams::default(), &cm)
                    .await
                    .unwrap_or_else(|e| panic!("refused during a reload: {e}"));
                let stamp =
                    stored.metadata.labels.unwrap_or_default().get("stamp").cloned().unwrap_or_default();
                if stamp == "b" {
                    seen_b.notify_one();
                }
                stamps.insert(stamp);
                n += 1;
            }
            (n, stamps)
        });
    }
    host.rewrite_toml(&admission_toml(&host.ns, "b")).await;
    tokio::time::timeout(PATIENCE, seen_b.notified()).await.expect("the new version mutates");
    host.rewrite_toml(&admission_toml(&host.ns, "a")).await;
    stop.cancel();
    let mut all = std::collections::BTreeSet::new();
    while let Some(r) = streams.join_next().await {
        let (_, stamps) = r.expect("stream");
        all.extend(stamps);
    }
    assert!(all.iter().all(|s| s == "a" || s == "b"), "{all:?}");
    assert!(all.contains("b"), "{all:?}");
    match Arc::try_unwrap(host) {
        Ok(host) => host.stop().await,
        Err(_) => panic!("host still shared"),
    }
}

// ---- Configuration ----

fn plugin_toml_errors(text: &str) -> String {
    match wasmctrl::config::PluginConfig::parse(Path::new("plugins/p.toml"), text, &Default::default()) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn admission_sections_are_checked_with_file_line_and_field() {
    let base = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";
    let cases = [
        ("[[admission]]\ntimeout = \"1500ms\"\n", "`admission[0].timeout`", "whole seconds from 1s to 30s"),
        ("[[admission]]\ntimeout = \"31s\"\n", "`admission[0].timeout`", "whole seconds"),
        ("[[admission]]\nkinds = [\"v1/Secret\"]\n", "`admission[0].kinds[0]`", "permissions.read"),
        (
            "[[admission]]\nreinvocation = \"IfNeeded\"\n",
            "`admission[0].reinvocation`",
            "mutating webhooks only",
        ),
        ("[[admission]]\n[[admission]]\n", "`admission[1]`", "webhook `validate` is already `admission[0]`"),
        (
            "[[admission]]\nnamespace-selector = \"tier>3\"\n",
            "`admission[0].namespace-selector`",
            "cannot express",
        ),
        ("[[admission]]\noperations = []\n", "`admission[0].operations`", "at least one operation"),
        ("[[admission]]\noperations = [\"PATCH\"]\n", "admission", "PATCH"),
        ("[[admission]]\nfailure-policy = \"fail\"\n", "admission", "fail"),
        ("[[admission]]\nname = \"Bad_Name\"\n", "`admission[0].name`", "not a valid webhook name"),
    ];
    for (section, field, message) in cases {
        let e = plugin_toml_errors(&format!("{base}{section}"));
        assert!(e.contains("plugins/p.toml:"), "no location in {e}");
        assert!(e.contains(field) && e.contains(message), "{field} / {message} missing from:\n{e}");
    }
    // Defaults: the `for` kind, CREATE and UPDATE, Fail, 10s, no side effects.
    let config = wasmctrl::config::PluginConfig::parse(
        Path::new("p.toml"),
        &format!("{base}[permissions]\nread = [\"v1/Secret\"]\n[[admission]]\n[[admission]]\nname = \"secrets\"\nkinds = [\"v1/Secret\"]\noperations = [\"*\"]\nmutating = true\n"),
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rule = &config.admission[0];
    assert_eq!(rule.kinds, [wasmctrl::plugin::Gvk::new("v1", "ConfigMap")]);
    assert_eq!(
        rule.operations,
        [wasmctrl::admission::Operation::Create, wasmctrl::admission::Operation::Update]
    );
    assert_eq!(
        (rule.failure_policy, rule.timeout),
        (wasmctrl::admission::FailurePolicy::Fail, Duration::from_secs(10))
    );
    assert_eq!(config.admission[1].operations.len(), 3);
    assert!(config.to_plugin_spec().permissions.can_admit(&wasmctrl::plugin::Gvk::new("v1", "Secret")));
}

#[test]
fn the_host_admission_table_is_checked() {
    let errors = |text: &str| match wasmctrl::config::HostConfig::parse(Path::new("wasmctrl.toml"), text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    };
    let e = errors("[admission]\naddress = \"0.0.0.0:9443\"\n");
    assert!(e.contains("`admission.address`") && e.contains("cannot dial 0.0.0.0"), "{e}");
    let e =
        errors("[admission]\nurl = \"https://a:1\"\nservice = { namespace = \"ns\", name = \"hooks\" }\n");
    assert!(e.contains("exclude each other"), "{e}");
    let e = errors("[admission]\nurl = \"http://127.0.0.1:9443\"\n");
    assert!(e.contains("`admission.url`") && e.contains("https://"), "{e}");
    let e = errors("[admission]\nca-file = \"ca.crt\"\n");
    assert!(e.contains("`admission.ca-file`"), "{e}");
    let e = errors("[admission]\ncert-file = \"tls.crt\"\n");
    assert!(e.contains("needs `key-file`"), "{e}");
    let host = wasmctrl::config::HostConfig::parse(
        Path::new("/etc/wasmctrl/wasmctrl.toml"),
        "[admission]\naddress = \"0.0.0.0:9443\"\nservice = { namespace = \"ops\", name = \"hooks\" }\ncert-file = \"tls/tls.crt\"\nkey-file = \"tls/tls.key\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let settings = host.admission.expect("admission");
    assert_eq!(settings.certificate.map(|c| c.cert), Some(PathBuf::from("/etc/wasmctrl/tls/tls.crt")));
    assert!(settings.manage_configurations);
    assert!(wasmctrl::config::HostConfig::parse(Path::new("w.toml"), "").unwrap().admission.is_none());
}

#[test]
fn check_refuses_sections_the_component_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    // The probe plugin exports no admission interface.
    std::fs::write(dir.path().join("probe.wasm"), guest("test-plugin-probe")).unwrap();
    std::fs::write(
        dir.path().join("probe.toml"),
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[admission]]\nmutating = true\n",
    )
    .unwrap();
    let engine = PluginEngine::new(EngineConfig::default(), None).expect("engine");
    let validator = wasmctrl::reload::EngineValidator(engine.clone());
    let options = wasmctrl::reload::CheckOptions { components: Some(&validator), ..Default::default() };
    let report = wasmctrl::reload::check_paths(&[dir.path().join("probe.toml")], &options);
    assert!(!report.ok());
    let text = report.render();
    assert!(
        text.contains("`admission[0]`") && text.contains("needs the plugin to export `mutator`"),
        "{text}"
    );
    // The admission plugin exports both: its sections pass and the report says what it admits.
    std::fs::write(dir.path().join("admit.wasm"), guest("test-plugin-admission")).unwrap();
    std::fs::write(dir.path().join("admit.toml"), admission_toml("team-a", "a")).unwrap();
    let report = wasmctrl::reload::check_paths(&[dir.path().join("admit.toml")], &options);
    let text = report.render();
    assert!(report.ok(), "{text}");
    assert!(text.contains("world wasmctrl:controller/admitting-plugin@0.2.1"), "{text}");
    assert!(text.contains("admits   mutate v1/ConfigMap (CREATE UPDATE) /admission/admit/mutate"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_an_admission_server_rejects_an_admitting_plugin() {
    let cluster = TestCluster::start().await.expect("test cluster");
    let ns = cluster.namespace().await.expect("namespace");
    let client = cluster.client();
    let plugins = PluginsDir::new();
    plugins.install("admit", &guest("test-plugin-admission"), &admission_toml(&ns, "a"));
    let host = TestHost::start(client, plugins, HostSetup::new("wasmctrl-admission", PATIENCE)).await;
    let status = host.status("admit").expect("status");
    let error = status.last_error.clone().unwrap_or_default();
    assert!(error.contains("this host serves none") && error.contains("[admission]"), "{status:?}");
    host.stop().await;
}

// ---- TypeScript and Python plugins ----

/// True, saying so, on the real server's run of the suite: for tests that reach no API
/// server's webhook path (reviews posted to the host), so the dev-cluster run covers them.
fn skipped_on_the_real_server(what: &str) -> bool {
    let real = Backend::from_env().is_ok_and(|b| b == Backend::Real);
    if real {
        eprintln!(
            "{what}: skipped on the real API server: covered by the dev-cluster run (no webhook call involved)"
        );
    }
    real
}

/// The admission test plugin of a guest language (`guests/{ts,python}/test-plugins/admission`),
/// or `None`, saying so, when that language's toolchain is not installed (build-guests then
/// builds none of its guests).
fn language_plugin(language: &str) -> Option<Vec<u8>> {
    let (probes, path): (&[(&str, &[&str])], &str) = match language {
        "ts" => (
            &[("node", &["--version"]), ("npm", &["--version"])],
            "guests/target/ts/test-plugin-ts-admission.wasm",
        ),
        _ => (
            &[("python3", &["-c", "import sys, venv; assert sys.version_info >= (3, 10)"])],
            "guests/target/python/test-plugin-py-admission.wasm",
        ),
    };
    for (cmd, args) in probes {
        if !std::process::Command::new(cmd).args(*args).output().is_ok_and(|o| o.status.success()) {
            eprintln!(
                "skipping the {language} admission plugin: `{cmd}` is missing, so build-guests built no {language} guests"
            );
            return None;
        }
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    Some(
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_and_python_plugins_validate_and_mutate() {
    if skipped_on_the_real_server("the TypeScript and Python admission plugins") {
        return;
    }
    for language in ["ts", "python"] {
        let Some(wasm) = language_plugin(language) else { continue };
        // An interpreter instance needs more memory than a Rust one (docs/guest-languages.md).
        let host = Host::start_plugin(
            wasm,
            |ns| format!("memory = \"128MiB\"\n{}", admission_toml(ns, language)),
            None,
        )
        .await;
        let ns = host.ns.clone();
        let allowed = host.review("validate", &create(&ns, "fine", json!({"k": "v"}))).await;
        assert_eq!(allowed["allowed"], true, "{language}: {allowed}");
        assert_eq!(warnings(&allowed), [format!("validated by {language}")], "{language}");
        let denied = host.review("validate", &create(&ns, "no", json!({"deny": "not in prod"}))).await;
        assert_eq!(
            (denied["allowed"].as_bool(), denied["status"]["code"].as_u64()),
            (Some(false), Some(403)),
            "{language}: {denied}"
        );
        assert_eq!(denied["status"]["message"], "not in prod", "{language}");
        let invalid = host.review("validate", &create(&ns, "bad", json!({"invalid": "x"}))).await;
        assert_eq!(invalid["status"]["code"], 422, "{language}: {invalid}");
        // An exception traps: the failure policy answers.
        let thrown = host.review("validate", &create(&ns, "boom", json!({"throw": "x"}))).await;
        assert_eq!(thrown["allowed"], false, "{language}: {thrown}");
        assert!(
            thrown["status"]["message"].as_str().unwrap_or("").contains("trapped in validate"),
            "{language}: {thrown}"
        );
        let mutated = host.review("mutate", &create(&ns, "m", json!({}))).await;
        assert_eq!(mutated["allowed"], true, "{language}: {mutated}");
        let mut object = configmap(&ns, "m", json!({}), json!({}));
        let ops: json_patch::Patch =
            serde_json::from_value(patch_of(&mutated).expect("a patch")).expect("RFC 6902");
        json_patch::patch(&mut object, &ops).expect("applies");
        assert_eq!(object["metadata"]["labels"]["stamp"], language, "{language}: {mutated}");
        assert_eq!(warnings(&mutated), [format!("mutated by {language}")], "{language}");
        host.stop().await;
    }
}

// ---- The binary: `wasmctrl run` with [admission], `wasmctrl webhook-config` ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasmctrl_run_serves_the_plugins_webhooks_and_webhook_config_prints_them() {
    // The binary runs its own embedded dev cluster whichever backend the suite uses.
    if skipped_on_the_real_server("wasmctrl run with [admission]") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let (ca_pem, _) = write_certificate(&tls, "run");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::write(plugins.join("admit.wasm"), guest("test-plugin-admission")).unwrap();
    std::fs::write(plugins.join("admit.toml"), admission_toml("default", "run")).unwrap();
    // A free port for the admission server (the host TOML names it).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let host_toml = dir.path().join("wasmctrl.toml");
    std::fs::write(
        &host_toml,
        format!(
            "plugins-dir = \"plugins\"\ncache-dir = \"cache\"\n[cluster]\nmode = \"embedded\"\n[server]\naddress = \"127.0.0.1:0\"\n\
             [admission]\naddress = \"127.0.0.1:{port}\"\ncert-file = \"tls/tls.crt\"\nkey-file = \"tls/tls.key\"\nca-file = \"tls/ca.crt\"\n\
             manage-configurations = false\n"
        ),
    )
    .unwrap();

    // `wasmctrl webhook-config`: the configurations the host would write.
    let out = std::process::Command::new(WASMCTRL)
        .args(["webhook-config", "--config"])
        .arg(&host_toml)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    for part in [
        "kind: MutatingWebhookConfiguration".to_owned(),
        "kind: ValidatingWebhookConfiguration".to_owned(),
        "name: wasmctrl-admit".to_owned(),
        format!("url: https://127.0.0.1:{port}/admission/admit/validate"),
        "name: lenient.admit.wasmctrl.dev".to_owned(),
        "failurePolicy: Ignore".to_owned(),
        "caBundle:".to_owned(),
    ] {
        assert!(yaml.contains(&part), "{part} missing from:\n{yaml}");
    }

    // `wasmctrl run`: the server comes up, the plugin joins it once loaded.
    let _host = HostProcess::spawn(
        std::process::Command::new(WASMCTRL)
            .args(["run", "--config"])
            .arg(&host_toml)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        "wasmctrl run",
    );
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let denied = create("default", "no", json!({"deny": "not from the binary"}));
    eventually("the host answers the plugin's webhook", || async {
        if tokio::net::TcpStream::connect(address).await.is_err() {
            return Err("not listening yet".into());
        }
        let (status, body) =
            post_to(address, ca_pem.as_bytes(), "/admission/admit/validate", denied.to_string().into_bytes())
                .await;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match (status, body["response"]["status"]["message"].as_str()) {
            (200, Some("not from the binary")) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[test]
fn rbac_grants_the_webhook_configurations_when_the_host_writes_them() {
    let admitting = wasmctrl::config::PluginConfig::parse(
        Path::new("a.toml"),
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[[admission]]\n",
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let yaml = |manage: bool| {
        let options = wasmctrl::reload::RbacOptions { webhook_configurations: manage, ..Default::default() };
        wasmctrl::reload::rbac_for(
            std::slice::from_ref(&admitting),
            &options,
            &wasmctrl::config::BuiltinKinds,
        )
        .to_yaml()
        .unwrap()
    };
    let managed = yaml(true);
    for part in
        ["name: wasmctrl-admission", "validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
    {
        assert!(managed.contains(part), "{part} missing from:\n{managed}");
    }
    assert!(!yaml(false).contains("webhookconfigurations"));
}
