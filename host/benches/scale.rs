//! Scale (harness-free; `cargo bench -p wasmctrl --bench scale`): many cached objects and a
//! sustained event rate through one Wasm plugin, and the sync of a very large list.
//!
//! The API server is the stream server of `bench/support` in a child process (this binary
//! with `serve`), so the figures are the host's alone; the host side runs in another child
//! (`consume ...`) so each scenario starts from an empty process.
//!
//! Allocators: each scenario runs once per allocator of `SCALE_ALLOCATORS` (comma-separated
//! `system`, `jemalloc`, `mimalloc`; default `system` — glibc's malloc — and the `wasmctrl`
//! binary's, jemalloc with the default `jemalloc` feature), each in its own consumer process
//! whose every allocation goes to that allocator (the counting allocator of `bench/support`,
//! told by `BENCH_ALLOCATOR`), with a fresh stream server; then one line per key figure
//! compares them (ratio to the first). The heap figures count requested bytes, the same
//! whichever allocator serves; RSS is what differs.
//!
//! - `sustained`: `SCALE_OBJECTS` (default 100,000) ~2 KB ConfigMaps listed, then
//!   `SCALE_RATE` (default 10,000) updates per second for `SCALE_SECS` (default 60; the issue's
//!   figure is 300) through a controller whose reconciler is a no-op Wasm plugin
//!   (`test-plugin-panic`, concurrency 1). Reports the host's RSS after the sync and every
//!   `SCALE_SECS / 6` of the stream (growth shows there), CPU (cores used while streaming:
//!   user + system time over wall time), and event → reconcile-start p50/p99/max for each
//!   third of the stream (skipping the first tenth overall).
//! - `sync`: `SCALE_SYNC_OBJECTS` (default 1,000,000) ConfigMaps listed into an informer:
//!   time to sync, RSS and heap after it, against the objects' JSON size.
//! - `relist`: `SCALE_RELIST_OBJECTS` (default 100,000) ConfigMaps listed into an informer
//!   with one handler; `SCALE_RELIST_AFTER` seconds (default 20) after it opened, the watch
//!   ends with 410 Expired and the reflector lists again (consistent read) and replaces the
//!   cache. Reports the heap after the first sync, the highest heap during the relist (the
//!   new list's bytes, the decoded objects and the re-delivered notifications live beside
//!   the old cache for a while) and after it. Issue 12's target: the relist must not double
//!   the cache's memory.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
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
    ALLOCATOR_ENV, Allocator, BackgroundServer, CountingAllocator, Figure, Pace, Plot, ProcStatus,
    StreamConfig, allocated, in_use, peak_allocated, reset_peak, unix_nanos,
};

/// The global allocator of the `wasmctrl` binary built with this package's features.
const BINARY_ALLOCATOR: Allocator =
    if cfg!(feature = "jemalloc") { Allocator::Jemalloc } else { Allocator::System };

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::new(BINARY_ALLOCATOR);

/// The `wasmctrl` binary's jemalloc options, so that jemalloc here behaves as it does there.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn flag(args: &[String], name: &str) -> Result<u64, Error> {
    let v =
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).ok_or(format!("missing {name}"))?;
    Ok(v.parse()?)
}

fn url_flag(args: &[String]) -> Result<String, Error> {
    Ok(args.iter().position(|a| a == "--url").and_then(|i| args.get(i + 1)).ok_or("missing --url")?.clone())
}

/// `VmRSS` and `VmHWM` of this process, bytes.
fn rss() -> (u64, u64) {
    let status = ProcStatus::read();
    (status.bytes("VmRSS:"), status.bytes("VmHWM:"))
}

/// User + system CPU time of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given; all-zero is a valid `rusage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage` for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn client(url: &str) -> Result<kube::Client, Error> {
    Ok(kube::Client::try_from(kube::Config::new(url.parse()?))?)
}

// ---------------------------------------------------------------------------------------------
// The stream server process

/// Serves until standard input closes.
fn serve(args: &[String]) -> Result<(), Error> {
    let objects = usize::try_from(flag(args, "--objects")?)?;
    let updates = flag(args, "--updates")?;
    let pace = match flag(args, "--rate") {
        Ok(rate) => Pace::PerSecond { rate: u32::try_from(rate)?, warmup: Duration::from_secs(2) },
        Err(_) => Pace::Flat,
    };
    let expire_first_watch = flag(args, "--expire-after").ok().map(Duration::from_secs);
    let server = BackgroundServer::start(StreamConfig { objects, updates, pace, expire_first_watch })?;
    println!("{}", json!({ "url": server.url(), "json_bytes_per_object": server.json_bytes_per_object() }));
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    Ok(())
}

