//! Informer pipeline benchmark (harness-free; `cargo bench -p wasmctrl --bench informer`).
//!
//! Throughput: the benchmarks' stream server (`wasmctrl_bench_support`, on its own thread,
//! HTTP on loopback) lists N ~2 KB ConfigMaps, then streams U watch updates flat out. The
//! same bytes go through
//!   1. wasmctrl: Reflector → DeltaFIFO → Indexer → one listener (events/s at the handler);
//!   2. kube-runtime: `watcher` + `reflector` into a `Store<DynamicObject>` (events/s at the
//!      stream consumer);
//!   3. plain `serde_json::from_slice::<serde_json::Value>` of each event line (the parse limit).
//!
//! Watch events/s = updates seen / time from the last listed object to the last update.
//! `cargo bench --bench anchors` runs the same comparison out of process, next to client-go.
//!
//! Memory: a counting global allocator measures the heap growth of caching M objects (the JSON
//! buffers are allocated before measuring) in wasmctrl's `Indexer` and in kube-rs's `Store`.
//! It counts requested bytes over the `wasmctrl` binary's allocator (jemalloc with the default
//! `jemalloc` feature; `BENCH_ALLOCATOR=system` runs on glibc's malloc, `mimalloc` on mimalloc),
//! which serves both consumers.
//!
//! What each does per event: wasmctrl decodes the metadata and keeps the object's bytes
//! (lazy); kube-runtime here builds a `DynamicObject` (typed metadata, the rest as a
//! `serde_json::Value`); the bare parse builds a whole `Value`. The anchors benchmark has the
//! full typed decoders and Go beside them.
//!
//! Sizes: `BENCH_OBJECTS` (default 20000), `BENCH_UPDATES` (default 200000),
//! `BENCH_CACHE_OBJECTS` (default 100000), `BENCH_ROUNDS` (default 3; the median and the spread
//! (min–max) of the rounds are reported). `BENCH_ONLY=wasmctrl` runs wasmctrl's pipeline
//! alone (for a profiler).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource as KubeApiResource;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use wasmctrl::informer::{InformerOptions, ResourceEventHandler, SharedIndexInformer};
use wasmctrl::object::{DeletedObject, Object, Transform};
use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};
use wasmctrl_bench_support::{
    Allocator, BackgroundServer, Corpus, CountingAllocator, Figure, Pace, Rounds, SEQ_ANNOTATION,
    StreamConfig, StreamProgress, Table, allocated, rounds_from_env, unix_nanos,
};

#[global_allocator]
static GLOBAL: CountingAllocator =
    CountingAllocator::new(if cfg!(feature = "jemalloc") { Allocator::Jemalloc } else { Allocator::System });

/// The `wasmctrl` binary's jemalloc options, so that jemalloc here behaves as it does there.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const TIMEOUT: Duration = Duration::from_secs(300);

fn server(objects: usize, updates: u64) -> BackgroundServer {
    BackgroundServer::start(StreamConfig { objects, updates, pace: Pace::Flat, expire_first_watch: None })
        .expect("stream server")
}

fn client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

struct CountingHandler(Arc<StreamProgress>);

impl ResourceEventHandler for CountingHandler {
    fn on_add(&self, obj: &Arc<Object>, _: bool) {
        std::hint::black_box(obj.key());
        self.0.added();
    }
    fn on_update(&self, _: &Arc<Object>, new: &Arc<Object>) {
        self.0.updated(new.annotation(SEQ_ANNOTATION));
    }
    fn on_delete(&self, _: &DeletedObject) {}
}

/// Watch events/s through wasmctrl's informer.
async fn run_wasmctrl(objects: usize, updates: u64) -> f64 {
    let server = server(objects, updates);
    let informer = SharedIndexInformer::new(InformerOptions { name: "bench".into(), ..Default::default() })
        .expect("informer");
    let progress = Arc::new(StreamProgress::new(objects, updates));
    informer.add_event_handler(Arc::new(CountingHandler(progress.clone())), None);
    let resource = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    informer.start(Reflector::new(client(server.url()), resource, ReflectorConfig::default()));
    progress.wait(TIMEOUT).await.expect("stream consumed");
    assert_eq!(informer.indexer().len(), objects);
    informer.stop();
    progress.figures().expect("figures").events_per_sec()
}

/// Watch events/s through kube-runtime's watcher + reflector.
async fn run_kube(objects: usize, updates: u64) -> f64 {
    let server = server(objects, updates);
    let ar = KubeApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let api: Api<DynamicObject> = Api::all_with(client(server.url()), &ar);
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let store = writer.as_reader();
    let progress = StreamProgress::new(objects, updates);
    let mut events =
        std::pin::pin!(reflector(writer, watcher(api, watcher::Config::default())).applied_objects());
    while let Some(ev) = events.next().await {
        let obj = ev.expect("event");
        if progress.adds() < objects {
            progress.added();
        } else {
            progress.updated(
                obj.metadata.annotations.as_ref().and_then(|a| a.get(SEQ_ANNOTATION)).map(String::as_str),
            );
            if progress.is_done() {
                break;
            }
        }
    }
    assert_eq!(store.state().len(), objects);
    progress.figures().expect("figures").events_per_sec()
}

