//! The reflector against what a hostile or broken API server (or one an attacker sits in
//! front of) can send: a watch event line that never ends, a list envelope that never ends, a
//! failure response whose body never ends, and objects over `max-object-size`. Each is cut
//! at its cap with a clear error, followed by the reflector's usual recovery (backoff, then a
//! relist); nothing grows without bound.
//!
//! The endless bodies come from a scripted server (the adversary cannot be a real API
//! server); the oversized object runs on either test backend (the dev cluster or a real
//! kube-apiserver). Every wait is for an event (a request reaching the server, a warning
//! logged, an object reaching the cache), with a generous safety timeout.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::RawQuery;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use wasmctrl::informer::{InformerOptions, ResourceEventHandler, SharedIndexInformer};
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::source::{ApiResource, BackoffConfig, Reflector, ReflectorConfig};
use wasmctrl_testkit::TestCluster;

const PATIENCE: Duration = Duration::from_secs(60);

/// Warnings logged by the reflectors, rendered (`message field=value ...`), and a counter
/// bumped on each, to wait on.
struct Warnings {
    lines: Mutex<Vec<String>>,
    count: tokio::sync::watch::Sender<usize>,
}

struct WarningLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > tracing::Level::WARN || !meta.target().starts_with("wasmctrl_runtime::source") {
            return;
        }
        struct Render(String);
        impl tracing::field::Visit for Render {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.push_str(&format!(" {}={value}", field.name()));
            }
        }
        let mut line = Render(String::new());
        event.record(&mut line);
        let warnings = warnings();
        warnings.lines.lock().push(line.0);
        warnings.count.send_modify(|n| *n += 1);
    }
}

/// The warnings logged so far (capture starts with the first call).
fn warnings() -> &'static Warnings {
    static WARNINGS: OnceLock<Warnings> = OnceLock::new();
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(WarningLayer));
    });
    WARNINGS.get_or_init(|| Warnings { lines: Mutex::default(), count: tokio::sync::watch::channel(0).0 })
}

/// Waits for a warning containing every one of `parts`; returns it.
async fn warning(parts: &[&str]) -> String {
    let w = warnings();
    let mut seen = w.count.subscribe();
    let found = || w.lines.lock().iter().find(|l| parts.iter().all(|p| l.contains(p))).cloned();
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(line) = found() {
                return line;
            }
            let _ = seen.changed().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no warning with {parts:?}; warnings: {:#?}", w.lines.lock()))
}

/// Bumps a counter on every notification, so a test can wait for the cache to change.
struct Changes(tokio::sync::watch::Sender<u64>);

impl ResourceEventHandler for Changes {
    fn on_add(&self, _: &Arc<Object>, _: bool) {
        self.0.send_modify(|n| *n += 1);
    }
    fn on_update(&self, _: &Arc<Object>, _: &Arc<Object>) {
        self.0.send_modify(|n| *n += 1);
    }
    fn on_delete(&self, _: &DeletedObject) {
        self.0.send_modify(|n| *n += 1);
    }
}

/// Starts `reflector` into a fresh informer; returns it and a receiver of its changes.
fn informer(reflector: Reflector) -> (SharedIndexInformer, tokio::sync::watch::Receiver<u64>) {
    let informer = SharedIndexInformer::new(InformerOptions::default()).expect("informer");
    let (tx, rx) = tokio::sync::watch::channel(0);
    informer.add_event_handler(Arc::new(Changes(tx)), None);
    informer.start(reflector);
    (informer, rx)
}

/// Waits until the cache's `name → data.k` is `want`.
async fn cache_is(
    informer: &SharedIndexInformer,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    want: &[(&str, &str)],
) {
    let want: BTreeMap<String, String> = want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let state = || -> BTreeMap<String, String> {
        informer
            .indexer()
            .list()
            .iter()
            .map(|o| {
                let cm: ConfigMap = o.parse().expect("a ConfigMap");
                let k = cm.data.and_then(|d| d.get("k").cloned()).unwrap_or_default();
                (o.name().to_owned(), k)
            })
            .collect()
    };
    let reached = tokio::time::timeout(PATIENCE, changes.wait_for(|_| state() == want)).await;
    assert!(reached.is_ok(), "cache never became {want:?}; it is {:?}", state());
}

fn fast_backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(50),
        ..BackoffConfig::default()
    }
}

fn item(name: &str, rv: u32, k: &str) -> String {
    format!(
        r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"{k}"}}}}"#
    )
}

fn ok(body: String) -> Response<Body> {
    Response::builder().header("content-type", "application/json").body(body.into()).expect("response")
}

