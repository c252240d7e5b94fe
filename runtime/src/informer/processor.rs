//! The shared processor: fans an informer's notifications out to its listeners.
//!
//! Invariants:
//! - each listener has its own unbounded buffer drained by its own thread, so a slow or
//!   blocked handler delays only itself; per-listener order is the informer's order;
//! - a listener counts the "initial list" adds queued to it and not yet handled; together with
//!   the informer's own sync state this is the registration's `has_synced`;
//! - `Sync` notifications go only to listeners in the syncing set (client-go's
//!   `sharedProcessor.listeners[l] = isSyncing`): a listener enters it when added, and the set
//!   is recomputed only when a resync check (`should_resync`) runs. With no resync period
//!   anywhere no check ever runs, so every listener gets an update for each unchanged object
//!   of a relist, which heals notifications missed while the watch was down;
//! - a panicking handler is logged and the notification skipped; delivery goes on;
//! - a listener leaves in one of three ways, none of which loses a notification it was
//!   given unless asked to: *stopped* (its buffer is dropped: removal, informer stop),
//!   *drained* (it delivers what its buffer holds, then ends), or *taken over* (its buffer is
//!   handed, in order, to a successor; see [`Listener::take_buffer`]). Once its thread has
//!   ended it calls its handler no more, which [`Listener::finished`] waits for.

use std::collections::{HashSet, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::ResourceEventHandler;
use crate::object::{DeletedObject, Object};

/// Shortest per-handler resync period (client-go `minimumResyncPeriod`).
pub const MINIMUM_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// One notification for one listener.
#[derive(Clone, Debug)]
pub(crate) enum Notification {
    Add(Arc<Object>, bool),
    Update(Arc<Object>, Arc<Object>),
    Delete(DeletedObject),
}

/// Sync state shared by an informer and its registrations.
#[derive(Default)]
pub(crate) struct SyncState {
    /// Woken whenever a listener finishes its initial list.
    pub(crate) changed: Notify,
}

/// What a listener's thread does with its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Delivers, and waits for more.
    Open,
    /// Delivers what is buffered, then ends.
    Draining,
    /// Ends after the call in progress (the buffer was dropped or taken).
    Closed,
}

/// A listener's buffer. Hand-written rather than a channel: a successor must be able to
/// take what is still undelivered, which a channel's receiver (owned by the thread) cannot
/// give back.
struct Buffer {
    queue: VecDeque<Notification>,
    mode: Mode,
}

/// Set once the listener's thread has ended (or never started).
#[derive(Default)]
struct Exit {
    done: AtomicBool,
    notify: Notify,
}

