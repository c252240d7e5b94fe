//! `SharedIndexInformer` (client-go `shared_informer.go`): a reflector feeding a DeltaFIFO,
//! a processing loop applying each key's deltas to the indexer (`HandleDeltas`) and fanning
//! notifications out to listeners, plus per-listener resync.
//!
//! Invariants:
//! - the cache is only written by `handle_deltas` (through the informer's one [`Writer`]),
//!   under the FIFO lock, and a popped batch's
//!   notifications are handed to the listeners before that lock is released; registering a
//!   handler takes the same lock, so its synthetic adds are exactly the cache at that instant
//!   and every later change reaches it as a notification;
//! - notifications are distributed in FIFO pop order, so each listener sees each key's
//!   changes in order;
//! - an update whose resourceVersion did not change (a resync, or an unchanged object of a
//!   relist) is a *sync*: it goes only to listeners in the processor's syncing set, as in
//!   client-go. A listener starts in that set and leaves it only when a resync check runs,
//!   so with no resync period every handler sees such an update for every unchanged object
//!   after a relist (controller predicates such as `ResourceVersionChanged` filter them);
//! - once stopped (explicitly or by the last [`InformerLease`](super::InformerLease) going
//!   away) the reflector and processing loop end and every listener thread exits;
//! - a handler can leave without losing what it was sent: [`HandlerRegistration::remove_draining`]
//!   delivers its buffer first, and [`SharedIndexInformer::replace_event_handler`] swaps it
//!   for a successor at one instant of the informer's stream (under the FIFO lock): every
//!   notification before that instant goes to the old handler or, when handed over, to the
//!   successor ahead of its synthetic adds; every one after it goes to the successor only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::ResourceEventHandler;
use super::processor::{Listener, Notification, Processor, SyncState};
use crate::cache::{IndexError, IndexFunc, Indexer, Writer};
use crate::fifo::{Delta, DeltaFifo, KnownObjects, PopOutcome};
use crate::object::DeletedObject;
use crate::source::Reflector;

/// How many keys the processing loop pops per FIFO lock.
const POP_BATCH: usize = 256;

/// Options of a [`SharedIndexInformer`].
#[derive(Debug, Clone, Default)]
pub struct InformerOptions {
    /// Name used in logs (e.g. `v1/ConfigMap ns=default`).
    pub name: String,
    /// Extra indexes (the namespace index always exists).
    pub indexes: Vec<(String, IndexFunc)>,
    /// Resync period of handlers registered without one (`None`: no resync).
    pub default_resync: Option<Duration>,
}

struct Shared {
    name: Arc<str>,
    /// The cache's only writer; `handle_deltas` is its only user.
    cache: Writer,
    /// Read handle on the same cache.
    indexer: Indexer,
    fifo: Arc<DeltaFifo>,
    processor: Processor,
    /// Notifications of the batch being popped (touched only under the FIFO lock).
    pending: Mutex<Vec<(Notification, bool)>>,
    sync: Arc<SyncState>,
    started: AtomicBool,
    cancel: CancellationToken,
    default_resync: Option<Duration>,
}

/// One watch + one cache of one kind, shared by every handler registered on it.
///
/// Obtain one from an [`InformerFactory`](super::InformerFactory) (shared, leased) or build
/// one directly and feed its [`fifo`](Self::fifo) yourself:
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use wasmctrl_runtime::informer::{InformerOptions, ResourceEventHandler, SharedIndexInformer};
/// use wasmctrl_runtime::object::{DeletedObject, Object};
///
/// struct Print;
/// impl ResourceEventHandler for Print {
///     fn on_add(&self, obj: &Arc<Object>, _initial: bool) { println!("add {}", obj.key()) }
///     fn on_update(&self, _old: &Arc<Object>, new: &Arc<Object>) { println!("update {}", new.key()) }
///     fn on_delete(&self, obj: &DeletedObject) { println!("delete {}", obj.key()) }
/// }
///
/// let informer = SharedIndexInformer::new(InformerOptions::default()).unwrap();
/// let registration = informer.add_event_handler(Arc::new(Print), None);
/// informer.start_processing();
/// informer.fifo().replace(vec![Arc::new(Object::from_json(r#"{"metadata":{"name":"a"}}"#.into()).unwrap())]);
/// registration.wait_for_sync().await;
/// assert!(informer.indexer().get("a").is_some());
/// informer.stop();
/// # });
/// ```
#[derive(Clone)]
pub struct SharedIndexInformer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SharedIndexInformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedIndexInformer")
            .field("name", &self.shared.name)
            .field("synced", &self.has_synced())
            .field("listeners", &self.shared.processor.len())
            .finish()
    }
}

