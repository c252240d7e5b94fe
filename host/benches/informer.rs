//! Informer pipeline benchmark (harness-free; `cargo bench -p wasmctrl --bench informer`).
//!
//! Throughput: an in-process fake API server (axum on loopback) answers an empty list and
//! then streams N watch ADDED events of ~2 KB ConfigMaps. The same bytes go through
//!   1. wasmctrl: Reflector → DeltaFIFO → Indexer → one listener (events/s at the handler);
//!   2. kube-runtime: `watcher` + `reflector` into a `Store<DynamicObject>` (events/s at the
//!      stream consumer);
//!   3. plain `serde_json::from_slice::<serde_json::Value>` of each event line (the parse limit).
//!
//! Memory: a counting global allocator measures the heap growth of caching M objects (the JSON
//! buffers are allocated before measuring) in wasmctrl's `Indexer` and in kube-rs's `Store`.
//!
//! Sizes: `BENCH_EVENTS` (default 20000), `BENCH_OBJECTS` (default 100000), `BENCH_ROUNDS`
//! (default 3; the best round is reported).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource as KubeApiResource;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use wasmctrl::informer::{InformerOptions, ResourceEventHandler, SharedIndexInformer};
use wasmctrl::object::{DeletedObject, Object, Transform};
use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
            ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A ~2 KB ConfigMap as the API server would send it.
fn configmap_json(i: usize) -> String {
    let payload: String = (0..1500).map(|j| (b'a' + ((i + j) % 26) as u8) as char).collect();
    format!(
        concat!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","namespace":"ns-{ns}","#,
            r#""uid":"6f1d{i:08}-aaaa-bbbb-cccc-0123456789ab","resourceVersion":"{rv}","#,
            r#""creationTimestamp":"2026-11-22T18:30:00Z","labels":{{"app":"bench","tier":"t{t}"}},"#,
            r#""annotations":{{"example.com/owner":"team-{t}","example.com/note":"a short note about object {i}"}}}},"#,
            r#""data":{{"payload":"{payload}","small":"value-{i}","config.yaml":"key: value\nother: {i}\n"}}}}"#
        ),
        i = i,
        ns = i % 10,
        rv = 100 + i,
        t = i % 4,
        payload = payload
    )
}

