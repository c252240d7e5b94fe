//! The version of a plugin that its handlers' `map` and `filter` calls go to.
//!
//! Handlers outlive versions (a handler the next version needs unchanged is carried over),
//! so they do not call a version directly: they call whichever version the plugin's slot
//! holds. Invariant: `map`/`filter` calls of two versions never overlap. A
//! [`VersionSlot::switch`] waits until every call that started on the old version has
//! returned before the new version takes calls, and calls that arrive meanwhile wait for
//! the switch (a few milliseconds, or the rest of a slow call).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::plugin::PluginReconciler;

struct State {
    current: Arc<PluginReconciler>,
    in_flight: usize,
    switching: bool,
}

/// A plugin's current version for `map` and `filter`. Cheap to clone: clones share one slot.
#[derive(Clone)]
pub(crate) struct VersionSlot {
    inner: Arc<(Mutex<State>, Condvar)>,
}

/// Ends a call's count however the call ends.
struct CallGuard<'a>(&'a (Mutex<State>, Condvar));

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.0.0.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            self.0.1.notify_all();
        }
    }
}

impl VersionSlot {
    pub fn new(plugin: Arc<PluginReconciler>) -> Self {
        VersionSlot {
            inner: Arc::new((
                Mutex::new(State { current: plugin, in_flight: 0, switching: false }),
                Condvar::new(),
            )),
        }
    }

    /// Runs `f` on the current version (blocking while a switch is in progress).
    pub fn call<R>(&self, f: impl FnOnce(&PluginReconciler) -> R) -> R {
        let plugin = {
            let mut s = self.inner.0.lock();
            while s.switching {
                self.inner.1.wait(&mut s);
            }
            s.in_flight += 1;
            s.current.clone()
        };
        let _guard = CallGuard(&self.inner);
        f(&plugin)
    }

    /// Makes `plugin` the version calls go to, once the calls in flight have returned.
    /// Blocking: run it off the async workers.
    pub fn switch(&self, plugin: Arc<PluginReconciler>) {
        let mut s = self.inner.0.lock();
        while s.switching {
            self.inner.1.wait(&mut s);
        }
        s.switching = true;
        while s.in_flight > 0 {
            self.inner.1.wait(&mut s);
        }
        s.current = plugin;
        s.switching = false;
        self.inner.1.notify_all();
    }

    /// [`switch`](Self::switch) from async code.
    pub async fn switch_to(&self, plugin: Arc<PluginReconciler>) {
        let me = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || me.switch(plugin)).await {
            tracing::error!(error = %e, "switching the plugin version of map/filter failed");
        }
    }
}