impl SharedIndexInformer {
    /// A stopped informer with an empty cache.
    pub fn new(options: InformerOptions) -> Result<Self, IndexError> {
        let cache = Writer::new();
        cache.add_indexers(options.indexes)?;
        let indexer = cache.reader();
        let known: Arc<dyn KnownObjects> = Arc::new(indexer.clone());
        Ok(Self {
            shared: Arc::new(Shared {
                name: Arc::from(options.name),
                cache,
                indexer,
                fifo: Arc::new(DeltaFifo::new(Some(known))),
                processor: Processor::default(),
                pending: Mutex::new(Vec::new()),
                sync: Arc::new(SyncState::default()),
                started: AtomicBool::new(false),
                cancel: CancellationToken::new(),
                default_resync: options.default_resync,
            }),
        })
    }

    /// The informer's name (for logs).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// A cheap-to-clone read handle on the cache.
    pub fn indexer(&self) -> Indexer {
        self.shared.indexer.clone()
    }

    /// The DeltaFIFO the source feeds (the reflector; tests and custom sources may feed it).
    pub fn fifo(&self) -> &Arc<DeltaFifo> {
        &self.shared.fifo
    }

    /// Adds indexes to the (possibly running) cache; existing objects are indexed at once.
    pub fn add_indexers(&self, indexes: Vec<(String, IndexFunc)>) -> Result<(), IndexError> {
        self.shared.cache.add_indexers(indexes)
    }

    /// Registers a handler. `resync`: `None` uses the informer's default period,
    /// `Some(Duration::ZERO)` disables resync for this handler, anything else is raised to
    /// at least one second.
    ///
    /// On a running informer the handler first receives an `on_add(obj, true)` for every
    /// cached object; its registration's [`has_synced`](HandlerRegistration::has_synced)
    /// turns true once those (or, before start, the first list) have been handled.
    pub fn add_event_handler(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
    ) -> HandlerRegistration {
        let shared = &self.shared;
        let resync = resync.or(shared.default_resync);
        let id = shared.processor.next_id();
        let listener = Listener::spawn(id, shared.name.clone(), handler, resync, shared.sync.clone());
        // Under the FIFO lock no batch is being applied: the synthetic adds are exactly the
        // cache now, and every later change reaches the new listener as a notification.
        shared.fifo.locked(|| {
            if shared.started.load(Ordering::SeqCst) {
                let adds = shared.indexer.list().into_iter().map(|o| Notification::Add(o, true)).collect();
                listener.send_batch(adds);
            }
            shared.processor.add(listener.clone());
        });
        tracing::debug!(informer = %shared.name, listener = id, ?resync, "event handler added");
        HandlerRegistration {
            listener,
            shared: Arc::downgrade(&self.shared),
            sync: shared.sync.clone(),
            informer_synced: shared.fifo.synced(),
        }
    }

    /// Replaces `old` with `handler`, at one instant of the informer's stream: `old` gets no
    /// notification after it, `handler` none before it. The new handler first receives —
    /// when `hand_over` — what `old` had not delivered yet (in order), then an
    /// `on_add(obj, true)` for every cached object, then every later change. Without
    /// `hand_over`, `old` delivers its buffer itself and then ends (await
    /// [`HandlerRegistration::finished`] to know when). An `old` that is not (or no longer)
    /// registered here is left alone and `handler` is simply added.
    pub fn replace_event_handler(
        &self,
        old: &HandlerRegistration,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
        hand_over: bool,
    ) -> HandlerRegistration {
        let shared = &self.shared;
        let resync = resync.or(shared.default_resync);
        let id = shared.processor.next_id();
        let listener = Listener::spawn(id, shared.name.clone(), handler, resync, shared.sync.clone());
        let mut handed_over = 0;
        shared.fifo.locked(|| {
            let mut batch = Vec::new();
            // Listener ids are per informer: only look for `old` if it is one of ours.
            let ours = std::ptr::eq(old.shared.as_ptr(), Arc::as_ptr(shared));
            if let Some(previous) = ours.then(|| shared.processor.take(old.listener.id)).flatten() {
                if hand_over {
                    batch = previous.take_buffer();
                    handed_over = batch.len();
                } else {
                    previous.drain();
                }
            }
            if shared.started.load(Ordering::SeqCst) {
                batch.extend(shared.indexer.list().into_iter().map(|o| Notification::Add(o, true)));
            }
            listener.send_batch(batch);
            shared.processor.add(listener.clone());
        });
        tracing::debug!(informer = %shared.name, listener = id, replaced = old.listener.id, handed_over, ?resync, "event handler replaced");
        HandlerRegistration {
            listener,
            shared: Arc::downgrade(&self.shared),
            sync: shared.sync.clone(),
            informer_synced: shared.fifo.synced(),
        }
    }

    /// Removes a handler; it receives nothing more. Returns whether it was registered.
    pub fn remove_event_handler(&self, registration: &HandlerRegistration) -> bool {
        self.shared.processor.remove(registration.listener.id)
    }

    /// Number of registered handlers.
    pub fn handler_count(&self) -> usize {
        self.shared.processor.len()
    }

    /// Whether the first list has been fully applied to the cache (and delivered to the
    /// listeners' buffers).
    pub fn has_synced(&self) -> bool {
        *self.shared.fifo.synced().borrow()
    }

