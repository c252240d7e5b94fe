//! wasmctrl next to kube-rs, client-go and controller-runtime on one generated stream
//! (harness-free; `cargo bench -p wasmctrl --bench anchors`, or `cargo xtask bench anchors`).
//!
//! One table with ratios:
//! - informer watch events/s and cache bytes per object: wasmctrl's SharedIndexInformer,
//!   kube-rs's `watcher` + `reflector` (typed `ConfigMap`), client-go's SharedIndexInformer
//!   (`bench/anchors/informer`);
//! - event → reconcile-start latency p50 / p99 at 5,000, 20,000 and 50,000 updates/s: wasmctrl's
//!   controller with a no-op Wasm plugin, kube-rs's `Controller`, controller-runtime
//!   (`bench/anchors/controller`); each with a no-op reconcile, concurrency 1.
//!
//! Every run is three processes: a stream server (this binary, `serve`; see
//! `wasmctrl_bench_support`) listing `BENCH_OBJECTS` ~2 KB ConfigMaps and then streaming
//! `BENCH_UPDATES` updates (flat out for the informers; paced at each rate for
//! `BENCH_SECONDS` per rate after a 1 s warm-up for the controllers), and one consumer (this
//! binary, `consume ...`, or a Go program) that prints one JSON line. The Go programs are
//! built here with the Go toolchain (module cache and build cache in Go's defaults, outside
//! the repository); without `go` their column says so. The no-op plugin is the `panic` test
//! plugin, whose reconcile of any request but `misbehave` returns `Done` at once (built by
//! `cargo xtask build-guests`).
//!
//! Measured the same way by every consumer:
//! - events/s: updates seen by an event handler (a stream consumer for kube-rs) divided by
//!   the time from the last listed object seen to the last update seen;
//! - cache bytes per object: heap after the stream minus heap before the client was made,
//!   divided by the objects (a counting allocator over the `wasmctrl` binary's allocator here,
//!   `BENCH_ALLOCATOR=system` for glibc's; Go's live heap after a GC there);
//! - latency: at reconcile start, now − the `sent` stamp of the object in the cache, over the
//!   updates after the first tenth; percentile q = the sorted samples' ⌊(n − 1)·q⌋-th;
//! - beside each controller run, the machine's own stalls: a thread of this (waiting) harness
//!   sleeps 1 ms at a time and records how late it wakes ([`SleepProbe`]); printed under the
//!   table for wasmctrl's runs, since the p99 rows move with them from one machine to another.
//!
//! What each informer does per watch event, on the same JSON stream (no consumer asks for
//! protobuf; the stream server speaks JSON only), with the same handler work (count the
//! update and read its sequence annotation):
//! - wasmctrl: splits the event envelope, parses the object's metadata (name, namespace,
//!   resourceVersion, labels, annotations, owner references) and keeps the object's JSON
//!   bytes as received (plugins are handed those bytes); `data` is validated, not built;
//!   then the DeltaFIFO, the indexer (namespace index) and the handler's listener;
//! - kube-rs: deserializes the event and the whole typed `ConfigMap` (serde), then the
//!   reflector's store;
//! - client-go: a typed `ConfigMap` SharedIndexInformer as its users write one (factory,
//!   no resync, default rate limits — which apply to requests, and there are two: the list
//!   and the watch). Its JSON watch path reads each event's bytes five times: the stream
//!   framer, `encoding/json`'s validation and skip of the envelope (the object is kept as a
//!   `RawExtension`), then `sigs.k8s.io/json`'s validation and typed decode of the object;
//!   a CPU profile (`-cpuprofile` on `bench/anchors/informer`) puts ~75% of its time there.
//!
//! Sizes: `BENCH_OBJECTS` (20000), `BENCH_UPDATES` (200000), `BENCH_RATES` ("5000,20000,50000"),
//! `BENCH_SECONDS` (6), `BENCH_ROUNDS` (1; the best informer round is kept).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wasmctrl::cache::Indexer;
use wasmctrl::controller::{Action, Controller, InformerSource, ReconcileError, Reconciler, Request};
use wasmctrl::informer::{
    FactoryOptions, InformerFactory, InformerOptions, InformerSpec, ResourceEventHandler, SharedIndexInformer,
};
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::plugin::{
    CacheReader, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginReconciler, PluginSpec,
};
use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};
use wasmctrl_bench_support::latency::{self, Sample};
use wasmctrl_bench_support::{
    Allocator, BackgroundServer, CountingAllocator, Figure, Pace, SEQ_ANNOTATION, StreamConfig,
    StreamProgress, allocated, unix_nanos,
};

