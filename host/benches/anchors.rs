//! wasmctrl next to kube-rs, client-go and controller-runtime on one generated stream
//! (harness-free; `cargo bench -p wasmctrl --bench anchors`, or `cargo xtask bench anchors`).
//!
//! Three tables, each figure the median (min–max) of `BENCH_ROUNDS` rounds, every row naming
//! what goes over the wire and what work each consumer does per event:
//! - informers, flat out: watch events/s at the event handler and cache bytes per object, for
//!   wasmctrl's SharedIndexInformer (JSON; lazy: metadata decoded, object bytes kept for the
//!   plugins), kube-rs's `watcher` + `reflector` (JSON; full typed decode), and client-go's
//!   typed SharedIndexInformer (`bench/anchors/informer`) once over JSON and once over
//!   protobuf (full typed decode both), and beside them the stream server's own line-drain
//!   rate (the list read, the watch's lines counted, nothing decoded), the ceiling a JSON
//!   consumer of this server can reach;
//! - the decode floor: the same watch events decoded in memory on one thread with no
//!   informer, by Rust (`anchors/decode_floor.rs`: `serde_json::Value`, typed `serde_json`,
//!   wasmctrl's lazy object, prost, and prost + a JSON re-encode, the prototype of a protobuf
//!   reflector whose decision the table states) and by Go (`bench/anchors/decode`: client-go's
//!   watch decoder and a bare `encoding/json` / gogo-protobuf Unmarshal, JSON and protobuf);
//! - event → reconcile-start latency p50 / p99 at each paced rate: wasmctrl's controller with
//!   a no-op Wasm plugin and with one that gets the object from the cache and parses it into a
//!   typed ConfigMap (the `bench-sdk` test plugin), kube-rs's `Controller` (JSON),
//!   controller-runtime (`bench/anchors/controller`, protobuf: its default for built-in
//!   types); kube-rs and controller-runtime with a no-op reconcile (their objects arrive
//!   decoded), concurrency 1. A consumer that does not keep up (`latency::Delivery`) is
//!   reported as "saturated at N events/s", never with a latency; a plot draws p99 against
//!   the rate for the runs that kept up.
//!
//! A fourth table gives the environment: the Go runtime's version, GOMAXPROCS and GOGC as
//! each Go program reported them; the harness pins GOMAXPROCS (the cores it may use) and
//! GOGC (100), and unsets GOMEMLIMIT and GODEBUG, for every Go process.
//!
//! Every run is separate processes: a stream server (this binary, `serve`; see
//! `wasmctrl_bench_support`) listing `BENCH_OBJECTS` ~2 KB ConfigMaps and then streaming
//! updates (flat out for the informers; paced at each rate for `BENCH_SECONDS` per rate after
//! a 1 s warm-up for the controllers), and one consumer (this binary, `consume ...`, or a Go
//! program) that prints one JSON line. The server answers each consumer in the encoding its
//! `Accept` header asks for; every Go program reports the Content-Type it was answered with,
//! and a row whose wire differs from its label fails. The Go programs are built here with the
//! Go toolchain (module cache and build cache in Go's defaults, outside the repository);
//! without `go` their rows say so. The no-op plugin is the `panic` test plugin, whose
//! reconcile of any request but `misbehave` returns `Done` at once; both plugins are built by
//! `cargo xtask build-guests`.
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
//!   sleeps 1 ms at a time and records how late it wakes ([`SleepProbe`]); noted under the
//!   latency table for wasmctrl's runs, since the p99 rows move with them.
//!
//! client-go's JSON watch path reads each event's bytes several times (the stream framer,
//! `encoding/json`'s validation and skip of the envelope, kept as a `RawExtension`, then
//! `sigs.k8s.io/json`'s validation and typed decode of the object); `-cpuprofile` on
//! `bench/anchors/informer` shows where its time goes.
//!
//! Sizes: `BENCH_OBJECTS` (20000), `BENCH_UPDATES` (200000), `BENCH_FLOOR_UPDATES` (50000, at
//! most `BENCH_UPDATES`), `BENCH_RATES` ("5000,20000,50000,100000"), `BENCH_SECONDS` (6),
//! `BENCH_ROUNDS` (3). `BENCH_QUICK=1` shrinks the defaults for a smoke run (2000 objects,
//! 20000 updates, rates 5000 and 20000, 2 s each).

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
use wasmctrl_bench_support::latency::{self, Delivery, Sample, Stamp};
use wasmctrl_bench_support::{
    Allocator, BackgroundServer, CountingAllocator, Figure, Pace, Plot, Rounds, SEQ_ANNOTATION, StreamConfig,
    StreamProgress, Table, allocated, number, quick, rounds_from_env, unix_nanos,
};