    /// Waits until [`has_synced`](Self::has_synced) (wrap in `tokio::time::timeout`).
    /// Returns at once if the informer was stopped before syncing.
    pub async fn wait_for_sync(&self) {
        let mut synced = self.shared.fifo.synced();
        tokio::select! {
            _ = synced.wait_for(|v| *v) => {}
            _ = self.shared.cancel.cancelled() => {}
        }
    }

    /// Whether the informer has been started.
    pub fn is_started(&self) -> bool {
        self.shared.started.load(Ordering::SeqCst)
    }

    /// Whether the informer has been stopped.
    pub fn is_stopped(&self) -> bool {
        self.shared.cancel.is_cancelled()
    }

    /// Starts the reflector and the processing loop (no-op if already started).
    pub fn start(&self, reflector: Reflector) {
        if self.start_processing() {
            let fifo = self.shared.fifo.clone();
            let cancel = self.shared.cancel.clone();
            tokio::spawn(async move { reflector.run(fifo, cancel).await });
        }
    }

    /// Starts only the processing and resync loops; the caller feeds [`fifo`](Self::fifo).
    /// Returns false if already started.
    pub fn start_processing(&self) -> bool {
        if self.shared.started.swap(true, Ordering::SeqCst) {
            return false;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.process_loop().await });
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.resync_loop().await });
        true
    }

    /// Stops the reflector and processing loop and every listener.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Removes several handlers of this informer at one instant of its stream (each as
    /// [`HandlerRegistration::remove_draining`], or
    /// [`remove_draining_departed`](HandlerRegistration::remove_draining_departed) when it
    /// comes with a `present`): a notification reaches all of them or none. Registrations
    /// of another informer are ignored.
    #[allow(clippy::type_complexity)]
    pub fn remove_handlers_draining(
        &self,
        removals: &[(&HandlerRegistration, Option<&dyn Fn(&str) -> bool>)],
    ) {
        self.shared.fifo.locked(|| {
            for (registration, present) in removals {
                if std::ptr::eq(registration.shared.as_ptr(), Arc::as_ptr(&self.shared)) {
                    self.shared.leave(registration.listener.id, *present);
                }
            }
        });
    }
}

impl Shared {
    /// Takes listener `id` out (the caller holds the FIFO lock), after appending a delete
    /// for every cached object `present` says is gone (see
    /// [`HandlerRegistration::remove_draining_departed`]); it then delivers its buffer and
    /// ends. Returns how many deletes were appended.
    fn leave(&self, id: u64, present: Option<&dyn Fn(&str) -> bool>) -> usize {
        let Some(l) = self.processor.take(id) else { return 0 };
        let mut sent = 0;
        if let Some(present) = present {
            let departed: Vec<Notification> = self
                .indexer
                .list()
                .into_iter()
                .filter(|o| !present(o.key()))
                .map(|o| {
                    Notification::Delete(DeletedObject::FinalStateUnknown {
                        key: Arc::from(o.key()),
                        last_known: o,
                    })
                })
                .collect();
            sent = departed.len();
            l.send_batch(departed);
            if sent > 0 {
                tracing::debug!(informer = %self.name, listener = l.id, departed = sent,
                    "handler removed with deletes for objects its successor no longer has");
            }
        }
        l.drain();
        sent
    }

    fn stop(&self) {
        if self.cancel.is_cancelled() {
            return;
        }
        self.cancel.cancel();
        self.fifo.close();
        self.processor.stop_all();
        tracing::info!(informer = %self.name, "informer stopped");
    }

    async fn process_loop(self: Arc<Self>) {
        let mut logged_sync = false;
        loop {
            let popped = self
                .fifo
                .pop_batch_then(
                    POP_BATCH,
                    |_, deltas, initial| {
                        self.handle_deltas(deltas, initial);
                        PopOutcome::Processed
                    },
                    || {
                        let batch = std::mem::take(&mut *self.pending.lock());
                        self.processor.distribute_batch(batch);
                    },
                )
                .await;
            if popped.is_err() {
                break;
            }
            if !logged_sync && *self.fifo.synced().borrow() {
                logged_sync = true;
                tracing::info!(informer = %self.name, objects = self.indexer.len(), "informer synced");
            }
        }
    }

    /// client-go `HandleDeltas`: apply each delta to the indexer, oldest first, and notify.
    /// Runs under the FIFO lock; the notifications go out when the batch ends.
    fn handle_deltas(&self, deltas: &[Delta], in_initial_list: bool) {
        let mut pending = self.pending.lock();
        for delta in deltas {
            match delta {
                Delta::Deleted(deleted) => {
                    self.cache.delete(deleted.key());
                    pending.push((Notification::Delete(deleted.clone()), false));
                }
                Delta::Added(obj) | Delta::Updated(obj) | Delta::Replaced(obj) | Delta::Sync(obj) => {
                    match self.cache.upsert(obj.clone()) {
                        Some(old) => {
                            // client-go's `OnUpdate`: an unchanged resourceVersion makes it a
                            // sync, delivered to the syncing listeners only.
                            let is_sync = matches!(delta, Delta::Sync(_))
                                || (matches!(delta, Delta::Replaced(_))
                                    && old.resource_version() == obj.resource_version());
                            pending.push((Notification::Update(old, obj.clone()), is_sync));
                        }
                        None => pending.push((Notification::Add(obj.clone(), in_initial_list), false)),
                    }
                }
            }
        }
    }

