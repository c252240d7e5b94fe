//! Informer integration tests over real HTTP against either test backend (the dev cluster or
//! a real kube-apiserver, see `wasmctrl-testkit`): initial sync, changes during the list,
//! dropped watches, forced 410 → relist, deletes missed while the watch was down (tombstones),
//! 429 handling, selectors, factory sharing and discovery. Tests that need the dev cluster's
//! fault injection skip on the real server, saying so. Every test works in its own namespaces.
//!
//! Every wait has a generous safety timeout; no assertion depends on timing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use parking_lot::Mutex;
use wasmctrl::cache::{IndexSpec, Indexer, LabelSelector};
use wasmctrl::informer::{FactoryOptions, InformerFactory, InformerSpec, ResourceEventHandler};
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::source::BackoffConfig;
use wasmctrl_devcluster::FaultRule;
use wasmctrl_testkit::TestCluster;

const PATIENCE: Duration = Duration::from_secs(60);

async fn cluster() -> (TestCluster, kube::Client) {
    let cluster = TestCluster::start().await.expect("test cluster starts");
    let client = cluster.client();
    (cluster, client)
}

fn fast_factory(client: kube::Client) -> InformerFactory {
    InformerFactory::new(
        client,
        FactoryOptions {
            backoff: BackoffConfig {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(200),
                ..BackoffConfig::default()
            },
            ..FactoryOptions::default()
        },
    )
}

/// Creates the test's namespaces (unique names derived from `namespaces`) holding `per_ns`
/// ConfigMaps each, labelled `seed=<the test's suffix>`; returns the namespaces' names.
async fn seed(cluster: &TestCluster, namespaces: &[&str], per_ns: usize) -> Vec<String> {
    let mut names = Vec::new();
    for ns in namespaces {
        names.push(cluster.namespace_named(ns).await.expect("namespace"));
    }
    let run = seed_label(cluster);
    let mut yaml = String::new();
    for ns in &names {
        for i in 0..per_ns {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n  namespace: {ns}\n  labels:\n    app: app-{}\n    seed: {run}\ndata:\n  k: v{i}\n",
                i % 3
            ));
        }
    }
    cluster.apply_yaml(&yaml).await.expect("seed applies");
    names
}

/// The label value marking this test's seeded objects (the real server is shared by tests).
fn seed_label(cluster: &TestCluster) -> String {
    cluster.unique("seed")
}

async fn server_state(client: &kube::Client, ns: Option<&str>) -> BTreeMap<String, String> {
    server_state_selected(client, ns, &ListParams::default()).await
}

async fn server_state_selected(
    client: &kube::Client,
    ns: Option<&str>,
    params: &ListParams,
) -> BTreeMap<String, String> {
    let api: Api<ConfigMap> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    api.list(params)
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|cm| {
            let m = cm.metadata;
            (
                format!("{}/{}", m.namespace.unwrap_or_default(), m.name.unwrap_or_default()),
                m.resource_version.unwrap_or_default(),
            )
        })
        .collect()
}

fn cache_state(indexer: &Indexer) -> BTreeMap<String, String> {
    indexer.list().iter().map(|o| (o.key().to_owned(), o.resource_version().to_owned())).collect()
}

/// Waits (with a safety timeout) until the cache equals the server's state.
async fn converge(client: &kube::Client, ns: Option<&str>, indexer: &Indexer) {
    let want = server_state(client, ns).await;
    let ok = tokio::time::timeout(PATIENCE, async {
        loop {
            if cache_state(indexer) == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if ok.is_err() {
        let have = cache_state(indexer);
        let missing: Vec<_> = want.iter().filter(|(k, v)| have.get(*k) != Some(v)).take(5).collect();
        let extra: Vec<_> = have.iter().filter(|(k, _)| !want.contains_key(*k)).take(5).collect();
        panic!(
            "cache never converged: {} vs {} objects; missing/stale {missing:?}; extra {extra:?}",
            have.len(),
            want.len()
        );
    }
}

async fn synced(lease: &wasmctrl::informer::InformerLease) {
    tokio::time::timeout(PATIENCE, lease.wait_for_sync()).await.expect("informer syncs");
}

fn cm(ns: &str, name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "live"}},
        "data": {"v": value},
    }))
    .expect("valid configmap")
}

