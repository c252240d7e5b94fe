//! The host's endpoint with `[server] auth = "kubernetes"`, against either test backend (the
//! dev cluster or a real kube-apiserver): HTTPS; `/metrics` and `/plugins` only for a bearer
//! token the API server authenticates (TokenReview) and authorizes for `get` on the path
//! (SubjectAccessReview), as controller-runtime's metrics filter decides; the probes open but
//! without details (they carry plugins' errors, guest stderr among them).

use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use wasmctrl::metrics::Metrics;
use wasmctrl::server::{Access, KubernetesAuth, Readiness, ServerTls, StatusSource};
use wasmctrl_testkit::TestCluster;

/// A host whose plugin failed with what its guest wrote to stderr.
struct FailedPlugin;

impl StatusSource for FailedPlugin {
    fn readiness(&self) -> Readiness {
        Readiness {
            ready: false,
            details: vec!["plugin p: no running version: failed: guest stderr: s3cret".into()],
        }
    }
    fn plugins(&self) -> serde_json::Value {
        serde_json::json!([{ "name": "p", "last_error": "guest stderr: s3cret" }])
    }
}

struct Endpoint {
    address: SocketAddr,
    certificate: rustls::pki_types::CertificateDer<'static>,
    auth: Arc<KubernetesAuth>,
    stop: CancellationToken,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn endpoint(client: kube::Client) -> Endpoint {
    let tls = ServerTls::self_signed(&[]).expect("certificate");
    let certificate = tls.certificate.clone();
    let auth = Arc::new(KubernetesAuth::new(client));
    let stop = CancellationToken::new();
    let metrics = Metrics::new();
    metrics.workqueue_adds.get_or_create(&wasmctrl::metrics::QueueLabels { name: "p".into() }).inc();
    let (address, _task) = wasmctrl::server::serve_with(
        "127.0.0.1:0".parse().expect("address"),
        Access::Kubernetes { auth: auth.clone(), tls },
        metrics,
        Arc::new(FailedPlugin),
        stop.clone(),
    )
    .await
    .expect("serves");
    Endpoint { address, certificate, auth, stop }
}

/// `GET path` over TLS (verifying the endpoint's certificate), with `token` as a bearer token:
/// the status code and the body.
async fn get(endpoint: &Endpoint, path: &str, token: Option<&str>) -> (u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(endpoint.certificate.clone()).expect("trust the endpoint's certificate");
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(endpoint.address).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls =
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.expect("handshake");
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    // A peer that closes without close_notify still gave us the whole response.
    let _ = tls.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    let code =
        out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status line: {out:?}"));
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

/// A ServiceAccount `name` in `ns` allowed `get` on `paths` (by a ClusterRole and binding of
/// the same unique name), and a token for it. Real server only.
async fn service_account_token(cluster: &TestCluster, ns: &str, name: &str, paths: &[&str]) -> String {
    let client = cluster.client();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns}})).expect("SA");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("SA");
    if !paths.is_empty() {
        let role_name = cluster.unique(name);
        let role: ClusterRole = serde_json::from_value(serde_json::json!({
            "metadata": {"name": role_name},
            "rules": [{"nonResourceURLs": paths, "verbs": ["get"]}],
        }))
        .expect("role");
        Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &role).await.expect("role");
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        }))
        .expect("binding");
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("binding");
    }
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": []}})).expect("token request");
    let issued = Api::<ServiceAccount>::namespaced(client, ns)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token issued");
    issued.status.and_then(|s| s.token).expect("token")
}

async fn delete_cluster_role(cluster: &TestCluster, name: &str) {
    let name = cluster.unique(name);
    let _ = Api::<ClusterRoleBinding>::all(cluster.client()).delete(&name, &DeleteParams::default()).await;
    let _ = Api::<ClusterRole>::all(cluster.client()).delete(&name, &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_plugins_need_a_token_the_api_server_accepts_and_probes_say_no_more_than_ready() {
    let cluster = TestCluster::start().await.expect("test cluster starts");
    let ns = cluster.namespace().await.expect("namespace");
    let token = match cluster.dev() {
        Some(dev) => dev.token().to_owned(),
        None => service_account_token(&cluster, &ns, "reader", &["/metrics", "/plugins"]).await,
    };
    let endpoint = endpoint(cluster.client()).await;

    for path in ["/metrics", "/plugins"] {
        let (code, body) = get(&endpoint, path, None).await;
        assert_eq!((code, body.as_str()), (401, "Unauthorized\n"), "{path} without a token");
        let (code, _) = get(&endpoint, path, Some("not-a-token")).await;
        assert_eq!(code, 401, "{path} with a token the API server does not know");
    }
    let (code, body) = get(&endpoint, "/metrics", Some(&token)).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("workqueue_adds_total{name=\"p\"} 1"), "{body}");
    let (code, body) = get(&endpoint, "/plugins", Some(&token)).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("s3cret"), "an authorized reader sees the plugins' errors: {body}");

    // The probes answer anyone, but only whether the host is ready.
    assert_eq!(get(&endpoint, "/healthz", None).await, (200, "ok\n".to_owned()));
    assert_eq!(get(&endpoint, "/readyz", None).await, (503, "not ready\n".to_owned()));

    // Answers are cached: two tokens (one allowed, one refused) and a decision per path.
    assert_eq!(endpoint.auth.cached(), (2, 2));
    if cluster.dev().is_none() {
        delete_cluster_role(&cluster, "reader").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_path_is_authorized_on_its_own() {
    let cluster = TestCluster::start().await.expect("test cluster starts");
    if cluster.dev().is_some() {
        eprintln!("skipped on the dev cluster: it has one user, allowed everything (no RBAC to deny a path)");
        return;
    }
    let ns = cluster.namespace().await.expect("namespace");
    let metrics_only = service_account_token(&cluster, &ns, "metrics-only", &["/metrics"]).await;
    let nobody = service_account_token(&cluster, &ns, "nobody", &[]).await;
    let endpoint = endpoint(cluster.client()).await;

    let (code, body) = get(&endpoint, "/metrics", Some(&metrics_only)).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(&endpoint, "/plugins", Some(&metrics_only)).await;
    assert_eq!(
        (code, body.as_str()),
        (403, format!("Authorization denied for user system:serviceaccount:{ns}:metrics-only\n").as_str())
    );
    let (code, body) = get(&endpoint, "/metrics", Some(&nobody)).await;
    assert_eq!(
        (code, body.trim()),
        (403, format!("Authorization denied for user system:serviceaccount:{ns}:nobody").as_str())
    );
    delete_cluster_role(&cluster, "metrics-only").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_that_cannot_be_made_fails_the_request_and_is_not_remembered() {
    // An API server that is not there.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let client = kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    let endpoint = endpoint(client).await;
    let (code, body) = get(&endpoint, "/metrics", Some("some-token")).await;
    assert_eq!((code, body.as_str()), (500, "Authentication failed\n"));
    assert_eq!(endpoint.auth.cached(), (0, 0), "a failed review is asked again next time");
    let (code, _) = get(&endpoint, "/metrics", None).await;
    assert_eq!(code, 401, "no token needs no review");
}
