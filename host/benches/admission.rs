//! Admission through the host: `AdmissionReview`s over HTTPS (TLS and HTTP/2, as the API
//! server sends them) answered by a Wasm policy, against a native Rust handler served by the
//! same server, the same review parsing and the same response building.
//!
//! Policies (a 2 KB ConfigMap per review):
//! - no-op: admits without reading the request (`guests/test-plugins/bench-admission`, raw
//!   bindings) vs a native handler that admits at once: the fixed cost of a plugin call
//!   (taking an idle instance, copying the request in, the call, which runs in the
//!   request's task and so makes no hop to another thread);
//! - typed-parse: decodes the object into k8s-openapi's `ConfigMap`, checks its data and
//!   warns (`guests/test-plugins/admission` through the SDK's `Validate`) vs the same in
//!   native Rust.
//!
//! Measures, each over `BENCH_ROUNDS` rounds (median round reported):
//! - throughput: `BENCH_IN_FLIGHT` requests at once on one HTTP/2 connection for
//!   `BENCH_SECONDS`, requests per second;
//! - latency: an open-loop stream at `BENCH_RATE` requests per second (1,000 by default),
//!   p50 and p99 from send to response.
//!
//! Run with `cargo bench -p wasmctrl --bench admission` after `cargo xtask build-guests`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;
use wasmctrl::admission::review::{self, Answer};
use wasmctrl::admission::{
    AdmissionRouter, AdmissionRule, AdmissionServer, CertSource, FailurePolicy, Operation, Reinvocation,
    ReviewReply, ReviewService, ServingCert, SideEffects, WebhookMetrics, WebhookType,
};
use wasmctrl::plugin::{EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginSpec};
use wasmctrl_bench_support::summary::Figure;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn wasm(crate_name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
}

/// A ~2 KB ConfigMap `AdmissionReview`, as the API server sends one.
fn review_body() -> Vec<u8> {
    let data: serde_json::Map<String, serde_json::Value> =
        (0..24).map(|i| (format!("key-{i:02}"), serde_json::Value::String("v".repeat(60)))).collect();
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bench", "namespace": "default", "uid": "0f6e2b7a-1b9d-4c35-9a4e-2f3c9d7e1a11",
            "resourceVersion": "12345", "labels": {"app": "bench", "tier": "web"},
            "annotations": {"example.com/owner": "team-a"}},
        "data": data,
    });
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e911857d-c318-11e8-bbad-025000000001",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "requestKind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "requestResource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": "bench", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "admin", "uid": "014fbff9a07c", "groups": ["system:authenticated"]},
            "object": object, "oldObject": null, "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    }))
    .expect("review")
}

fn rule() -> AdmissionRule {
    AdmissionRule {
        name: "validate".into(),
        webhook_type: WebhookType::Validating,
        kinds: vec![Gvk::new("v1", "ConfigMap")],
        operations: vec![Operation::Create, Operation::Update],
        namespace_selector: None,
        object_selector: None,
        failure_policy: FailurePolicy::Fail,
        timeout: Duration::from_secs(10),
        side_effects: SideEffects::None,
        reinvocation: Reinvocation::Never,
    }
}

/// The native handler: the host's review path with native Rust where the plugin call is.
struct Native {
    typed: bool,
}

impl ReviewService for Native {
    fn review<'a>(&'a self, _path: &'a str, body: Bytes) -> BoxFuture<'a, ReviewReply> {
        Box::pin(async move {
            let request = match review::parse(&body) {
                Ok(r) => r,
                Err(e) => return ReviewReply::json(Answer::invalid(&e.to_string()).to_json()),
            };
            let Ok(input) = review::to_input(&request) else {
                return ReviewReply::json(Answer::invalid("encoding").to_json());
            };
            if !self.typed {
                return ReviewReply::json(Answer::allow(&request).to_json());
            }
            // What the typed-parse plugin does: decode, check the data, warn.
            let cm: ConfigMap = match input.object.as_deref().map(serde_json::from_slice).transpose() {
                Ok(Some(cm)) => cm,
                _ => return ReviewReply::json(Answer::deny(&request, 400, "decoding the object").to_json()),
            };
            let warnings = vec!["validated by bench".to_owned()];
            let data = cm.data.unwrap_or_default();
            let answer = match data.get("deny") {
                Some(m) => Answer::deny(&request, 403, m),
                None if data.contains_key("invalid") => {
                    Answer::deny(&request, 422, "data.invalid is not allowed")
                }
                None => Answer::allow(&request),
            };
            ReviewReply::json(answer.warn(warnings).to_json())
        })
    }
}

/// A client's HTTP/2 connection to the server.
async fn connect(address: SocketAddr, ca_pem: &[u8]) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA")).expect("CA");
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(address).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(rustls::pki_types::ServerName::IpAddress(address.ip().into()), tcp)
        .await
        .expect("TLS handshake");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    sender
}

async fn post(sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>, body: Bytes) {
    let request = http::Request::post("https://127.0.0.1/admission/bench/validate")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    let answer = response.into_body().collect().await.expect("body").to_bytes();
    assert!(answer.windows(14).any(|w| w == b"\"allowed\":true"), "{}", String::from_utf8_lossy(&answer));
}