#[path = "anchors/decode_floor.rs"]
mod decode_floor;

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
    if what.0 == Some("floor") {
        let objects = usize::try_from(flag_u64(args, "--objects")?)?;
        let updates = flag_u64(args, "--updates")?;
        let rounds = usize::try_from(flag_u64(args, "--rounds")?)?.max(1);
        println!("{}", decode_floor::run(objects, updates, rounds)?);
        return Ok(());
    }
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
        (Some("informer"), Some("drain")) => rt.block_on(line_drain(&url, objects, updates, timeout))?,
        (Some("controller"), Some(which)) => {
            let stamps = match which {
                "wasmctrl" => {
                    let plugin = PathBuf::from(flag(args, "--plugin").ok_or("missing --plugin")?);
                    rt.block_on(controller_wasmctrl(&url, &plugin, updates, timeout))?
                }
                "kube-rs" => rt.block_on(controller_kube(&url, updates, timeout))?,
                other => return Err(format!("unknown controller {other}").into()),
            };
            let samples: Vec<Sample> = stamps.iter().map(Stamp::sample).collect();
            let p = latency::percentiles(&samples, updates / 10)
                .ok_or("no reconcile of an update after the first tenth")?;
            let d =
                Delivery::of(&stamps, updates / 10).ok_or("fewer than 3 reconciles after the first tenth")?;
            let ms = |n: u64| n as f64 / 1e6;
            json!({ "kind": "latency", "reconciles": samples.len(), "samples": p.count,
                    "p50_ms": ms(p.p50), "p99_ms": ms(p.p99), "max_ms": ms(p.max),
                    "delivery": { "offered_per_sec": d.offered_per_sec, "delivered_per_sec": d.delivered_per_sec,
                                  "lag_first_third_ms": d.lag_first_third_ms, "lag_last_third_ms": d.lag_last_third_ms } })
        }
        _ => {
            return Err(
                "usage: consume informer <wasmctrl|kube-rs|drain> --url URL ... | consume controller <wasmctrl|kube-rs> --url URL ... | consume floor ..."
                    .into(),
            );
        }
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

