//! Workqueue and controller benchmark (harness-free; `cargo bench -p wasmctrl --bench queue`).
//!
//! 1. Queue throughput: one producer adds `BENCH_QUEUE_ITEMS` distinct `Request` keys while
//!    1 or 8 workers `get` + `done` them (a 2-thread runtime); reported as items/s, each item
//!    being one add + one get + one done.
//! 2. Event → reconcile-start latency: the benchmarks' stream server (`wasmctrl_bench_support`,
//!    on its own thread, HTTP on loopback) lists `BENCH_OBJECTS` (default 1000) ~2 KB
//!    ConfigMaps, then after a 1 s warm-up streams updates at `BENCH_RATE` events/s (default
//!    5000) for `BENCH_SECONDS` (default 4) through the full host path: kube client →
//!    Reflector → DeltaFIFO → SharedIndexInformer → listener → `for` handler → rate-limited
//!    queue → worker → no-op native reconciler. Latency = reconcile start − the `sent` stamp
//!    the server wrote into the object (read from the cache). p50 / p99 / max over the updates
//!    after the first 10 %. A second listener on the same informer takes the same sample when
//!    it sees each update, which splits the figure into informer delivery and the
//!    controller's handler + queue + worker hand-off. (`cargo bench --bench anchors` runs the
//!    same measurement with a Wasm plugin, next to kube-rs and controller-runtime.)
//!
//! Sizes are environment variables so CI can run it briefly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::core::GroupVersionKind;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use wasmctrl::controller::source::SourceError;
use wasmctrl::controller::{Action, Controller, EventRegistration, EventSource, Request, reconciler_fn};
use wasmctrl::informer::{HandlerRegistration, InformerOptions, ResourceEventHandler, SharedIndexInformer};
use wasmctrl::queue::WorkQueue;
use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};
use wasmctrl_bench_support::latency::{self, Percentiles, Sample};
use wasmctrl_bench_support::{BackgroundServer, Figure, Pace, StreamConfig, unix_nanos};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// 1. Queue throughput

async fn queue_throughput(items: usize, workers: usize) -> Duration {
    let keys: Vec<Request> = (0..items)
        .map(|i| Request { namespace: Some(format!("ns-{}", i % 10)), name: format!("cm-{i}") })
        .collect();
    let q: WorkQueue<Request> = WorkQueue::new();
    let processed = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (q, processed, done) = (q.clone(), processed.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(k) = q.get().await {
                std::hint::black_box(&k);
                q.done(&k);
                if processed.fetch_add(1, Ordering::Relaxed) + 1 == items {
                    done.notify_one();
                }
            }
        }));
    }
    let producer = tokio::spawn({
        let q = q.clone();
        async move {
            for (i, k) in keys.into_iter().enumerate() {
                q.add(k);
                if i % 256 == 255 {
                    tokio::task::yield_now().await;
                }
            }
        }
    });
    done.notified().await;
    let took = start.elapsed();
    producer.await.expect("producer");
    q.shut_down();
    for t in tasks {
        t.await.expect("worker");
    }
    took
}

// ---------------------------------------------------------------------------------------------
// 2. Event → reconcile-start latency

/// A started informer as the controller's `for` source.
struct InformerOnly {
    informer: SharedIndexInformer,
}

struct Registration(HandlerRegistration);

impl EventRegistration for Registration {
    fn has_synced(&self) -> bool {
        self.0.has_synced()
    }
    fn remove(&self) {
        self.0.remove();
    }
}