/// Requests per second with `in_flight` requests at once for `duration`.
async fn throughput(
    address: SocketAddr,
    ca: &[u8],
    body: Bytes,
    in_flight: usize,
    duration: Duration,
) -> f64 {
    let sender = connect(address, ca).await;
    let stop = Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (mut sender, body) = (sender.clone(), body.clone());
        tasks.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                post(&mut sender, body.clone()).await;
                n += 1;
            }
            n
        });
    }
    let started = Instant::now();
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.expect("client");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// p50 and p99 (ms) of an open-loop stream at `rate` per second for `duration`.
async fn latency(address: SocketAddr, ca: &[u8], body: Bytes, rate: u32, duration: Duration) -> (f64, f64) {
    let sender = connect(address, ca).await;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let n = (f64::from(rate) * duration.as_secs_f64()) as usize;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        ticks.tick().await;
        let (mut sender, body) = (sender.clone(), body.clone());
        let sent = Instant::now();
        tasks.spawn(async move {
            post(&mut sender, body).await;
            sent.elapsed()
        });
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(n);
    while let Some(d) = tasks.join_next().await {
        samples.push(d.expect("client"));
    }
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

/// Median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

struct Measured {
    rps: f64,
    p50: f64,
    p99: f64,
}

async fn measure(
    service: Arc<dyn ReviewService>,
    cert: &ServingCert,
    rounds: usize,
    in_flight: usize,
    rate: u32,
    seconds: Duration,
) -> Measured {
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let server =
        AdmissionServer::start(listener, cert.server_config().expect("TLS"), service, shutdown.clone())
            .expect("server");
    let (address, ca) = (server.address(), cert.ca_bundle().expect("CA"));
    let body = Bytes::from(review_body());
    // Warm-up: instances made, code paged in, connections' TLS done.
    throughput(address, &ca, body.clone(), in_flight, Duration::from_millis(500)).await;
    let (mut rps, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        rps.push(throughput(address, &ca, body.clone(), in_flight, seconds).await);
        let (a, b) = latency(address, &ca, body.clone(), rate, seconds).await;
        p50.push(a);
        p99.push(b);
    }
    shutdown.cancel();
    server.stopped().await;
    Measured { rps: median(rps), p50: median(p50), p99: median(p99) }
}

fn main() {
    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let seconds = Duration::from_secs(env_usize("BENCH_SECONDS", 3).max(1) as u64);
    let in_flight = env_usize("BENCH_IN_FLIGHT", 8).max(1);
    let rate = u32::try_from(env_usize("BENCH_RATE", 1000).max(1)).unwrap_or(1000);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let engine = PluginEngine::new(EngineConfig::default(), None).expect("engine");
    let cert =
        ServingCert::load(&CertSource::Generated { names: vec!["127.0.0.1".into()] }).expect("certificate");

    let load = |crate_name: &str, settings: &'static [u8]| {
        let mut spec = PluginSpec::new("bench", Gvk::new("v1", "ConfigMap"));
        spec.permissions = spec.permissions.clone().admitting([Gvk::new("v1", "ConfigMap")]);
        spec.settings = Bytes::from_static(settings);
        // One instance per request in flight, as a plugin with that `concurrency` has.
        spec.concurrency = in_flight;
        Plugin::load(&engine, spec, &wasm(crate_name), PluginEnv::default()).expect("plugin")
    };
    let router = |plugin: Plugin| {
        let (_, ca) = tokio::sync::watch::channel(None);
        let router = AdmissionRouter::new(None, ca, WebhookMetrics::default());
        rt.block_on(router.install(None, plugin, vec![rule()]));
        Arc::new(router) as Arc<dyn ReviewService>
    };

    println!(
        "admission reviews over HTTPS (TLS, HTTP/2), 2 KB ConfigMap, median of {rounds} round(s) of {}s; \
         throughput with {in_flight} in flight, latency open-loop at {rate}/s:",
        seconds.as_secs()
    );
    println!("  {:<34} {:>10} {:>9} {:>9}", "handler", "req/s", "p50 ms", "p99 ms");
    let mut results = Vec::new();
    for (policy, crate_name, settings, typed) in [
        ("no-op", "test-plugin-bench-admission", &b"{}"[..], false),
        ("typed-parse", "test-plugin-admission", &br#"{"stamp":"bench"}"#[..], true),
    ] {
        let wasm =
            rt.block_on(measure(router(load(crate_name, settings)), &cert, rounds, in_flight, rate, seconds));
        let native =
            rt.block_on(measure(Arc::new(Native { typed }), &cert, rounds, in_flight, rate, seconds));
        for (name, m) in [(format!("Wasm {policy}"), &wasm), (format!("native Rust {policy}"), &native)] {
            println!("  {name:<34} {:>10.0} {:>9.3} {:>9.3}", m.rps, m.p50, m.p99);
        }
        println!(
            "  {:<34} {:>9.2}x {:>8.2}x {:>8.2}x",
            format!("Wasm / native ({policy})"),
            native.rps / wasm.rps,
            wasm.p50 / native.p50,
            wasm.p99 / native.p99
        );
        results.push((policy, wasm, native));
    }
    for (policy, wasm, native) in &results {
        // Target: the Wasm overhead at most 1.5x native, i.e. throughput at least native / 1.5.
        Figure::higher(
            "admission",
            format!("admission reviews/s over HTTPS, Wasm {policy} policy"),
            wasm.rps,
            "req/s",
        )
        .against(&format!("native Rust {policy}"), native.rps)
        .target(native.rps / 1.5)
        .record();
        Figure::lower(
            "admission",
            format!("admission p99 ms at {rate}/s, Wasm {policy} policy"),
            wasm.p99,
            "ms",
        )
        .against(&format!("native Rust {policy}"), native.p99)
        .target(2.0)
        .record();
        Figure::lower(
            "admission",
            format!("admission p50 ms at {rate}/s, Wasm {policy} policy"),
            wasm.p50,
            "ms",
        )
        .against(&format!("native Rust {policy}"), native.p50)
        .record();
    }
}
