//! A [`Plugin`] as the rest of the host sees it: the controller's [`Reconciler`],
//! [`Mapper`] (`map`) and [`Filter`] (`filter`), and an informer
//! [`ResourceEventHandler`] for its `on-add`/`on-update`/`on-delete` hooks.
//!
//! Invariants:
//! - No Wasm call stalls a tokio worker's other tasks: reconciles and `map`/`filter` run
//!   under `block_in_place` (on a current-thread runtime, reconciles go to
//!   `spawn_blocking`); notifications are queued, in order, to one dispatcher thread per
//!   adapter.
//! - Hooks the plugin did not declare in `init` are never called (nothing is queued).
//! - A trap in a notification hook is logged and counted; it never stops the dispatcher.
//! - A gated adapter ([`PluginReconciler::new_gated`]) queues hook notifications but calls
//!   none until [`PluginReconciler::open_hooks`]; one dropped before that calls none at all.
//!   Hot reload uses this so that only one version of a plugin receives hook calls at a time.
//! - Every reconcile and hook call runs in a span carrying the plugin's name and version.

use std::sync::Arc;
use std::sync::mpsc;

use futures::future::BoxFuture;

use super::plugin::{FilterInput, Plugin};
use crate::controller::{Action, Filter, FilterEvent, Mapper, ReconcileError, Reconciler, Request};
use crate::informer::ResourceEventHandler;
use crate::object::{DeletedObject, Object};
use crate::plugin::spec::Gvk;

enum Notification {
    Add {
        kind: Arc<Gvk>,
        object: Arc<Object>,
        in_initial_list: bool,
    },
    Update {
        kind: Arc<Gvk>,
        old: Arc<Object>,
        new: Arc<Object>,
    },
    Delete {
        kind: Arc<Gvk>,
        object: DeletedObject,
    },
    /// Answered once every notification queued before it was delivered.
    Barrier(mpsc::SyncSender<()>),
}

/// Whether the dispatcher may call hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HookGateState {
    Closed,
    Open,
    /// Dropped before it opened: deliver nothing.
    Abandoned,
}

type HookGate = Arc<(parking_lot::Mutex<HookGateState>, parking_lot::Condvar)>;

fn set_gate(gate: &HookGate, from: HookGateState, to: HookGateState) {
    let (lock, cond) = &**gate;
    let mut g = lock.lock();
    if *g == from {
        *g = to;
        cond.notify_all();
    }
}

/// Waits until the gate is no longer closed; true when it opened.
fn wait_gate(gate: &HookGate) -> bool {
    let (lock, cond) = &**gate;
    let mut g = lock.lock();
    while *g == HookGateState::Closed {
        cond.wait(&mut g);
    }
    *g == HookGateState::Open
}

/// A plugin adapted to the controller and the informers.
pub struct PluginReconciler {
    plugin: Plugin,
    notifications: mpsc::Sender<Notification>,
    gate: HookGate,
}

impl Drop for PluginReconciler {
    fn drop(&mut self) {
        set_gate(&self.gate, HookGateState::Closed, HookGateState::Abandoned);
    }
}

impl PluginReconciler {
    /// Wraps `plugin`; starts its notification dispatcher thread (it ends when the
    /// adapter and every handler from [`PluginReconciler::event_handler`] are dropped).
    pub fn new(plugin: Plugin) -> Result<Arc<Self>, std::io::Error> {
        let adapter = Self::new_gated(plugin)?;
        adapter.open_hooks();
        Ok(adapter)
    }

    /// As [`new`](Self::new), but hook notifications wait (queued, in order) until
    /// [`open_hooks`](Self::open_hooks).
    pub fn new_gated(plugin: Plugin) -> Result<Arc<Self>, std::io::Error> {
        let (tx, rx) = mpsc::channel::<Notification>();
        let p = plugin.clone();
        let gate: HookGate =
            Arc::new((parking_lot::Mutex::new(HookGateState::Closed), parking_lot::Condvar::new()));
        let thread_gate = gate.clone();
        std::thread::Builder::new().name(format!("plugin-{}", plugin.name())).spawn(move || {
            if !wait_gate(&thread_gate) {
                // Never opened: answer barriers, call nothing.
                for n in rx {
                    if let Notification::Barrier(done) = n {
                        let _ = done.send(());
                    }
                }
                return;
            }
            for n in rx {
                let (event, kind, resource_version) = match &n {
                    Notification::Add { kind, object, .. } => ("add", kind.to_string(), object.resource_version()),
                    Notification::Update { kind, new, .. } => ("update", kind.to_string(), new.resource_version()),
                    Notification::Delete { kind, object } => {
                        ("delete", kind.to_string(), object.object().resource_version())
                    }
                    Notification::Barrier(_) => ("barrier", String::new(), ""),
                };
                let span = tracing::debug_span!("hook", plugin = p.name(), version = p.short_version(), event, kind, resource_version);
                let _enter = span.enter();
                let result = match &n {
                    Notification::Add { kind, object, in_initial_list } => {
                        p.on_add_blocking(kind, object.json(), *in_initial_list)
                    }
                    Notification::Update { kind, old, new } => {
                        p.on_update_blocking(kind, old.json(), new.json())
                    }
                    Notification::Delete { kind, object } => {
                        p.on_delete_blocking(kind, object.object().json(), object.is_final_state_unknown())
                    }
                    Notification::Barrier(done) => {
                        let _ = done.send(());
                        Ok(())
                    }
                };
                if let Err(e) = result {
                    tracing::warn!(plugin = p.name(), version = p.short_version(), error = %e, "notification hook failed");
                }
            }
        })?;
        Ok(Arc::new(PluginReconciler { plugin, notifications: tx, gate }))
    }

