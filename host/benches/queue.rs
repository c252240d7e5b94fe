//! Workqueue and controller benchmark (harness-free; `cargo bench -p wasmctrl --bench queue`).
//!
//! 1. Queue throughput: one producer adds `BENCH_QUEUE_ITEMS` distinct `Request` keys while
//!    1 or 8 workers `get` + `done` them (a 2-thread runtime); reported as items/s, each item
//!    being one add + one get + one done.
//! 2. Event → reconcile-start latency: an in-process fake API server (axum on loopback) streams
//!    watch ADDED events of ~1 KB ConfigMaps at `BENCH_RATE` events/s (default 5000) for
//!    `BENCH_SECONDS` (default 4) through the full host path: kube client → Reflector →
//!    DeltaFIFO → SharedIndexInformer → listener → `for` handler → rate-limited queue → worker →
//!    no-op native reconciler. Latency = reconcile start − the instant the event was handed to
//!    the server's response stream. p50 / p99 / max over all events after the first 10 %. A
//!    second listener on the same informer stamps when it sees each event, which splits the
//!    figure into informer delivery and the controller's handler + queue + worker hand-off.
//!
//! Sizes are environment variables so CI can run it briefly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kube::core::GroupVersionKind;
use tokio_util::sync::CancellationToken;
use wasmctrl::controller::source::SourceError;
use wasmctrl::controller::{Action, Controller, EventRegistration, EventSource, Request, reconciler_fn};
use wasmctrl::informer::{HandlerRegistration, InformerOptions, ResourceEventHandler, SharedIndexInformer};
use wasmctrl::queue::WorkQueue;
use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};

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

/// A ~1 KB ConfigMap watch event.
fn event_line(i: usize) -> Bytes {
    let payload: String = (0..700).map(|j| (b'a' + ((i + j) % 26) as u8) as char).collect();
    Bytes::from(format!(
        concat!(
            r#"{{"type":"ADDED","object":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","#,
            r#""namespace":"bench","uid":"uid-{i}","resourceVersion":"{rv}","labels":{{"app":"bench"}}}},"#,
            r#""data":{{"payload":"{payload}"}}}}}}"#,
            "\n"
        ),
        i = i,
        rv = 1000 + i,
        payload = payload
    ))
}

