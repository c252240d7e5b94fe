//! Workqueue and controller tests: queue properties (proptest, real concurrency), controller
//! result handling and event sources with native closure reconcilers on tokio's paused
//! clock, and end-to-end runs (informer + controller, leader election) against the embedded
//! dev cluster.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use kube::core::GroupVersionKind;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmctrl::controller::handler::{EnqueueForObject, EnqueueForOwner, EnqueueMapped, Mapper};
use wasmctrl::controller::predicate::{GenerationChanged, LabelSelectorPredicate};
use wasmctrl::controller::{
    Action, Claim, Controller, ControllerError, Filter, FilterEvent, HotSwap, ManualSource, Ownership,
    ReconcileError, Reconciler, Request, SourceSpec, Swap, reconciler_fn,
};
use wasmctrl::informer::ResourceEventHandler;
use wasmctrl::metrics::Metrics;
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::queue::{ItemExponential, RateLimitingQueue, WorkQueue};

// ---------------------------------------------------------------------------------------------
// Helpers

fn obj(json: serde_json::Value) -> Arc<Object> {
    Arc::new(Object::from_json(serde_json::to_vec(&json).unwrap().into()).unwrap())
}

fn configmap(ns: &str, name: &str, rv: &str) -> Arc<Object> {
    obj(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "uid": format!("uid-{name}")}
    }))
}

fn with_generation(ns: &str, name: &str, rv: &str, generation: i64) -> Arc<Object> {
    obj(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "generation": generation}
    }))
}

fn owned_pod(name: &str, owner_api: &str, owner_kind: &str, owner: &str, controller: bool) -> Arc<Object> {
    obj(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": "1", "ownerReferences": [
            {"apiVersion": owner_api, "kind": owner_kind, "name": owner, "uid": "u", "controller": controller}
        ]}
    }))
}

fn req(ns: &str, name: &str) -> Request {
    Request { namespace: Some(ns.to_owned()), name: name.to_owned() }
}

fn cm_kind() -> GroupVersionKind {
    GroupVersionKind::gvk("", "v1", "ConfigMap")
}

fn deploy_kind() -> GroupVersionKind {
    GroupVersionKind::gvk("apps", "v1", "Deployment")
}

type Calls = mpsc::UnboundedReceiver<(Request, Instant)>;

/// A reconciler that reports each call and returns scripted results (then `Done`).
fn scripted(results: Vec<Result<Action, ReconcileError>>) -> (Arc<dyn Reconciler>, Calls) {
    let (tx, rx) = mpsc::unbounded_channel();
    let results = Arc::new(Mutex::new(VecDeque::from(results)));
    let r = reconciler_fn(move |request: Request| {
        let result = results.lock().pop_front().unwrap_or(Ok(Action::Done));
        let _ = tx.send((request, Instant::now()));
        async move { result }
    });
    (r, rx)
}

/// Starts `controller` and waits (on the paused clock) until its workers run.
async fn start(
    controller: &Controller,
) -> (CancellationToken, tokio::task::JoinHandle<Result<(), ControllerError>>) {
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let c = controller.clone();
        let t = token.clone();
        async move { c.run(t).await }
    });
    while !controller.readiness().is_ready() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (token, task)
}