/// Event lines/s through a bare `serde_json` parse.
fn run_raw(corpus: &Corpus, lines: u64) -> f64 {
    let mut stream = Vec::new();
    for u in 0..lines {
        corpus.write_update_event(&mut stream, u, unix_nanos());
    }
    let start = Instant::now();
    let mut count = 0;
    for line in stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).expect("json");
        std::hint::black_box(&v);
        count += 1;
    }
    assert_eq!(count, lines);
    count as f64 / start.elapsed().as_secs_f64()
}

fn memory(m: usize) {
    let corpus = Corpus::new(m);
    let jsons: Vec<Bytes> = (0..m)
        .map(|i| {
            let mut json = Vec::new();
            corpus.write_listed(&mut json, i, unix_nanos());
            Bytes::from(json)
        })
        .collect();
    drop(corpus);
    let json_bytes: usize = jsons.iter().map(|j| j.len()).sum();
    let per_json = json_bytes as f64 / m as f64;

    let before = allocated();
    let writer = wasmctrl::cache::Writer::new();
    for j in &jsons {
        let obj = Object::from_api_json(j, None, Transform::default()).expect("object");
        writer.upsert(Arc::new(obj));
    }
    let ours = allocated() - before;
    assert_eq!(writer.reader().len(), m);
    drop(writer);

    let before = allocated();
    let ar = KubeApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
    let mut writer = reflector::store::Writer::<DynamicObject>::new(ar);
    let store = writer.as_reader();
    for j in &jsons {
        let obj: DynamicObject = serde_json::from_slice(j).expect("dynamic object");
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    let kube = allocated() - before;
    assert_eq!(store.state().len(), m);
    drop((store, writer));

    let mut table = Table::new(
        "informer",
        format!(
            "Cache memory: {m} objects of {per_json:.0} B of JSON each, heap growth (counting allocator)"
        ),
        &["store", "what it keeps", "bytes per object", "× the JSON"],
    );
    for (store, keeps, bytes) in [
        ("wasmctrl Indexer", "the JSON bytes and decoded metadata", ours),
        ("kube-rs Store<DynamicObject>", "typed metadata, the rest as serde_json::Value", kube),
    ] {
        table.row(vec![
            store.into(),
            keeps.into(),
            format!("{:.0}", bytes as f64 / m as f64),
            format!("{:.2}", bytes as f64 / json_bytes as f64),
        ]);
    }
    table.print_and_record();
    Figure::lower(
        "informer",
        format!("cache bytes per object (JSON {per_json:.0} B)"),
        ours as f64 / m as f64,
        "B",
    )
    .against("kube-rs", kube as f64 / m as f64)
    .target(1.2 * per_json)
    .record();
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let objects = env_usize("BENCH_OBJECTS", 20_000).max(1);
    let updates = env_usize("BENCH_UPDATES", 200_000).max(1) as u64;
    let m = env_usize("BENCH_CACHE_OBJECTS", 100_000);
    let rounds = rounds_from_env();
    let corpus = Corpus::new(objects);
    println!(
        "informer pipeline: {objects} ConfigMaps listed ({:.0} B of JSON each), then {updates} watch updates",
        corpus.json_bytes_per_object()
    );

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let rounds_of = |f: &mut dyn FnMut() -> f64| Rounds::new((0..rounds).map(|_| f()));

    let ours = rounds_of(&mut || rt.block_on(run_wasmctrl(objects, updates)));
    if std::env::var("BENCH_ONLY").is_ok_and(|o| o == "wasmctrl") {
        // For profilers: wasmctrl's pipeline alone, nothing compared or recorded.
        println!("  wasmctrl reflector→fifo→indexer→listener : {} events/s", ours.display());
        return;
    }
    let kube = rounds_of(&mut || rt.block_on(run_kube(objects, updates)));
    let raw_lines = updates.min(20_000);
    let raw = rounds_of(&mut || run_raw(&corpus, raw_lines));
    let mut table = Table::new(
        "informer",
        format!(
            "Informer pipeline in one process: {objects} ConfigMaps listed, then {updates} updates flat out; events/s, median (min–max) of {rounds} rounds"
        ),
        &["pipeline", "work per event", "events/s"],
    );
    table.row(vec![
        "wasmctrl reflector → DeltaFIFO → indexer → listener".into(),
        "lazy: metadata decoded, object bytes kept".into(),
        ours.display(),
    ]);
    table.row(vec![
        "kube-runtime watcher + reflector (DynamicObject)".into(),
        "typed metadata, the rest a serde_json::Value".into(),
        kube.display(),
    ]);
    table.row(vec![
        format!("serde_json::from_slice::<Value>, {raw_lines} lines in memory"),
        "untyped: every field built, no HTTP, no store".into(),
        raw.display(),
    ]);
    table.note("The stream server runs on a thread of the same process; the runtime has two workers.");
    table.print_and_record();
    Figure::higher("informer", "watch events/s (in process)", ours.median(), "events/s")
        .against("kube-rs DynamicObject", kube.median())
        .against("bare serde_json::Value parse", raw.median())
        .target(200_000.0)
        .record();
    drop(rt);
    drop(corpus);
    memory(m);
}