    async fn resync_loop(self: Arc<Self>) {
        loop {
            let changed = self.processor.resync_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let due = self.processor.next_resync_due();
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = &mut changed => continue,
                _ = async {
                    match due {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if self.processor.should_resync(tokio::time::Instant::now()) {
                        tracing::debug!(informer = %self.name, "resync");
                        self.fifo.resync();
                    }
                }
            }
        }
    }
}

/// A handler's registration on an informer.
pub struct HandlerRegistration {
    listener: Arc<Listener>,
    shared: std::sync::Weak<Shared>,
    sync: Arc<SyncState>,
    informer_synced: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for HandlerRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("id", &self.listener.id)
            .field("synced", &self.has_synced())
            .finish()
    }
}

impl HandlerRegistration {
    /// Whether the informer has synced and this handler has handled every object of the
    /// initial list (or its synthetic adds).
    pub fn has_synced(&self) -> bool {
        *self.informer_synced.borrow() && self.listener.initial_handled()
    }

    /// Waits until [`has_synced`](Self::has_synced) (wrap in `tokio::time::timeout`).
    pub async fn wait_for_sync(&self) {
        let mut informer_synced = self.informer_synced.clone();
        if informer_synced.wait_for(|v| *v).await.is_err() {
            return;
        }
        loop {
            let changed = self.sync.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.has_synced() || self.listener.is_stopped() {
                return;
            }
            changed.await;
        }
    }

    /// The handler's resync period after defaults and the one-second floor.
    pub fn resync_period(&self) -> Option<Duration> {
        self.listener.resync
    }

    /// Unregisters the handler: it receives nothing more. Returns whether it was registered.
    pub fn remove(&self) -> bool {
        match self.shared.upgrade() {
            Some(shared) => shared.processor.remove(self.listener.id),
            None => false,
        }
    }

    /// Unregisters the handler, which first delivers what it was already sent (await
    /// [`finished`](Self::finished) for the end). Returns whether it was registered.
    pub fn remove_draining(&self) -> bool {
        let Some(shared) = self.shared.upgrade() else { return false };
        match shared.processor.take(self.listener.id) {
            Some(l) => {
                l.drain();
                true
            }
            None => false,
        }
    }

    /// Unregisters the handler like [`remove_draining`](Self::remove_draining), and first
    /// appends to its buffer a delete (`DeletedFinalStateUnknown`, with the last state this
    /// informer knows) for every object in this informer's cache, at the instant of the
    /// removal, that `present` says is gone. Returns how many such deletes were sent.
    ///
    /// For a successor that watches the same kind through another informer: that informer
    /// may be ahead of this one, so an object it no longer has (deleted, or out of its scope)
    /// but this one still caches has a delete on its way here that no handler would receive
    /// once this one leaves, and that the successor never sees (its synthetic adds start
    /// after it). Taken under the FIFO lock, the cache and the removal are one instant of
    /// this informer's stream: every delete before it reached the buffer, every object still
    /// cached at it is judged by `present`.
    pub fn remove_draining_departed(&self, present: &dyn Fn(&str) -> bool) -> usize {
        let Some(shared) = self.shared.upgrade() else { return 0 };
        shared.fifo.locked(|| shared.leave(self.listener.id, Some(present)))
    }

    /// Whether the handler was removed or its informer stopped.
    /// Whether the handler was removed or its informer stopped.
    pub fn is_removed(&self) -> bool {
        self.listener.is_stopped()
    }

    /// Whether the handler will be called no more (removed or stopped, and its last call
    /// returned).
    pub fn is_finished(&self) -> bool {
        self.listener.is_finished()
    }

    /// Waits until the handler will be called no more (after a removal of any kind).
    pub fn finished(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.listener.finished()
    }