/// The stream server's own line-drain rate, the ceiling of any JSON consumer of its stream:
/// the list read whole (its resourceVersion found by a search of its first bytes), then the
/// watch's newlines counted as its chunks arrive. Nothing is decoded, copied or kept; timed
/// over the same part of the stream as the informers (last listed object to last update).
async fn line_drain(url: &str, objects: usize, updates: u64, timeout: Duration) -> Result<Value, Error> {
    use futures::{AsyncBufRead, AsyncBufReadExt};
    let progress = StreamProgress::new(objects, updates);
    let client = client(url)?;
    let drain = async {
        let list = http::Request::get("/api/v1/configmaps?resourceVersion=0")
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())?;
        let list = client.request_text(list).await?;
        let rv = list_resource_version(&list).ok_or("the list carries no resourceVersion")?;
        for _ in 0..objects {
            progress.added();
        }
        let watch = http::Request::get(format!("/api/v1/configmaps?watch=true&resourceVersion={rv}"))
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())?;
        let mut body = std::pin::pin!(client.request_stream(watch).await?);
        let last = updates.saturating_sub(1).to_string();
        let mut lines = 0u64;
        loop {
            let chunk = body.fill_buf().await?;
            if chunk.is_empty() {
                return Err::<(), Error>("the watch stream ended".into());
            }
            let (len, newlines) = (chunk.len(), chunk.iter().filter(|&&b| b == b'\n').count() as u64);
            body.as_mut().consume(len);
            for _ in 0..newlines {
                lines += 1;
                progress.updated((lines == updates).then_some(last.as_str()));
            }
            if lines >= updates {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(timeout, drain).await.map_err(|_| format!("timed out after {timeout:?}"))??;
    let f = progress.figures()?;
    Ok(json!({
        "impl": "line drain",
        "kind": "informer",
        "objects": objects,
        "updates_seen": f.updates_seen,
        "list_seconds": f.list.as_secs_f64(),
        "watch_seconds": f.watch.as_secs_f64(),
        "events_per_sec": f.events_per_sec(),
    }))
}

/// The `metadata.resourceVersion` of a list's JSON, which the API server (and the stream
/// server) write before the items.
fn list_resource_version(list: &str) -> Option<&str> {
    const KEY: &str = "\"resourceVersion\":\"";
    let start = list.find(KEY)? + KEY.len();
    let len = list[start..].find('"')?;
    Some(&list[start..start + len])
}

/// Takes a latency stamp at the start of each reconcile, then hands the request on.
struct Stamping {
    inner: Arc<dyn Reconciler>,
    cache: Indexer,
    last_seq: u64,
    samples: parking_lot::Mutex<Vec<Stamp>>,
    done: tokio::sync::Notify,
}

impl Reconciler for Stamping {
    fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>> {
        let now = unix_nanos();
        if let Some(obj) = self.cache.get_by_name(request.namespace.as_deref(), &request.name)
            && let Some(s) = latency::stamp(|k| obj.annotation(k), now)
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
) -> Result<Vec<Stamp>, Error> {
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
    let plugin = Plugin::load(&engine, PluginSpec::new("bench", kind), &wasm, env)?;
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
    samples: parking_lot::Mutex<Vec<Stamp>>,
    done: tokio::sync::Notify,
}

async fn kube_reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<KubeContext>,
) -> Result<kube::runtime::controller::Action, std::convert::Infallible> {
    let now = unix_nanos();
    let annotations = cm.metadata.annotations.as_ref();
    if let Some(s) = latency::stamp(|k| annotations.and_then(|a| a.get(k)).map(String::as_str), now) {
        ctx.samples.lock().push(s);
        if s.seq == ctx.last_seq {
            ctx.done.notify_one();
        }
    }
    Ok(kube::runtime::controller::Action::await_change())
}

async fn controller_kube(url: &str, updates: u64, timeout: Duration) -> Result<Vec<Stamp>, Error> {
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
    last_json_line(&out.stdout, out.status.success())
        .map(|v| (v, server.json_bytes_per_object))
        .map_err(|e| format!("{:?}: {e} ({})", cmd.get_program(), out.status))
}

/// The Go anchors, built.
struct GoAnchors {
    informer: PathBuf,
    controller: PathBuf,
    decode: PathBuf,
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
        .args(["./informer", "./controller", "./decode"])
        .output()
        .map_err(|e| format!("failed: go build: {e}"))?;
    if !built.status.success() {
        let err = String::from_utf8_lossy(&built.stderr);
        return Err(format!("failed: go build: {}", err.lines().last().unwrap_or("")));
    }
    Ok(GoAnchors {
        informer: out.join("informer"),
        controller: out.join("controller"),
        decode: out.join("decode"),
    })
}

/// A test plugin built by `cargo xtask build-guests`, or why a row has no figures.
fn guest_plugin(file: &str) -> Result<PathBuf, String> {
    let path = repo_root().join("guests/target/wasm32-wasip2/release").join(file);
    if path.exists() { Ok(path) } else { Err("skipped: run `cargo xtask build-guests`".into()) }
}

fn self_consumer(args: &[String]) -> impl FnOnce(&str) -> Command {
    let args = args.to_vec();
    move |url| {
        let mut cmd = Command::new(std::env::current_exe().unwrap_or_else(|_| PathBuf::from("anchors")));
        cmd.arg("consume").args(&args).args(["--url", url]);
        cmd
    }
}

/// GOGC every Go consumer runs with: Go's default, set explicitly so a value in the
/// environment cannot change it.
const GOGC: &str = "100";

/// GOMAXPROCS every Go consumer runs with: the cores this process may use (Go's default,
/// set explicitly, as GOGC).
fn gomaxprocs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn go_consumer(bin: &Path, args: &[String]) -> impl FnOnce(&str) -> Command {
    let (bin, args) = (bin.to_owned(), args.to_vec());
    move |url| {
        let mut cmd = Command::new(bin);
        cmd.args(&args)
            .args(["-url", url])
            .env("GOMAXPROCS", gomaxprocs().to_string())
            .env("GOGC", GOGC)
            .env_remove("GOMEMLIMIT")
            .env_remove("GODEBUG");
        cmd
    }
}

fn field(v: &Value, name: &str) -> Result<f64, String> {
    v[name].as_f64().ok_or_else(|| format!("no {name} in {v}"))
}

/// "go1.26.8, GOMAXPROCS 2, GOGC 100" from a Go result line's `env` (what the runtime
/// reported), or why it differs from what the harness pinned.
fn go_environment(v: &Value) -> Result<String, String> {
    let env = &v["env"];
    let (version, procs, gogc) =
        (env["go_version"].as_str(), env["gomaxprocs"].as_u64(), env["gogc"].as_i64());
    let (Some(version), Some(procs), Some(gogc)) = (version, procs, gogc) else {
        return Err(format!("no Go environment in {v}"));
    };
    if procs as usize != gomaxprocs() || gogc.to_string() != GOGC {
        return Err(format!(
            "Go ran with GOMAXPROCS {procs}, GOGC {gogc}; the harness pinned {}, {GOGC}",
            gomaxprocs()
        ));
    }
    Ok(format!("{version}, GOMAXPROCS {procs}, GOGC {gogc}"))
}

/// "JSON", "protobuf", or the Content-Types as received, from a Go result line's `wire`.
fn wire_of(v: &Value) -> String {
    let types: Vec<&str> = v["wire"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !types.is_empty() && types.iter().all(|t| t.starts_with("application/vnd.kubernetes.protobuf")) {
        "protobuf".into()
    } else if !types.is_empty() && types.iter().all(|t| t.starts_with("application/json")) {
        "JSON".into()
    } else {
        format!("{types:?}")
    }
}

/// Benchmark sizes, from the environment (smaller defaults with `BENCH_QUICK`).
struct Sizes {
    objects: usize,
    updates: u64,
    floor_updates: u64,
    seconds: u64,
    rounds: usize,
    rates: Vec<u32>,
}

impl Sizes {
    fn from_env() -> Self {
        let quick = quick();
        let updates = env_usize("BENCH_UPDATES", if quick { 20_000 } else { 200_000 }).max(1) as u64;
        Sizes {
            objects: env_usize("BENCH_OBJECTS", if quick { 2_000 } else { 20_000 }).max(1),
            updates,
            floor_updates: env_usize("BENCH_FLOOR_UPDATES", 50_000).max(1).min(updates as usize) as u64,
            seconds: env_usize("BENCH_SECONDS", if quick { 2 } else { 6 }).max(1) as u64,
            rounds: rounds_from_env(),
            rates: std::env::var("BENCH_RATES")
                .unwrap_or_else(|_| if quick { "5000,20000" } else { "5000,20000,50000,100000" }.into())
                .split(',')
                .filter_map(|r| r.trim().parse().ok())
                .collect(),
        }
    }
}

/// A consumer's figures over the rounds, or why it has none.
struct Measured {
    rounds: Vec<Value>,
    /// The last failure, and how many rounds failed.
    failure: Option<String>,
    failed: usize,
}

impl Measured {
    fn new() -> Self {
        Measured { rounds: Vec::new(), failure: None, failed: 0 }
    }

    /// Keeps one round's outcome.
    fn add(&mut self, label: &str, outcome: Result<Value, String>) {
        match outcome {
            Ok(v) => {
                eprintln!("anchors: {v}");
                self.rounds.push(v);
            }
            Err(e) => {
                eprintln!("anchors: {label}: {e}");
                self.failure = Some(e);
                self.failed += 1;
            }
        }
    }

    fn figure(&self, name: &str) -> Rounds {
        Rounds::new(self.rounds.iter().filter_map(|v| field(v, name).ok()))
    }

    /// The figure's "median (min–max)", or the failure.
    fn cell(&self, name: &str) -> String {
        let r = self.figure(name);
        match (&self.failure, r.is_empty()) {
            (Some(e), true) => e.clone(),
            (Some(e), false) => {
                format!("{} ({} of {} rounds; the others: {e})", r.display(), r.len(), r.len() + self.failed)
            }
            (None, _) => r.display(),
        }
    }
}

/// One informer consumer: how it is run, what goes over the wire, what it does per event.
struct InformerConsumer {
    label: &'static str,
    wire: &'static str,
    work: &'static str,
}

/// The informer consumers; the first is wasmctrl's, the last the stream server's line drain
/// (not an informer: the rate the others are measured against).
const INFORMERS: [InformerConsumer; 5] = [
    InformerConsumer {
        label: "wasmctrl SharedIndexInformer",
        wire: "JSON",
        work: "lazy: metadata decoded, object bytes kept (plugins parse them)",
    },
    InformerConsumer {
        label: "kube-rs watcher + reflector",
        wire: "JSON",
        work: "full typed decode (serde → k8s-openapi ConfigMap)",
    },
    InformerConsumer {
        label: "client-go SharedIndexInformer",
        wire: "JSON",
        work: "full typed decode (sigs.k8s.io/json → corev1.ConfigMap)",
    },
    InformerConsumer {
        label: "client-go SharedIndexInformer",
        wire: "protobuf",
        work: "full typed decode (gogo protobuf → corev1.ConfigMap)",
    },
    InformerConsumer {
        label: "the stream server's line drain (no informer)",
        wire: "JSON",
        work: "none: the list read whole, the watch's lines counted; nothing decoded or kept",
    },
];

/// The index in [`INFORMERS`] of the line drain.
const LINE_DRAIN: usize = INFORMERS.len() - 1;

/// Who reconciles in a controller run.
#[derive(Clone, Copy, PartialEq)]
enum Reconciling {
    /// wasmctrl's controller calling a Wasm plugin (file name under the guests' release dir).
    Wasmctrl(&'static str),
    KubeRs,
    ControllerRuntime,
}

/// A controller consumer of the latency table.
struct ControllerConsumer {
    label: &'static str,
    wire: &'static str,
    /// What its reconcile does with the object.
    work: &'static str,
    who: Reconciling,
}

/// The controller consumers. wasmctrl's runs come first; the first is the one the
/// project's long-standing p99 targets are for.
const CONTROLLERS: [ControllerConsumer; 4] = [
    ControllerConsumer {
        label: "wasmctrl (no-op Wasm plugin)",
        wire: "JSON",
        work: "none: returns at once (the `panic` test plugin)",
        who: Reconciling::Wasmctrl("test_plugin_panic.wasm"),
    },
    ControllerConsumer {
        label: "wasmctrl (typed-parse Wasm plugin)",
        wire: "JSON",
        work: "cache get + typed parse of the ConfigMap through the Rust SDK (`bench-sdk` test plugin)",
        who: Reconciling::Wasmctrl("test_plugin_bench_sdk.wasm"),
    },
    ControllerConsumer {
        label: "kube-rs Controller",
        wire: "JSON",
        work: "none (the object arrives decoded: full typed decode in its reflector)",
        who: Reconciling::KubeRs,
    },
    ControllerConsumer {
        label: "controller-runtime",
        wire: "protobuf (its default for built-in types, v0.25.2)",
        work: "none (the object arrives decoded: full typed decode in its informer)",
        who: Reconciling::ControllerRuntime,
    },
];

fn orchestrate() -> Result<(), Error> {
    let sizes = Sizes::from_env();
    let Sizes { objects, updates, rounds, .. } = sizes;
    let go = build_go_anchors();
    let timeout = |run_seconds: u64| (run_seconds + 120).to_string();
    let mut go_envs: Vec<String> = Vec::new();
    let mut note_go = |v: &Value| -> Result<(), String> {
        let env = go_environment(v)?;
        if !go_envs.contains(&env) {
            go_envs.push(env);
        }
        Ok(())
    };
    let mut json_bytes = 0.0;

    // Informers, flat out.
    let rust_args = |which: &str| -> Vec<String> {
        [
            "informer",
            which,
            "--objects",
            &objects.to_string(),
            "--updates",
            &updates.to_string(),
            "--timeout-s",
            &timeout(0),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let go_informer_args = |content_type: &str| -> Vec<String> {
        [
            "-objects",
            &objects.to_string(),
            "-updates",
            &updates.to_string(),
            "-timeout",
            &format!("{}s", timeout(0)),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["-content-type".to_string(), content_type.to_string()])
        .collect()
    };
    // Rounds interleave the consumers, so a slow spell of the machine does not fall on one.
    let mut informers: Vec<Measured> = INFORMERS.iter().map(|_| Measured::new()).collect();
    for round in 0..rounds {
        for (i, c) in INFORMERS.iter().enumerate() {
            let label = format!("informer {} ({})", c.label, c.wire);
            eprintln!("anchors: {label}, round {}", round + 1);
            let outcome = match (i, &go) {
                (0, _) => run_consumer(objects, updates, None, self_consumer(&rust_args("wasmctrl"))),
                (1, _) => run_consumer(objects, updates, None, self_consumer(&rust_args("kube-rs"))),
                (LINE_DRAIN, _) => run_consumer(objects, updates, None, self_consumer(&rust_args("drain"))),
                (_, Err(why)) => Err(why.clone()),
                (_, Ok(go)) => {
                    let content_type = if c.wire == "JSON" { "json" } else { "protobuf" };
                    run_consumer(
                        objects,
                        updates,
                        None,
                        go_consumer(&go.informer, &go_informer_args(content_type)),
                    )
                    .and_then(|(v, bytes)| {
                        note_go(&v)?;
                        if wire_of(&v) != c.wire {
                            return Err(format!("asked for {}, the server answered {}", c.wire, wire_of(&v)));
                        }
                        Ok((v, bytes))
                    })
                }
            };
            let outcome = outcome.map(|(v, bytes)| {
                json_bytes = bytes;
                v
            });
            informers[i].add(&label, outcome);
        }
    }
    let mut table = Table::new(
        "anchors",
        format!(
            "Informers: {objects} ConfigMaps listed, then {updates} updates flat out; events/s at the event handler, median (min–max) of {rounds} rounds"
        ),
        &["consumer", "wire", "work per event", "watch events/s", "cache bytes per object"],
    );
    for (i, (c, m)) in INFORMERS.iter().zip(&informers).enumerate() {
        let bytes = if i == LINE_DRAIN { "none kept".into() } else { m.cell("cache_bytes_per_object") };
        table.row(vec![c.label.into(), c.wire.into(), c.work.into(), m.cell("events_per_sec"), bytes]);
    }
    table.note(format!(
        "Each round is two fresh processes (the stream server and the consumer). The listed objects are {json_bytes:.0} B of JSON each. Cache bytes: heap after the stream minus heap before the client (Rust: a counting allocator; Go: live heap after a GC), per object. client-go v0.37.2's typed ConfigMap client asks for protobuf first when rest.Config.ContentType is unset, so its default is the protobuf row; the JSON row sets ContentType to application/json."
    ));
    let drain = informers[LINE_DRAIN].figure("events_per_sec").median();
    let ours = informers[0].figure("events_per_sec").median();
    table.note(format!(
        "The line drain is the stream server's own rate, what a consumer that does nothing with the events reaches: wasmctrl's informer reaches {:.0} % of it (median against median).",
        100.0 * ours / drain
    ));
    table.print_and_record();
    let mut rate_figure =
        Figure::higher("anchors", "informer watch events/s", ours, "events/s").target(200_000.0);
    let mut bytes_figure = Figure::lower(
        "anchors",
        format!("cache bytes per object (JSON {json_bytes:.0} B)"),
        informers[0].figure("cache_bytes_per_object").median(),
        "B",
    )
    .target(1.2 * json_bytes);
    Figure::higher("anchors", "informer watch events/s ÷ the stream server's line drain", ours / drain, "×")
        .target(0.9)
        .record();
    for (c, m) in INFORMERS.iter().zip(&informers).skip(1).take(LINE_DRAIN - 1) {
        let name = format!("{} ({}, full typed)", c.label, c.wire);
        rate_figure = rate_figure.against(&name, m.figure("events_per_sec").median());
        bytes_figure = bytes_figure.against(&name, m.figure("cache_bytes_per_object").median());
    }
    rate_figure.record();
    bytes_figure.record();

    decode_floors(&sizes, &go, &mut note_go, &informers)?;
    controllers(&sizes, &go, &mut note_go)?;

    let mut env = Table::new("anchors", "Environment of the anchors runs", &["", ""]);
    env.row(vec![
        "Go (as the Go runtime reported it in every Go result)".into(),
        match (&go, go_envs.is_empty()) {
            (Err(why), _) => why.clone(),
            (Ok(_), true) => "no Go result".into(),
            (Ok(_), false) => go_envs.join("; "),
        },
    ]);
    env.row(vec![
        "Go pinned by the harness".into(),
        format!("GOMAXPROCS={}, GOGC={GOGC}, GOMEMLIMIT and GODEBUG unset", gomaxprocs()),
    ]);
    let build = if cfg!(debug_assertions) { "debug build (figures not comparable)" } else { "release build" };
    env.row(vec![
        "Rust consumers".into(),
        format!("{build}, tokio multi-threaded runtime with one worker per core"),
    ]);
    env.row(vec!["rounds per figure".into(), rounds.to_string()]);
    env.print_and_record();
    Ok(())
}

/// The decode floor table: the same watch events decoded in memory, without an informer.
fn decode_floors(
    sizes: &Sizes,
    go: &Result<GoAnchors, String>,
    note_go: &mut impl FnMut(&Value) -> Result<(), String>,
    informers: &[Measured],
) -> Result<(), Error> {
    let (objects, n, rounds) = (sizes.objects, sizes.floor_updates, sizes.rounds);
    eprintln!("anchors: decode floors over {n} events");
    let rust = {
        let exe = std::env::current_exe()?;
        let out = Command::new(exe)
            .args(["consume", "floor", "--objects", &objects.to_string(), "--updates", &n.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .stderr(Stdio::inherit())
            .output()?;
        last_json_line(&out.stdout, out.status.success())
    };
    let go_floor = |content_type: &str| -> Result<Value, String> {
        let go = go.as_ref().map_err(Clone::clone)?;
        let args: Vec<String> =
            ["-mode", "floor", "-objects", &objects.to_string(), "-updates", &n.to_string()]
                .iter()
                .map(|s| s.to_string())
                .chain(["-rounds".into(), rounds.to_string(), "-content-type".into(), content_type.into()])
                .collect();
        let (v, _) = run_consumer(objects, n, None, go_consumer(&go.decode, &args))?;
        Ok(v)
    };
    let go_json = go_floor("json");
    let go_protobuf = go_floor("protobuf");
    for v in [&go_json, &go_protobuf].into_iter().flatten() {
        note_go(v)?;
    }
    let figures = |v: &Result<Value, String>, path: &str| -> Result<Rounds, String> {
        let v = v.as_ref().map_err(Clone::clone)?;
        let values = v["events_per_sec"][path].as_array().ok_or_else(|| format!("no {path} in {v}"))?;
        Ok(Rounds::new(values.iter().filter_map(Value::as_f64)))
    };
    let bytes = |v: &Result<Value, String>, key: &str| -> String {
        v.as_ref().ok().and_then(|v| v[key].as_f64()).map_or_else(String::new, |b| format!("{b:.0}"))
    };
    let mut table = Table::new(
        "anchors",
        format!(
            "Decode floor: {n} of the same watch events, in memory, one thread, no informer; events/s, median (min–max) of {rounds} passes"
        ),
        &["decoder", "wire", "work per event", "events/s", "bytes per event"],
    );
    let cell = |r: &Result<Rounds, String>| r.as_ref().map_or_else(Clone::clone, Rounds::display);
    let mut rust_rounds = Vec::new();
    for (name, wire, work) in decode_floor::PATHS {
        let r = figures(&rust, name);
        let key = if wire == "JSON" { "json_bytes_per_event" } else { "protobuf_bytes_per_event" };
        table.row(vec![format!("Rust: {name}"), wire.into(), work.into(), cell(&r), bytes(&rust, key)]);
        rust_rounds.push(r);
    }
    let go_paths = [
        (
            "client-go watch decoder",
            "JSON",
            &go_json,
            "framer, envelope, then full typed decode (what an informer runs)",
        ),
        ("encoding/json Unmarshal", "JSON", &go_json, "full typed decode into corev1.ConfigMap"),
        (
            "client-go watch decoder",
            "protobuf",
            &go_protobuf,
            "framer, envelope, then full typed decode (what an informer runs)",
        ),
        ("gogo-protobuf Unmarshal", "protobuf", &go_protobuf, "full typed decode into corev1.ConfigMap"),
    ];
    for (name, wire, v, work) in go_paths {
        table.row(vec![
            format!("Go: {name}"),
            wire.into(),
            work.into(),
            cell(&figures(v, name)),
            bytes(v, "bytes_per_event"),
        ]);
    }
    table.note(format!(
        "Rust decodes the events the corpus generates in its own process; Go reads them from the stream server first, then decodes the buffer. The first pass includes warm-up. For comparison, the informer rows above: wasmctrl {}, client-go JSON {}, client-go protobuf {} events/s.",
        informers[0].figure("events_per_sec").display(),
        informers[2].figure("events_per_sec").display(),
        informers[3].figure("events_per_sec").display(),
    ));
    // The decision on protobuf in wasmctrl's reflector, from this run's figures.
    if let (Ok(lazy), Ok(proto)) = (&rust_rounds[2], &rust_rounds[4]) {
        let (lazy, proto) = (lazy.median(), proto.median());
        let verdict = if proto < lazy {
            "This run's figures agree with the decision"
        } else {
            "This run's figures contradict the decision: revisit it"
        };
        table.note(format!(
            "Protobuf in wasmctrl's reflector (for built-in kinds, handing plugins JSON): not adopted. Decoding protobuf and re-encoding the ConfigMap as JSON, before any metadata index is built, reaches {} events/s here, against {} events/s for the lazy JSON path that builds the whole cached object ({:.2}× the cost per event); protobuf saves {} of {} bytes per event on the wire, and would need a typed message and a JSON mapping per built-in kind. {verdict}.",
            number(proto),
            number(lazy),
            lazy / proto,
            number(
                rust.as_ref().ok().and_then(|v| Some(v["json_bytes_per_event"].as_f64()? - v["protobuf_bytes_per_event"].as_f64()?)).unwrap_or(f64::NAN)
            ),
            bytes(&rust, "json_bytes_per_event"),
        ));
    }
    table.print_and_record();
    if let Ok(lazy) = &rust_rounds[2] {
        let mut figure =
            Figure::higher("anchors", "decode floor events/s, wasmctrl lazy JSON", lazy.median(), "events/s");
        for (r, (name, wire, _)) in
            rust_rounds.iter().zip(decode_floor::PATHS).filter(|(_, (n, ..))| !n.starts_with("wasmctrl"))
        {
            if let Ok(r) = r {
                figure = figure.against(&format!("Rust {name} ({wire})"), r.median());
            }
        }
        for (name, wire, v, _) in go_paths {
            if let Ok(r) = figures(v, name) {
                figure = figure.against(&format!("Go {name} ({wire})"), r.median());
            }
        }
        figure.record();
    }
    Ok(())
}

/// The last JSON object line of a process's output, or its error.
fn last_json_line(stdout: &[u8], success: bool) -> Result<Value, String> {
    let stdout = String::from_utf8_lossy(stdout);
    let last =
        stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok().filter(Value::is_object));
    match last {
        Some(v) if v.get("error").is_some() => Err(v["error"].as_str().unwrap_or("error").to_owned()),
        Some(v) if success => Ok(v),
        _ => Err("exited without a result".into()),
    }
}

/// One controller run's outcome.
struct ControllerRun {
    p50_ms: f64,
    p99_ms: f64,
    delivery: Delivery,
}

impl ControllerRun {
    fn parse(v: &Value) -> Result<Self, String> {
        let d = &v["delivery"];
        let num = |v: &Value, k: &str| v[k].as_f64().ok_or_else(|| format!("no {k} in {v}"));
        Ok(ControllerRun {
            p50_ms: num(v, "p50_ms")?,
            p99_ms: num(v, "p99_ms")?,
            delivery: Delivery {
                offered_per_sec: num(d, "offered_per_sec")?,
                delivered_per_sec: num(d, "delivered_per_sec")?,
                lag_first_third_ms: num(d, "lag_first_third_ms")?,
                lag_last_third_ms: num(d, "lag_last_third_ms")?,
            },
        })
    }
}

/// A consumer's runs at one rate, reduced to the table's cells.
enum ControllerCell {
    Failed(String),
    /// Most rounds did not keep up: (median delivered events/s of those rounds, how many, of).
    Saturated(f64, usize, usize),
    /// Most rounds kept up: their percentiles and offered rates, and the rounds that did not
    /// (how many, their median delivered events/s).
    KeptUp {
        p50: Rounds,
        p99: Rounds,
        offered: Rounds,
        behind: Option<(usize, f64)>,
    },
}

impl ControllerCell {
    fn of(runs: &[ControllerRun], failure: Option<String>) -> Self {
        if runs.is_empty() {
            return ControllerCell::Failed(failure.unwrap_or_else(|| "no run".into()));
        }
        let (saturated, kept): (Vec<&ControllerRun>, Vec<&ControllerRun>) =
            runs.iter().partition(|r| r.delivery.saturated());
        let delivered = Rounds::new(saturated.iter().map(|r| r.delivery.delivered_per_sec));
        if saturated.len() * 2 >= runs.len() {
            return ControllerCell::Saturated(delivered.median(), saturated.len(), runs.len());
        }
        ControllerCell::KeptUp {
            p50: Rounds::new(kept.iter().map(|r| r.p50_ms)),
            p99: Rounds::new(kept.iter().map(|r| r.p99_ms)),
            offered: Rounds::new(kept.iter().map(|r| r.delivery.offered_per_sec)),
            behind: (!saturated.is_empty()).then(|| (saturated.len(), delivered.median())),
        }
    }
}

fn controllers(
    sizes: &Sizes,
    go: &Result<GoAnchors, String>,
    note_go: &mut impl FnMut(&Value) -> Result<(), String>,
) -> Result<(), Error> {
    let Sizes { objects, seconds, rounds, .. } = *sizes;
    let timeout = (seconds + 120).to_string();
    let mut table = Table::new(
        "anchors",
        format!(
            "Event → reconcile start, {seconds} s paced at each rate after a 1 s warm-up, concurrency 1; ms, median (min–max) of {rounds} rounds"
        ),
        &["consumer", "wire", "reconcile does", "offered updates/s", "p50 ms", "p99 ms", "kept up"],
    );
    let mut probes: Vec<String> = Vec::new();
    let mut plot = Plot::new(
        "anchors",
        "Event → reconcile start p99 against the offered rate (saturated runs not drawn)",
        "updates/s offered",
        "p99 ms",
    )
    .log_y();
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new(); CONTROLLERS.len()];
    for &rate in &sizes.rates {
        let n = u64::from(rate) * seconds;
        let mut runs: Vec<Vec<ControllerRun>> = CONTROLLERS.iter().map(|_| Vec::new()).collect();
        let mut failures: Vec<Option<String>> = vec![None; CONTROLLERS.len()];
        // Rounds interleave the consumers, as the informers' do.
        for round in 0..rounds {
            for (column, consumer) in CONTROLLERS.iter().enumerate() {
                let (name, wire) = (consumer.label, consumer.wire);
                eprintln!("anchors: controller {name} at {rate} updates/s, round {}", round + 1);
                let args: Vec<String> = [
                    "controller",
                    if consumer.who == Reconciling::KubeRs { "kube-rs" } else { "wasmctrl" },
                    "--objects",
                    &objects.to_string(),
                    "--updates",
                    &n.to_string(),
                    "--timeout-s",
                    &timeout,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let probe = SleepProbe::start();
                let outcome = match (consumer.who, go) {
                    (Reconciling::ControllerRuntime, Err(why)) => Err(why.clone()),
                    (Reconciling::ControllerRuntime, Ok(go)) => {
                        let go_args: Vec<String> = [
                            "-updates",
                            &n.to_string(),
                            "-rate",
                            &rate.to_string(),
                            "-timeout",
                            &format!("{timeout}s"),
                        ]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                        run_consumer(objects, n, Some(rate), go_consumer(&go.controller, &go_args)).and_then(
                            |(v, _)| {
                                note_go(&v)?;
                                if !wire.starts_with(&wire_of(&v)) {
                                    return Err(format!(
                                        "expected {wire}, the server answered {}",
                                        wire_of(&v)
                                    ));
                                }
                                Ok(v)
                            },
                        )
                    }
                    (Reconciling::Wasmctrl(file), _) => guest_plugin(file).and_then(|plugin| {
                        let mut args = args;
                        args.extend(["--plugin".to_string(), plugin.display().to_string()]);
                        run_consumer(objects, n, Some(rate), self_consumer(&args)).map(|(v, _)| v)
                    }),
                    (Reconciling::KubeRs, _) => {
                        run_consumer(objects, n, Some(rate), self_consumer(&args)).map(|(v, _)| v)
                    }
                };
                let stalls = probe.finish();
                eprintln!("anchors: sleep probe during the run: {stalls}");
                if matches!(consumer.who, Reconciling::Wasmctrl(_)) {
                    probes.push(format!("{name}, {rate}/s round {}: {stalls}", round + 1));
                }
                match outcome.and_then(|v| {
                    eprintln!("anchors: {v}");
                    ControllerRun::parse(&v)
                }) {
                    Ok(run) => runs[column].push(run),
                    Err(e) => failures[column] = Some(e),
                }
            }
        }
        let mut cells = Vec::new();
        for (column, consumer) in CONTROLLERS.iter().enumerate() {
            let cell = ControllerCell::of(&runs[column], failures[column].take());
            let (p50, p99, kept) = match &cell {
                ControllerCell::Failed(e) => (e.clone(), e.clone(), String::new()),
                ControllerCell::Saturated(at, k, of) => {
                    let text = format!("saturated at {} events/s", number(*at));
                    (text.clone(), text, format!("no: {k} of {of} rounds fell behind"))
                }
                ControllerCell::KeptUp { p50, p99, offered, behind } => {
                    lines[column].push((offered.median(), p99.median()));
                    let kept = match behind {
                        None => format!("yes, {} of {} rounds", p50.len(), rounds),
                        Some((k, at)) => format!(
                            "{} of {} rounds (figures from those); {k} fell behind, at {} events/s",
                            p50.len(),
                            rounds,
                            number(*at)
                        ),
                    };
                    (p50.display(), p99.display(), kept)
                }
            };
            table.row(vec![
                consumer.label.to_string(),
                consumer.wire.to_string(),
                consumer.work.to_string(),
                rate.to_string(),
                p50,
                p99,
                kept,
            ]);
            cells.push(cell);
        }
        // A figure for each wasmctrl consumer, against the others of the same rate. Targets:
        // the no-op plugin's p99 ≤ 1 ms up to 20,000 updates/s and ≤ 5 ms at 50,000 (issue
        // 12); the typed-parse plugin's ≤ 1 ms up to 20,000 and ≤ 5 ms at 50,000 and 100,000
        // (issue 31).
        let others: Vec<(String, f64)> = CONTROLLERS
            .iter()
            .zip(&cells)
            .filter(|(c, _)| !matches!(c.who, Reconciling::Wasmctrl(_)))
            .filter_map(|(c, cell)| match cell {
                ControllerCell::KeptUp { p99, .. } => {
                    Some((format!("{} ({})", c.label, c.wire), p99.median()))
                }
                _ => None,
            })
            .collect();
        for (column, _) in
            CONTROLLERS.iter().enumerate().filter(|(_, c)| matches!(c.who, Reconciling::Wasmctrl(_)))
        {
            let (suffix, p99_target) = if column == 0 {
                let target = match rate {
                    ..=20_000 => Some(1.0),
                    20_001..=50_000 => Some(5.0),
                    _ => None,
                };
                (String::new(), target)
            } else {
                let target = match rate {
                    ..=20_000 => Some(1.0),
                    20_001..=100_000 => Some(5.0),
                    _ => None,
                };
                (", typed-parse plugin".to_string(), target)
            };
            match &cells[column] {
                ControllerCell::KeptUp { p99, .. } => {
                    let mut figure = Figure::lower(
                        "anchors",
                        format!("event → reconcile p99 ms at {rate}/s{suffix}"),
                        p99.median(),
                        "ms",
                    );
                    for (name, value) in &others {
                        figure = figure.against(name, *value);
                    }
                    if let Some(t) = p99_target {
                        figure = figure.target(t);
                    }
                    figure.record();
                }
                ControllerCell::Saturated(at, behind, of) => {
                    // A standing backlog is saturation at about the offered rate, so the
                    // rate sustained is shown without a target; keeping up is the target.
                    Figure::higher(
                        "anchors",
                        format!("saturated: events/s sustained of {rate}/s offered{suffix}"),
                        *at,
                        "events/s",
                    )
                    .record();
                    Figure::higher(
                        "anchors",
                        format!("rounds that kept up at {rate}/s{suffix}"),
                        (of - behind) as f64,
                        "rounds",
                    )
                    .target(*of as f64)
                    .record();
                }
                ControllerCell::Failed(_) => {}
            }
        }
    }
    for (consumer, points) in CONTROLLERS.iter().zip(lines) {
        plot.line(consumer.label, points);
    }
    table.note(format!(
        "A round kept up when its consumer reconciled updates at ≥ {:.0} % of the rate the server sent them, its median lag did not grow by more than {} ms (and double) from the first to the last third of the run, and its median lag over the last third was at most {} ms (above that, a standing backlog: the consumer runs at its limit and the lag is the queue in front of it). A consumer that fell behind in at least half of the rounds is reported as saturated at the rate it did reconcile them (its sustainable maximum here), and its latency, the backlog built over the run, is not shown; otherwise the latencies are those of the rounds that kept up.",
        Delivery::KEPT_UP_SHARE * 100.0,
        Delivery::LAG_GROWTH_MS,
        Delivery::BACKLOG_MS
    ));
    table.note("Latency: at reconcile start, now − the object's sent stamp, over the updates after the first tenth; percentile q = the sorted samples' ⌊(n − 1)·q⌋-th.".to_string());
    if !probes.is_empty() {
        table.note(format!(
            "The machine's own stalls during each wasmctrl run (a harness thread sleeping 1 ms at a time; how late it woke): {}",
            probes.join("; ")
        ));
    }
    table.print_and_record();
    plot.record();
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