#[global_allocator]
static GLOBAL: CountingAllocator =
    CountingAllocator::new(if cfg!(feature = "jemalloc") { Allocator::Jemalloc } else { Allocator::System });

/// The `wasmctrl` binary's jemalloc options, so that jemalloc here behaves as it does there.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `--name value` from the arguments.
fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn flag_u64(args: &[String], name: &str) -> Result<u64, Error> {
    let v = flag(args, name).ok_or_else(|| format!("missing {name}"))?;
    v.parse().map_err(|e| format!("{name} {v}: {e}").into())
}

fn main() {
    // `cargo bench` passes `--bench`.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let outcome = match args.first().map(String::as_str) {
        Some("serve") => serve(&args),
        Some("consume") => consume(&args),
        _ => orchestrate(),
    };
    if let Err(e) = outcome {
        // A consumer reports its failure as a JSON line for the harness to show.
        println!("{}", json!({ "error": e.to_string() }));
        std::process::exit(1);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

// ---------------------------------------------------------------------------------------------
// The stream server process

/// Serves until standard input closes (so it never outlives the harness).
fn serve(args: &[String]) -> Result<(), Error> {
    let objects = usize::try_from(flag_u64(args, "--objects")?)?;
    let updates = flag_u64(args, "--updates")?;
    let pace = match flag(args, "--rate") {
        Some(r) => Pace::PerSecond {
            rate: r.parse()?,
            warmup: Duration::from_millis(flag_u64(args, "--warmup-ms").unwrap_or(1000)),
        },
        None => Pace::Flat,
    };
    // One thread: the other core is the consumer's.
    let server = BackgroundServer::start(StreamConfig { objects, updates, pace, expire_first_watch: None })?;
    println!("{}", json!({ "url": server.url(), "json_bytes_per_object": server.json_bytes_per_object() }));
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The Rust consumers

fn consume(args: &[String]) -> Result<(), Error> {
    let what = (args.get(1).map(String::as_str), args.get(2).map(String::as_str));
    let url = flag(args, "--url").ok_or("missing --url")?;
    let objects = usize::try_from(flag_u64(args, "--objects")?)?;
    let updates = flag_u64(args, "--updates")?;
    let timeout = Duration::from_secs(flag_u64(args, "--timeout-s").unwrap_or(300));
    let rt = runtime()?;
    let result = match what {
        (Some("informer"), Some("wasmctrl")) => {
            rt.block_on(informer_wasmctrl(&url, objects, updates, timeout))?
        }
        (Some("informer"), Some("kube-rs")) => rt.block_on(informer_kube(&url, objects, updates, timeout))?,
        (Some("controller"), Some(which)) => {
            let samples = match which {
                "wasmctrl" => {
                    let plugin = PathBuf::from(flag(args, "--plugin").ok_or("missing --plugin")?);
                    rt.block_on(controller_wasmctrl(&url, &plugin, updates, timeout))?
                }
                "kube-rs" => rt.block_on(controller_kube(&url, updates, timeout))?,
                other => return Err(format!("unknown controller {other}").into()),
            };
            let p = latency::percentiles(&samples, updates / 10)
                .ok_or("no reconcile of an update after the first tenth")?;
            let ms = |n: u64| n as f64 / 1e6;
            json!({ "kind": "latency", "reconciles": samples.len(), "samples": p.count,
                    "p50_ms": ms(p.p50), "p99_ms": ms(p.p99), "max_ms": ms(p.max) })
        }
        _ => return Err("usage: consume <informer|controller> <wasmctrl|kube-rs> --url URL ...".into()),
    };
    rt.shutdown_timeout(Duration::from_secs(1));
    println!("{result}");
    Ok(())
}

fn client(url: &str) -> Result<kube::Client, Error> {
    Ok(kube::Client::try_from(kube::Config::new(url.parse()?))?)
}

/// The JSON line of an informer consumer.
fn informer_result(
    implementation: &str,
    progress: &StreamProgress,
    objects: usize,
    heap_before: usize,
    cached: usize,
) -> Result<Value, Error> {
    let f = progress.figures()?;
    Ok(json!({
        "impl": implementation,
        "kind": "informer",
        "objects": objects,
        "cached": cached,
        "updates_seen": f.updates_seen,
        "list_seconds": f.list.as_secs_f64(),
        "watch_seconds": f.watch.as_secs_f64(),
        "events_per_sec": f.events_per_sec(),
        "cache_bytes_per_object": (allocated() as f64 - heap_before as f64) / objects as f64,
    }))
}

struct CountingHandler(Arc<StreamProgress>);

impl ResourceEventHandler for CountingHandler {
    fn on_add(&self, _: &Arc<Object>, _: bool) {
        self.0.added();
    }
    fn on_update(&self, _: &Arc<Object>, new: &Arc<Object>) {
        self.0.updated(new.annotation(SEQ_ANNOTATION));
    }
    fn on_delete(&self, _: &DeletedObject) {}
}

async fn informer_wasmctrl(
    url: &str,
    objects: usize,
    updates: u64,
    timeout: Duration,
) -> Result<Value, Error> {
    let before = allocated();
    let progress = Arc::new(StreamProgress::new(objects, updates));
    let informer = SharedIndexInformer::new(InformerOptions { name: "bench".into(), ..Default::default() })?;
    informer.add_event_handler(Arc::new(CountingHandler(progress.clone())), None);
    let resource = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    informer.start(Reflector::new(client(url)?, resource, ReflectorConfig::default()));
    progress.wait(timeout).await?;
    let result = informer_result("wasmctrl", &progress, objects, before, informer.indexer().len());
    informer.stop();
    result
}

async fn informer_kube(url: &str, objects: usize, updates: u64, timeout: Duration) -> Result<Value, Error> {
    let before = allocated();
    let progress = StreamProgress::new(objects, updates);
    let api: Api<ConfigMap> = Api::all(client(url)?);
    let writer = reflector::store::Writer::<ConfigMap>::default();
    let store = writer.as_reader();
    let consume = async {
        let mut events =
            std::pin::pin!(reflector(writer, watcher(api, watcher::Config::default())).applied_objects());
        let mut listed = 0;
        while let Some(event) = events.next().await {
            let cm = event?;
            if listed < objects {
                listed += 1;
                progress.added();
            } else {
                let seq = cm.metadata.annotations.as_ref().and_then(|a| a.get(SEQ_ANNOTATION));
                progress.updated(seq.map(String::as_str));
                if progress.is_done() {
                    return Ok::<_, Error>(());
                }
            }
        }
        Err("the watch stream ended".into())
    };
    tokio::time::timeout(timeout, consume).await.map_err(|_| format!("timed out after {timeout:?}"))??;
    informer_result("kube-rs", &progress, objects, before, store.state().len())
}

/// Takes a latency sample at the start of each reconcile, then hands the request on.
struct Stamping {
    inner: Arc<dyn Reconciler>,
    cache: Indexer,
    last_seq: u64,
    samples: parking_lot::Mutex<Vec<Sample>>,
    done: tokio::sync::Notify,
}

impl Reconciler for Stamping {
    fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>> {
        let now = unix_nanos();
        if let Some(obj) = self.cache.get_by_name(request.namespace.as_deref(), &request.name)
            && let Some(s) = latency::sample(|k| obj.annotation(k), now)
        {
            self.samples.lock().push(s);
            if s.seq == self.last_seq {
                self.done.notify_one();
            }
        }
        self.inner.reconcile(request)
    }
}

async fn controller_wasmctrl(
    url: &str,
    plugin: &Path,
    updates: u64,
    timeout: Duration,
) -> Result<Vec<Sample>, Error> {
    let wasm = std::fs::read(plugin).map_err(|e| format!("{}: {e}", plugin.display()))?;
    let factory = InformerFactory::new(client(url)?, FactoryOptions::default());
    let source = InformerSource::new(&factory, InformerSpec::new("v1", "ConfigMap")).await?;
    let cache = source.lease().indexer();
    let kind = Gvk::new("v1", "ConfigMap");
    let engine = PluginEngine::new(EngineConfig::default(), None)?;
    let env = PluginEnv {
        caches: [(kind.clone(), Arc::new(cache.clone()) as Arc<dyn CacheReader>)].into_iter().collect(),
        kube: None,
    };
    let plugin = Plugin::load(&engine, PluginSpec::new("noop", kind), &wasm, env)?;
    let stamping = Arc::new(Stamping {
        inner: PluginReconciler::new(plugin)?,
        cache,
        last_seq: updates.saturating_sub(1),
        samples: Default::default(),
        done: Default::default(),
    });
    let controller = Controller::builder("bench", stamping.clone())
        .for_source(source)
        .max_concurrent_reconciles(1)
        .build()?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (c, s) = (controller.clone(), shutdown.clone());
        async move { c.run(s).await }
    });
    let finished = tokio::time::timeout(timeout, stamping.done.notified()).await;
    shutdown.cancel();
    run.await??;
    factory.shutdown();
    let samples = std::mem::take(&mut *stamping.samples.lock());
    finished
        .map_err(|_| format!("timed out after {timeout:?} with {} reconciles of updates", samples.len()))?;
    Ok(samples)
}