fn watch_stream(objects: &[String]) -> Bytes {
    let mut out = Vec::with_capacity(objects.iter().map(|o| o.len() + 32).sum());
    for o in objects {
        out.extend_from_slice(br#"{"type":"ADDED","object":"#);
        out.extend_from_slice(o.as_bytes());
        out.extend_from_slice(b"}\n");
    }
    Bytes::from(out)
}

/// Serves an empty list, then the whole stream on the first watch; later watches hang.
async fn fake_server(stream: Bytes) -> (String, tokio::task::JoinHandle<()>) {
    use axum::body::Body;
    use axum::extract::RawQuery;
    use axum::response::Response;
    let served = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/api/v1/configmaps",
        axum::routing::get(move |RawQuery(q): RawQuery| {
            let stream = stream.clone();
            let served = served.clone();
            async move {
                let q = q.unwrap_or_default();
                let body = if !q.contains("watch=true") {
                    Body::from(r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#)
                } else if served.fetch_add(1, Ordering::SeqCst) == 0 {
                    // Chunked like a real server: 64 KiB frames.
                    let chunks: Vec<Result<Bytes, std::io::Error>> =
                        (0..stream.len()).step_by(64 * 1024).map(|s| Ok(stream.slice(s..(s + 64 * 1024).min(stream.len())))).collect();
                    Body::from_stream(futures::stream::iter(chunks))
                } else {
                    Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
                };
                Response::builder().header("content-type", "application/json").body(body).expect("response")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

fn client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

struct CountingHandler {
    seen: AtomicUsize,
    target: usize,
    done: tokio::sync::Notify,
}

impl ResourceEventHandler for CountingHandler {
    fn on_add(&self, obj: &Arc<Object>, _: bool) {
        std::hint::black_box(obj.key());
        if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.done.notify_one();
        }
    }
    fn on_update(&self, _: &Arc<Object>, _: &Arc<Object>) {}
    fn on_delete(&self, _: &DeletedObject) {}
}

async fn run_wasmctrl(stream: Bytes, n: usize) -> Duration {
    let (url, server) = fake_server(stream).await;
    let informer = SharedIndexInformer::new(InformerOptions { name: "bench".into(), ..Default::default() })
        .expect("informer");
    let handler =
        Arc::new(CountingHandler { seen: AtomicUsize::new(0), target: n, done: Default::default() });
    informer.add_event_handler(handler.clone(), None);
    let resource = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    let start = Instant::now();
    informer.start(Reflector::new(client(&url), resource, ReflectorConfig::default()));
    handler.done.notified().await;
    let took = start.elapsed();
    assert_eq!(informer.indexer().len(), n);
    informer.stop();
    server.abort();
    took
}

async fn run_kube(stream: Bytes, n: usize) -> Duration {
    let (url, server) = fake_server(stream).await;
    let ar = KubeApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let api: Api<DynamicObject> = Api::all_with(client(&url), &ar);
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let start = Instant::now();
    let mut events =
        std::pin::pin!(reflector(writer, watcher(api, watcher::Config::default())).applied_objects());
    let mut seen = 0;
    while let Some(ev) = events.next().await {
        let obj = ev.expect("event");
        std::hint::black_box(&obj.metadata.name);
        seen += 1;
        if seen == n {
            break;
        }
    }
    let took = start.elapsed();
    assert_eq!(store.state().len(), n);
    server.abort();
    took
}

fn run_raw(stream: &Bytes, n: usize) -> Duration {
    let start = Instant::now();
    let mut count = 0;
    for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).expect("json");
        std::hint::black_box(&v);
        count += 1;
    }
    assert_eq!(count, n);
    start.elapsed()
}

fn memory(m: usize) {
    let jsons: Vec<Bytes> = (0..m).map(|i| Bytes::from(configmap_json(i))).collect();
    let json_bytes: usize = jsons.iter().map(|j| j.len()).sum();
    let per_json = json_bytes as f64 / m as f64;

    let before = ALLOCATED.load(Ordering::SeqCst);
    let indexer = wasmctrl::cache::Indexer::new();
    for j in &jsons {
        let obj = Object::from_api_json(j, None, Transform::default()).expect("object");
        indexer.upsert(Arc::new(obj));
    }
    let ours = ALLOCATED.load(Ordering::SeqCst) - before;
    assert_eq!(indexer.len(), m);
    drop(indexer);

    let before = ALLOCATED.load(Ordering::SeqCst);
    let ar = KubeApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let mut writer = reflector::store::Writer::<DynamicObject>::new(ar);
    let store = writer.as_reader();
    for j in &jsons {
        let obj: DynamicObject = serde_json::from_slice(j).expect("dynamic object");
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    let kube = ALLOCATED.load(Ordering::SeqCst) - before;
    assert_eq!(store.state().len(), m);
    drop((store, writer));

    println!("memory ({m} objects, {per_json:.0} B of JSON each):");
    println!(
        "  wasmctrl Indexer : {:>8.0} B/object = {:.2}x JSON",
        ours as f64 / m as f64,
        ours as f64 / json_bytes as f64
    );
    println!(
        "  kube-rs Store    : {:>8.0} B/object = {:.2}x JSON",
        kube as f64 / m as f64,
        kube as f64 / json_bytes as f64
    );
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let n = env_usize("BENCH_EVENTS", 20_000);
    let m = env_usize("BENCH_OBJECTS", 100_000);
    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let objects: Vec<String> = (0..n).map(configmap_json).collect();
    let stream = watch_stream(&objects);
    drop(objects);
    println!("informer pipeline: {n} watch events, {} B of JSON per event", stream.len() / n);

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let best = |f: &mut dyn FnMut() -> Duration| (0..rounds).map(|_| f()).min().unwrap_or_default();

    let ours = best(&mut || rt.block_on(run_wasmctrl(stream.clone(), n)));
    let kube = best(&mut || rt.block_on(run_kube(stream.clone(), n)));
    let raw = best(&mut || run_raw(&stream, n));
    println!("  wasmctrl reflector→fifo→indexer→listener : {:>9.0} events/s", rate(ours));
    println!("  kube-runtime watcher+reflector (Dynamic)  : {:>9.0} events/s", rate(kube));
    println!("  serde_json::from_slice::<Value> only      : {:>9.0} events/s", rate(raw));
    println!(
        "  wasmctrl / kube-rs = {:.2}x; wasmctrl / raw parse = {:.0}%",
        rate(ours) / rate(kube),
        100.0 * rate(ours) / rate(raw)
    );
    drop(rt);
    memory(m);
}