/// A stream server process; closing its standard input stops it.
struct ServerProcess {
    child: Child,
    url: String,
    json_bytes_per_object: f64,
}

impl ServerProcess {
    fn start(objects: u64, updates: u64, rate: Option<u64>) -> Result<Self, Error> {
        Self::start_with(objects, updates, rate, None)
    }

    /// `expire_after`: seconds after which the first watch ends with 410 Expired.
    fn start_with(
        objects: u64,
        updates: u64,
        rate: Option<u64>,
        expire_after: Option<u64>,
    ) -> Result<Self, Error> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["serve", "--objects", &objects.to_string(), "--updates", &updates.to_string()]);
        if let Some(rate) = rate {
            cmd.args(["--rate", &rate.to_string()]);
        }
        if let Some(secs) = expire_after {
            cmd.args(["--expire-after", &secs.to_string()]);
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
        let deadline = Instant::now() + Duration::from_secs(5);
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

// ---------------------------------------------------------------------------------------------
// The host side

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
            if s.seq >= self.last_seq {
                self.done.notify_one();
            }
        }
        self.inner.reconcile(request)
    }
}

/// An empty vector with room for `n` samples whose pages are already resident, so that RSS
/// over time does not grow with the samples.
fn touched(n: usize) -> Vec<Sample> {
    let mut v = vec![Sample { seq: u64::MAX, nanos: u64::MAX }; n];
    v.clear();
    v
}

fn noop_plugin() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release/test_plugin_panic.wasm")
}