/// `start`, then `fill` repeated for ever: a body that never ends.
fn endless(status: u16, start: impl Into<Bytes>, fill: u8) -> Response<Body> {
    let (start, chunk) = (start.into(), Bytes::from(vec![fill; 16 << 10]));
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(start) })
        .chain(futures::stream::repeat_with(move || Ok(chunk.clone())));
    Response::builder().status(status).body(Body::from_stream(stream)).expect("response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_lines_envelopes_and_failure_bodies_are_cut_at_the_cap_and_the_reflector_relists() {
    warnings();
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let (seen_tx, mut seen) = tokio::sync::watch::channel(0usize);
    let app = {
        let requests = requests.clone();
        axum::Router::new().route(
            "/api/v1/namespaces/ns/configmaps",
            axum::routing::get(move |RawQuery(q): RawQuery| {
                let requests = requests.clone();
                let seen_tx = seen_tx.clone();
                async move {
                    let n = {
                        let mut requests = requests.lock();
                        requests.push(q.unwrap_or_default());
                        requests.len()
                    };
                    seen_tx.send_replace(n);
                    match n {
                        1 => ok(format!(
                            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"10"}},"items":[{}]}}"#,
                            item("cm-0", 5, "a")
                        )),
                        // One good event, then a line that never ends.
                        2 => endless(
                            200,
                            format!(
                                "{{\"type\":\"MODIFIED\",\"object\":{}}}\n{{\"type\":\"ADDED\",\"object\":{{\"data\":\"",
                                item("cm-0", 11, "b")
                            ),
                            b'x',
                        ),
                        // A list whose envelope never ends.
                        3 => endless(200, r#"{"kind":"ConfigMapList","metadata":{"resourceVersion":""#, b'7'),
                        // A failure whose body never ends.
                        4 => endless(500, "", b'!'),
                        5 => ok(format!(
                            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"20"}},"items":[{},{}]}}"#,
                            item("cm-0", 11, "b"),
                            item("cm-1", 15, "c")
                        )),
                        _ => Response::builder()
                            .body(Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()))
                            .expect("response"),
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let client = kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    let config = ReflectorConfig {
        namespace: Some("ns".into()),
        max_object_size: 256 << 10,
        backoff: fast_backoff(),
        ..ReflectorConfig::default()
    };
    let (informer, mut changes) =
        informer(Reflector::new(client, ApiResource::new("v1", "ConfigMap", "configmaps", true), config));

    let reached = tokio::time::timeout(PATIENCE, seen.wait_for(|n| *n >= 6)).await;
    assert!(reached.is_ok(), "the reflector got past every endless body: {:?}", requests.lock());
    cache_is(&informer, &mut changes, &[("cm-0", "b"), ("cm-1", "c")]).await;

    let line =
        warning(&["watch failed", "in ns", "a watch event of at least", "262144 bytes", "max-object-size"])
            .await;
    assert!(line.contains("transient=false"), "{line}");
    warning(&["list failed", "a list envelope of at least", "max-object-size"]).await;
    warning(&["list failed", "API server returned 500"]).await;
    let requests = requests.lock().clone();
    let query = |i: usize| -> BTreeMap<String, String> {
        form_urlencoded::parse(requests[i].as_bytes()).into_owned().collect()
    };
    assert_eq!(query(1).get("watch").map(String::as_str), Some("true"));
    // The watch reached resourceVersion 11 before its endless line: the relist is from there.
    assert_eq!(query(2).get("resourceVersion").map(String::as_str), Some("11"), "{requests:?}");
    assert!(!query(2).contains_key("watch"));
    assert_eq!(query(5).get("resourceVersion").map(String::as_str), Some("20"));
    informer.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_over_max_object_size_fails_the_watch_then_the_list_until_it_shrinks() {
    warnings();
    let cluster = TestCluster::start().await.expect("test cluster starts");
    let ns = cluster.namespace().await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let cm = |name: &str, k: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": k},
        }))
        .expect("ConfigMap")
    };
    api.create(&PostParams::default(), &cm("a", "small")).await.expect("create");
    let config = ReflectorConfig {
        namespace: Some(ns.clone()),
        max_object_size: 64 << 10,
        backoff: fast_backoff(),
        ..ReflectorConfig::default()
    };
    let (informer, mut changes) = informer(Reflector::new(
        cluster.client(),
        ApiResource::new("v1", "ConfigMap", "configmaps", true),
        config,
    ));
    cache_is(&informer, &mut changes, &[("a", "small")]).await;

    // Grown past the cap: its watch event is refused, then so is the relist's item.
    let big = "x".repeat(100 << 10);
    let mut grown = api.get("a").await.expect("get");
    grown.data = Some([("k".to_owned(), big)].into());
    api.replace("a", &PostParams::default(), &grown).await.expect("replace");
    let scope = format!("in {ns}");
    warning(&["watch failed", &scope, "a watch event of at least", "65536 bytes", "max-object-size"]).await;
    warning(&["list failed", &scope, "a list item of at least", "65536 bytes", "max-object-size"]).await;

    // Shrunk again, and another object created meanwhile: the next relist brings both.
    api.create(&PostParams::default(), &cm("b", "new")).await.expect("create");
    let mut shrunk = api.get("a").await.expect("get");
    shrunk.data = Some([("k".to_owned(), "small-again".to_owned())].into());
    api.replace("a", &PostParams::default(), &shrunk).await.expect("replace");
    cache_is(&informer, &mut changes, &[("a", "small-again"), ("b", "new")]).await;
    informer.stop();
}
