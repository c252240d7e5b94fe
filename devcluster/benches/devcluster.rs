//! Dev cluster benchmark (harness = false): store writes/s, HTTP writes/s, watch events/s
//! delivered to 1 and 16 watchers (replayed from history and live) with ~2 KB objects, and
//! memory per stored object.
//!
//! `cargo bench -p wasmctrl-devcluster` (sizes: `BENCH_OBJECTS`, default 20000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use wasmctrl_devcluster::resources::GroupResource;
use wasmctrl_devcluster::store::{Store, Subresource, WriteOpts};
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

fn configmaps() -> GroupResource {
    GroupResource { group: String::new(), resource: "configmaps".into() }
}

/// A ConfigMap of about 2 KB of JSON.
fn object(name: &str, rev: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "backend"}},
        "data": {"payload": "x".repeat(1800), "rev": rev.to_string()},
    })
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// Store-level creates then updates; returns (creates/s, updates/s).
fn store_writes(store: &Store, n: usize) -> (f64, f64) {
    let gr = configmaps();
    let opts = WriteOpts::default();
    let t = Instant::now();
    for i in 0..n {
        store.create(&gr, "default", object(&format!("cm-{i}"), 0), &opts).expect("create");
    }
    let creates = rate(n, t.elapsed());
    let t = Instant::now();
    for i in 0..n {
        let name = format!("cm-{i}");
        store
            .modify(&gr, "default", &name, Subresource::Main, &opts, false, |cur, _| {
                let mut v = cur.unwrap_or_default();
                v["data"]["rev"] = json!("1");
                Ok(v)
            })
            .expect("update");
    }
    (creates, rate(n, t.elapsed()))
}

/// Reads a watch stream until `events` newline-delimited events arrived.
async fn watch_count(
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    url: String,
    token: String,
    events: usize,
) -> usize {
    let req = http::Request::get(url)
        .header("Authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .expect("request");
    let resp = client.request(req).await.expect("watch response");
    let mut body = resp.into_body();
    let mut seen = 0;
    while seen < events {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    seen += data.iter().filter(|b| **b == b'\n').count();
                }
            }
            _ => break,
        }
    }
    seen
}

async fn watchers(cluster: &DevCluster, from_rv: u64, watchers: usize, events: usize) -> Duration {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let url = format!(
        "{}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={from_rv}&timeoutSeconds=600",
        cluster.url()
    );
    let t = Instant::now();
    let tasks: Vec<_> = (0..watchers)
        .map(|_| tokio::spawn(watch_count(client.clone(), url.clone(), cluster.token().to_string(), events)))
        .collect();
    for task in tasks {
        let got = task.await.expect("watcher");
        assert!(got >= events, "watcher got {got} of {events}");
    }
    t.elapsed()
}

async fn http_writes(cluster: &DevCluster, n: usize, concurrency: usize) -> f64 {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("{}/api/v1/namespaces/default/configmaps", cluster.url());
    let t = Instant::now();
    let per = n / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let client = client.clone();
            let url = url.clone();
            let token = cluster.token().to_string();
            tokio::spawn(async move {
                for i in 0..per {
                    let body = serde_json::to_vec(&object(&format!("http-{w}-{i}"), 0)).expect("encode");
                    let req = http::Request::post(&url)
                        .header("Authorization", format!("Bearer {token}"))
                        .header("Content-Type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .expect("request");
                    let resp = client.request(req).await.expect("response");
                    assert_eq!(resp.status(), 201);
                    let _ = resp.into_body().collect().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer");
    }
    rate(per * concurrency, t.elapsed())
}

fn main() {
    let n: usize = std::env::var("BENCH_OBJECTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        // Memory per stored object with (almost) no history: a cluster keeping 1 event.
        {
            let small = DevCluster::start(DevClusterConfig {
                tls: false,
                history_size: 1,
                ..Default::default()
            })
            .await
            .expect("start");
            let rss0 = rss_bytes();
            let gr = configmaps();
            for i in 0..n {
                small
                    .store()
                    .create(&gr, "default", object(&format!("m-{i}"), 0), &WriteOpts::default())
                    .expect("create");
            }
            let rss1 = rss_bytes();
            println!(
                "memory: {:.0} bytes RSS per stored object without history ({n} objects)",
                rss1.saturating_sub(rss0) as f64 / n as f64
            );
            small.shutdown().await;
        }
        let cluster = DevCluster::start(DevClusterConfig {
            tls: false,
            history_size: 4 * n + 16,
            ..Default::default()
        })
        .await
        .expect("start");
        let store: Arc<Store> = cluster.store().clone();
        let object_json = serde_json::to_vec(&object("cm-00000", 0)).expect("encode").len();

        let rss0 = rss_bytes();
        let start_rv = store.current_rv();
        let (creates, updates) = store_writes(&store, n);
        let rss1 = rss_bytes();
        println!("object size: {object_json} bytes of JSON; {n} objects");
        println!("store writes: {creates:.0} creates/s, {updates:.0} updates/s (in-process, 1 writer)");
        println!(
            "memory: {:.0} bytes RSS per stored object incl. 2 history events ({:.1} MiB for {n})",
            (rss1.saturating_sub(rss0)) as f64 / n as f64,
            (rss1.saturating_sub(rss0)) as f64 / (1 << 20) as f64
        );

        // Replay: 2n events (creates + updates) in history, streamed to 1 and 16 watchers.
        let events = 2 * n;
        for w in [1, 16] {
            let d = watchers(&cluster, start_rv, w, events).await;
            println!(
                "watch replay: {w:>2} watcher(s): {:.0} events/s per watcher, {:.0} events/s total",
                rate(events, d),
                rate(events * w, d)
            );
        }

        // Live: watchers registered at the current RV while one in-process writer updates.
        for w in [1, 16] {
            let from = store.current_rv();
            let cluster_ref = &cluster;
            let watch = watchers(cluster_ref, from, w, n);
            let store2 = store.clone();
            let writer = tokio::task::spawn_blocking(move || {
                std::thread::sleep(Duration::from_millis(200));
                let gr = configmaps();
                for i in 0..n {
                    store2
                        .modify(&gr, "default", &format!("cm-{i}"), Subresource::Main, &WriteOpts::default(), false, |cur, _| {
                            let mut v = cur.unwrap_or_default();
                            v["data"]["rev"] = json!(format!("live-{w}"));
                            Ok(v)
                        })
                        .expect("update");
                }
            });
            let d = watch.await;
            writer.await.expect("writer");
            let d = d.saturating_sub(Duration::from_millis(200));
            println!(
                "watch live:   {w:>2} watcher(s): {:.0} events/s per watcher, {:.0} events/s total (bounded by the writer)",
                rate(n, d),
                rate(n * w, d)
            );
        }

        let http = http_writes(&cluster, n / 4, 8).await;
        println!("HTTP creates: {http:.0} writes/s (8 concurrent clients, plain HTTP/1.1)");
        cluster.shutdown().await;
    });
}