impl Exit {
    fn set(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

pub(crate) struct Listener {
    pub(crate) id: u64,
    name: Arc<str>,
    buffer: Arc<(Mutex<Buffer>, Condvar)>,
    pub(crate) resync: Option<Duration>,
    next_resync: Mutex<Option<Instant>>,
    pending_initial: Arc<AtomicUsize>,
    removed: Arc<AtomicBool>,
    exit: Arc<Exit>,
    /// The listener thread could not be started: it will never deliver nor sync.
    dead: bool,
}

impl Listener {
    pub(crate) fn spawn(
        id: u64,
        informer_name: Arc<str>,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
        sync: Arc<SyncState>,
    ) -> Arc<Listener> {
        let buffer =
            Arc::new((Mutex::new(Buffer { queue: VecDeque::new(), mode: Mode::Open }), Condvar::new()));
        let pending_initial = Arc::new(AtomicUsize::new(0));
        let removed = Arc::new(AtomicBool::new(false));
        let exit = Arc::new(Exit::default());
        let runtime = tokio::runtime::Handle::try_current().ok();
        let thread = {
            let pending = pending_initial.clone();
            let buffer = buffer.clone();
            let exit = exit.clone();
            let name = informer_name.clone();
            std::thread::Builder::new().name(format!("listener-{id}")).spawn(move || {
                // Handlers may use tokio (spawn, channels): give them the informer's runtime.
                let _guard = runtime.as_ref().map(|h| h.enter());
                run_listener(&name, id, handler, &buffer, &pending, &sync);
                drop(_guard);
                exit.set();
                sync.changed.notify_waiters();
            })
        };
        let dead = match thread {
            Ok(_) => false,
            Err(error) => {
                tracing::error!(informer = %informer_name, listener = id, %error,
                    "cannot start listener thread; handler will receive nothing");
                exit.set();
                true
            }
        };
        let resync = resync.filter(|d| !d.is_zero()).map(|d| d.max(MINIMUM_RESYNC_PERIOD));
        Arc::new(Listener {
            id,
            name: informer_name,
            buffer,
            resync,
            next_resync: Mutex::new(resync.map(|d| Instant::now() + d)),
            pending_initial,
            removed,
            exit,
            dead,
        })
    }

    /// Hands a batch to the listener thread with a single wake-up.
    pub(crate) fn send_batch(&self, batch: Vec<Notification>) {
        if batch.is_empty() || self.dead {
            return;
        }
        let initial = batch.iter().filter(|n| matches!(n, Notification::Add(_, true))).count();
        let (lock, cond) = &*self.buffer;
        let mut b = lock.lock();
        if b.mode != Mode::Open {
            return;
        }
        self.pending_initial.fetch_add(initial, Ordering::SeqCst);
        b.queue.extend(batch);
        drop(b);
        cond.notify_one();
    }

    /// All initial-list notifications handed to this listener have been handled.
    pub(crate) fn initial_handled(&self) -> bool {
        !self.dead && self.pending_initial.load(Ordering::SeqCst) == 0
    }

    /// Stops the listener: what its buffer holds is dropped.
    pub(crate) fn stop(&self) {
        self.close();
        tracing::debug!(informer = %self.name, listener = self.id, "listener stopped");
    }

    /// Stops taking notifications; the thread delivers what is buffered, then ends.
    pub(crate) fn drain(&self) {
        self.removed.store(true, Ordering::SeqCst);
        let (lock, cond) = &*self.buffer;
        let mut b = lock.lock();
        if b.mode == Mode::Open {
            b.mode = Mode::Draining;
        }
        drop(b);
        cond.notify_all();
        tracing::debug!(informer = %self.name, listener = self.id, "listener draining");
    }

    /// Stops the listener and returns, in order, what it had not delivered yet (a call in
    /// progress finishes; nothing else is delivered).
    pub(crate) fn take_buffer(&self) -> Vec<Notification> {
        let taken = self.close();
        tracing::debug!(informer = %self.name, listener = self.id, handed_over = taken.len(), "listener taken over");
        taken
    }

    fn close(&self) -> Vec<Notification> {
        self.removed.store(true, Ordering::SeqCst);
        let (lock, cond) = &*self.buffer;
        let mut b = lock.lock();
        b.mode = Mode::Closed;
        let taken: Vec<Notification> = b.queue.drain(..).collect();
        drop(b);
        cond.notify_all();
        let initial = taken.iter().filter(|n| matches!(n, Notification::Add(_, true))).count();
        // Nothing will handle these here any more.
        self.pending_initial.fetch_sub(initial, Ordering::SeqCst);
        taken
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    /// Whether the thread has ended: the handler is called no more.
    pub(crate) fn is_finished(&self) -> bool {
        self.exit.done.load(Ordering::SeqCst)
    }

    /// Waits until the thread has ended (after [`stop`](Self::stop), [`drain`](Self::drain)
    /// or [`take_buffer`](Self::take_buffer)).
    pub(crate) fn finished(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let exit = self.exit.clone();
        async move {
            loop {
                let notified = exit.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if exit.done.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        }
    }
}

/// The next notification to deliver, or `None` when the listener is to end.
fn next(buffer: &(Mutex<Buffer>, Condvar)) -> Option<Notification> {
    let (lock, cond) = buffer;
    let mut b = lock.lock();
    loop {
        match b.mode {
            Mode::Closed => return None,
            Mode::Draining => return b.queue.pop_front(),
            Mode::Open => {
                if let Some(n) = b.queue.pop_front() {
                    return Some(n);
                }
                cond.wait(&mut b);
            }
        }
    }
}

fn run_listener(
    informer: &str,
    id: u64,
    handler: Arc<dyn ResourceEventHandler>,
    buffer: &(Mutex<Buffer>, Condvar),
    pending_initial: &AtomicUsize,
    sync: &SyncState,
) {
    while let Some(n) = next(buffer) {
        let initial = matches!(n, Notification::Add(_, true));
        let outcome = catch_unwind(AssertUnwindSafe(|| match &n {
            Notification::Add(obj, in_initial_list) => handler.on_add(obj, *in_initial_list),
            Notification::Update(old, new) => handler.on_update(old, new),
            Notification::Delete(obj) => handler.on_delete(obj),
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            let (event, key) = match &n {
                Notification::Add(o, _) => ("add", o.key().to_owned()),
                Notification::Update(_, o) => ("update", o.key().to_owned()),
                Notification::Delete(d) => ("delete", d.key().to_owned()),
            };
            tracing::error!(informer, listener = id, event, key, panic = %message,
                "event handler panicked; notification skipped");
        }
        if initial && pending_initial.fetch_sub(1, Ordering::SeqCst) == 1 {
            sync.changed.notify_waiters();
        }
    }
}

/// The set of listeners of one informer.
#[derive(Default)]
pub(crate) struct Processor {
    listeners: RwLock<Vec<Arc<Listener>>>,
    /// Listeners that receive `Sync` notifications: new ones, then those due at the last
    /// resync check.
    syncing: Mutex<HashSet<u64>>,
    next_id: AtomicU64,
    /// Woken when the set of resync periods changes.
    pub(crate) resync_changed: Notify,
}

impl Processor {
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn add(&self, listener: Arc<Listener>) {
        let mut listeners = self.listeners.write();
        self.syncing.lock().insert(listener.id);
        listeners.push(listener);
        drop(listeners);
        self.resync_changed.notify_waiters();
    }

    pub(crate) fn remove(&self, id: u64) -> bool {
        match self.take(id) {
            Some(l) => {
                l.stop();
                true
            }
            None => false,
        }
    }

    /// Unlinks a listener without stopping it (the caller decides how it leaves).
    pub(crate) fn take(&self, id: u64) -> Option<Arc<Listener>> {
        let mut listeners = self.listeners.write();
        let at = listeners.iter().position(|l| l.id == id)?;
        Some(listeners.remove(at))
    }

    pub(crate) fn stop_all(&self) {
        for l in self.listeners.write().drain(..) {
            l.stop();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.listeners.read().len()
    }

    /// Distributes a batch of `(notification, is_sync)` in order, one message per listener.
    pub(crate) fn distribute_batch(&self, batch: Vec<(Notification, bool)>) {
        if batch.is_empty() {
            return;
        }
        let listeners = self.listeners.read();
        let any_sync = batch.iter().any(|(_, is_sync)| *is_sync);
        let syncing = if any_sync { Some(self.syncing.lock().clone()) } else { None };
        if let ([only], false) = (listeners.as_slice(), any_sync) {
            only.send_batch(batch.into_iter().map(|(n, _)| n).collect());
            return;
        }
        for l in listeners.iter() {
            let wanted = |is_sync: bool| !is_sync || syncing.as_ref().is_some_and(|s| s.contains(&l.id));
            l.send_batch(batch.iter().filter(|(_, s)| wanted(*s)).map(|(n, _)| n.clone()).collect());
        }
    }

    /// Picks the listeners whose resync period has elapsed at `now` (and schedules their next
    /// one). Returns whether any is due: only then should the FIFO resync.
    pub(crate) fn should_resync(&self, now: Instant) -> bool {
        let listeners = self.listeners.read();
        let mut syncing = self.syncing.lock();
        syncing.clear();
        for l in listeners.iter() {
            let Some(period) = l.resync else { continue };
            let mut next = l.next_resync.lock();
            if next.is_some_and(|t| t <= now) {
                syncing.insert(l.id);
                *next = Some(now + period);
            }
        }
        !syncing.is_empty()
    }

    /// The earliest time any listener is due for a resync.
    pub(crate) fn next_resync_due(&self) -> Option<Instant> {
        self.listeners.read().iter().filter_map(|l| *l.next_resync.lock()).min()
    }
}