impl EventSource for InformerOnly {
    fn gvk(&self) -> GroupVersionKind {
        GroupVersionKind::gvk("", "v1", "ConfigMap")
    }
    fn namespaced(&self) -> bool {
        true
    }
    fn register(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError> {
        Ok(Box::new(Registration(self.informer.add_event_handler(handler, None))))
    }
}

/// Takes a latency sample when a second listener of the same informer sees each update,
/// to split the latency into informer delivery and queue + worker hand-off.
struct SeenAt {
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl ResourceEventHandler for SeenAt {
    fn on_add(&self, _: &Arc<wasmctrl::object::Object>, _: bool) {}
    fn on_update(&self, _: &Arc<wasmctrl::object::Object>, new: &Arc<wasmctrl::object::Object>) {
        if let Some(s) = latency::sample(|k| new.annotation(k), unix_nanos()) {
            self.samples.lock().push(s);
        }
    }
    fn on_delete(&self, _: &wasmctrl::object::DeletedObject) {}
}

struct Latencies {
    to_reconcile: Percentiles,
    to_handler: Percentiles,
}

async fn event_to_reconcile(objects: usize, rate: u32, seconds: u64, workers: usize) -> Latencies {
    let n = u64::from(rate) * seconds;
    let pace = Pace::PerSecond { rate, warmup: Duration::from_secs(1) };
    let server =
        BackgroundServer::start(StreamConfig { objects, updates: n, pace, expire_first_watch: None })
            .expect("stream server");
    let started: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let seen: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let all_done = Arc::new(tokio::sync::Notify::new());

    let client =
        kube::Client::try_from(kube::Config::new(server.url().parse().expect("url"))).expect("client");
    let informer = SharedIndexInformer::new(InformerOptions { name: "bench".into(), ..Default::default() })
        .expect("informer");
    informer.add_event_handler(Arc::new(SeenAt { samples: seen.clone() }), None);
    informer.start(Reflector::new(
        client,
        ApiResource::new("v1", "ConfigMap", "configmaps", true),
        ReflectorConfig::default(),
    ));

    let reconciler = reconciler_fn({
        let (cache, started, all_done) = (informer.indexer(), started.clone(), all_done.clone());
        move |r: Request| {
            let now = unix_nanos();
            if let Some(obj) = cache.get_by_name(r.namespace.as_deref(), &r.name)
                && let Some(s) = latency::sample(|k| obj.annotation(k), now)
            {
                started.lock().push(s);
                if s.seq == n - 1 {
                    all_done.notify_one();
                }
            }
            async { Ok(Action::Done) }
        }
    });
    let controller = Controller::builder("bench", reconciler)
        .for_source(Arc::new(InformerOnly { informer: informer.clone() }))
        .max_concurrent_reconciles(workers)
        .build()
        .expect("controller");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (c, s) = (controller.clone(), shutdown.clone());
        async move { c.run(s).await }
    });
    tokio::time::timeout(Duration::from_secs(seconds + 60), all_done.notified())
        .await
        .expect("all events reconciled");
    shutdown.cancel();
    run.await.expect("run task").expect("controller");
    informer.stop();
    drop(server);

    let skip = n / 10;
    Latencies {
        to_reconcile: latency::percentiles(&started.lock(), skip).expect("reconciles of updates"),
        to_handler: latency::percentiles(&seen.lock(), skip).expect("updates seen"),
    }
}

fn main() {
    let items = env_usize("BENCH_QUEUE_ITEMS", 200_000);
    let rate = env_usize("BENCH_RATE", 5_000);
    let seconds = env_usize("BENCH_SECONDS", 4).max(1);
    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    println!("workqueue throughput ({items} distinct Request keys, add+get+done each, best of {rounds}):");
    for workers in [1, 8] {
        let best =
            (0..rounds).map(|_| rt.block_on(queue_throughput(items, workers))).min().unwrap_or_default();
        println!(
            "  {workers} worker(s): {:>10.0} items/s ({:.2} µs/item)",
            items as f64 / best.as_secs_f64(),
            best.as_secs_f64() * 1e6 / items as f64
        );
        Figure::higher(
            "queue",
            format!("workqueue add+get+done/s, {workers} worker(s)"),
            items as f64 / best.as_secs_f64(),
            "items/s",
        )
        .record();
    }

    let objects = env_usize("BENCH_OBJECTS", 1000).max(1);
    let rate = u32::try_from(rate).unwrap_or(u32::MAX).max(1);
    println!(
        "event -> reconcile start, informer + queue + no-op reconciler, {rate} events/s for {seconds} s ({objects} objects):"
    );
    for workers in [1, 4] {
        let l = rt.block_on(event_to_reconcile(objects, rate, seconds as u64, workers));
        let ms = |nanos: u64| nanos as f64 / 1e6;
        println!(
            "  {workers} worker(s): reconcile start p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  ({} samples)",
            ms(l.to_reconcile.p50),
            ms(l.to_reconcile.p99),
            ms(l.to_reconcile.max),
            l.to_reconcile.count
        );
        Figure::lower(
            "queue",
            format!("event → reconcile p99 ms at {rate}/s, native no-op, {workers} worker(s)"),
            ms(l.to_reconcile.p99),
            "ms",
        )
        .record();
        println!(
            "              (informer listener p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms)",
            ms(l.to_handler.p50),
            ms(l.to_handler.p99),
            ms(l.to_handler.max)
        );
    }
}