    /// As [`wait_for_sync`](Self::wait_for_sync), as a future that borrows nothing; it also
    /// ends when the handler stops.
    pub fn synced(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (listener, sync, mut informer_synced) =
            (self.listener.clone(), self.sync.clone(), self.informer_synced.clone());
        async move {
            if informer_synced.wait_for(|v| *v).await.is_err() {
                return;
            }
            loop {
                let changed = sync.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if listener.initial_handled() || listener.is_stopped() {
                    return;
                }
                changed.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{DeletedObject, Object};
    use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Ev {
        Add(String, String, bool),
        Update(String, String, String),
        Delete(String, String, bool),
    }

    type Gate = Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>;

    struct Recorder {
        tx: UnboundedSender<Ev>,
        gate: Option<Gate>,
        panic_on: Option<&'static str>,
        /// Told when a call is about to wait at the gate.
        entered: Option<UnboundedSender<()>>,
    }

    impl Recorder {
        fn wait_gate(&self) {
            if let Some(e) = &self.entered {
                let _ = e.send(());
            }
            if let Some(g) = &self.gate {
                let mut open = g.0.lock().unwrap();
                while !*open {
                    open = g.1.wait(open).unwrap();
                }
            }
        }
    }

    impl ResourceEventHandler for Recorder {
        fn on_add(&self, obj: &Arc<Object>, initial: bool) {
            self.wait_gate();
            if self.panic_on == Some(obj.name()) {
                panic!("handler fails on {}", obj.name());
            }
            let _ = self.tx.send(Ev::Add(obj.key().into(), obj.resource_version().into(), initial));
        }
        fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
            self.wait_gate();
            if self.panic_on == Some(new.name()) {
                panic!("handler fails on {}", new.name());
            }
            let _ = self.tx.send(Ev::Update(
                new.key().into(),
                old.resource_version().into(),
                new.resource_version().into(),
            ));
        }
        fn on_delete(&self, obj: &DeletedObject) {
            self.wait_gate();
            let _ = self.tx.send(Ev::Delete(
                obj.key().into(),
                obj.object().resource_version().into(),
                obj.is_final_state_unknown(),
            ));
        }
    }

    fn recorder() -> (Arc<Recorder>, UnboundedReceiver<Ev>) {
        let (tx, rx) = unbounded_channel();
        (Arc::new(Recorder { tx, gate: None, panic_on: None, entered: None }), rx)
    }

    fn gated() -> (Arc<Recorder>, UnboundedReceiver<Ev>, Gate) {
        let (tx, rx) = unbounded_channel();
        let gate: Gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        (Arc::new(Recorder { tx, gate: Some(gate.clone()), panic_on: None, entered: None }), rx, gate)
    }

    /// A gated recorder that reports each call reaching its gate.
    fn gated_entered() -> (Arc<Recorder>, UnboundedReceiver<Ev>, Gate, UnboundedReceiver<()>) {
        let (tx, rx) = unbounded_channel();
        let (etx, erx) = unbounded_channel();
        let gate: Gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        (
            Arc::new(Recorder { tx, gate: Some(gate.clone()), panic_on: None, entered: Some(etx) }),
            rx,
            gate,
            erx,
        )
    }

    /// An informer whose old handler is inside `on_add(a)` (held at its gate) with
    /// `add b` and `delete a` buffered behind; the cache holds only b.
    async fn held_with_buffer() -> (SharedIndexInformer, HandlerRegistration, UnboundedReceiver<Ev>, Gate) {
        let inf = informer();
        let (h, rx, gate, mut entered) = gated_entered();
        let reg = inf.add_event_handler(h, None);
        inf.start_processing();
        inf.fifo().replace(Vec::new());
        inf.wait_for_sync().await;
        inf.fifo().add(obj("a", 1));
        entered.recv().await.expect("the handler is called");
        inf.fifo().add(obj("b", 2));
        inf.fifo().delete(DeletedObject::Known(obj("a", 3)));
        while inf.indexer().get("ns/a").is_some() || inf.indexer().get("ns/b").is_none() {
            tokio::task::yield_now().await;
        }
        (inf, reg, rx, gate)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replace_hands_the_buffer_to_the_successor_before_its_synthetic_adds() {
        let (inf, old, mut old_rx, gate) = held_with_buffer().await;
        let (h, mut rx) = recorder();
        let new = inf.replace_event_handler(&old, h, None, true);
        assert_eq!(inf.handler_count(), 1);
        assert_eq!(next(&mut rx).await, add("b", 2, false));
        assert_eq!(next(&mut rx).await, Ev::Delete("ns/a".into(), "3".into(), false));
        assert_eq!(next(&mut rx).await, add("b", 2, true), "then the cache at the replacement");
        new.wait_for_sync().await;
        // The old handler finishes the call it was in, and gets nothing else.
        open(&gate);
        assert_eq!(next(&mut old_rx).await, add("a", 1, false));
        old.finished().await;
        assert!(old.is_finished());
        assert!(old_rx.recv().await.is_none(), "nothing more for the old handler");
        inf.fifo().add(obj("c", 4));
        assert_eq!(next(&mut rx).await, add("c", 4, false), "live events go to the successor");
        inf.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replace_without_hand_over_lets_the_old_handler_deliver_up_to_the_cut() {
        let (inf, old, mut old_rx, gate) = held_with_buffer().await;
        let (h, mut rx) = recorder();
        let new = inf.replace_event_handler(&old, h, None, false);
        inf.fifo().add(obj("c", 4));
        assert_eq!(next(&mut rx).await, add("b", 2, true), "the successor starts from the cache");
        assert_eq!(next(&mut rx).await, add("c", 4, false));
        new.wait_for_sync().await;
        open(&gate);
        assert_eq!(next(&mut old_rx).await, add("a", 1, false));
        assert_eq!(next(&mut old_rx).await, add("b", 2, false));
        assert_eq!(next(&mut old_rx).await, Ev::Delete("ns/a".into(), "3".into(), false));
        old.finished().await;
        assert!(old_rx.recv().await.is_none(), "nothing after the cut for the old handler");
        inf.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn remove_draining_delivers_the_buffer_then_ends() {
        let (inf, old, mut old_rx, gate) = held_with_buffer().await;
        assert!(old.remove_draining());
        assert!(!old.remove_draining(), "second removal is a no-op");
        assert_eq!(inf.handler_count(), 0);
        inf.fifo().add(obj("c", 4));
        assert!(!old.is_finished());
        open(&gate);
        assert_eq!(next(&mut old_rx).await, add("a", 1, false));
        assert_eq!(next(&mut old_rx).await, add("b", 2, false));
        assert_eq!(next(&mut old_rx).await, Ev::Delete("ns/a".into(), "3".into(), false));
        old.finished().await;
        assert!(old_rx.recv().await.is_none(), "c came after the removal");
        inf.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn remove_draining_departed_adds_deletes_for_what_is_gone_elsewhere() {
        let (inf, old, mut old_rx, gate) = held_with_buffer().await;
        inf.fifo().add(obj("c", 4));
        while inf.indexer().get("ns/c").is_none() {
            tokio::task::yield_now().await;
        }
        // Elsewhere, b is gone and c is still there: only b gets a delete, after the buffer.
        assert_eq!(old.remove_draining_departed(&|key| key != "ns/b"), 1);
        assert_eq!(old.remove_draining_departed(&|_| false), 0, "second removal is a no-op");
        assert_eq!(inf.handler_count(), 0);
        inf.fifo().add(obj("d", 5));
        open(&gate);
        assert_eq!(next(&mut old_rx).await, add("a", 1, false));
        assert_eq!(next(&mut old_rx).await, add("b", 2, false));
        assert_eq!(next(&mut old_rx).await, Ev::Delete("ns/a".into(), "3".into(), false));
        assert_eq!(next(&mut old_rx).await, add("c", 4, false));
        assert_eq!(next(&mut old_rx).await, Ev::Delete("ns/b".into(), "2".into(), true));
        old.finished().await;
        assert!(old_rx.recv().await.is_none(), "d came after the removal");
        inf.stop();
    }

    fn open(g: &Gate) {
        *g.0.lock().unwrap() = true;
        g.1.notify_all();
    }

    fn obj(name: &str, rv: u64) -> Arc<Object> {
        let json = format!(r#"{{"metadata":{{"namespace":"ns","name":"{name}","resourceVersion":"{rv}"}}}}"#);
        Arc::new(Object::from_json(json.into()).unwrap())
    }

    fn informer() -> SharedIndexInformer {
        SharedIndexInformer::new(InformerOptions { name: "test".into(), ..Default::default() }).unwrap()
    }

    async fn next(rx: &mut UnboundedReceiver<Ev>) -> Ev {
        rx.recv().await.expect("handler channel closed")
    }

    fn add(name: &str, rv: u64, initial: bool) -> Ev {
        Ev::Add(format!("ns/{name}"), rv.to_string(), initial)
    }

    #[tokio::test]
    async fn handle_deltas_updates_cache_and_notifies_in_order() {
        let inf = informer();
        let (h, mut rx) = recorder();
        let reg = inf.add_event_handler(h, None);
        inf.start_processing();
        inf.fifo().replace(vec![obj("a", 1), obj("b", 2)]);
        inf.fifo().update(obj("a", 3));
        inf.fifo().delete(DeletedObject::Known(obj("b", 4)));
        // Deltas are grouped per key (a's update joins a's queued Replaced), in key order.
        let mut evs = Vec::new();
        for _ in 0..4 {
            evs.push(next(&mut rx).await);
        }
        let of = |k: &str| evs.iter().filter(|e| format!("{e:?}").contains(k)).cloned().collect::<Vec<_>>();
        assert_eq!(of("ns/a"), [add("a", 1, true), Ev::Update("ns/a".into(), "1".into(), "3".into())]);
        assert_eq!(of("ns/b"), [add("b", 2, true), Ev::Delete("ns/b".into(), "4".into(), false)]);
        reg.wait_for_sync().await;
        inf.wait_for_sync().await;
        assert_eq!(inf.indexer().get("ns/a").unwrap().resource_version(), "3");
        assert!(inf.indexer().get("ns/b").is_none());
        inf.stop();
    }

    // A relist: changed objects are updates, vanished ones arrive as FinalStateUnknown
    // tombstones, and (no resync check ever ran) unchanged ones are re-sent as updates with
    // the same resourceVersion, as client-go does.
    #[tokio::test]
    async fn relist_sends_updates_tombstones_and_syncs_unchanged() {
        let inf = informer();
        let (h, mut rx) = recorder();
        inf.add_event_handler(h, None);
        inf.start_processing();
        inf.fifo().replace(vec![obj("same", 1), obj("changed", 2), obj("gone", 3)]);
        for _ in 0..3 {
            next(&mut rx).await;
        }
        inf.fifo().replace(vec![obj("same", 1), obj("changed", 5), obj("new", 6)]);
        let mut evs = Vec::new();
        for _ in 0..4 {
            evs.push(next(&mut rx).await);
        }
        evs.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(
            evs,
            [
                add("new", 6, false),
                Ev::Delete("ns/gone".into(), "3".into(), true),
                Ev::Update("ns/changed".into(), "2".into(), "5".into()),
                Ev::Update("ns/same".into(), "1".into(), "1".into()),
            ]
        );
        inf.fifo().add(obj("marker", 7));
        assert_eq!(next(&mut rx).await, add("marker", 7, false));
        inf.stop();
    }

    // client-go's syncing set: listeners start in it; a resync check recomputes it, after
    // which a listener without a resync period no longer gets relist syncs and one with a
    // period gets them only when it was due at the last check.
    #[tokio::test]
    async fn relist_syncs_follow_the_syncing_set() {
        let inf = informer();
        let (plain, mut plain_rx) = recorder();
        let (periodic, mut periodic_rx) = recorder();
        inf.add_event_handler(plain, Some(Duration::ZERO));
        inf.add_event_handler(periodic, Some(Duration::from_secs(1)));
        // Drive by hand: the processing loop only (no resync loop).
        let shared = inf.shared.clone();
        tokio::spawn({
            let shared = shared.clone();
            async move { shared.process_loop().await }
        });
        shared.started.store(true, Ordering::SeqCst);
        inf.fifo().replace(vec![obj("a", 1)]);
        assert_eq!(next(&mut plain_rx).await, add("a", 1, true));
        assert_eq!(next(&mut periodic_rx).await, add("a", 1, true));
        let same = || Ev::Update("ns/a".into(), "1".into(), "1".into());
        // No check has run: both are in the syncing set.
        inf.fifo().replace(vec![obj("a", 1)]);
        assert_eq!(next(&mut plain_rx).await, same());
        assert_eq!(next(&mut periodic_rx).await, same());
        // A check at which the periodic listener is due: only it stays in the set.
        assert!(shared.processor.should_resync(tokio::time::Instant::now() + Duration::from_secs(2)));
        inf.fifo().replace(vec![obj("a", 1)]);
        assert_eq!(next(&mut periodic_rx).await, same());
        // A check at which nobody is due empties the set.
        assert!(!shared.processor.should_resync(tokio::time::Instant::now()));
        inf.fifo().replace(vec![obj("a", 1)]);
        inf.fifo().update(obj("a", 2));
        let changed = Ev::Update("ns/a".into(), "1".into(), "2".into());
        assert_eq!(next(&mut plain_rx).await, changed, "no sync reached the plain listener");
        assert_eq!(next(&mut periodic_rx).await, changed, "nor the periodic one when not due");
        inf.stop();
    }

    // TestSharedInformerInitializationRace / synthetic adds on a running informer.
    #[tokio::test]
    async fn handler_added_late_gets_synthetic_adds_then_changes() {
        let inf = informer();
        inf.start_processing();
        inf.fifo().replace(vec![obj("a", 1), obj("b", 2)]);
        inf.wait_for_sync().await;
        let (h, mut rx) = recorder();
        let reg = inf.add_event_handler(h, None);
        let mut evs = vec![next(&mut rx).await, next(&mut rx).await];
        evs.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(evs, [add("a", 1, true), add("b", 2, true)]);
        reg.wait_for_sync().await;
        assert!(reg.has_synced());
        inf.fifo().update(obj("a", 3));
        assert_eq!(next(&mut rx).await, Ev::Update("ns/a".into(), "1".into(), "3".into()));
        inf.stop();
    }

    // Per-handler HasSynced (TestSharedInformerHandlerHasSynced-like): the informer is synced
    // but a handler that has not processed its initial list is not.
    #[tokio::test]
    async fn registration_synced_only_after_its_initial_list_is_handled() {
        let inf = informer();
        let (slow, mut slow_rx, gate) = gated();
        let (fast, mut fast_rx) = recorder();
        let slow_reg = inf.add_event_handler(slow, None);
        let fast_reg = inf.add_event_handler(fast, None);
        inf.start_processing();
        inf.fifo().replace(vec![obj("a", 1)]);
        next(&mut fast_rx).await;
        fast_reg.wait_for_sync().await;
        inf.wait_for_sync().await;
        assert!(inf.has_synced());
        assert!(!slow_reg.has_synced(), "slow handler has not handled its initial add yet");
        open(&gate);
        next(&mut slow_rx).await;
        slow_reg.wait_for_sync().await;
        assert!(slow_reg.has_synced());
        inf.stop();
    }

    // A slow listener delays only itself (unbounded per-listener buffers).
    #[tokio::test]
    async fn slow_listener_does_not_block_others() {
        let inf = informer();
        let (slow, mut slow_rx, gate) = gated();
        let (fast, mut fast_rx) = recorder();
        inf.add_event_handler(slow, None);
        inf.add_event_handler(fast, None);
        inf.start_processing();
        inf.fifo().replace(Vec::new());
        for i in 0..200 {
            inf.fifo().add(obj(&format!("o{i}"), i));
        }
        for i in 0..200 {
            assert_eq!(next(&mut fast_rx).await, add(&format!("o{i}"), i, false));
        }
        assert!(slow_rx.try_recv().is_err(), "the slow handler is still blocked");
        open(&gate);
        for i in 0..200 {
            assert_eq!(next(&mut slow_rx).await, add(&format!("o{i}"), i, false), "order kept");
        }
        inf.stop();
    }

    #[tokio::test]
    async fn panicking_handler_is_logged_and_skipped() {
        let inf = informer();
        let (tx, mut rx) = unbounded_channel();
        inf.add_event_handler(
            Arc::new(Recorder { tx, gate: None, panic_on: Some("bad"), entered: None }),
            None,
        );
        inf.start_processing();
        inf.fifo().add(obj("good1", 1));
        inf.fifo().add(obj("bad", 2));
        inf.fifo().add(obj("good2", 3));
        assert_eq!(next(&mut rx).await, add("good1", 1, false));
        assert_eq!(next(&mut rx).await, add("good2", 3, false));
        assert_eq!(inf.indexer().len(), 3, "the cache is unaffected");
        inf.stop();
    }

    #[tokio::test]
    async fn removed_handler_receives_nothing_more() {
        let inf = informer();
        let (h, mut rx) = recorder();
        let (witness, mut wrx) = recorder();
        let reg = inf.add_event_handler(h, None);
        inf.add_event_handler(witness, None);
        inf.start_processing();
        inf.fifo().add(obj("a", 1));
        next(&mut rx).await;
        next(&mut wrx).await;
        assert!(reg.remove());
        assert!(!reg.remove(), "second removal is a no-op");
        assert_eq!(inf.handler_count(), 1);
        inf.fifo().add(obj("b", 2));
        assert_eq!(next(&mut wrx).await, add("b", 2, false));
        assert!(rx.recv().await.is_none(), "removed listener's channel closes without delivering");
        inf.stop();
    }

    // TestListenerResyncPeriods: Sync goes only to listeners whose period elapsed.
    #[tokio::test]
    async fn resync_goes_only_to_due_listeners() {
        let inf = informer();
        let (often, mut often_rx) = recorder();
        let (never, mut never_rx) = recorder();
        let often_reg = inf.add_event_handler(often, Some(Duration::from_secs(1)));
        let never_reg = inf.add_event_handler(never, Some(Duration::ZERO));
        assert_eq!(often_reg.resync_period(), Some(Duration::from_secs(1)));
        assert_eq!(never_reg.resync_period(), None);
        // Drive the FIFO by hand (no resync loop): start only the processing loop.
        let shared = inf.shared.clone();
        tokio::spawn({
            let shared = shared.clone();
            async move { shared.process_loop().await }
        });
        shared.started.store(true, Ordering::SeqCst);
        inf.fifo().replace(vec![obj("a", 1)]);
        next(&mut often_rx).await;
        next(&mut never_rx).await;
        let later = tokio::time::Instant::now() + Duration::from_secs(2);
        assert!(shared.processor.should_resync(later));
        inf.fifo().resync();
        assert_eq!(next(&mut often_rx).await, Ev::Update("ns/a".into(), "1".into(), "1".into()));
        inf.fifo().update(obj("a", 2));
        assert_eq!(next(&mut often_rx).await, Ev::Update("ns/a".into(), "1".into(), "2".into()));
        assert_eq!(
            next(&mut never_rx).await,
            Ev::Update("ns/a".into(), "1".into(), "2".into()),
            "the non-resyncing listener saw no Sync"
        );
        // Not due again right away.
        assert!(!shared.processor.should_resync(later + Duration::from_millis(500)));
        inf.stop();
    }

    #[tokio::test(start_paused = true)]
    async fn resync_loop_fires_on_the_handler_period() {
        let start = tokio::time::Instant::now();
        let inf = informer();
        let (h, mut rx) = recorder();
        inf.add_event_handler(h, Some(Duration::from_secs(30)));
        inf.start_processing();
        inf.fifo().replace(vec![obj("a", 1)]);
        assert_eq!(next(&mut rx).await, add("a", 1, true));
        assert_eq!(next(&mut rx).await, Ev::Update("ns/a".into(), "1".into(), "1".into()));
        assert!(start.elapsed() >= Duration::from_secs(30), "resync waited for its period");
        inf.stop();
    }

    #[tokio::test]
    async fn empty_initial_list_syncs_informer_and_handlers() {
        let inf = informer();
        let (h, _rx) = recorder();
        let reg = inf.add_event_handler(h, None);
        inf.start_processing();
        assert!(!inf.has_synced());
        inf.fifo().replace(Vec::new());
        inf.wait_for_sync().await;
        reg.wait_for_sync().await;
        assert!(inf.has_synced() && reg.has_synced());
        inf.stop();
    }

    #[tokio::test]
    async fn stop_ends_listeners_and_fifo() {
        let inf = informer();
        let (h, mut rx) = recorder();
        let reg = inf.add_event_handler(h, None);
        inf.start_processing();
        inf.stop();
        assert!(inf.is_stopped());
        assert!(inf.fifo().is_closed());
        assert!(reg.is_removed());
        assert!(rx.recv().await.is_none());
    }
}