#[derive(Default)]
struct Deletes(Mutex<Vec<(String, bool)>>);

impl ResourceEventHandler for Deletes {
    fn on_add(&self, _: &Arc<Object>, _: bool) {}
    fn on_update(&self, _: &Arc<Object>, _: &Arc<Object>) {}
    fn on_delete(&self, obj: &DeletedObject) {
        self.0.lock().push((obj.key().to_owned(), obj.is_final_state_unknown()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_of_5000_objects_matches_server() {
    let (cluster, client) = cluster().await;
    let ns = seed(&cluster, &["ns-a", "ns-b", "ns-c", "ns-d", "ns-e"], 1000).await;
    // All namespaces, restricted to this test's objects (the real server is shared).
    let selector = format!("seed={}", seed_label(&cluster));
    let factory = fast_factory(client.clone());
    let lease = factory
        .informer(InformerSpec::new("v1", "ConfigMap").label_selector(&selector))
        .await
        .expect("informer");
    synced(&lease).await;
    let indexer = lease.indexer();
    assert_eq!(indexer.len(), 5000);
    let want = server_state_selected(&client, None, &ListParams::default().labels(&selector)).await;
    assert_eq!(cache_state(&indexer), want);
    // Items of a list carry apiVersion/kind and lose managedFields.
    let one = indexer.get(&format!("{}/cm-1", ns[0])).expect("cached");
    let v: serde_json::Value = one.parse().expect("json");
    assert_eq!(v["kind"], "ConfigMap");
    assert_eq!(v["apiVersion"], "v1");
    assert!(v["metadata"].get("managedFields").is_none());
    assert_eq!(indexer.by_index("namespace", &ns[1]).expect("index").len(), 1000);
    let web = LabelSelector::parse("app=app-1").expect("selector");
    assert_eq!(indexer.list_selected(Some(&ns[2]), &web).len(), 333);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_during_list_and_watch_converge() {
    let (cluster, client) = cluster().await;
    let ns = seed(&cluster, &["busy"], 1500).await.remove(0);
    // On the dev cluster, slow list pages down so the writes below race with the paginated
    // list; the real server's list is raced as it comes.
    if let Some(dev) = cluster.dev() {
        dev.faults().inject(
            FaultRule::latency(format!("/api/v1/namespaces/{ns}/configmaps"), Duration::from_millis(30))
                .watch(false)
                .times(4),
        );
    }
    let factory = fast_factory(client.clone());
    let spec = InformerSpec::new("v1", "ConfigMap").namespace(&ns);
    let writer = {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let ns = ns.clone();
        tokio::spawn(async move {
            for i in 0..60 {
                api.create(&PostParams::default(), &cm(&ns, &format!("new-{i}"), "1")).await.expect("create");
                api.replace(&format!("cm-{i}"), &PostParams::default(), &{
                    let mut c = api.get(&format!("cm-{i}")).await.expect("get");
                    c.data = Some([("k".to_string(), "changed".to_string())].into());
                    c
                })
                .await
                .expect("replace");
                api.delete(&format!("cm-{}", 1000 + i), &DeleteParams::default()).await.expect("delete");
            }
        })
    };
    let lease = factory.informer(spec).await.expect("informer");
    writer.await.expect("writer");
    synced(&lease).await;
    converge(&client, Some(&ns), &lease.indexer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watch_resumes_without_losing_changes() {
    let (cluster, client) = cluster().await;
    let Some(dev) = cluster.dev_or_skip("fault injection (dropping watches)") else { return };
    let ns = seed(&cluster, &["drop"], 50).await.remove(0);
    let factory = fast_factory(client.clone());
    let lease =
        factory.informer(InformerSpec::new("v1", "ConfigMap").namespace(&ns)).await.expect("informer");
    synced(&lease).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for round in 0..5 {
        dev.faults().drop_watches();
        api.create(&PostParams::default(), &cm(&ns, &format!("after-drop-{round}"), "x"))
            .await
            .expect("create");
        api.delete(&format!("cm-{round}"), &DeleteParams::default()).await.expect("delete");
    }
    converge(&client, Some(&ns), &lease.indexer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_while_watch_down_arrives_as_tombstone_after_410_relist() {
    let (cluster, client) = cluster().await;
    let Some(dev) = cluster.dev_or_skip("fault injection (failing watches, compacting history)") else {
        return;
    };
    let ns = seed(&cluster, &["gone"], 20).await.remove(0);
    let factory = fast_factory(client.clone());
    let lease =
        factory.informer(InformerSpec::new("v1", "ConfigMap").namespace(&ns)).await.expect("informer");
    synced(&lease).await;
    let deletes = Arc::new(Deletes::default());
    let reg = lease.add_handler(deletes.clone());
    tokio::time::timeout(PATIENCE, reg.wait_for_sync()).await.expect("handler syncs");

    // Take the watch down: every re-watch fails until the faults are cleared.
    let faults = dev.faults();
    faults.inject(FaultRule::error(format!("/api/v1/namespaces/{ns}/configmaps"), 500).watch(true));
    faults.drop_watches();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.delete("cm-7", &DeleteParams::default()).await.expect("delete");
    api.create(&PostParams::default(), &cm(&ns, "born-while-down", "x")).await.expect("create");
    // History compacted: the re-watch from the old resourceVersion gets 410 → relist.
    faults.compact_history();
    faults.clear();

    converge(&client, Some(&ns), &lease.indexer()).await;
    // The cache is updated before the handler's listener delivers: wait for the delivery.
    tokio::time::timeout(PATIENCE, async {
        while deletes.0.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a delete notification arrives");
    let seen = deletes.0.lock().clone();
    assert_eq!(seen, [(format!("{ns}/cm-7"), true)], "the missed delete arrives as a tombstone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_watch_retries_after_retry_after() {
    let (cluster, client) = cluster().await;
    let Some(dev) = cluster.dev_or_skip("fault injection (429 on watch)") else { return };
    let ns = seed(&cluster, &["slow"], 5).await.remove(0);
    let factory = fast_factory(client.clone());
    let lease =
        factory.informer(InformerSpec::new("v1", "ConfigMap").namespace(&ns)).await.expect("informer");
    synced(&lease).await;
    let faults = dev.faults();
    faults.inject(
        FaultRule::too_many_requests(format!("/api/v1/namespaces/{ns}/configmaps"), 1).watch(true).times(2),
    );
    faults.drop_watches();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &cm(&ns, "after-429", "x")).await.expect("create");
    converge(&client, Some(&ns), &lease.indexer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_and_namespace_scope_apply_to_list_and_watch() {
    let (cluster, client) = cluster().await;
    let ns = seed(&cluster, &["sel-a", "sel-b"], 30).await;
    let (a, b) = (&ns[0], &ns[1]);
    let factory = fast_factory(client.clone());
    let lease = factory
        .informer(InformerSpec::new("v1", "ConfigMap").namespace(a).label_selector("app in (app-0,live)"))
        .await
        .expect("informer");
    synced(&lease).await;
    let indexer = lease.indexer();
    assert_eq!(indexer.len(), 10);
    assert!(
        indexer.list().iter().all(|o| o.namespace() == Some(a.as_str()) && o.label("app") == Some("app-0"))
    );
    Api::<ConfigMap>::namespaced(client.clone(), a)
        .create(&PostParams::default(), &cm(a, "live-one", "x"))
        .await
        .expect("create");
    Api::<ConfigMap>::namespaced(client.clone(), b)
        .create(&PostParams::default(), &cm(b, "live-two", "x"))
        .await
        .expect("create");
    tokio::time::timeout(PATIENCE, async {
        while indexer.get(&format!("{a}/live-one")).is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("watched object arrives");
    assert!(indexer.get(&format!("{b}/live-two")).is_none(), "other namespace filtered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factory_shares_informers_merges_indexes_and_stops_on_last_release() {
    let (cluster, client) = cluster().await;
    let ns = seed(&cluster, &["share", "other"], 10).await;
    let factory = fast_factory(client.clone());
    let spec = || InformerSpec::new("v1", "ConfigMap").namespace(&ns[0]);
    let a = factory.informer(spec().index("by-app", IndexSpec::Label("app".into()))).await.expect("a");
    let b = factory.informer(spec().index("by-k", IndexSpec::Field("data.k".into()))).await.expect("b");
    assert!(a.same_informer(&b));
    assert_eq!(factory.informer_count(), 1);
    let other =
        factory.informer(InformerSpec::new("v1", "ConfigMap").namespace(&ns[1])).await.expect("other");
    assert!(!a.same_informer(&other));
    assert_eq!(factory.informer_count(), 2);
    synced(&a).await;
    // A list may come from the API server's watch cache a moment behind the seeding writes
    // (client-go lists at resourceVersion "0" too); the rest arrive through the watch.
    tokio::time::timeout(PATIENCE, async {
        while a.indexer().len() < 10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every seeded object cached");
    // Both users' indexes exist on the one cache.
    assert_eq!(a.indexer().by_index("by-app", "app-1").expect("by-app").len(), 3);
    assert_eq!(b.indexer().index_keys("by-k", "v4").expect("by-k"), [format!("{}/cm-4", ns[0])]);
    // The same index name with another definition is refused.
    let err = factory.informer(spec().index("by-app", IndexSpec::Annotation("x".into()))).await.unwrap_err();
    assert!(err.to_string().contains("by-app"), "{err}");
    assert_eq!(factory.informer_count(), 2, "a refused request takes no lease");

    let informer = a.informer().clone();
    drop(a);
    assert!(!informer.is_stopped(), "b still holds it");
    b.release();
    assert!(informer.is_stopped(), "the last release stops the informer");
    assert_eq!(factory.informer_count(), 1);
    drop(other);
    assert_eq!(factory.informer_count(), 0);
    // A new request starts a fresh informer.
    let again = factory.informer(spec()).await.expect("again");
    synced(&again).await;
    assert_eq!(again.indexer().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_resolves_kinds_and_names_unknown_ones() {
    let (_cluster, client) = cluster().await;
    let factory = fast_factory(client.clone());
    let d = factory.discovery().resolve("apps/v1", "Deployment").await.expect("deployments");
    assert_eq!((d.plural.as_str(), d.namespaced), ("deployments", true));
    let ns = factory.discovery().resolve("v1", "Namespace").await.expect("namespaces");
    assert_eq!((ns.plural.as_str(), ns.namespaced), ("namespaces", false));
    let err = factory.informer(InformerSpec::new("v1", "ConfigMapz")).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("ConfigMapz") && msg.contains("ConfigMap,"), "{msg}");
    let err = factory.informer(InformerSpec::new("nope.example.com/v1", "Thing")).await.unwrap_err();
    assert!(err.to_string().contains("nope.example.com/v1"), "{err}");
    let err = factory.informer(InformerSpec::new("v1", "Namespace").namespace("default")).await.unwrap_err();
    assert!(err.to_string().contains("cluster-scoped"), "{err}");
    let err =
        factory.informer(InformerSpec::new("v1", "ConfigMap").label_selector("a in (")).await.unwrap_err();
    assert!(err.to_string().contains("label selector"), "{err}");
}

/// A scripted fake API server (reflector_test.go style): checks the exact sequence of list and
/// watch requests the reflector makes through pagination, an expired continue token, a
/// bookmark, a watch that ends, a 410 ERROR event and the relist that follows.
mod scripted {
    use super::*;
    use axum::body::Body;
    use axum::extract::RawQuery;
    use axum::response::Response;
    use wasmctrl::informer::{InformerOptions, SharedIndexInformer};
    use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};

    fn item(name: &str, rv: u32) -> String {
        // No apiVersion/kind: list items often lack them; the reflector must add them.
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"data":{{"k":"v"}}}}"#
        )
    }

    fn list(items: &[String], rv: u32, cont: Option<&str>) -> String {
        let cont = cont.map(|c| format!(r#","continue":"{c}""#)).unwrap_or_default();
        format!(
            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"{cont}}},"items":[{}]}}"#,
            items.join(",")
        )
    }

    fn gone() -> Response<Body> {
        Response::builder()
            .status(410)
            .body(Body::from(r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"continue expired"}"#))
            .expect("response")
    }

    fn ok(body: String) -> Response<Body> {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("response")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reflector_request_sequence_pagination_expiry_bookmark_and_relist() {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let app = {
            let log = log.clone();
            axum::Router::new().route(
                "/api/v1/namespaces/ns/configmaps",
                axum::routing::get(move |RawQuery(q): RawQuery| {
                    let log = log.clone();
                    async move {
                        let q = q.unwrap_or_default();
                        let n = {
                            let mut log = log.lock();
                            log.push(q.clone());
                            log.len()
                        };
                        let p: Vec<_> = (0..4).map(|i| item(&format!("cm-{i}"), i + 1)).collect();
                        match n {
                            1 => ok(list(&p[..2], 10, Some("c1"))),
                            2 => gone(),
                            3 => ok(list(&p[..2], 20, Some("c2"))),
                            4 => ok(list(&p[2..], 20, None)),
                            5 => ok(format!(
                                "{}\n{{\"type\":\"MODIFIED\",\"object\":{}}}\n",
                                r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"25"}}}"#,
                                item("cm-0", 26),
                            )),
                            6 => ok(r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old resource version: 26 (28)"}}"#.to_string() + "\n"),
                            7 => ok(list(&[item("cm-0", 26), item("cm-1", 2)], 30, None)),
                            _ => Response::builder()
                                .body(Body::from_stream(futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>()))
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

        let informer = SharedIndexInformer::new(InformerOptions::default()).expect("informer");
        let deletes = Arc::new(Deletes::default());
        informer.add_event_handler(deletes.clone(), None);
        let config = ReflectorConfig {
            namespace: Some("ns".into()),
            label_selector: Some("app in (a,b)".into()),
            page_size: 2,
            ..ReflectorConfig::default()
        };
        informer.start(Reflector::new(
            client,
            ApiResource::new("v1", "ConfigMap", "configmaps", true),
            config,
        ));
        tokio::time::timeout(PATIENCE, async {
            while log.lock().len() < 8 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("reflector reaches the final watch");
        let log = log.lock().clone();
        // Compared as decoded parameters: their order and the percent-encoding style (`+` or
        // `%20` for a space) are the request builder's and mean the same to an API server.
        let params = |q: &str| -> Vec<(String, String)> {
            let mut p: Vec<_> = form_urlencoded::parse(q.as_bytes()).into_owned().collect();
            p.sort();
            p
        };
        let expect = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            let mut p: Vec<_> = pairs
                .iter()
                .chain(&[("labelSelector", "app in (a,b)")])
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            p.sort();
            p
        };
        assert_eq!(
            params(&log[0]),
            expect(&[("limit", "2"), ("resourceVersion", "0")]),
            "first list from the watch cache: {}",
            log[0]
        );
        assert_eq!(
            params(&log[1]),
            expect(&[("limit", "2"), ("continue", "c1")]),
            "next page by continue token only"
        );
        assert_eq!(
            params(&log[2]),
            expect(&[("limit", "2")]),
            "expired continue restarts with a consistent list"
        );
        assert_eq!(params(&log[3]), expect(&[("limit", "2"), ("continue", "c2")]));
        let watch = |q: &str, rv: &str| {
            let (timeout, p): (Vec<_>, Vec<_>) =
                params(q).into_iter().partition(|(k, _)| k == "timeoutSeconds");
            let t: u64 = timeout.first().and_then(|(_, t)| t.parse().ok()).unwrap_or(0);
            timeout.len() == 1
                && p == expect(&[("watch", "true"), ("allowWatchBookmarks", "true"), ("resourceVersion", rv)])
                && (300..=600).contains(&t)
        };
        assert!(watch(&log[4], "20"), "watch from the list RV: {}", log[4]);
        assert!(watch(&log[5], "26"), "re-watch from the last event RV, no relist: {}", log[5]);
        assert_eq!(params(&log[6]), expect(&[("limit", "2")]), "410 → relist with resourceVersion=\"\"");
        assert!(watch(&log[7], "30"), "{}", log[7]);

        tokio::time::timeout(PATIENCE, informer.wait_for_sync()).await.expect("synced");
        let indexer = informer.indexer();
        tokio::time::timeout(PATIENCE, async {
            while indexer.len() != 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("relist applied");
        let cm0 = indexer.get("ns/cm-0").expect("cm-0");
        assert_eq!(cm0.resource_version(), "26");
        let v: serde_json::Value = cm0.parse().expect("json");
        assert_eq!((v["apiVersion"].as_str(), v["kind"].as_str()), (Some("v1"), Some("ConfigMap")));
        tokio::time::timeout(PATIENCE, async {
            while deletes.0.lock().len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("tombstones delivered");
        let mut seen = deletes.0.lock().clone();
        seen.sort();
        assert_eq!(seen, [("ns/cm-2".to_string(), true), ("ns/cm-3".to_string(), true)]);
        informer.stop();
    }
}