    /// Lets the dispatcher call the hooks (what was queued first, in order).
    pub fn open_hooks(&self) {
        set_gate(&self.gate, HookGateState::Closed, HookGateState::Open);
    }

    /// The adapted plugin.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Blocks until every notification queued so far has been delivered to the plugin
    /// (before swapping it out, and in tests). On a gated adapter it waits for the gate to
    /// open: call it on open adapters.
    pub fn drain_notifications(&self) {
        let (tx, rx) = mpsc::sync_channel(1);
        if self.notifications.send(Notification::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// A handler for the informer of `kind` that forwards to the plugin's hooks.
    pub fn event_handler(&self, kind: Gvk) -> Arc<dyn ResourceEventHandler> {
        Arc::new(HookHandler {
            kind: Arc::new(kind),
            plugin: self.plugin.clone(),
            tx: self.notifications.clone(),
        })
    }

    /// The plugin's `map` for a `watches` kind: the requests an object of `kind` affects.
    /// A failed call maps to nothing (logged).
    pub fn map(&self, kind: &Gvk, object: &Object) -> Vec<Request> {
        if !self.plugin.hooks().map {
            return Vec::new();
        }
        let _span = tracing::debug_span!("hook", plugin = self.plugin.name(), version = self.plugin.short_version(), event = "map", kind = %kind, resource_version = object.resource_version()).entered();
        match off_worker(|| self.plugin.map_blocking(kind, object.json())) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(plugin = self.plugin.name(), version = self.plugin.short_version(), kind = %kind, object = object.key(), error = %e, "map failed");
                Vec::new()
            }
        }
    }

    /// The plugin's `filter`: whether the event goes on to the queue. A plugin without a
    /// filter passes everything; a failed call passes the event too (logged), since
    /// dropping it could lose a change.
    pub fn filter(&self, kind: &Gvk, event: FilterInput<'_>) -> bool {
        if !self.plugin.hooks().filter {
            return true;
        }
        let _span = tracing::debug_span!("hook", plugin = self.plugin.name(), version = self.plugin.short_version(), event = "filter", kind = %kind).entered();
        off_worker(|| self.plugin.filter_blocking(kind, event)).unwrap_or_else(|e| {
            tracing::warn!(plugin = self.plugin.name(), version = self.plugin.short_version(), kind = %kind, error = %e, "filter failed; letting the event through");
            true
        })
    }
}

/// Runs blocking plugin code without stalling a multi-threaded runtime's worker.
fn off_worker<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn gvk_of(kind: &kube::core::GroupVersionKind) -> Gvk {
    Gvk::new(kind.api_version(), kind.kind.clone())
}

impl Mapper for PluginReconciler {
    fn map(&self, kind: &kube::core::GroupVersionKind, obj: &Arc<Object>) -> Vec<Request> {
        PluginReconciler::map(self, &gvk_of(kind), obj)
    }
}

impl Filter for PluginReconciler {
    fn filter(&self, kind: &kube::core::GroupVersionKind, event: FilterEvent<'_>) -> bool {
        let input = match event {
            FilterEvent::Create(o) => FilterInput::Create(o.json()),
            FilterEvent::Update { old, new } => FilterInput::Update(old.json(), new.json()),
            FilterEvent::Delete(d) => FilterInput::Delete(d.object().json()),
        };
        PluginReconciler::filter(self, &gvk_of(kind), input)
    }
}

impl Reconciler for PluginReconciler {
    fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>> {
        let plugin = self.plugin.clone();
        let span = tracing::info_span!(
            "plugin_reconcile",
            plugin = plugin.name(),
            version = plugin.short_version(),
            request = %request
        );
        let work = async move {
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                // The worker runs the call itself and hands its other tasks to another
                // thread: cheaper per call than a round trip through spawn_blocking (the
                // `plugin` benchmark's "via adapter" row measures this path).
                // (Other futures of this same task wait meanwhile; controller workers are
                // tasks of their own.)
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(|| plugin.reconcile_blocking(&request))
                }
                _ => {
                    let span = tracing::Span::current();
                    tokio::task::spawn_blocking(move || span.in_scope(|| plugin.reconcile_blocking(&request)))
                        .await
                        .unwrap_or_else(|e| Err(ReconcileError::Panic(format!("reconcile task failed: {e}"))))
                }
            }
        };
        Box::pin(tracing::Instrument::instrument(work, span))
    }
}

struct HookHandler {
    kind: Arc<Gvk>,
    plugin: Plugin,
    tx: mpsc::Sender<Notification>,
}

impl HookHandler {
    fn send(&self, n: Notification) {
        // The dispatcher only stops when every sender is gone; this one is alive.
        let _ = self.tx.send(n);
    }
}

impl ResourceEventHandler for HookHandler {
    fn on_add(&self, obj: &Arc<Object>, in_initial_list: bool) {
        if self.plugin.hooks().on_add {
            self.send(Notification::Add { kind: self.kind.clone(), object: obj.clone(), in_initial_list });
        }
    }

    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        if self.plugin.hooks().on_update {
            self.send(Notification::Update { kind: self.kind.clone(), old: old.clone(), new: new.clone() });
        }
    }

    fn on_delete(&self, obj: &DeletedObject) {
        if self.plugin.hooks().on_delete {
            self.send(Notification::Delete { kind: self.kind.clone(), object: obj.clone() });
        }
    }
}
