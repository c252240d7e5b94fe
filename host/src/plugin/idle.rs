//! Releasing plugin instances that stayed idle: their memory goes back to the host, and
//! the next call instantiates afresh (~30 µs plus the guest's `init`).
//!
//! Invariants:
//! - An instance is released only while idle (never during a call), once it has been idle
//!   for at least the engine's idle timeout; a plugin loses nothing but warm state
//!   (every instance runs `init` before its first call, as any new instance does).
//! - The reaper holds plugins weakly: registering a plugin never keeps it alive.
//! - While an [`IdleReaper`] lives, its thread sweeps every quarter of the timeout (between
//!   10 ms and 10 s apart); the thread stops when the reaper is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::PluginError;

/// Something with idle instances to release (a loaded plugin's pool).
pub(crate) trait IdleInstances: Send + Sync {
    /// Drops the instances idle since `cutoff` or earlier; returns how many.
    fn release_idle_since(&self, cutoff: Instant) -> usize;
}

/// The plugins of one engine whose idle instances are released after `idle_for`.
pub(crate) struct IdleReaper {
    idle_for: Duration,
    plugins: Mutex<Vec<Weak<dyn IdleInstances>>>,
}

impl IdleReaper {
    /// A reaper releasing instances idle for `idle_for`, swept by a thread of its own.
    pub fn start(idle_for: Duration) -> Result<(Arc<Self>, ReaperThread), PluginError> {
        let reaper = Arc::new(IdleReaper { idle_for, plugins: Mutex::new(Vec::new()) });
        let period = (idle_for / 4).clamp(Duration::from_millis(10), Duration::from_secs(10));
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, weak) = (stop.clone(), Arc::downgrade(&reaper));
        let thread = std::thread::Builder::new()
            .name("wasm-idle-reaper".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(period);
                    let Some(reaper) = weak.upgrade() else { return };
                    reaper.sweep(Instant::now());
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the idle-instance reaper: {e}")))?;
        Ok((reaper, ReaperThread { stop, thread: Some(thread) }))
    }

    /// Adds a plugin to the sweeps.
    pub fn register(&self, plugin: Weak<dyn IdleInstances>) {
        self.plugins.lock().push(plugin);
    }

    /// Releases every instance that, at `now`, has been idle for the timeout or longer;
    /// forgets plugins that were dropped. Returns how many instances were released.
    pub fn sweep(&self, now: Instant) -> usize {
        let Some(cutoff) = now.checked_sub(self.idle_for) else { return 0 };
        let plugins: Vec<Arc<dyn IdleInstances>> = {
            let mut list = self.plugins.lock();
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        let released: usize = plugins.iter().map(|p| p.release_idle_since(cutoff)).sum();
        if released > 0 {
            tracing::debug!(released, idle_for = ?self.idle_for, "released idle plugin instances");
        }
        released
    }
}

/// The reaper's sweeping thread; stopped and joined on drop.
pub(crate) struct ReaperThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ReaperThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // A sweep can hold the last handle of a plugin, and so of the engine: then
            // the engine is dropped on the reaper's own thread, which must not join itself
            // (it sees the stop flag and ends after this sweep).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts instances idle since a fixed time.
    struct Fake {
        idle_since: Instant,
        idle: AtomicUsize,
    }

    impl IdleInstances for Fake {
        fn release_idle_since(&self, cutoff: Instant) -> usize {
            if self.idle_since <= cutoff { self.idle.swap(0, Ordering::SeqCst) } else { 0 }
        }
    }

    #[test]
    fn sweeps_release_only_past_the_timeout_and_forget_dropped_plugins() {
        let (reaper, _thread) =
            IdleReaper::start(Duration::from_secs(3600)).unwrap_or_else(|e| panic!("{e}"));
        let t0 = Instant::now();
        let plugin = Arc::new(Fake { idle_since: t0, idle: AtomicUsize::new(2) });
        let weak: Weak<dyn IdleInstances> = Arc::downgrade(&plugin) as Weak<dyn IdleInstances>;
        reaper.register(weak);
        assert_eq!(reaper.sweep(t0 + Duration::from_secs(3599)), 0, "not idle long enough");
        assert_eq!(reaper.sweep(t0 + Duration::from_secs(3600)), 2);
        assert_eq!(plugin.idle.load(Ordering::SeqCst), 0);
        drop(plugin);
        assert_eq!(reaper.sweep(t0 + Duration::from_secs(7200)), 0);
        assert!(reaper.plugins.lock().is_empty(), "a dropped plugin is forgotten");
    }
}