/// Serves a one-object list, then on the first watch the events the generator sends.
async fn paced_server(events: tokio::sync::mpsc::Receiver<Bytes>) -> (String, tokio::task::JoinHandle<()>) {
    use axum::body::Body;
    use axum::extract::RawQuery;
    use axum::response::Response;
    let events = Arc::new(parking_lot::Mutex::new(Some(events)));
    let app = axum::Router::new().route(
        "/api/v1/namespaces/bench/configmaps",
        axum::routing::get(move |RawQuery(q): RawQuery| {
            let events = events.clone();
            async move {
                let q = q.unwrap_or_default();
                let body = if !q.contains("watch=true") {
                    // One object, so the informer syncs with a non-empty initial list.
                    Body::from(concat!(
                        r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"999"},"#,
                        r#""items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"warm-up","#,
                        r#""namespace":"bench","uid":"warm","resourceVersion":"999"}}]}"#
                    ))
                } else if let Some(rx) = events.lock().take() {
                    let stream = futures::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
                    });
                    Body::from_stream(stream)
                } else {
                    Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
                };
                Response::builder()
                    .header("content-type", "application/json")
                    .body(body)
                    .expect("static response parts are valid")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    // Like a real API server (Go sets TCP_NODELAY by default): without it, Nagle's algorithm
    // holds small watch events back until the client's delayed ACK, tens of milliseconds.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

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

/// Records when a second listener of the same informer sees each event, to split the
/// latency into informer delivery and queue + worker hand-off.
struct SeenAt {
    base: Instant,
    seen: Arc<Vec<AtomicU64>>,
}

impl ResourceEventHandler for SeenAt {
    fn on_add(&self, obj: &Arc<wasmctrl::object::Object>, _: bool) {
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if let Some(i) = obj.name().strip_prefix("cm-").and_then(|i| i.parse::<usize>().ok()) {
            self.seen[i].store(now, Ordering::Relaxed);
        }
    }
    fn on_update(&self, _: &Arc<wasmctrl::object::Object>, _: &Arc<wasmctrl::object::Object>) {}
    fn on_delete(&self, _: &wasmctrl::object::DeletedObject) {}
}

struct Percentiles {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn percentiles(mut nanos: Vec<u64>) -> Percentiles {
    nanos.sort_unstable();
    let pick = |q: f64| Duration::from_nanos(nanos[((nanos.len() - 1) as f64 * q) as usize]);
    Percentiles { p50: pick(0.50), p99: pick(0.99), max: pick(1.0) }
}

struct Latencies {
    to_reconcile: Percentiles,
    to_handler: Percentiles,
    achieved_rate: f64,
}

async fn event_to_reconcile(rate: usize, seconds: usize, workers: usize) -> Latencies {
    let n = rate * seconds;
    let base = Instant::now();
    let nanos = move |t: Instant| u64::try_from(t.duration_since(base).as_nanos()).unwrap_or(u64::MAX);
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let seen: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let count = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(tokio::sync::Notify::new());
    let lines: Vec<Bytes> = (0..n).map(event_line).collect();

    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1024);
    let (url, server) = paced_server(rx).await;
    let client = kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    let informer = SharedIndexInformer::new(InformerOptions { name: "bench".into(), ..Default::default() })
        .expect("informer");
    informer.add_event_handler(Arc::new(SeenAt { base, seen: seen.clone() }), None);
    informer.start(Reflector::new(
        client,
        ApiResource::new("v1", "ConfigMap", "configmaps", true),
        ReflectorConfig { namespace: Some("bench".into()), ..ReflectorConfig::default() },
    ));

    let reconciler = reconciler_fn({
        let (started, count, all_done) = (started.clone(), count.clone(), all_done.clone());
        move |r: Request| {
            let now = Instant::now();
            if let Some(i) = r.name.strip_prefix("cm-").and_then(|i| i.parse::<usize>().ok()) {
                let _ = started[i].compare_exchange(0, nanos(now), Ordering::Relaxed, Ordering::Relaxed);
                if count.fetch_add(1, Ordering::Relaxed) + 1 == n {
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
    while !controller.readiness().is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Generator: events due at base + i/rate; the tokio timer has 1 ms resolution, so each
    // wake-up sends every event that is due (about rate/1000 of them).
    let gen_start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut i = 0;
    while i < n {
        let now = Instant::now();
        while i < n && gen_start + interval * i as u32 <= now {
            sent[i].store(nanos(Instant::now()), Ordering::Relaxed);
            if tx.send(lines[i].clone()).await.is_err() {
                panic!("watch stream closed");
            }
            i += 1;
        }
        tokio::time::sleep_until((gen_start + interval * i as u32).into()).await;
    }
    let gen_took = gen_start.elapsed();
    tokio::time::timeout(Duration::from_secs(60), all_done.notified()).await.expect("all events reconciled");
    shutdown.cancel();
    run.await.expect("run task").expect("controller");
    informer.stop();
    server.abort();

    let skip = n / 10;
    let since_sent = |stamps: &[AtomicU64]| -> Vec<u64> {
        (skip..n)
            .map(|i| stamps[i].load(Ordering::Relaxed).saturating_sub(sent[i].load(Ordering::Relaxed)))
            .collect()
    };
    Latencies {
        to_reconcile: percentiles(since_sent(&started)),
        to_handler: percentiles(since_sent(&seen)),
        achieved_rate: n as f64 / gen_took.as_secs_f64(),
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
    }

    println!(
        "event -> reconcile start, informer + queue + no-op reconciler, {rate} events/s for {seconds} s:"
    );
    for workers in [1, 4] {
        let l = rt.block_on(event_to_reconcile(rate, seconds, workers));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "  {workers} worker(s): reconcile start p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms  (generated {:.0} events/s)",
            ms(l.to_reconcile.p50),
            ms(l.to_reconcile.p99),
            ms(l.to_reconcile.max),
            l.achieved_rate
        );
        println!(
            "              (informer listener p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms)",
            ms(l.to_handler.p50),
            ms(l.to_handler.p99),
            ms(l.to_handler.max)
        );
    }
}