/// The value of one exported series, e.g. `controller_runtime_reconcile_total{controller="x",result="error"}`.
fn series(metrics: &Metrics, name: &str) -> Option<f64> {
    metrics.encode().lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Intervals between consecutive call times.
fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

async fn next_calls(calls: &mut Calls, n: usize) -> Vec<(Request, Instant)> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(calls.recv().await.expect("reconciler dropped"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Queue properties

mod queue_properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Add(u8),
        AddAfter(u8, u8),
        Yield,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..6).prop_map(Op::Add),
            1 => ((0u8..6), (0u8..3)).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
            1 => Just(Op::Yield),
        ]
    }

    /// Producers add keys while workers get/done them on a multi-threaded runtime.
    /// Checks: a key is never held by two workers at once, and every add is followed by a
    /// `get` of that key (no change is lost).
    fn run_case(producers: Vec<Vec<Op>>, workers: usize, work_yields: u8) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let q: WorkQueue<u8> = WorkQueue::new();
            let clock = Arc::new(AtomicU64::new(0));
            // Key → stamp of its last add (taken before the add) / of its last get.
            let last_add = Arc::new(Mutex::new(HashMap::<u8, u64>::new()));
            let last_get = Arc::new(Mutex::new(HashMap::<u8, u64>::new()));
            let holding = Arc::new(Mutex::new(HashSet::<u8>::new()));
            let violations = Arc::new(AtomicUsize::new(0));

            let mut worker_tasks = Vec::new();
            for _ in 0..workers {
                let (q, clock, last_get, holding, violations) =
                    (q.clone(), clock.clone(), last_get.clone(), holding.clone(), violations.clone());
                worker_tasks.push(tokio::spawn(async move {
                    while let Some(k) = q.get().await {
                        let stamp = clock.fetch_add(1, Ordering::SeqCst);
                        last_get.lock().insert(k, stamp);
                        if !holding.lock().insert(k) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        for _ in 0..work_yields {
                            tokio::task::yield_now().await;
                        }
                        holding.lock().remove(&k);
                        q.done(&k);
                    }
                }));
            }
            let mut producer_tasks = Vec::new();
            for ops in producers {
                let (q, clock, last_add) = (q.clone(), clock.clone(), last_add.clone());
                producer_tasks.push(tokio::spawn(async move {
                    for op in ops {
                        match op {
                            Op::Add(k) => {
                                let stamp = clock.fetch_add(1, Ordering::SeqCst);
                                last_add.lock().insert(k, stamp);
                                q.add(k);
                            }
                            Op::AddAfter(k, ms) => {
                                let stamp = clock.fetch_add(1, Ordering::SeqCst);
                                last_add.lock().insert(k, stamp);
                                q.add_after(k, Duration::from_millis(u64::from(ms)));
                            }
                            Op::Yield => tokio::task::yield_now().await,
                        }
                    }
                }));
            }
            for p in producer_tasks {
                p.await.unwrap();
            }
            // Wait for the queue to go idle: nothing ready, processing or delayed.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !q.is_idle() {
                assert!(std::time::Instant::now() < deadline, "queue never went idle: {q:?}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            q.shut_down();
            for w in worker_tasks {
                w.await.unwrap();
            }
            assert_eq!(violations.load(Ordering::SeqCst), 0, "a key was held by two workers at once");
            let adds = last_add.lock();
            let gets = last_get.lock();
            for (k, added) in adds.iter() {
                let got = gets.get(k).copied();
                assert!(got.is_some_and(|g| g > *added), "key {k} added at {added} but last got at {got:?}");
            }
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

        #[test]
        fn no_key_twice_at_once_and_no_add_lost(
            producers in proptest::collection::vec(proptest::collection::vec(op(), 1..60), 1..4),
            workers in 1usize..5,
            work_yields in 0u8..4,
        ) {
            run_case(producers, workers, work_yields);
        }
    }

    /// A single-threaded model check on the paused clock: the queue agrees with a simple
    /// model of dirty/processing sets after every operation.
    #[derive(Clone, Debug)]
    enum ModelOp {
        Add(u8),
        Get,
        Done(u8),
    }

    fn model_op() -> impl Strategy<Value = ModelOp> {
        prop_oneof![(0u8..5).prop_map(ModelOp::Add), Just(ModelOp::Get), (0u8..5).prop_map(ModelOp::Done)]
    }

    proptest! {
        #[test]
        fn matches_dirty_processing_model(ops in proptest::collection::vec(model_op(), 1..100)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let q: WorkQueue<u8> = WorkQueue::new();
                let mut ready: VecDeque<u8> = VecDeque::new();
                let mut dirty: HashSet<u8> = HashSet::new();
                let mut processing: HashSet<u8> = HashSet::new();
                for op in ops {
                    match op {
                        ModelOp::Add(k) => {
                            q.add(k);
                            if dirty.insert(k) && !processing.contains(&k) {
                                ready.push_back(k);
                            }
                        }
                        ModelOp::Get => {
                            let expected = ready.pop_front();
                            let got = if expected.is_some() { q.get().await } else { None };
                            assert_eq!(got, expected);
                            if let Some(k) = got {
                                dirty.remove(&k);
                                processing.insert(k);
                            }
                        }
                        ModelOp::Done(k) => {
                            q.done(&k);
                            if processing.remove(&k) && dirty.contains(&k) {
                                ready.push_back(k);
                            }
                        }
                    }
                    assert_eq!(q.len(), ready.len());
                    assert_eq!(q.processing_len(), processing.len());
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Controller: result handling (paused clock)

#[tokio::test(start_paused = true)]
async fn error_backoff_grows_then_success_forgets() {
    let metrics = Metrics::new();
    let err = || Err(ReconcileError::Retryable("boom".into()));
    let (r, mut calls) = scripted(vec![err(), err(), err(), err(), Ok(Action::Done)]);
    let src = ManualSource::new(cm_kind(), true);
    let c =
        Controller::builder("backoff", r).for_source(src.clone()).metrics(metrics.clone()).build().unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    let got = next_calls(&mut calls, 5).await;
    let times: Vec<Instant> = got.iter().map(|(_, t)| *t).collect();
    assert!(got.iter().all(|(r, _)| *r == req("ns", "a")));
    // client-go's default: 5 ms · 2^n per failure.
    assert_eq!(gaps(&times), [5, 10, 20, 40].map(Duration::from_millis));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(calls.try_recv().is_err(), "a success is not retried");
    assert_eq!(c.queue().num_requeues(&req("ns", "a")), 0, "success forgets the failures");
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_total{controller="backoff",result="error"}"#),
        Some(4.0)
    );
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_total{controller="backoff",result="success"}"#),
        Some(1.0)
    );
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_errors_total{controller="backoff"}"#),
        Some(4.0)
    );
    assert_eq!(series(&metrics, r#"workqueue_retries_total{name="backoff"}"#), Some(4.0));
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn terminal_error_is_counted_and_not_retried() {
    let metrics = Metrics::new();
    let (r, mut calls) = scripted(vec![
        Err(ReconcileError::Retryable("transient".into())),
        Err(ReconcileError::Terminal("bad spec".into())),
    ]);
    let src = ManualSource::new(cm_kind(), true);
    let c =
        Controller::builder("terminal", r).for_source(src.clone()).metrics(metrics.clone()).build().unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    next_calls(&mut calls, 2).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(calls.try_recv().is_err(), "a terminal error is not retried");
    assert_eq!(
        c.queue().num_requeues(&req("ns", "a")),
        1,
        "a terminal error keeps the key's failures (controller-runtime does not Forget)"
    );
    assert_eq!(
        series(&metrics, r#"controller_runtime_terminal_reconcile_errors_total{controller="terminal"}"#),
        Some(1.0)
    );
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_errors_total{controller="terminal"}"#),
        Some(2.0)
    );
    // The object changing again reconciles it again.
    src.update(&configmap("ns", "a", "1"), &configmap("ns", "a", "2"));
    next_calls(&mut calls, 1).await;
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn panic_is_retried_with_backoff_and_counted() {
    let metrics = Metrics::new();
    let (tx, mut calls) = mpsc::unbounded_channel();
    let n = Arc::new(AtomicUsize::new(0));
    let r = reconciler_fn(move |request: Request| {
        let first = n.fetch_add(1, Ordering::SeqCst) == 0;
        let _ = tx.send((request, Instant::now()));
        async move {
            if first {
                panic!("reconciler bug");
            }
            Ok(Action::Done)
        }
    });
    let src = ManualSource::new(cm_kind(), true);
    let c =
        Controller::builder("panics", r).for_source(src.clone()).metrics(metrics.clone()).build().unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    let got = next_calls(&mut calls, 2).await;
    assert_eq!(got[1].1 - got[0].1, Duration::from_millis(5));
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_panics_total{controller="panics"}"#),
        Some(1.0)
    );
    assert!(c.readiness().is_ready(), "the worker survived the panic");
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn requeue_after_forgets_failures_and_waits() {
    let metrics = Metrics::new();
    let err = || Err(ReconcileError::Retryable("x".into()));
    let (r, mut calls) =
        scripted(vec![err(), err(), Ok(Action::RequeueAfter(Duration::from_secs(30))), err()]);
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("after", r).for_source(src.clone()).metrics(metrics.clone()).build().unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    let got = next_calls(&mut calls, 5).await;
    let times: Vec<Instant> = got.iter().map(|(_, t)| *t).collect();
    // err (5 ms), err (10 ms), requeue-after 30 s, err: backoff restarts at 5 ms.
    assert_eq!(gaps(&times), [5, 10, 30_000, 5].map(Duration::from_millis));
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_total{controller="after",result="requeue_after"}"#),
        Some(1.0)
    );
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn requeue_uses_the_rate_limiter() {
    let metrics = Metrics::new();
    let (r, mut calls) = scripted(vec![Ok(Action::Requeue), Ok(Action::Requeue), Ok(Action::Requeue)]);
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("requeue", r)
        .for_source(src.clone())
        .rate_limiter(Arc::new(ItemExponential::new(Duration::from_secs(1), Duration::from_secs(60))))
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    let got = next_calls(&mut calls, 4).await;
    let times: Vec<Instant> = got.iter().map(|(_, t)| *t).collect();
    assert_eq!(gaps(&times), [1, 2, 4].map(Duration::from_secs));
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_total{controller="requeue",result="requeue"}"#),
        Some(3.0)
    );
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn reconcile_deadline_counts_as_error() {
    let metrics = Metrics::new();
    let (tx, mut calls) = mpsc::unbounded_channel();
    let n = Arc::new(AtomicUsize::new(0));
    let r = reconciler_fn(move |request: Request| {
        let first = n.fetch_add(1, Ordering::SeqCst) == 0;
        let _ = tx.send((request, Instant::now()));
        async move {
            if first {
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            Ok(Action::Done)
        }
    });
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("deadline", r)
        .for_source(src.clone())
        .reconcile_timeout(Duration::from_secs(2))
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    let got = next_calls(&mut calls, 2).await;
    assert_eq!(got[1].1 - got[0].1, Duration::from_secs(2) + Duration::from_millis(5));
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_errors_total{controller="deadline"}"#),
        Some(1.0)
    );
    token.cancel();
    task.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Controller: start-up, readiness, shutdown, swap

#[tokio::test(start_paused = true)]
async fn workers_start_only_after_sources_synced() {
    let (r, mut calls) = scripted(vec![]);
    let src = ManualSource::new(cm_kind(), true);
    src.set_synced(false);
    let c = Controller::builder("sync", r).for_source(src.clone()).build().unwrap();
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let (c, t) = (c.clone(), token.clone());
        async move { c.run(t).await }
    });
    while src.handler_count() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    src.add(&configmap("ns", "a", "1"), true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(calls.try_recv().is_err(), "no reconcile before sync");
    let r = c.readiness();
    assert!(!r.synced && r.workers == 0 && !r.is_ready());
    src.set_synced(true);
    let (got, _) = calls.recv().await.unwrap();
    assert_eq!(got, req("ns", "a"));
    assert!(c.readiness().is_ready());
    token.cancel();
    task.await.unwrap().unwrap();
    let r = c.readiness();
    assert_eq!(r.workers, 0, "no worker after shutdown");
    assert_eq!(src.handler_count(), 0, "handlers removed on shutdown");
}

#[tokio::test(start_paused = true)]
async fn cache_sync_timeout_is_an_error_and_not_ready() {
    let (r, _calls) = scripted(vec![]);
    let src = ManualSource::new(cm_kind(), true);
    src.set_synced(false);
    let c = Controller::builder("never-synced", r)
        .for_source(src.clone())
        .cache_sync_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // Work handed to the controller before it runs (a predecessor's retry, a ready key).
    c.queue().add(Request { namespace: Some("ns".into()), name: "ready".into() });
    c.queue()
        .add_after(Request { namespace: Some("ns".into()), name: "retry".into() }, Duration::from_secs(600));
    let started = Instant::now();
    let err = c.run(CancellationToken::new()).await.unwrap_err();
    assert_eq!(started.elapsed().as_secs(), 30);
    // A failed run leaves its queue to whoever takes it over: nothing is dropped.
    assert!(!c.queue().is_shutting_down());
    assert_eq!((c.queue().len(), c.queue().queue().waiting_len()), (1, 1));
    assert!(matches!(err, ControllerError::CacheSyncTimeout { .. }));
    let msg = err.to_string();
    assert!(msg.contains("never-synced") && msg.contains("v1/ConfigMap"), "{msg}");
    let r = c.readiness();
    assert!(!r.is_ready());
    assert_eq!(r.error.as_deref(), Some(msg.as_str()));
    assert!(matches!(c.run(CancellationToken::new()).await, Err(ControllerError::AlreadyStarted { .. })));
}

#[test]
fn builder_rejects_bad_configs() {
    let (r, _calls) = scripted(vec![]);
    let no_for = Controller::builder("x", r.clone()).build().unwrap_err();
    assert!(no_for.to_string().contains("no `for` source"), "{no_for}");
    let src = ManualSource::new(cm_kind(), true);
    let zero =
        Controller::builder("x", r.clone()).for_source(src.clone()).max_concurrent_reconciles(0).build();
    assert!(zero.is_err());
    let filter_without_hook =
        Controller::builder("x", r).for_source(SourceSpec::new(src).with_filter()).build().unwrap_err();
    assert!(filter_without_hook.to_string().contains("filter"), "{filter_without_hook}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_in_flight_and_takes_no_new_keys() {
    let release = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicBool::new(false));
    let (tx, mut calls) = mpsc::unbounded_channel();
    let r = reconciler_fn({
        let (release, finished) = (release.clone(), finished.clone());
        move |request: Request| {
            let _ = tx.send(request.clone());
            let (release, finished) = (release.clone(), finished.clone());
            async move {
                if request.name == "slow" {
                    release.notified().await;
                    finished.store(true, Ordering::SeqCst);
                }
                Ok(Action::Done)
            }
        }
    });
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("drain", r).for_source(src.clone()).build().unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "slow", "1"), false);
    assert_eq!(calls.recv().await.unwrap().name, "slow");
    src.add(&configmap("ns", "queued", "1"), false);
    token.cancel();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!task.is_finished(), "shutdown waits for the in-flight reconcile");
    release.notify_one();
    task.await.unwrap().unwrap();
    assert!(finished.load(Ordering::SeqCst), "the in-flight reconcile ran to completion");
    assert!(calls.try_recv().is_err(), "no new key is taken after shutdown");
    // The queue is shut down: later events are ignored.
    src.add(&configmap("ns", "late", "1"), false);
    assert!(c.queue().is_shutting_down());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swap_reconciler_under_load() {
    const KEYS: usize = 40;
    let clock = Arc::new(AtomicU64::new(0));
    let holding = Arc::new(Mutex::new(HashSet::<Request>::new()));
    let last_start = Arc::new(Mutex::new(HashMap::<Request, u64>::new()));
    let violations = Arc::new(AtomicUsize::new(0));
    let in_flight = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let total = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let make = |version: usize| {
        let (clock, holding, last_start, violations) =
            (clock.clone(), holding.clone(), last_start.clone(), violations.clone());
        let (in_flight, total) = (in_flight[version].clone(), total[version].clone());
        reconciler_fn(move |request: Request| {
            let (clock, holding, last_start, violations, in_flight, total) = (
                clock.clone(),
                holding.clone(),
                last_start.clone(),
                violations.clone(),
                in_flight.clone(),
                total.clone(),
            );
            async move {
                in_flight.fetch_add(1, Ordering::SeqCst);
                total.fetch_add(1, Ordering::SeqCst);
                last_start.lock().insert(request.clone(), clock.fetch_add(1, Ordering::SeqCst));
                if !holding.lock().insert(request.clone()) {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
                holding.lock().remove(&request);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(Action::Done)
            }
        })
    };
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("swap", make(0))
        .for_source(src.clone())
        .max_concurrent_reconciles(4)
        .build()
        .unwrap();
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let (c, t) = (c.clone(), token.clone());
        async move { c.run(t).await }
    });
    while !c.readiness().is_ready() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let last_add = Arc::new(Mutex::new(HashMap::<Request, u64>::new()));
    let produce = |rounds: usize| {
        let (src, clock, last_add) = (src.clone(), clock.clone(), last_add.clone());
        tokio::spawn(async move {
            for round in 0..rounds {
                for k in 0..KEYS {
                    let o = configmap("ns", &format!("k{k}"), &round.to_string());
                    last_add.lock().insert(req("ns", &format!("k{k}")), clock.fetch_add(1, Ordering::SeqCst));
                    src.add(&o, false);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let before = produce(20);
    // Swap while the first producer is still going.
    while total[0].load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    c.swap(Swap { reconciler: Some(make(1)), ..Swap::default() }).unwrap();
    // In-flight calls finish on the old reconciler; after that it is never called again.
    while in_flight[0].load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let old_calls = total[0].load(Ordering::SeqCst);
    before.await.unwrap();
    produce(10).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !c.queue().queue().is_idle() {
        assert!(std::time::Instant::now() < deadline, "queue never went idle");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    token.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(violations.load(Ordering::SeqCst), 0, "a key was reconciled twice at once");
    assert_eq!(total[0].load(Ordering::SeqCst), old_calls, "the old reconciler was called after the swap");
    assert!(total[1].load(Ordering::SeqCst) > 0, "the new reconciler serves the queue");
    let (adds, starts) = (last_add.lock(), last_start.lock());
    for (r, added) in adds.iter() {
        let started = starts.get(r).copied();
        assert!(started.is_some_and(|s| s > *added), "{r} added at {added}, last reconciled at {started:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_report_workers_and_reconcile_time() {
    let metrics = Metrics::new();
    let (r, mut calls) = scripted(vec![]);
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("m", r)
        .for_source(src.clone())
        .max_concurrent_reconciles(3)
        .metrics(metrics.clone())
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "a", "1"), false);
    calls.recv().await.unwrap();
    while !c.queue().queue().is_idle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        series(&metrics, r#"controller_runtime_max_concurrent_reconciles{controller="m"}"#),
        Some(3.0)
    );
    assert_eq!(series(&metrics, r#"controller_runtime_active_workers{controller="m"}"#), Some(0.0));
    assert_eq!(
        series(&metrics, r#"controller_runtime_reconcile_time_seconds_count{controller="m"}"#),
        Some(1.0)
    );
    assert_eq!(series(&metrics, r#"workqueue_adds_total{name="m"}"#), Some(1.0));
    assert_eq!(series(&metrics, r#"workqueue_depth{name="m"}"#), Some(0.0));
    token.cancel();
    task.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Event handlers and predicates

fn queue() -> RateLimitingQueue<Request> {
    RateLimitingQueue::default()
}

/// Every request ready in `q`, in order.
async fn drain(q: &RateLimitingQueue<Request>) -> Vec<Request> {
    let mut out = Vec::new();
    while !q.is_empty() {
        let r = q.get().await.unwrap();
        q.done(&r);
        out.push(r);
    }
    out
}

#[tokio::test]
async fn for_object_enqueues_own_key_with_initial_list_low_priority() {
    let q = queue();
    let h = EnqueueForObject::new(q.clone(), vec![]);
    h.on_add(&configmap("ns", "initial-1", "1"), true);
    h.on_add(&configmap("ns", "initial-2", "1"), true);
    h.on_add(&configmap("ns", "live", "1"), false);
    // A resync (same resourceVersion) is low priority too; a real change is not.
    h.on_update(&configmap("ns", "resync", "5"), &configmap("ns", "resync", "5"));
    h.on_update(&configmap("ns", "changed", "5"), &configmap("ns", "changed", "6"));
    h.on_delete(&DeletedObject::FinalStateUnknown {
        key: "ns/gone".into(),
        last_known: configmap("ns", "gone", "1"),
    });
    let order: Vec<String> = drain(&q).await.into_iter().map(|r| r.name).collect();
    assert_eq!(order, ["live", "changed", "gone", "initial-1", "initial-2", "resync"]);
}

#[tokio::test]
async fn owns_enqueues_controller_owner_of_for_kind_including_tombstones() {
    let q = queue();
    let h = EnqueueForOwner::new(q.clone(), vec![], &deploy_kind(), true);
    h.on_add(&owned_pod("p1", "apps/v1", "Deployment", "web", true), false);
    // Not the controller, another kind, another group: ignored.
    h.on_add(&owned_pod("p2", "apps/v1", "Deployment", "not-controller", false), false);
    h.on_add(&owned_pod("p3", "apps/v1", "ReplicaSet", "rs", true), false);
    h.on_add(&owned_pod("p4", "example.com/v1", "Deployment", "other-group", true), false);
    // Another version of the same group/kind counts.
    h.on_add(&owned_pod("p5", "apps/v1beta1", "Deployment", "old-version", true), false);
    assert_eq!(drain(&q).await, [req("ns", "web"), req("ns", "old-version")]);

    // Update that moves the pod to another owner: both owners hear of it.
    h.on_update(
        &owned_pod("p1", "apps/v1", "Deployment", "web", true),
        &owned_pod("p1", "apps/v1", "Deployment", "api", true),
    );
    assert_eq!(drain(&q).await, [req("ns", "web"), req("ns", "api")]);

    // Deletes, known and learned late.
    h.on_delete(&DeletedObject::Known(owned_pod("p1", "apps/v1", "Deployment", "api", true)));
    h.on_delete(&DeletedObject::FinalStateUnknown {
        key: "ns/p9".into(),
        last_known: owned_pod("p9", "apps/v1", "Deployment", "tomb", true),
    });
    assert_eq!(drain(&q).await, [req("ns", "api"), req("ns", "tomb")]);
}

#[tokio::test]
async fn owns_cluster_scoped_owner_has_no_namespace() {
    let q = queue();
    let h = EnqueueForOwner::new(q.clone(), vec![], &GroupVersionKind::gvk("", "v1", "Namespace"), false);
    h.on_add(&owned_pod("p", "v1", "Namespace", "team-a", true), false);
    assert_eq!(drain(&q).await, [Request { namespace: None, name: "team-a".into() }]);
}

#[tokio::test]
async fn watches_map_runs_on_old_and_new() {
    let q = queue();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mapper: Arc<dyn Mapper> = Arc::new({
        let seen = seen.clone();
        move |kind: &GroupVersionKind, o: &Arc<Object>| {
            seen.lock().push(kind.kind.clone());
            o.label("target").map(|t| vec![req("ns", t)]).unwrap_or_default()
        }
    });
    let slot = HotSwap::new(mapper);
    let h = EnqueueMapped::new(q.clone(), vec![], cm_kind(), slot.clone());
    let labelled = |t: &str, rv: &str| {
        obj(
            serde_json::json!({"metadata": {"namespace": "ns", "name": "src", "resourceVersion": rv, "labels": {"target": t}}}),
        )
    };
    h.on_update(&labelled("a", "1"), &labelled("b", "2"));
    assert_eq!(drain(&q).await, [req("ns", "a"), req("ns", "b")]);
    assert_eq!(*seen.lock(), ["ConfigMap", "ConfigMap"]);
    h.on_delete(&DeletedObject::Known(labelled("c", "3")));
    assert_eq!(drain(&q).await, [req("ns", "c")]);
    // A swapped mapper serves the next event.
    slot.store(Arc::new(|_: &GroupVersionKind, _: &Arc<Object>| vec![req("ns", "swapped")]));
    h.on_add(&labelled("d", "4"), false);
    assert_eq!(drain(&q).await, [req("ns", "swapped")]);
}

#[tokio::test(start_paused = true)]
async fn predicates_filter_events_before_the_queue() {
    let (r, mut calls) = scripted(vec![]);
    let src = ManualSource::new(deploy_kind(), true);
    let c = Controller::builder("preds", r)
        .for_source(
            SourceSpec::new(src.clone())
                .predicate(GenerationChanged)
                .predicate(LabelSelectorPredicate("tier!=db".parse().unwrap())),
        )
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    let d1 = with_generation("ns", "d", "1", 1);
    src.add(&d1, false);
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "d"));
    // Status-only write: same generation, new resourceVersion.
    src.update(&d1, &with_generation("ns", "d", "2", 1));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(calls.try_recv().is_err(), "a status-only update is filtered");
    src.update(&with_generation("ns", "d", "2", 1), &with_generation("ns", "d", "3", 2));
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "d"));
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn filter_hook_decides_and_can_be_swapped() {
    let (r, mut calls) = scripted(vec![]);
    let src = ManualSource::new(cm_kind(), true);
    let only_keep: Arc<dyn Filter> = Arc::new(|kind: &GroupVersionKind, e: FilterEvent<'_>| match e {
        FilterEvent::Create(o) => kind.kind == "ConfigMap" && o.name().starts_with("keep"),
        _ => false,
    });
    let c = Controller::builder("filter", r)
        .for_source(SourceSpec::new(src.clone()).with_filter())
        .filter(only_keep)
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    src.add(&configmap("ns", "drop-me", "1"), false);
    src.add(&configmap("ns", "keep-me", "1"), false);
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "keep-me"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(calls.try_recv().is_err());
    c.swap(Swap {
        filter: Some(Arc::new(|_: &GroupVersionKind, _: FilterEvent<'_>| true)),
        ..Swap::default()
    })
    .unwrap();
    src.add(&configmap("ns", "drop-me", "2"), false);
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "drop-me"));
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn owns_and_watches_through_a_running_controller() {
    let (r, mut calls) = scripted(vec![]);
    let deployments = ManualSource::new(deploy_kind(), true);
    let pods = ManualSource::new(GroupVersionKind::gvk("", "v1", "Pod"), true);
    let configmaps = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("wired", r)
        .for_source(deployments.clone())
        .owns(pods.clone())
        .watches(
            configmaps.clone(),
            Arc::new(|_: &GroupVersionKind, o: &Arc<Object>| vec![req("ns", &format!("from-{}", o.name()))]),
        )
        .build()
        .unwrap();
    let (token, task) = start(&c).await;
    pods.delete(&DeletedObject::FinalStateUnknown {
        key: "ns/p".into(),
        last_known: owned_pod("p", "apps/v1", "Deployment", "owner", true),
    });
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "owner"));
    configmaps.add(&configmap("ns", "cm", "1"), false);
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "from-cm"));
    // Swapping the mapper of a running controller (a plugin reload) serves the next event.
    let mapper: Arc<dyn Mapper> =
        Arc::new(|_: &GroupVersionKind, o: &Arc<Object>| vec![req("ns", &format!("v2-{}", o.name()))]);
    c.swap(Swap { mapper: Some(mapper), ..Swap::default() }).unwrap();
    configmaps.add(&configmap("ns", "cm2", "1"), false);
    assert_eq!(calls.recv().await.unwrap().0, req("ns", "v2-cm2"));
    token.cancel();
    task.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Ownership (sharding's hook): admission at enqueue, a claim held across each reconcile

/// Admits every key but `elsewhere-*`; claims every key but `released-*`; counts the claims
/// alive.
#[derive(Default)]
struct FixedOwnership {
    alive: Arc<AtomicUsize>,
    refused: AtomicUsize,
    attached: Mutex<Option<RateLimitingQueue<Request>>>,
}

struct AliveClaim(Arc<AtomicUsize>);

impl Drop for AliveClaim {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ownership for FixedOwnership {
    fn admits(&self, request: &Request) -> bool {
        !request.name.starts_with("elsewhere-")
    }

    fn claim(&self, request: &Request) -> Option<Claim> {
        if request.name.starts_with("released-") {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return None;
        }
        self.alive.fetch_add(1, Ordering::SeqCst);
        Some(Claim::new(AliveClaim(self.alive.clone())))
    }

    fn attach(&self, queue: &RateLimitingQueue<Request>) {
        *self.attached.lock() = Some(queue.clone());
    }
}

#[tokio::test(start_paused = true)]
async fn a_controller_reconciles_only_what_its_ownership_admits_and_claims() {
    let ownership = Arc::new(FixedOwnership::default());
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, usize)>();
    let alive = ownership.alive.clone();
    let reconciler = reconciler_fn(move |r: Request| {
        // The claim of the key being reconciled is alive during its reconcile.
        let _ = tx.send((r.name.clone(), alive.load(Ordering::SeqCst)));
        async { Ok(Action::Done) }
    });
    let src = ManualSource::new(cm_kind(), true);
    let c = Controller::builder("owned", reconciler)
        .for_source(src.clone())
        .ownership(ownership.clone() as Arc<dyn Ownership>)
        .build()
        .unwrap();
    assert!(ownership.attached.lock().is_some(), "the controller hands its queue to the ownership");
    let (token, task) = start(&c).await;
    for name in ["mine-1", "elsewhere-1", "released-1", "mine-2"] {
        src.add(&configmap("ns", name, "1"), false);
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (name, claims) = rx.recv().await.expect("a reconcile");
        assert_eq!(claims, 1, "{name} is reconciled under its claim");
        seen.push(name);
    }
    seen.sort();
    assert_eq!(seen, ["mine-1", "mine-2"]);
    // One worker takes the queue in order: `released-1`, between the two, was refused;
    // `elsewhere-1` was never queued.
    assert_eq!(ownership.refused.load(Ordering::SeqCst), 1);
    assert_eq!(c.queue().len(), 0);
    // A key the ownership queues later (gained) is reconciled too; by then the claims of the
    // earlier reconciles have ended (only its own is alive).
    ownership.attached.lock().clone().expect("attached").add(req("ns", "mine-3"));
    assert_eq!(rx.recv().await.expect("a reconcile"), ("mine-3".to_owned(), 1));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(rx.try_recv().is_err(), "nothing else was reconciled");
    assert_eq!(ownership.alive.load(Ordering::SeqCst), 0, "every claim was released");
    token.cancel();
    task.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Against a live API server of either test backend (see `wasmctrl-testkit`); each test works
// in its own namespace.

mod live {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};
    use wasmctrl::controller::InformerSource;
    use wasmctrl::controller::leader::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
    use wasmctrl::informer::{FactoryOptions, InformerFactory, InformerSpec};
    use wasmctrl_devcluster::FaultRule;
    use wasmctrl_testkit::TestCluster;

    const WAIT: Duration = Duration::from_secs(30);

    /// The test's cluster, a client and a fresh namespace.
    async fn cluster() -> (TestCluster, kube::Client, String) {
        let cluster = TestCluster::start().await.unwrap();
        let client = cluster.client();
        let ns = cluster.namespace().await.unwrap();
        (cluster, client, ns)
    }

    fn cm(ns: &str, name: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}
        }))
        .unwrap()
    }

    /// Waits for the controller's queue to go idle, then throws away the calls seen so far.
    async fn settle(c: &Controller, calls: &mut Calls) {
        tokio::time::timeout(WAIT, async {
            while !c.queue().queue().is_idle() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("queue never went idle");
        while calls.try_recv().is_ok() {}
    }

    /// Receives calls until `want` was seen (bounded wait; not a timing assertion).
    async fn until_seen(calls: &mut Calls, want: &Request) {
        tokio::time::timeout(WAIT, async {
            while calls.recv().await.expect("reconciler dropped").0 != *want {}
        })
        .await
        .unwrap_or_else(|_| panic!("{want} was never reconciled"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn end_to_end_for_and_owns_through_informers() {
        let (_cluster, client, ns) = cluster().await;
        let ns = ns.as_str();
        // Objects present before the informers start arrive as initial-list adds.
        let secrets_api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let unowned: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unowned", "namespace": ns}
        }))
        .unwrap();
        secrets_api.create(&PostParams::default(), &unowned).await.unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        cms.create(&PostParams::default(), &cm(ns, "existing")).await.unwrap();
        let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
        let configmaps =
            InformerSource::new(&factory, InformerSpec::new("v1", "ConfigMap").namespace(ns)).await.unwrap();
        let secrets =
            InformerSource::new(&factory, InformerSpec::new("v1", "Secret").namespace(ns)).await.unwrap();
        let (r, mut calls) = scripted(vec![]);
        let metrics = Metrics::new();
        let c = Controller::builder("e2e", r)
            .for_source(configmaps)
            .owns(secrets)
            .max_concurrent_reconciles(2)
            .metrics(metrics.clone())
            .build()
            .unwrap();
        let token = CancellationToken::new();
        let task = tokio::spawn({
            let (c, t) = (c.clone(), token.clone());
            async move { c.run(t).await }
        });

        until_seen(&mut calls, &req(ns, "existing")).await;
        let created = cms.create(&PostParams::default(), &cm(ns, "parent")).await.unwrap();
        until_seen(&mut calls, &req(ns, "parent")).await;
        assert!(c.readiness().is_ready());
        settle(&c, &mut calls).await;

        // A Secret controlled by the ConfigMap enqueues its owner, also when deleted.
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "child", "namespace": ns, "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "parent",
                "uid": created.metadata.uid.clone().unwrap(), "controller": true
            }]}
        }))
        .unwrap();
        secrets_api.create(&PostParams::default(), &secret).await.unwrap();
        until_seen(&mut calls, &req(ns, "parent")).await;
        settle(&c, &mut calls).await;
        secrets_api.delete("child", &DeleteParams::default()).await.unwrap();
        until_seen(&mut calls, &req(ns, "parent")).await;

        token.cancel();
        task.await.unwrap().unwrap();
        assert!(
            series(&metrics, r#"controller_runtime_reconcile_total{controller="e2e",result="success"}"#)
                .unwrap()
                >= 3.0
        );
        factory.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn controller_on_an_empty_kind_becomes_ready() {
        let (_cluster, client, ns) = cluster().await;
        let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
        let source =
            InformerSource::new(&factory, InformerSpec::new("v1", "Secret").namespace(&ns)).await.unwrap();
        let (r, _calls) = scripted(vec![]);
        let c = Controller::builder("empty", r).for_source(source).build().unwrap();
        let token = CancellationToken::new();
        let task = tokio::spawn({
            let (c, t) = (c.clone(), token.clone());
            async move { c.run(t).await }
        });
        tokio::time::timeout(WAIT, async {
            while !c.readiness().is_ready() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("an empty initial list must count as synced: {:?}", c.readiness()));
        token.cancel();
        task.await.unwrap().unwrap();
        factory.shutdown();
    }

    struct Replica {
        elector: Arc<LeaderElector>,
        controller: Controller,
        calls: Calls,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<Result<(), LeaderElectionError>>,
        factory: InformerFactory,
    }

    /// One replica: its own informers and controller, workers run only while it leads.
    async fn replica(client: &kube::Client, ns: &str, id: &str) -> Replica {
        replica_electing_with(client, client, ns, id).await
    }

    /// A replica whose elector uses `elector_client` (its informers use `client`).
    async fn replica_electing_with(
        client: &kube::Client,
        elector_client: &kube::Client,
        ns: &str,
        id: &str,
    ) -> Replica {
        let mut config = LeaderElectionConfig::new(ns, "wasmctrl-test", id);
        config.lease_duration = Duration::from_secs(4);
        config.renew_deadline = Duration::from_secs(3);
        config.retry_period = Duration::from_millis(500);
        let elector = Arc::new(LeaderElector::new(elector_client.clone(), config).unwrap());
        let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
        let source =
            InformerSource::new(&factory, InformerSpec::new("v1", "ConfigMap").namespace(ns)).await.unwrap();
        let (r, calls) = scripted(vec![]);
        let controller = Controller::builder(format!("le-{id}"), r).for_source(source).build().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (elector, shutdown, c) = (elector.clone(), shutdown.clone(), controller.clone());
            async move {
                elector
                    .run(shutdown, |leading| async move {
                        let _ = c.run(leading).await;
                    })
                    .await
            }
        });
        Replica { elector, controller, calls, shutdown, task, factory }
    }

    /// Waits until the lease of [`replica`]s was renewed `times` more times (its
    /// resourceVersion changed as often).
    async fn until_renewed(client: &kube::Client, ns: &str, times: usize) {
        let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
        let version = || async {
            let lease = leases.get("wasmctrl-test").await.expect("the lease");
            lease.metadata.resource_version.expect("resourceVersion")
        };
        let mut last = version().await;
        tokio::time::timeout(WAIT, async {
            for _ in 0..times {
                loop {
                    let now = version().await;
                    if now != last {
                        last = now;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
        .await
        .expect("the leader renews its lease");
    }

    async fn until_leader(r: &Replica) {
        tokio::time::timeout(WAIT, async {
            while !r.elector.is_leader() || !r.controller.readiness().is_ready() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("never became leader");
    }

    /// A lost lease drops the leading work without draining it: the workers are aborted,
    /// and their count reaches zero as the runtime cancels them.
    async fn workers_stop(c: &Controller) {
        tokio::time::timeout(WAIT, async {
            while c.readiness().workers != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("workers stopped with the lease");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leader_stops_workers_when_renewals_fail() {
        let (cluster, client, ns) = cluster().await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        cms.create(&PostParams::default(), &cm(&ns, "x")).await.unwrap();
        // On the real server the elector acts as a user allowed to use Leases in `ns` until its
        // RoleBinding is deleted (the dev cluster does not authorize: it gets faults instead).
        let holder = "lease-holder";
        let rules = serde_json::json!([{
            "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"],
        }]);
        cluster.grant(&ns, holder, "lease-holder", rules).await.unwrap();
        let elector_client = cluster.client_as(holder).unwrap();
        let mut a = replica_electing_with(&client, &elector_client, &ns, "replica-a").await;
        until_leader(&a).await;
        until_seen(&mut a.calls, &req(&ns, "x")).await;
        // The API refuses every Lease request (dev: 500; real: 403 Forbidden): renewals fail
        // until the renew deadline passes.
        match cluster.dev() {
            Some(dev) => dev.faults().inject(FaultRule::error("/apis/coordination.k8s.io", 500)),
            None => cluster.revoke(&ns, "lease-holder").await.unwrap(),
        }
        let ended = tokio::time::timeout(WAIT, a.task).await.expect("leader never gave up").unwrap();
        assert!(matches!(ended, Err(LeaderElectionError::LeadershipLost { .. })), "{ended:?}");
        assert!(!a.elector.is_leader());
        workers_stop(&a.controller).await;
        a.factory.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leader_stops_workers_when_the_lease_is_taken_over() {
        let (_cluster, client, ns) = cluster().await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        cms.create(&PostParams::default(), &cm(&ns, "x")).await.unwrap();
        let a = replica(&client, &ns, "replica-a").await;
        until_leader(&a).await;
        // Someone else writes the Lease (optimistic concurrency: retry on conflict).
        let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
        loop {
            let mut lease = leases.get("wasmctrl-test").await.unwrap();
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = Some("intruder".into());
            }
            if leases.replace("wasmctrl-test", &PostParams::default(), &lease).await.is_ok() {
                break;
            }
        }
        let ended = tokio::time::timeout(WAIT, a.task).await.expect("leader never noticed").unwrap();
        assert!(matches!(ended, Err(LeaderElectionError::LeadershipLost { .. })), "{ended:?}");
        workers_stop(&a.controller).await;
        a.factory.shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leader_releases_the_lease_when_its_work_ends() {
        let (_cluster, client, ns) = cluster().await;
        let config = LeaderElectionConfig::new(&ns, "short-lived", "only");
        let elector = LeaderElector::new(client.clone(), config).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        tokio::time::timeout(
            WAIT,
            elector.run(CancellationToken::new(), |_leading| async move {
                flag.store(true, Ordering::SeqCst);
            }),
        )
        .await
        .expect("run did not return")
        .unwrap();
        assert!(ran.load(Ordering::SeqCst));
        assert!(!elector.is_leader());
        let lease = Api::<Lease>::namespaced(client, &ns).get("short-lived").await.unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity, None, "released");
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leader_election_only_the_leader_reconciles() {
        let (_cluster, client, ns) = cluster().await;
        let ns = ns.as_str();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        cms.create(&PostParams::default(), &cm(ns, "seen-by-leader")).await.unwrap();

        let mut a = replica(&client, ns, "replica-a").await;
        // Let a win before b campaigns.
        until_leader(&a).await;
        let mut b = replica(&client, ns, "replica-b").await;
        until_seen(&mut a.calls, &req(ns, "seen-by-leader")).await;
        cms.create(&PostParams::default(), &cm(ns, "second")).await.unwrap();
        until_seen(&mut a.calls, &req(ns, "second")).await;
        // b campaigns and fails (it saw a holding the lease), and keeps campaigning while a
        // renews the lease four more times: neither makes b lead or reconcile.
        tokio::time::timeout(WAIT, async {
            while b.elector.observed_holder().as_deref() != Some("replica-a") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("b never saw a holding the lease");
        until_renewed(&client, ns, 4).await;
        assert!(!b.elector.is_leader());
        assert_eq!(b.controller.readiness().workers, 0, "a standby runs no workers");
        assert!(b.calls.try_recv().is_err(), "a standby must not reconcile");
        assert_eq!(b.elector.observed_holder().as_deref(), Some("replica-a"));

        // The leader shuts down and releases the lease: b takes over and reconciles everything.
        a.shutdown.cancel();
        a.task.await.unwrap().unwrap();
        assert!(!a.elector.is_leader());
        while a.calls.try_recv().is_ok() {}
        until_seen(&mut b.calls, &req(ns, "seen-by-leader")).await;
        assert!(b.elector.is_leader());
        cms.create(&PostParams::default(), &cm(ns, "third")).await.unwrap();
        until_seen(&mut b.calls, &req(ns, "third")).await;
        assert!(a.calls.try_recv().is_err(), "the old leader no longer reconciles");
        b.shutdown.cancel();
        b.task.await.unwrap().unwrap();
        a.factory.shutdown();
        b.factory.shutdown();
    }
}
