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
//! - A queued job keeps its `.wasm` on disk, not in the heap: a hundred plugins loading at
//!   once would otherwise hold a hundred copies of their bytes until their turn. The bytes
//!   of all queued jobs go end to end into one unnamed file in the compile cache directory
//!   ([`CompileCache::unnamed_file`]), closed once no queued job holds bytes in it. A job
//!   reads its bytes back when it starts and compiles them only if their SHA-256 is the one
//!   queued (else the tier-up fails, with a warning, and the plugins keep the baseline
//!   code). Without a compile cache, or when the file cannot be written, they stay in memory.

use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use sha2::{Digest, Sha256};

use super::compile_cache::CompileCache;
use super::optimizer::Optimizer;
use super::tier::TieredComponent;
use crate::plugin::PluginError;
use crate::plugin::metrics::{RuntimeMetrics, TierUpLabels};

/// A component loaded with the baseline compiler, to compile with Cranelift.
struct TierUpJob {
    wasm: QueuedWasm,
    /// Hex SHA-256 of the `.wasm`.
    hash: String,
    /// The shared code to upgrade; gone when no plugin uses it any more.
    target: Weak<TieredComponent>,
}

/// The `.wasm` of a queued job (see the module's invariants).
enum QueuedWasm {
    Memory(Vec<u8>),
    Parked(Parked),
}

impl QueuedWasm {
    fn new(wasm: &[u8], spool: Option<&Arc<Spool>>) -> Self {
        let Some(spool) = spool else { return QueuedWasm::Memory(wasm.to_vec()) };
        match spool.park(wasm) {
            Ok(parked) => QueuedWasm::Parked(parked),
            Err(e) => {
                tracing::debug!(error = %e, "cannot park a queued tier-up's wasm in the compile cache directory; keeping it in memory");
                QueuedWasm::Memory(wasm.to_vec())
            }
        }
    }

    /// The bytes, checked against the hex SHA-256 `hash` they were queued with.
    fn read(self, hash: &str) -> Result<Vec<u8>, PluginError> {
        let wasm = match self {
            QueuedWasm::Memory(wasm) => return Ok(wasm),
            QueuedWasm::Parked(parked) => parked
                .read()
                .map_err(|e| PluginError::Compile(format!("reading the queued wasm back: {e}")))?,
        };
        if hex::encode(Sha256::digest(&wasm)) != hash {
            return Err(PluginError::Compile(
                "the queued wasm changed on disk while it waited (not compiled)".into(),
            ));
        }
        Ok(wasm)
    }
}

/// One unnamed file in the compile cache directory holding the `.wasm` of every queued job
/// end to end, closed (and so gone) whenever no job holds bytes in it: one descriptor
/// however many jobs wait.
struct Spool {
    disk: CompileCache,
    state: Mutex<SpoolState>,
}

#[derive(Default)]
struct SpoolState {
    file: Option<std::fs::File>,
    /// Where the next bytes go.
    end: u64,
    /// Jobs whose bytes are in the file.
    held: usize,
}

/// A job's bytes in the spool; released when dropped.
struct Parked {
    spool: Arc<Spool>,
    offset: u64,
    len: usize,
}

impl Spool {
    fn park(self: &Arc<Self>, wasm: &[u8]) -> std::io::Result<Parked> {
        let mut state = self.state.lock();
        let file = match state.file.take() {
            Some(file) => file,
            None => self.disk.unnamed_file()?,
        };
        let offset = state.end;
        let written = file.write_all_at(wasm, offset);
        // A file no job holds bytes in is closed (dropped here) rather than kept.
        if written.is_ok() || state.held > 0 {
            state.file = Some(file);
        }
        written?;
        state.end += wasm.len() as u64;
        state.held += 1;
        Ok(Parked { spool: self.clone(), offset, len: wasm.len() })
    }
}

impl Parked {
    fn read(&self) -> std::io::Result<Vec<u8>> {
        let state = self.spool.state.lock();
        let file = state.file.as_ref().ok_or_else(|| std::io::Error::other("the spool file is closed"))?;
        let mut wasm = vec![0; self.len];
        file.read_exact_at(&mut wasm, self.offset)?;
        Ok(wasm)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut state = self.spool.state.lock();
        state.held = state.held.saturating_sub(1);
        if state.held == 0 {
            *state = SpoolState::default();
        }
    }
}

/// The background tier-up thread; stopped (and joined) on drop.
pub(crate) struct TierUpWorker {
    jobs: Option<mpsc::Sender<TierUpJob>>,
    /// Where queued jobs keep their `.wasm`.
    spool: Option<Arc<Spool>>,
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
    /// Starts the worker thread and its compile thread pool; queued jobs keep their `.wasm`
    /// in `spool`, when given.
    pub fn start(
        optimizer: Optimizer,
        metrics: RuntimeMetrics,
        spool: Option<CompileCache>,
    ) -> Result<Self, PluginError> {
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
        let spool = spool.map(|disk| Arc::new(Spool { disk, state: Mutex::default() }));
        Ok(TierUpWorker { jobs: Some(jobs), spool, pending, thread: Some(thread) })
    }

    /// Queues the tier-up of `target`, the baseline code of `wasm` (hex SHA-256 `hash`).
    pub fn submit(&self, wasm: &[u8], hash: String, target: Weak<TieredComponent>) {
        let job = TierUpJob { wasm: QueuedWasm::new(wasm, self.spool.as_ref()), hash, target };
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
        let compiled = job
            .wasm
            .read(&job.hash)
            .and_then(|wasm| self.pool.install(|| self.optimizer.compile(&wasm, &job.hash, permit)));
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
        // What the switch freed (the Winch instances and code, the compile's buffers) goes
        // back to the system now, not in seconds, as after a load.
        if !crate::heap::release_free_pages() {
            tracing::debug!(%version, "jemalloc refused to purge its free pages");
        }
    }
}
