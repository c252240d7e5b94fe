//! The hand-offs between versions of one plugin: swap, restart, first start and stop.
//!
//! Every reload is a hand-off, never a drop:
//!
//! - **Swap** (new code, or a TOML change that keeps the `for` kind, concurrency and name):
//!   the controller's reconciler is replaced (calls in flight finish on the old version,
//!   every later call — queued keys included — goes to the new one; the queue's processing
//!   set keeps a key from being reconciled by both at once); the new version's handlers are
//!   wired from the old ones (see `generation`) and every cached object of the `for` kind is
//!   enqueued; `map`/`filter` switch to the new version (once the old one's calls
//!   returned) before its handlers are registered, so its synthetic adds are its own;
//!   once the new handlers have synced, the old generation retires (its remaining handlers
//!   deliver their buffers, its last hook call returns), and only then does the new version
//!   receive hook calls.
//! - **Restart** (the `for` kind, concurrency or name changed, or the controller failed): a
//!   new controller is built with the old one's rate limiter (failure counts and backoff
//!   kept) and takes over the old queue (ready keys, delayed keys with their ready time;
//!   keys in flight stay borrowed until their reconcile ends). When the `for` kind changed,
//!   the old queue's keys are of the old kind: they are parked under it (handed back if the
//!   plugin returns to that kind) and the new controller takes what is parked for the new
//!   kind. The new generation is wired as for a swap, the old one retires, and the old
//!   controller winds down in the background (its in-flight reconciles finish).
//! - **First start**: a new controller takes the queue parked for the plugin's name and kind.
//! - **Stop** (TOML removed): the informers first catch up with the server, the queue is
//!   parked, the handlers drain into it, in-flight reconciles finish; the informers are
//!   released.
//!
//! A controller that never synced leaves its queue intact (see the controller runner); the
//! next load restarts it and hands that queue on. Keys of objects that left the plugin's
//! scope are not reconciled as gone (see `scope`).

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::current_generation::{CurrentGenerationSource, ForKeys};
use super::generation::Generation;
use super::leases::Leases;
use super::manager_core::{ManagerCore, Rejection, Running, Slot};
use super::map_filter::kube_gvk;
use super::scope::ScopedReconciler;
use super::slot::VersionSlot;
use crate::config::PluginConfig;
use crate::controller::{Controller, EventSource, Reconciler, Request};
use crate::plugin::PluginReconciler;
use crate::queue::{Priority, RateLimiter, RateLimitingQueue};

/// A new version that passed every check, ready to be handed the plugin.
pub(super) struct Candidate {
    pub config: PluginConfig,
    pub version: String,
    /// Its hooks stay closed until the previous version's last hook call returned.
    pub reconciler: Arc<PluginReconciler>,
    pub leases: Leases,
}

/// Whether going from `old` to `new` needs a new controller (restart) rather than a swap:
/// the `for` kind, the concurrency or the name changed.
pub(super) fn needs_restart(old: &PluginConfig, new: &PluginConfig) -> bool {
    old.for_source.kind != new.for_source.kind || old.concurrency != new.concurrency || old.name != new.name
}

impl ManagerCore {
    fn scoped(&self, candidate: &Candidate) -> Arc<ScopedReconciler> {
        ScopedReconciler::new(
            candidate.reconciler.clone(),
            candidate.config.for_source.kind.clone(),
            &candidate.leases,
            self.deps.informers.clone(),
        )
    }

    /// Swap: the new reconciler first, then the new handlers (wired from the old ones), then
    /// every `for` key once more (a key the old version took meanwhile is done again by the
    /// new one); the old generation retires before the new one receives hook calls. A wiring
    /// failure puts the old version back, untouched.
    pub(super) async fn swap(
        &self,
        running: &mut Option<Running>,
        mut r: Running,
        next: Candidate,
        for_keys: Vec<String>,
    ) -> Result<(), Rejection> {
        let scoped = self.scoped(&next);
        scoped.succeed(&r.scoped, r.generation.leases());
        let Candidate { config, version, reconciler, leases } = next;
        let before = r.controller.swap_reconciler(scoped.clone() as Arc<dyn Reconciler>);
        // The new handlers' `map`/`filter` (their synthetic adds first) are the new version's.
        r.slot.switch_to(reconciler.clone()).await;
        let wired = Generation::wire(
            config,
            version,
            reconciler.clone(),
            &r.slot,
            leases,
            r.controller.queue(),
            Some(&r.generation),
            true,
        );
        let generation = match wired {
            Ok(g) => Arc::new(g),
            Err(e) => {
                // Nothing was taken from the old generation: put its version back.
                r.controller.swap_reconciler(before);
                r.slot.switch_to(r.generation.plugin.clone()).await;
                *running = Some(r);
                return Err(Rejection(e));
            }
        };
        *r.current.lock() = Arc::downgrade(&generation);
        for key in for_keys {
            r.controller.queue().add_with_priority(Request::from_key(&key), Priority::Low);
        }
        self.hand_over_hooks(&r.generation, &generation, &scoped).await;
        r.generation = generation;
        r.scoped = scoped;
        *running = Some(r);
        Ok(())
    }

