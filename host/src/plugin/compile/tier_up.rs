//! Background tier-ups: the Cranelift compiles of components that were loaded with Winch,
//! run one at a time on a thread of their own; each hands its optimised code to the plugins
//! running the component (see [`super::tier`]).
//!
//! Invariants:
//! - Jobs run in the order they were submitted, one at a time, each holding a background
//!   [`super::permits`] permit (so they count against the one-compile-per-core bound and
//!   never take a permit a waiting load could have had). The compile runs in a thread pool
//!   of its own with one thread fewer than the cores (at least one): the baseline compiles
//!   of new loads and the guests' calls, on the global pool and the blocking threads, never
//!   queue behind it.
//! - A job whose component no plugin uses any more (its version replaced or removed, or
//!   its load failed) is abandoned before compiling when that is known in time; a compile
//!   finished for such a component only leaves its artifact in the compile cache (the next
//!   load of those bytes is then warm) and tells no plugin.
//! - A failed compile leaves the plugins on the baseline code (a warning is logged).
//! - The worker holds no plugin and no engine handle between jobs; it stops once the engine
//!   is dropped (after the job it is running, if any).

use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::optimizer::Optimizer;
use super::tier::TieredComponent;
use crate::plugin::PluginError;
use crate::plugin::metrics::{RuntimeMetrics, TierUpLabels};

/// A component loaded with the baseline compiler, to compile with Cranelift.
pub(crate) struct TierUpJob {
    /// The `.wasm`.
    pub wasm: Vec<u8>,
    /// Hex SHA-256 of the `.wasm`.
    pub hash: String,
    /// The shared code to upgrade; gone when no plugin uses it any more.
    pub target: Weak<TieredComponent>,
}

/// The background tier-up thread; stopped (and joined) on drop.
pub(crate) struct TierUpWorker {
    jobs: Option<mpsc::Sender<TierUpJob>>,
    pending: Arc<Pending>,
    thread: Option<JoinHandle<()>>,
}

/// Jobs submitted and not finished yet.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    settled: Condvar,
}

impl Pending {
    fn add(&self) {
        *self.count.lock() += 1;
    }

    fn done(&self) {
        let mut n = self.count.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.settled.notify_all();
        }
    }
}

impl TierUpWorker {
    /// Starts the worker thread and its compile thread pool.
    pub fn start(optimizer: Optimizer, metrics: RuntimeMetrics) -> Result<Self, PluginError> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from).saturating_sub(1).max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("wasm-tier-up-{i}"))
            .start_handler(|_| crate::heap::InCompileArena::bind_for_life())
            .build()
            .map_err(|e| PluginError::Engine(format!("starting the tier-up compile threads: {e}")))?;
        let (jobs, queue) = mpsc::channel::<TierUpJob>();
        let pending = Arc::new(Pending::default());
        let worker = Worker { optimizer, metrics, pool, pending: pending.clone() };
        let thread = std::thread::Builder::new()
            .name("wasm-tier-up".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    worker.run(job);
                    worker.pending.done();
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the tier-up thread: {e}")))?;
        Ok(TierUpWorker { jobs: Some(jobs), pending, thread: Some(thread) })
    }

    /// Queues a tier-up.
    pub fn submit(&self, job: TierUpJob) {
        self.pending.add();
        let sent = self.jobs.as_ref().is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            // The thread is gone (it only ends once this worker is dropped).
            self.pending.done();
        }
    }

    /// Waits until every job submitted so far has finished, at most `timeout`; whether
    /// they have.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut n = self.pending.count.lock();
        while *n > 0 {
            if self.pending.settled.wait_until(&mut n, deadline).timed_out() {
                return *n == 0;
            }
        }
        true
    }
}

impl Drop for TierUpWorker {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the job it is running.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            // A job can hold the last handle of a plugin, and so of the engine: then the
            // engine is dropped on the worker's own thread, which must not join itself (its
            // queue is closed: it ends after this job).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// What the worker thread owns.
struct Worker {
    optimizer: Optimizer,
    metrics: RuntimeMetrics,
    pool: rayon::ThreadPool,
    pending: Arc<Pending>,
}

impl Worker {
    fn count(&self, result: &'static str) {
        self.metrics.tier_ups.get_or_create(&TierUpLabels { result }).inc();
    }

    fn run(&self, job: TierUpJob) {
        let version = job.hash.get(..12).unwrap_or(&job.hash);
        let abandoned = |when: &str| {
            self.count("abandoned");
            tracing::debug!(%version, "tier-up abandoned {when}: no plugin runs this component any more");
        };
        if job.target.strong_count() == 0 {
            return abandoned("before compiling");
        }
        let permit = self.optimizer.permits().enter_background();
        if job.target.strong_count() == 0 {
            return abandoned("before compiling");
        }
        let started = Instant::now();
        let compiled = self.pool.install(|| self.optimizer.compile(&job.wasm, &job.hash, permit));
        let compile = started.elapsed();
        let component = match compiled {
            Ok(c) => c,
            Err(e) => {
                self.count("failed");
                tracing::warn!(%version, error = %e, "tier-up failed: plugins keep running the baseline code");
                return;
            }
        };
        let Some(tiered) = job.target.upgrade() else {
            return abandoned("after compiling (the artifact stays in the compile cache)");
        };
        let since_load = tiered.loaded_at().elapsed();
        let Some(targets) = tiered.complete(component.clone()) else { return };
        drop(tiered);
        self.count("done");
        tracing::debug!(
            %version,
            compile_ms = compile.as_secs_f64() * 1e3,
            since_load_ms = since_load.as_secs_f64() * 1e3,
            plugins = targets.len(),
            "tier-up compiled"
        );
        for target in targets {
            target.tier_up(&component, since_load);
        }
    }
}