struct KubeContext {
    last_seq: u64,
    samples: parking_lot::Mutex<Vec<Sample>>,
    done: tokio::sync::Notify,
}

async fn kube_reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<KubeContext>,
) -> Result<kube::runtime::controller::Action, std::convert::Infallible> {
    let now = unix_nanos();
    let annotations = cm.metadata.annotations.as_ref();
    if let Some(s) = latency::sample(|k| annotations.and_then(|a| a.get(k)).map(String::as_str), now) {
        ctx.samples.lock().push(s);
        if s.seq == ctx.last_seq {
            ctx.done.notify_one();
        }
    }
    Ok(kube::runtime::controller::Action::await_change())
}

async fn controller_kube(url: &str, updates: u64, timeout: Duration) -> Result<Vec<Sample>, Error> {
    use kube::runtime::controller::{Config, Controller as KubeController};
    let api: Api<ConfigMap> = Api::all(client(url)?);
    let ctx = Arc::new(KubeContext {
        last_seq: updates.saturating_sub(1),
        samples: Default::default(),
        done: Default::default(),
    });
    let run = KubeController::new(api, watcher::Config::default())
        .with_config(Config::default().concurrency(1))
        .run(
            kube_reconcile,
            |_, _: &std::convert::Infallible, _| kube::runtime::controller::Action::await_change(),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let finished = tokio::select! {
        _ = run => Err("the kube-rs controller stopped".to_string()),
        r = tokio::time::timeout(timeout, ctx.done.notified()) => r.map_err(|_| format!("timed out after {timeout:?}")),
    };
    let samples = std::mem::take(&mut *ctx.samples.lock());
    finished?;
    Ok(samples)
}

// ---------------------------------------------------------------------------------------------
// The harness

/// A stream server process; closing its standard input stops it.
struct ServerProcess {
    child: Child,
    url: String,
    json_bytes_per_object: f64,
}

impl ServerProcess {
    fn start(objects: usize, updates: u64, rate: Option<u32>) -> Result<Self, Error> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["serve", "--objects", &objects.to_string(), "--updates", &updates.to_string()]);
        if let Some(rate) = rate {
            cmd.args(["--rate", &rate.to_string()]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let ready: Value =
            serde_json::from_str(&line).map_err(|e| format!("stream server said {line:?}: {e}"))?;
        let url = ready["url"].as_str().ok_or_else(|| format!("stream server said {line:?}"))?.to_owned();
        Ok(ServerProcess {
            child,
            url,
            json_bytes_per_object: ready["json_bytes_per_object"].as_f64().unwrap_or(0.0),
        })
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one consumer against a fresh server; its last JSON line, or why there is none.
fn run_consumer(
    objects: usize,
    updates: u64,
    rate: Option<u32>,
    consumer: impl FnOnce(&str) -> Command,
) -> Result<(Value, f64), String> {
    let server = ServerProcess::start(objects, updates, rate).map_err(|e| format!("stream server: {e}"))?;
    let mut cmd = consumer(&server.url);
    let out = cmd.stderr(Stdio::inherit()).output().map_err(|e| format!("starting {cmd:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last =
        stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok().filter(Value::is_object));
    match last {
        Some(v) if v.get("error").is_some() => Err(v["error"].as_str().unwrap_or("error").to_owned()),
        Some(v) if out.status.success() => Ok((v, server.json_bytes_per_object)),
        _ => Err(format!("{:?} exited with {} and no result", cmd.get_program(), out.status)),
    }
}

/// The Go anchors, built, or why not.
struct GoAnchors {
    informer: PathBuf,
    controller: PathBuf,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn build_go_anchors() -> Result<GoAnchors, String> {
    if !Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        return Err("skipped: go not installed".into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/anchors-… → target/<profile>/anchors-go/
    let out = exe.parent().and_then(Path::parent).ok_or("no target directory")?.join("anchors-go");
    let dir = repo_root().join("bench/anchors");
    eprintln!("anchors: building the Go anchors in {} into {}", dir.display(), out.display());
    let built = Command::new("go")
        .current_dir(&dir)
        .args(["build", "-trimpath", "-o"])
        .arg(format!("{}/", out.display()))
        .args(["./informer", "./controller"])
        .output()
        .map_err(|e| format!("failed: go build: {e}"))?;
    if !built.status.success() {
        let err = String::from_utf8_lossy(&built.stderr);
        return Err(format!("failed: go build: {}", err.lines().last().unwrap_or("")));
    }
    Ok(GoAnchors { informer: out.join("informer"), controller: out.join("controller") })
}

fn noop_plugin() -> Result<PathBuf, String> {
    let path = repo_root().join("guests/target/wasm32-wasip2/release/test_plugin_panic.wasm");
    if path.exists() { Ok(path) } else { Err("skipped: run `cargo xtask build-guests`".into()) }
}

/// One cell: a figure or why it is missing.
type Cell = Result<f64, String>;

struct Row {
    label: String,
    higher_is_better: bool,
    cells: [Cell; 3],
    /// Issue 12's target for wasmctrl's figure, in the row's unit.
    target: Option<f64>,
}

impl Row {
    /// Records wasmctrl's figure next to the others for `cargo xtask bench`'s closing table.
    fn record(&self, unit: &str) {
        let Ok(ours) = self.cells[0] else { return };
        let figure = if self.higher_is_better {
            Figure::higher("anchors", &self.label, ours, unit)
        } else {
            Figure::lower("anchors", &self.label, ours, unit)
        };
        let mut figure = figure
            .against("kube-rs", self.cells[1].clone().unwrap_or(f64::NAN))
            .against("Go", self.cells[2].clone().unwrap_or(f64::NAN));
        if let Some(t) = self.target {
            figure = figure.target(t);
        }
        figure.record();
    }
}

fn self_consumer(args: &[String]) -> impl FnOnce(&str) -> Command {
    let args = args.to_vec();
    move |url| {
        let mut cmd = Command::new(std::env::current_exe().unwrap_or_else(|_| PathBuf::from("anchors")));
        cmd.arg("consume").args(&args).args(["--url", url]);
        cmd
    }
}

fn go_consumer(bin: &Path, args: &[String]) -> impl FnOnce(&str) -> Command {
    let (bin, args) = (bin.to_owned(), args.to_vec());
    move |url| {
        let mut cmd = Command::new(bin);
        cmd.args(&args).args(["-url", url]);
        cmd
    }
}

fn field(v: &Value, name: &str) -> Cell {
    v[name].as_f64().ok_or_else(|| format!("no {name} in {v}"))
}

fn orchestrate() -> Result<(), Error> {
    let objects = env_usize("BENCH_OBJECTS", 20_000);
    let updates = env_usize("BENCH_UPDATES", 200_000) as u64;
    let seconds = env_usize("BENCH_SECONDS", 6).max(1) as u64;
    let rounds = env_usize("BENCH_ROUNDS", 1).max(1);
    let rates: Vec<u32> = std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "5000,20000,50000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let go = build_go_anchors();
    let plugin = noop_plugin();
    let timeout = |run_seconds: u64| (run_seconds + 120).to_string();

    // Informers: the best of `rounds` for each.
    let mut json_bytes = 0.0;
    let informer_args = |which: &str| -> Vec<String> {
        ["informer", which, "--objects", &objects.to_string(), "--updates", &updates.to_string()]
            .iter()
            .map(|s| s.to_string())
            .chain(["--timeout-s".to_string(), timeout(0)])
            .collect()
    };
    let go_informer_args = vec![
        "-objects".into(),
        objects.to_string(),
        "-updates".into(),
        updates.to_string(),
        "-timeout".into(),
        format!("{}s", timeout(0)),
    ];
    let mut rate_cells: [Cell; 3] = [Err(String::new()), Err(String::new()), Err(String::new())];
    let mut bytes_cells: [Cell; 3] = [Err(String::new()), Err(String::new()), Err(String::new())];
    for (column, name) in ["wasmctrl", "kube-rs", "client-go"].into_iter().enumerate() {
        let mut best: Option<Value> = None;
        let mut failure = String::new();
        for round in 0..rounds {
            eprintln!("anchors: informer {name}, round {}", round + 1);
            let outcome = match (name, &go) {
                ("client-go", Err(why)) => Err(why.clone()),
                ("client-go", Ok(go)) => {
                    run_consumer(objects, updates, None, go_consumer(&go.informer, &go_informer_args))
                }
                _ => run_consumer(objects, updates, None, self_consumer(&informer_args(name))),
            };
            match outcome {
                Ok((v, bytes)) => {
                    json_bytes = bytes;
                    let better = best
                        .as_ref()
                        .is_none_or(|b| field(&v, "events_per_sec").ok() > field(b, "events_per_sec").ok());
                    if better {
                        best = Some(v);
                    }
                }
                Err(e) => failure = e,
            }
        }
        match best {
            Some(v) => {
                eprintln!("anchors: {v}");
                rate_cells[column] = field(&v, "events_per_sec");
                bytes_cells[column] = field(&v, "cache_bytes_per_object");
            }
            None => {
                rate_cells[column] = Err(failure.clone());
                bytes_cells[column] = Err(failure);
            }
        }
    }
    let mut rows = vec![
        Row {
            label: "informer watch events/s".into(),
            higher_is_better: true,
            cells: rate_cells,
            target: Some(200_000.0),
        },
        Row {
            label: format!("cache bytes per object (JSON {json_bytes:.0} B)"),
            higher_is_better: false,
            cells: bytes_cells,
            target: Some(1.2 * json_bytes),
        },
    ];
    rows[0].record("events/s");
    rows[1].record("B");

    // Controllers, one paced run per rate.
    let mut probes: Vec<String> = Vec::new();
    for &rate in &rates {
        let n = u64::from(rate) * seconds;
        let mut p50: [Cell; 3] = [Err(String::new()), Err(String::new()), Err(String::new())];
        let mut p99: [Cell; 3] = [Err(String::new()), Err(String::new()), Err(String::new())];
        for (column, name) in ["wasmctrl", "kube-rs", "controller-runtime"].into_iter().enumerate() {
            eprintln!("anchors: controller {name} at {rate} updates/s");
            let mut args: Vec<String> =
                ["controller", name, "--objects", &objects.to_string(), "--updates", &n.to_string()]
                    .iter()
                    .map(|s| s.to_string())
                    .chain(["--timeout-s".to_string(), timeout(seconds)])
                    .collect();
            let probe = SleepProbe::start();
            let outcome = match (name, &go, &plugin) {
                ("controller-runtime", Err(why), _) => Err(why.clone()),
                ("controller-runtime", Ok(go), _) => {
                    let go_args = vec![
                        "-updates".into(),
                        n.to_string(),
                        "-rate".into(),
                        rate.to_string(),
                        "-timeout".into(),
                        format!("{}s", timeout(seconds)),
                    ];
                    run_consumer(objects, n, Some(rate), go_consumer(&go.controller, &go_args))
                }
                ("wasmctrl", _, Err(why)) => Err(why.clone()),
                ("wasmctrl", _, Ok(plugin)) => {
                    args.extend(["--plugin".to_string(), plugin.display().to_string()]);
                    run_consumer(objects, n, Some(rate), self_consumer(&args))
                }
                _ => run_consumer(objects, n, Some(rate), self_consumer(&args)),
            };
            let stalls = probe.finish();
            eprintln!("anchors: sleep probe during the run: {stalls}");
            if name == "wasmctrl" {
                probes.push(format!("{rate}/s: {stalls}"));
            }
            match outcome {
                Ok((v, _)) => {
                    eprintln!("anchors: {v}");
                    p50[column] = field(&v, "p50_ms");
                    p99[column] = field(&v, "p99_ms");
                }
                Err(e) => {
                    p50[column] = Err(e.clone());
                    p99[column] = Err(e);
                }
            }
        }
        // Issue 12: p99 ≤ 1 ms up to 20,000 updates/s, ≤ 5 ms at 50,000.
        let p99_target = match rate {
            ..=20_000 => Some(1.0),
            20_001..=50_000 => Some(5.0),
            _ => None,
        };
        let p50 = Row {
            label: format!("event → reconcile p50 ms at {rate}/s"),
            higher_is_better: false,
            cells: p50,
            target: None,
        };
        let p99 = Row {
            label: format!("event → reconcile p99 ms at {rate}/s"),
            higher_is_better: false,
            cells: p99,
            target: p99_target,
        };
        p50.record("ms");
        p99.record("ms");
        rows.push(p50);
        rows.push(p99);
    }

    println!();
    println!(
        "anchors: {objects} ConfigMaps listed, then {updates} updates flat out (informers) or {seconds} s at each rate (controllers);"
    );
    println!(
        "stream server, consumer: one process each; ratio = how many times better wasmctrl is (>1 better, <1 worse)"
    );
    println!();
    print_table(&rows);
    if !probes.is_empty() {
        println!();
        println!(
            "the machine's own stalls during each wasmctrl controller run (a harness thread sleeping 1 ms at a time; how late it woke): {}",
            probes.join("; ")
        );
    }
    Ok(())
}

/// The machine's own stalls during a run. A thread of the harness process (which only waits
/// while a consumer runs) sleeps 1 ms at a time and records how much later than asked each
/// sleep ended. With the cores mostly idle, a wake-up late by milliseconds is the machine's
/// doing (on a VM: a virtual CPU the hypervisor did not run), and the consumers' latency
/// tails show the same stalls, so the table's p99 rows are read next to these figures.
struct SleepProbe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Duration>>,
}

impl SleepProbe {
    const NAP: Duration = Duration::from_millis(1);

    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut late = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let start = Instant::now();
                std::thread::sleep(Self::NAP);
                late.push(start.elapsed().saturating_sub(Self::NAP));
            }
            late
        });
        SleepProbe { stop, thread }
    }

    /// "p99 X ms, max Y ms, N over 2 ms" of the lateness seen since `start`.
    fn finish(self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let Ok(mut late) = self.thread.join() else { return "probe failed".into() };
        if late.is_empty() {
            return "no samples".into();
        }
        late.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let p99 = late[(late.len() - 1) * 99 / 100];
        let over = late.iter().filter(|d| **d > Duration::from_millis(2)).count();
        format!(
            "{} sleeps of 1 ms late by p99 {:.2} ms, max {:.2} ms, {over} by over 2 ms",
            late.len(),
            ms(p99),
            ms(late[late.len() - 1])
        )
    }
}

fn print_table(rows: &[Row]) {
    let fmt = |c: &Cell| match c {
        Ok(v) if *v >= 1000.0 => format!("{v:.0}"),
        Ok(v) => format!("{v:.2}"),
        Err(e) => e.clone(),
    };
    let ratio = |row: &Row, other: &Cell| match (&row.cells[0], other) {
        (Ok(ours), Ok(theirs)) if *ours > 0.0 && *theirs > 0.0 => {
            let r = if row.higher_is_better { ours / theirs } else { theirs / ours };
            // Two significant digits below 0.1, so a large loss does not read as 0.00×.
            if r < 0.1 { format!("{r:.2e}×") } else { format!("{r:.2}×") }
        }
        _ => "–".into(),
    };
    let header = ["", "wasmctrl", "kube-rs", "client-go / controller-runtime", "vs kube-rs", "vs Go"];
    let body: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.label.clone(),
                fmt(&r.cells[0]),
                fmt(&r.cells[1]),
                fmt(&r.cells[2]),
                ratio(r, &r.cells[1]),
                ratio(r, &r.cells[2]),
            ]
        })
        .collect();
    let width = |i: usize| {
        body.iter().map(|r| r[i].chars().count()).chain([header[i].chars().count()]).max().unwrap_or(0)
    };
    let widths: Vec<usize> = (0..6).map(width).collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i] - c.chars().count();
                if i == 0 { format!("{c}{}", " ".repeat(pad)) } else { format!("{}{c}", " ".repeat(pad)) }
            })
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(&header.map(String::from));
    // Markdown: the first column left-aligned, the figures right-aligned.
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| if i == 0 { "-".repeat(w + 2) } else { format!("{}:", "-".repeat(w + 1)) })
        .collect();
    println!("|{}|", rule.join("|"));
    for r in &body {
        line(r);
    }
}