async fn sustained(url: &str, objects: u64, updates: u64, secs: u64) -> Result<Value, Error> {
    let wasm = std::fs::read(noop_plugin())
        .map_err(|e| format!("{}: {e}; run `cargo xtask build-guests`", noop_plugin().display()))?;
    let start = Instant::now();
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
        cache: cache.clone(),
        last_seq: updates.saturating_sub(1),
        samples: parking_lot::Mutex::new(touched(usize::try_from(updates)?)),
        done: Default::default(),
    });
    let controller = Controller::builder("scale", stamping.clone())
        .for_source(source)
        .max_concurrent_reconciles(1)
        .build()?;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (c, s) = (controller.clone(), shutdown.clone());
        async move { c.run(s).await }
    });
    while (cache.len() as u64) < objects {
        if start.elapsed() > Duration::from_secs(600) {
            return Err("the list did not sync within 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = start.elapsed();
    let (rss_synced, _) = rss();
    // RSS and CPU while the updates stream, every sixth of the run.
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    let step = Duration::from_secs((secs / 6).max(1));
    let mut rss_over_time = Vec::new();
    let done = stamping.done.notified();
    tokio::pin!(done);
    let limit = Instant::now() + Duration::from_secs(secs + 60);
    loop {
        tokio::select! {
            _ = &mut done => break,
            _ = tokio::time::sleep(step) => {
                // The bench's own latency samples are not the host's.
                let samples = (stamping.samples.lock().capacity() * std::mem::size_of::<Sample>()) as f64;
                rss_over_time.push(json!({
                    "at_s": wall0.elapsed().as_secs(),
                    "rss_mib": mib(rss().0 as f64),
                    "heap_mib": mib(allocated() as f64 - samples),
                }));
                if Instant::now() > limit {
                    return Err(format!("timed out with {} reconciles of updates", stamping.samples.lock().len()).into());
                }
            }
        }
    }
    let cores = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
    let (rss_end, peak) = rss();
    shutdown.cancel();
    run.await??;
    factory.shutdown();
    let samples = std::mem::take(&mut *stamping.samples.lock());
    let ms = |n: u64| n as f64 / 1e6;
    let third = updates / 3;
    let windows: Vec<Value> = [(updates / 10, third), (third, 2 * third), (2 * third, updates)]
        .iter()
        .filter_map(|&(from, to)| {
            let part: Vec<Sample> = samples.iter().copied().filter(|s| s.seq >= from && s.seq < to).collect();
            latency::percentiles(&part, from).map(|p| json!({ "from_seq": from, "p50_ms": ms(p.p50), "p99_ms": ms(p.p99), "max_ms": ms(p.max) }))
        })
        .collect();
    let all = latency::percentiles(&samples, updates / 10)
        .ok_or("no reconcile of an update after the first tenth")?;
    Ok(json!({
        "sync_s": synced.as_secs_f64(),
        "rss_synced_mib": mib(rss_synced as f64),
        "rss_end_mib": mib(rss_end as f64),
        "peak_mib": mib(peak as f64),
        "rss_over_time": rss_over_time,
        "cores": cores,
        "reconciles": samples.len(),
        "p50_ms": ms(all.p50), "p99_ms": ms(all.p99), "max_ms": ms(all.max),
        "windows": windows,
    }))
}

async fn sync(url: &str, objects: u64) -> Result<Value, Error> {
    let heap_before = allocated();
    let start = Instant::now();
    let informer = SharedIndexInformer::new(InformerOptions { name: "scale".into(), ..Default::default() })?;
    let resource = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    informer.start(Reflector::new(client(url)?, resource, ReflectorConfig::default()));
    while !informer.has_synced() || (informer.indexer().len() as u64) < objects {
        if start.elapsed() > Duration::from_secs(900) {
            return Err("no sync within 15 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = start.elapsed();
    let (rss_synced, peak) = rss();
    let heap = allocated() as f64 - heap_before as f64;
    let cached = informer.indexer().len();
    informer.stop();
    Ok(json!({
        "sync_s": synced.as_secs_f64(),
        "cached": cached,
        "rss_mib": mib(rss_synced as f64),
        "peak_mib": mib(peak as f64),
        "heap_mib": mib(heap),
    }))
}

/// Counts the unchanged objects a relist re-delivers (`on_update` with one resourceVersion).
#[derive(Default)]
struct Redelivered(std::sync::atomic::AtomicU64);

impl Redelivered {
    fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ResourceEventHandler for Redelivered {
    fn on_add(&self, _: &Arc<Object>, _: bool) {}
    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        if old.resource_version() == new.resource_version() {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn on_delete(&self, _: &DeletedObject) {}
}

async fn relist(url: &str, objects: u64) -> Result<Value, Error> {
    let heap_before = allocated();
    let start = Instant::now();
    let informer = SharedIndexInformer::new(InformerOptions { name: "relist".into(), ..Default::default() })?;
    let redelivered = Arc::new(Redelivered::default());
    let _registration = informer.add_event_handler(redelivered.clone(), Some(Duration::ZERO));
    let resource = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    informer.start(Reflector::new(client(url)?, resource, ReflectorConfig::default()));
    while !informer.has_synced() || (informer.indexer().len() as u64) < objects {
        if start.elapsed() > Duration::from_secs(900) {
            return Err("no sync within 15 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = start.elapsed();
    if redelivered.count() > 0 {
        return Err("the relist began before the first sync was measured; raise SCALE_RELIST_AFTER".into());
    }
    let heap_synced = allocated().saturating_sub(heap_before);
    let (rss_synced, _) = rss();
    reset_peak();
    let relist_started = Instant::now();
    while redelivered.count() < objects {
        if relist_started.elapsed() > Duration::from_secs(900) {
            return Err(format!(
                "the relist re-delivered {} of {objects} objects in 15 minutes",
                redelivered.count()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let peak = peak_allocated().saturating_sub(heap_before);
    let heap_after = allocated().saturating_sub(heap_before);
    let (rss_after, rss_peak) = rss();
    informer.stop();
    Ok(json!({
        "sync_s": synced.as_secs_f64(),
        "relisted_at_s": (synced + relist_started.elapsed()).as_secs_f64(),
        "heap_synced_mib": mib(heap_synced as f64),
        "heap_peak_mib": mib(peak as f64),
        "heap_after_mib": mib(heap_after as f64),
        "rss_synced_mib": mib(rss_synced as f64),
        "rss_after_mib": mib(rss_after as f64),
        "rss_peak_mib": mib(rss_peak as f64),
    }))
}

fn consume(args: &[String]) -> Result<(), Error> {
    let url = url_flag(args)?;
    let rt = runtime()?;
    let result = match args.get(1).map(String::as_str) {
        Some("sustained") => rt.block_on(sustained(
            &url,
            flag(args, "--objects")?,
            flag(args, "--updates")?,
            flag(args, "--secs")?,
        ))?,
        Some("sync") => rt.block_on(sync(&url, flag(args, "--objects")?))?,
        Some("relist") => rt.block_on(relist(&url, flag(args, "--objects")?))?,
        _ => return Err("usage: consume <sustained|sync|relist> --url URL ...".into()),
    };
    rt.shutdown_timeout(Duration::from_secs(1));
    let mut result = result;
    result["allocator"] = json!(in_use().map_or("none", Allocator::name));
    println!("{result}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The harness

/// Runs one consumer child process on `allocator` and returns its figures.
fn run(server: &ServerProcess, allocator: Allocator, args: &[&str]) -> Result<Value, Error> {
    let out = Command::new(std::env::current_exe()?)
        .arg("consume")
        .args(args)
        .args(["--url", &server.url])
        .env(ALLOCATOR_ENV, allocator.name())
        .stderr(Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok().filter(Value::is_object))
        .filter(|_| out.status.success())
        .ok_or_else(|| format!("consumer exited with {}: {stdout}", out.status))?;
    if r["allocator"] != allocator.name() {
        return Err(format!("the consumer ran on {} instead of {}", r["allocator"], allocator.name()).into());
    }
    Ok(r)
}

/// `SCALE_ALLOCATORS` (comma-separated names; default the system's and the binary's).
fn allocators() -> Result<Vec<Allocator>, Error> {
    let Ok(names) = std::env::var("SCALE_ALLOCATORS") else {
        let mut all = vec![Allocator::System, BINARY_ALLOCATOR];
        all.dedup();
        return Ok(all);
    };
    names
        .split(',')
        .map(|n| {
            Allocator::from_name(n.trim()).ok_or_else(|| {
                let known: Vec<&str> = Allocator::ALL.iter().map(|a| a.name()).collect();
                format!("SCALE_ALLOCATORS: unknown allocator {n:?} (known: {})", known.join(", ")).into()
            })
        })
        .collect()
}

/// One line comparing each allocator's `key` figure with the first allocator's.
fn compare(results: &[(Allocator, Value)], what: &str, key: &str, unit: &str) {
    let Some((_, first)) = results.first() else { return };
    let base = first[key].as_f64().unwrap_or(0.0);
    let figures: Vec<String> = results
        .iter()
        .enumerate()
        .map(|(i, (a, r))| {
            let v = r[key].as_f64().unwrap_or(0.0);
            if i == 0 {
                format!("{} {v:.2}{unit}", a.name())
            } else {
                format!("{} {v:.2}{unit} ({:.2}×)", a.name(), v / base.max(f64::MIN_POSITIVE))
            }
        })
        .collect();
    println!("    {what}: {}", figures.join(", "));
}

fn orchestrate() -> Result<(), Error> {
    let objects = env_u64("SCALE_OBJECTS", 100_000);
    let rate = env_u64("SCALE_RATE", 10_000);
    let secs = env_u64("SCALE_SECS", 60);
    let sync_objects = env_u64("SCALE_SYNC_OBJECTS", 1_000_000);
    let relist_objects = env_u64("SCALE_RELIST_OBJECTS", 100_000);
    let relist_after = env_u64("SCALE_RELIST_AFTER", 20);
    let updates = rate * secs;
    let allocators = allocators()?;
    let names: Vec<&str> = allocators.iter().map(|a| a.name()).collect();

    println!();
    println!(
        "scale: {objects} ConfigMaps, {rate} updates/s for {secs} s, one no-op Wasm plugin (concurrency 1); allocators {} (the binary's: {})",
        names.join(", "),
        BINARY_ALLOCATOR.name()
    );
    let mut results = Vec::new();
    for &allocator in &allocators {
        println!(" [{}]", allocator.name());
        // A server per run: its one watch streams the updates once.
        let server = ServerProcess::start(objects, updates, Some(rate))?;
        let json_mib = mib(server.json_bytes_per_object * objects as f64);
        match run(
            &server,
            allocator,
            &[
                "sustained",
                "--objects",
                &objects.to_string(),
                "--updates",
                &updates.to_string(),
                "--secs",
                &secs.to_string(),
            ],
        ) {
            Ok(mut r) => {
                print_sustained(&r, json_mib, server.json_bytes_per_object);
                let growth =
                    r["rss_end_mib"].as_f64().unwrap_or(0.0) - r["rss_synced_mib"].as_f64().unwrap_or(0.0);
                r["rss_growth_mib"] = json!(growth);
                results.push((allocator, r));
            }
            Err(e) => println!("  failed: {e}"),
        }
    }
    // For docs/benchmarks.md: RSS over the run, one line per allocator.
    let mut plot = Plot::new(
        "scale",
        format!("RSS while {rate} updates/s stream through {objects} cached objects"),
        "s into the stream",
        "RSS MiB",
    );
    for (allocator, r) in &results {
        let points = r["rss_over_time"].as_array().into_iter().flatten();
        plot.line(
            allocator.name(),
            points.filter_map(|p| Some((p["at_s"].as_f64()?, p["rss_mib"].as_f64()?))),
        );
    }
    plot.record();
    if results.len() > 1 {
        println!("  by allocator (ratio to the first):");
        compare(&results, "RSS after sync", "rss_synced_mib", " MiB");
        compare(&results, "RSS at the end", "rss_end_mib", " MiB");
        compare(&results, "RSS growth while streaming", "rss_growth_mib", " MiB");
        compare(&results, "CPU while streaming", "cores", " cores");
        compare(&results, "p99 event → reconcile", "p99_ms", " ms");
        compare(&results, "list sync", "sync_s", " s");
    }
    // Issue 12: ≤ 350 MB, no growth over time, p99 ≤ 5 ms.
    record(
        &results,
        &format!("sustained: RSS MB at the end of {secs} s"),
        "rss_end_mib",
        "MB",
        1.048_576,
        Some(350.0),
    );
    record(&results, "sustained: RSS growth MB while streaming", "rss_growth_mib", "MB", 1.048_576, None);
    record(
        &results,
        &format!("sustained: p99 ms event → reconcile at {rate}/s"),
        "p99_ms",
        "ms",
        1.0,
        Some(5.0),
    );
    record(&results, "sustained: CPU cores while streaming", "cores", "cores", 1.0, None);

    if sync_objects > 0 {
        println!("sync: {sync_objects} ConfigMaps listed into one informer");
        let mut results = Vec::new();
        for &allocator in &allocators {
            let server = ServerProcess::start(sync_objects, 0, None)?;
            let json_mib = mib(server.json_bytes_per_object * sync_objects as f64);
            match run(&server, allocator, &["sync", "--objects", &sync_objects.to_string()]) {
                Ok(mut r) => {
                    let rss = r["rss_mib"].as_f64().unwrap_or(0.0);
                    let heap = r["heap_mib"].as_f64().unwrap_or(0.0);
                    println!(
                        "  [{}] synced in {:.1} s; JSON {json_mib:.0} MiB; RSS {rss:.0} MiB ({:.2}× JSON), peak {:.0} MiB; heap {heap:.0} MiB ({:.2}× JSON) (target RSS ≤ 1.2× JSON)",
                        allocator.name(),
                        r["sync_s"].as_f64().unwrap_or(0.0),
                        rss / json_mib,
                        r["peak_mib"].as_f64().unwrap_or(0.0),
                        heap / json_mib
                    );
                    r["rss_per_json"] = json!(rss / json_mib);
                    results.push((allocator, r));
                }
                Err(e) => println!("  [{}] failed: {e}", allocator.name()),
            }
        }
        if results.len() > 1 {
            println!("  by allocator (ratio to the first):");
            compare(&results, "RSS / JSON", "rss_per_json", "×");
            compare(&results, "peak RSS", "peak_mib", " MiB");
            compare(&results, "sync time", "sync_s", " s");
        }
        record(&results, &format!("sync of {sync_objects}: RSS ÷ JSON"), "rss_per_json", "×", 1.0, Some(1.2));
        record(&results, &format!("sync of {sync_objects}: seconds"), "sync_s", "s", 1.0, None);
    }

    if relist_objects > 0 {
        println!(
            "relist: {relist_objects} ConfigMaps listed, the watch expired after {relist_after} s, listed again"
        );
        let mut results = Vec::new();
        for &allocator in &allocators {
            let server = ServerProcess::start_with(relist_objects, 0, None, Some(relist_after))?;
            let json_mib = mib(server.json_bytes_per_object * relist_objects as f64);
            match run(&server, allocator, &["relist", "--objects", &relist_objects.to_string()]) {
                Ok(r) => {
                    let num = |k: &str| r[k].as_f64().unwrap_or(0.0);
                    let synced = num("heap_synced_mib");
                    println!(
                        "  [{}] synced in {:.1} s, relisted by {:.1} s; JSON {json_mib:.0} MiB; heap: synced {synced:.0} MiB, peak during the relist {:.0} MiB ({:.2}× synced; target < 2×), after {:.0} MiB; RSS synced {:.0} / after {:.0} / peak {:.0} MiB",
                        allocator.name(),
                        num("sync_s"),
                        num("relisted_at_s"),
                        num("heap_peak_mib"),
                        num("heap_peak_mib") / synced.max(f64::MIN_POSITIVE),
                        num("heap_after_mib"),
                        num("rss_synced_mib"),
                        num("rss_after_mib"),
                        num("rss_peak_mib"),
                    );
                    let ratio = num("heap_peak_mib") / synced.max(f64::MIN_POSITIVE);
                    let mut r = r;
                    r["heap_peak_ratio"] = json!(ratio);
                    results.push((allocator, r));
                }
                Err(e) => println!("  [{}] failed: {e}", allocator.name()),
            }
        }
        if results.len() > 1 {
            println!("  by allocator (ratio to the first):");
            compare(&results, "RSS synced", "rss_synced_mib", " MiB");
            compare(&results, "RSS after the relist", "rss_after_mib", " MiB");
            compare(&results, "peak RSS", "rss_peak_mib", " MiB");
        }
        record(
            &results,
            &format!("relist of {relist_objects}: heap peak ÷ synced heap"),
            "heap_peak_ratio",
            "×",
            1.0,
            Some(2.0),
        );
    }
    Ok(())
}

/// Records the binary allocator's figure `key` (times `factor`) for `cargo xtask bench`'s
/// table, next to glibc's from the same run when both ran.
fn record(
    results: &[(Allocator, Value)],
    measure: &str,
    key: &str,
    unit: &str,
    factor: f64,
    target: Option<f64>,
) {
    let value = |a: Allocator| {
        results.iter().find(|(x, _)| *x == a).and_then(|(_, r)| r[key].as_f64()).map(|v| v * factor)
    };
    let Some(ours) = value(BINARY_ALLOCATOR) else { return };
    let mut figure = Figure::lower("scale", format!("{measure} ({})", BINARY_ALLOCATOR.name()), ours, unit);
    if BINARY_ALLOCATOR != Allocator::System
        && let Some(system) = value(Allocator::System)
    {
        figure = figure.against("glibc malloc", system);
    }
    if let Some(t) = target {
        figure = figure.target(t);
    }
    figure.record();
}

/// The figures of one `sustained` run.
fn print_sustained(r: &Value, json_mib: f64, json_bytes_per_object: f64) {
    println!(
        "  list synced in {:.1} s; objects' JSON {json_mib:.0} MiB ({json_bytes_per_object:.0} B each)",
        r["sync_s"].as_f64().unwrap_or(0.0),
    );
    println!(
        "  RSS after sync {:.0} MiB, at the end {:.0} MiB, peak {:.0} MiB (target ≤ 350 MB)",
        r["rss_synced_mib"].as_f64().unwrap_or(0.0),
        r["rss_end_mib"].as_f64().unwrap_or(0.0),
        r["peak_mib"].as_f64().unwrap_or(0.0)
    );
    let over_time: Vec<String> = r["rss_over_time"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    format!(
                        "{}s {:.0}/{:.0}",
                        p["at_s"],
                        p["rss_mib"].as_f64().unwrap_or(0.0),
                        p["heap_mib"].as_f64().unwrap_or(0.0)
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    println!(
        "  RSS / live heap over time (MiB; the heap without the benchmark's latency samples): {}",
        over_time.join(", ")
    );
    println!("  CPU while streaming: {:.2} cores", r["cores"].as_f64().unwrap_or(0.0));
    println!(
        "  event → reconcile start ({} reconciles): p50 {:.3} ms, p99 {:.3} ms, max {:.1} ms (target p99 ≤ 5 ms)",
        r["reconciles"],
        r["p50_ms"].as_f64().unwrap_or(0.0),
        r["p99_ms"].as_f64().unwrap_or(0.0),
        r["max_ms"].as_f64().unwrap_or(0.0)
    );
    let thirds: Vec<String> = r["windows"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|w| {
                    format!(
                        "from update {}: p50 {:.3} / p99 {:.3} / max {:.1} ms",
                        w["from_seq"],
                        w["p50_ms"].as_f64().unwrap_or(0.0),
                        w["p99_ms"].as_f64().unwrap_or(0.0),
                        w["max_ms"].as_f64().unwrap_or(0.0)
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    println!("  by thirds of the stream: {}", thirds.join("; "));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args),
        Some("consume") => consume(&args),
        _ => orchestrate(),
    };
    if let Err(e) = result {
        println!("{}", json!({ "error": e.to_string() }));
        eprintln!("scale: {e}");
        std::process::exit(1);
    }
}
