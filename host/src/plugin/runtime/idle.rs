//! Releasing what idle plugins hold: instances idle past the idle-instance timeout (their
//! memory goes back to the host, and the next call instantiates afresh and runs the guest's
//! `init`), and the compiled code of plugins unused past the idle-code timeout (the next
//! call loads it again from the compile cache). The `many_plugins` benchmark measures both
//! first calls.
//!
//! Invariants:
//! - An instance is released only while idle (never during a call), once it has been idle
//!   for at least the engine's idle-instance timeout; a plugin loses nothing but warm state
//!   (every instance runs `init` before its first call, as any new instance does).
//! - A plugin's code is dropped only by the plugin itself ([`IdlePlugin::drop_code_unused_since`]
//!   decides when that is safe); the reaper only says when to ask.
//! - The reaper holds plugins weakly: registering a plugin never keeps it alive.
//! - While an [`IdleReaper`] lives, its thread sweeps every quarter of the shorter timeout
//!   (between 10 ms and 10 s apart); the thread stops when the reaper is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::plugin::PluginError;

/// Something holding instances and code it can let go of while idle (a loaded plugin).
pub(crate) trait IdlePlugin: Send + Sync {
    /// Drops the instances idle since `cutoff` or earlier; returns how many.
    fn release_idle_since(&self, cutoff: Instant) -> usize;

    /// Drops the compiled code when nothing ran since `cutoff` or earlier (releasing the
    /// instances idle since then first) and the code can be had again later; whether it
    /// was dropped now.
    fn drop_code_unused_since(&self, cutoff: Instant) -> bool;
}

/// The plugins of one engine, whose idle instances are released after `instances_for` and
/// whose code is dropped after `code_for` without a call (each `None`: never).
pub(crate) struct IdleReaper {
    instances_for: Option<Duration>,
    code_for: Option<Duration>,
    plugins: Mutex<Vec<Weak<dyn IdlePlugin>>>,
}

impl IdleReaper {
    /// A reaper with those timeouts (zero counts as `None`), swept by a thread of its own;
    /// `None` when both are off.
    pub fn start(
        instances_for: Option<Duration>,
        code_for: Option<Duration>,
    ) -> Result<Option<(Arc<Self>, ReaperThread)>, PluginError> {
        let (instances_for, code_for) =
            (instances_for.filter(|t| !t.is_zero()), code_for.filter(|t| !t.is_zero()));
        let Some(shortest) = instances_for.into_iter().chain(code_for).min() else { return Ok(None) };
        let reaper = Arc::new(IdleReaper { instances_for, code_for, plugins: Mutex::new(Vec::new()) });
        let period = (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(10));
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, weak) = (stop.clone(), Arc::downgrade(&reaper));
        let thread = std::thread::Builder::new()
            .name("wasm-idle-reaper".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(period);
                    let Some(reaper) = weak.upgrade() else { return };
                    let now = Instant::now();
                    reaper.sweep_instances(now);
                    reaper.sweep_code(now);
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the idle reaper: {e}")))?;
        Ok(Some((reaper, ReaperThread { stop, thread: Some(thread) })))
    }

    /// Adds a plugin to the sweeps.
    pub fn register(&self, plugin: Weak<dyn IdlePlugin>) {
        self.plugins.lock().push(plugin);
    }

    /// The plugins still alive; forgets the dropped ones.
    fn alive(&self) -> Vec<Arc<dyn IdlePlugin>> {
        let mut list = self.plugins.lock();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Releases every instance that, at `now`, has been idle for the idle-instance timeout
    /// or longer. Returns how many instances were released.
    pub fn sweep_instances(&self, now: Instant) -> usize {
        let Some(idle_for) = self.instances_for else { return 0 };
        let Some(cutoff) = now.checked_sub(idle_for) else { return 0 };
        let released: usize = self.alive().iter().map(|p| p.release_idle_since(cutoff)).sum();
        if released > 0 {
            tracing::debug!(released, ?idle_for, "released idle plugin instances");
        }
        released
    }

    /// Drops the code of every plugin that, at `now`, has had no call for the idle-code
    /// timeout or longer (and can drop it). Returns how many dropped their code.
    pub fn sweep_code(&self, now: Instant) -> usize {
        let Some(idle_for) = self.code_for else { return 0 };
        let Some(cutoff) = now.checked_sub(idle_for) else { return 0 };
        self.alive().iter().filter(|p| p.drop_code_unused_since(cutoff)).count()
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
        code_dropped: AtomicBool,
    }

    /// A reaper with those timeouts, in seconds. Its thread's own sweeps (at the real time)
    /// find nothing idle long enough: the tests sweep at times of their choosing.
    fn start(instances: u64, code: Option<u64>) -> (Arc<IdleReaper>, ReaperThread) {
        IdleReaper::start(Some(Duration::from_secs(instances)), code.map(Duration::from_secs))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("a timeout is set"))
    }

    impl IdlePlugin for Fake {
        fn release_idle_since(&self, cutoff: Instant) -> usize {
            if self.idle_since <= cutoff { self.idle.swap(0, Ordering::SeqCst) } else { 0 }
        }

        fn drop_code_unused_since(&self, cutoff: Instant) -> bool {
            self.idle_since <= cutoff && !self.code_dropped.swap(true, Ordering::SeqCst)
        }
    }

    fn fake(t0: Instant, reaper: &IdleReaper) -> Arc<Fake> {
        let plugin = Arc::new(Fake {
            idle_since: t0,
            idle: AtomicUsize::new(2),
            code_dropped: AtomicBool::new(false),
        });
        reaper.register(Arc::downgrade(&plugin) as Weak<dyn IdlePlugin>);
        plugin
    }

    #[test]
    fn sweeps_release_only_past_the_timeout_and_forget_dropped_plugins() {
        let (reaper, _thread) = start(3600, None);
        let t0 = Instant::now();
        let plugin = fake(t0, &reaper);
        assert_eq!(reaper.sweep_instances(t0 + Duration::from_secs(3599)), 0, "not idle long enough");
        assert_eq!(reaper.sweep_instances(t0 + Duration::from_secs(3600)), 2);
        assert_eq!(plugin.idle.load(Ordering::SeqCst), 0);
        assert_eq!(reaper.sweep_code(t0 + Duration::from_secs(360_000)), 0, "no idle-code timeout");
        drop(plugin);
        assert_eq!(reaper.sweep_instances(t0 + Duration::from_secs(7200)), 0);
        assert!(reaper.plugins.lock().is_empty(), "a dropped plugin is forgotten");
    }

    #[test]
    fn code_is_dropped_only_past_the_idle_code_timeout() {
        let (reaper, _thread) = start(60, Some(600));
        let t0 = Instant::now();
        let plugin = fake(t0, &reaper);
        assert_eq!(reaper.sweep_code(t0 + Duration::from_secs(599)), 0, "not unused long enough");
        assert_eq!(reaper.sweep_code(t0 + Duration::from_secs(600)), 1);
        assert!(plugin.code_dropped.load(Ordering::SeqCst));
        assert_eq!(reaper.sweep_code(t0 + Duration::from_secs(601)), 0, "already dropped");
    }

    #[test]
    fn no_reaper_without_a_timeout() {
        let none = IdleReaper::start(None, Some(Duration::ZERO)).unwrap_or_else(|e| panic!("{e}"));
        assert!(none.is_none(), "zero means off");
    }
}