    /// Restart: a new controller with the old one's rate limiter takes over the old queue
    /// (or, when the `for` kind changed, the queue parked for the new kind, the old queue
    /// being parked under the old one); the old generation retires before the new one
    /// receives hook calls, and the old controller winds down in the background. A refusal
    /// before the queue was handed over leaves the old controller running.
    pub(super) async fn restart(
        &self,
        running: &mut Option<Running>,
        old: Running,
        next: Candidate,
    ) -> Result<(), Rejection> {
        let kind_changed = old.generation.config.for_source.kind != next.config.for_source.kind;
        tracing::info!(plugin = %next.config.name, previous_name = %old.name(), version = %next.version,
            previous = %old.generation.version, kind_changed, controller_alive = old.alive(),
            "restarting the plugin's controller, handing its queue over");
        let scoped = self.scoped(&next);
        if !kind_changed {
            scoped.succeed(&old.scoped, old.generation.leases());
        }
        let name = next.config.name.clone();
        let new_kind = next.config.for_source.kind.clone();
        let (limiter, predecessor) = if kind_changed {
            let parked = self.parked.lock().take(&name, &next.config.for_source.kind);
            (parked.as_ref().map(|q| q.limiter().clone()), parked)
        } else {
            (Some(old.controller.queue().limiter().clone()), None)
        };
        let predecessor_queue = predecessor.clone().unwrap_or_else(|| old.controller.queue().clone());
        old.slot.switch_to(next.reconciler.clone()).await;
        let started = self.start_controller(
            next,
            scoped.clone(),
            old.slot.clone(),
            limiter,
            if kind_changed && predecessor.is_none() { None } else { Some(&predecessor_queue) },
            Some(&old.generation),
        );
        let mut new = match started {
            Ok(new) => new,
            Err(e) => {
                if let Some(q) = predecessor {
                    self.parked.lock().park(&name, &new_kind, q);
                }
                // Refused before the queue was handed over: the old one runs on.
                old.slot.switch_to(old.generation.plugin.clone()).await;
                *running = Some(old);
                return Err(Rejection(e));
            }
        };
        if kind_changed {
            // The old queue's keys are of the old kind: kept for the plugin's return to it.
            let old_kind = old.generation.config.for_source.kind.clone();
            let parked = RateLimitingQueue::new(old.controller.queue().limiter().clone());
            old.controller.queue().hand_over_to(&parked);
            self.parked.lock().park(old.name(), &old_kind, parked);
        }
        self.hand_over_hooks(&old.generation, &new.generation, &scoped).await;
        let Running { stop, task, generation, mut retiring, .. } = old;
        // The old controller hands out nothing more; let its in-flight reconciles
        // finish without holding up the new one.
        retiring.push(tokio::spawn(async move {
            stop.cancel();
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(plugin = %name, error = %e, "previous controller ended with an error")
                }
                Err(e) => tracing::error!(plugin = %name, error = %e, "previous controller task failed"),
            }
            drop(generation);
        }));
        new.retiring = retiring;
        *running = Some(new);
        Ok(())
    }

    /// First start: a new controller, taking over the queue parked for the plugin's name
    /// and `for` kind (if any, with its rate limiter); its hooks open at once. A refusal
    /// parks that queue again.
    pub(super) fn first_start(
        &self,
        running: &mut Option<Running>,
        next: Candidate,
    ) -> Result<(), Rejection> {
        let name = next.config.name.clone();
        let kind = next.config.for_source.kind.clone();
        let parked = self.parked.lock().take(&name, &kind);
        let limiter = parked.as_ref().map(|q| q.limiter().clone());
        let reconciler = next.reconciler.clone();
        let scoped = self.scoped(&next);
        let slot = VersionSlot::new(reconciler.clone());
        match self.start_controller(next, scoped, slot, limiter, parked.as_ref(), None) {
            Ok(r) => {
                reconciler.open_hooks();
                *running = Some(r);
                Ok(())
            }
            Err(e) => {
                if let Some(q) = parked {
                    self.parked.lock().park(&name, &kind, q);
                }
                Err(Rejection(e))
            }
        }
    }

    /// Builds the plugin's controller (with `limiter`, to keep a predecessor's backoff),
    /// takes over `predecessor`'s queue, wires the generation (from `previous`) and starts
    /// the controller; its workers start once the generation has synced.
    fn start_controller(
        &self,
        next: Candidate,
        scoped: Arc<ScopedReconciler>,
        slot: VersionSlot,
        limiter: Option<Arc<dyn RateLimiter<Request>>>,
        predecessor: Option<&RateLimitingQueue<Request>>,
        previous: Option<&Generation>,
    ) -> Result<Running, String> {
        let Candidate { config, version, reconciler, leases } = next;
        let current: Arc<Mutex<Weak<Generation>>> = Arc::new(Mutex::new(Weak::new()));
        let source = Arc::new(CurrentGenerationSource {
            kind: kube_gvk(&config.for_source.kind),
            namespaced: leases.for_namespaced(&config),
            current: current.clone(),
        });
        let mut builder = Controller::builder(config.name.clone(), scoped.clone() as Arc<dyn Reconciler>)
            .for_source(source as Arc<dyn EventSource>)
            .max_concurrent_reconciles(config.concurrency)
            .cache_sync_timeout(self.options.cache_sync_timeout)
            .metrics(self.deps.metrics.clone());
        if let Some(limiter) = limiter {
            builder = builder.rate_limiter(limiter);
        }
        if let Some(sharding) = &self.options.sharding {
            let keys = ForKeys { current: current.clone(), informers: self.deps.informers.clone() };
            builder = builder.ownership(sharding.ownership(&config.name, Arc::new(keys)));
        }
        let controller = builder.build().map_err(|e| e.to_string())?;
        if let Some(old) = predecessor {
            let (ready, delayed, in_flight) = old.hand_over_to(controller.queue());
            tracing::info!(plugin = %config.name, ready, delayed, in_flight, "queue handed over to the new controller");
        }
        let generation = Arc::new(Generation::wire(
            config,
            version,
            reconciler,
            &slot,
            leases,
            controller.queue(),
            previous,
            false,
        )?);
        *current.lock() = Arc::downgrade(&generation);
        let stop = self.shutdown.child_token();
        let run = controller.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move { run.run(token).await });
        Ok(Running { controller, slot, scoped, stop, task, generation, current, retiring: Vec::new() })
    }

    /// Waits (bounded by the sync timeout) for `new`'s handlers to sync, retires `old` —
    /// its remaining handlers deliver their buffers, its last hook call returns — and only
    /// then lets `new`'s version receive hook calls.
    async fn hand_over_hooks(&self, old: &Generation, new: &Generation, scoped: &ScopedReconciler) {
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            synced = tokio::time::timeout(self.options.cache_sync_timeout, new.synced()) => {
                if synced.is_err() {
                    tracing::warn!(plugin = %new.config.name, version = %new.version,
                        "the new version's handlers did not sync in time; retiring the old version anyway");
                }
            }
        }
        let left = |key: &str| scoped.has_or_left(key);
        old.retire(Some(new), Some(&left)).await;
        new.plugin.open_hooks();
    }

    /// Stops a plugin without dropping its work: its informers first catch up with the
    /// server (every change made before the stop began reaches its handlers), its queue is
    /// parked (handed to the plugin if it comes back with the same kind), its handlers
    /// drain into it, its in-flight reconciles finish; then its informers are released.
    pub(super) async fn stop_plugin(&self, id: &str, r: Running) {
        let name = r.name().to_owned();
        if let Some(router) = &self.options.admission {
            // Its webhooks go first: no review reaches a plugin that is stopping.
            router.remove(&name).await;
        }
        // From here until the plugin comes back no version of it runs: a change the server
        // applies after the catch-up below started may reach none.
        tracing::info!(plugin = %name, version = %r.generation.version,
            "plugin stopping: its informers catch up with the server, then its queue is parked");
        self.status.update(id, r.generation.config.toml_path.clone(), |s| {
            s.state = super::status::PluginState::Stopping
        });
        r.generation.catch_up_with_server(&*self.deps.informers).await;
        let parked = RateLimitingQueue::new(r.controller.queue().limiter().clone());
        r.controller.queue().hand_over_to(&parked);
        r.generation.retire(None, None).await;
        r.stop.cancel();
        match r.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(plugin = %name, error = %e, "controller ended with an error"),
            Err(e) => tracing::error!(plugin = %name, error = %e, "controller task failed"),
        }
        for t in r.retiring {
            let _ = t.await;
        }
        self.status.set_probe(id, None);
        self.status.set_info(&name, Some(&r.generation.version), None);
        let kind = r.generation.config.for_source.kind.clone();
        drop(r.generation);
        let pending = super::parked::pending_keys(&parked);
        tracing::info!(plugin = %name, pending, "plugin stopped; no version of it runs; its pending keys are kept for its return");
        self.parked.lock().park(&name, &kind, parked);
    }

    /// Stops every plugin (at shutdown), concurrently: each drains its own in-flight
    /// reconciles.
    pub(super) async fn stop_all(&self) {
        let slots: Vec<(String, Slot)> =
            self.slots.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut set = tokio::task::JoinSet::new();
        for (name, slot) in slots {
            let Some(r) = slot.lock().await.take() else { continue };
            // Stop concurrently: each drains its own in-flight reconciles.
            r.stop.cancel();
            set.spawn(async move {
                let _ = r.task.await;
                for t in r.retiring {
                    let _ = t.await;
                }
                drop(r.generation);
                tracing::info!(plugin = %name, "plugin stopped");
            });
        }
        while set.join_next().await.is_some() {}
    }
}
