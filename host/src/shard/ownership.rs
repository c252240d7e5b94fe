//! The ownership gate: what the controllers of this replica may queue and reconcile, from
//! the hand-over state ([`HandOver`]), and the bookkeeping that keeps a hand-over from losing
//! work.
//!
//! - [`Gate`] (one per replica) holds the hand-over state and every key being reconciled,
//!   of any plugin. A reconcile claims its key under the state's read lock, and a new epoch
//!   is taken under its write lock, so once [`Gate::publish`] returns no new claim can be
//!   granted on a key lost in that epoch, and [`Gate::released`] waits for the claims
//!   granted before.
//! - [`PluginGate`] (one per controller) is the controller's [`Ownership`]: a request is
//!   admitted and claimed only if this replica owns its key and (label mode) the object is in
//!   its cache or gone from its scope altogether. A request refused for a key owned elsewhere
//!   whose object is absent (a delete, or a request for an object that does not exist) is
//!   *retained* for [`RETENTION`](crate::shard) lease durations: if this replica gains the
//!   key meanwhile, it queues it again — also if it gains the key in an epoch and already
//!   releases it in a newer one (it *passes through*: the next owner may have started
//!   after the delete). On a gain it also queues every object of its scope it gained, so
//!   the new owner reconciles each once (as a restarted controller would).
//!
//! - Shutting down, [`Gate::finish_deletes`] first has the replica claim only deletes of its
//!   keys and waits for those queued, so the key's next owner — which may have started
//!   after the delete — is not needed to hear of them.
//!
//! Invariants: a claim is granted only for a key [`HandOver::owns`] says this replica owns
//! (or, for a delete, is releasing); while leaving, only for deletes; after [`Gate::close`]
//! (fenced, or stopped leaving) none is granted. The gate's locks are never held while a
//! queue is used (an add asks the gate's admission).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::directory::{Departures, Directory};
use super::handover::{Assignment, Completion, HandOver, Peer};
use super::metrics::{PluginLabels, ShardMetrics};
use super::protocol::LabelScope;
use super::scopes::Scopes;
use crate::config::WatchSource;
use crate::controller::{Claim, Ownership, Request};
use crate::queue::{Priority, RateLimitingQueue};

/// The plugin's `for` cache as it is now (provided by the plugin manager; it follows hot
/// reloads).
pub trait KeySource: Send + Sync + 'static {
    /// Keys of every object the plugin's `for` cache holds now.
    fn keys(&self) -> Vec<String>;
    /// Whether the plugin's `for` cache holds `key`.
    fn cached(&self, key: &str) -> bool;
    /// The `for` source the cache follows (label mode: narrowed to this shard).
    fn source(&self) -> Option<WatchSource>;
    /// Resolves once the plugin's informers have handed their handlers every change the
    /// server had made when this was called (bounded: it gives up after a while).
    fn catch_up(&self) -> futures::future::BoxFuture<'static, ()>;
}

/// How long a request that is not decidable yet (label mode, its scope's directory still
/// listing) waits before it is tried again.
const UNDECIDED_RETRY: Duration = Duration::from_millis(200);

thread_local! {
    /// Set while [`PluginGate::retry_later`] adds a key back on this thread.
    static RETRYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While a release waits for queued deletes, how often it looks again (at most).
const DRAIN_LOOK: Duration = Duration::from_millis(20);

/// One replica's hand-over state and the keys in flight.
pub struct Gate {
    handover: RwLock<HandOver>,
    /// Key → reconciles of it in flight (any plugin).
    in_flight: Mutex<HashMap<String, usize>>,
    /// Notified when a claim ends, and when a completion's gains were queued.
    claim_ended: Notify,
    /// Completions whose gains are being queued (a release waits for them).
    gaining: AtomicUsize,
    /// Shutting down: only deletes are claimed (see [`Gate::finish_deletes`]).
    leaving: AtomicBool,
    closed: AtomicBool,
    plugins: Mutex<Vec<Weak<PluginGate>>>,
    retention: Duration,
    metrics: ShardMetrics,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = self.handover.read();
        f.debug_struct("Gate")
            .field("me", &h.me())
            .field("completed", &h.completed())
            .field("acked", &h.acked())
            .field("releasing", &h.releasing())
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A granted claim: the key is in flight until dropped.
struct KeyClaim {
    gate: Arc<Gate>,
    key: String,
}

impl Drop for KeyClaim {
    fn drop(&mut self) {
        let mut in_flight = self.gate.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.key);
            }
        }
        drop(in_flight);
        self.gate.claim_ended.notify_waiters();
    }
}

impl Gate {
    /// The gate of shard `me`, its Lease held as `identity`.
    pub fn new(
        me: &str,
        identity: &str,
        virtual_nodes: u32,
        retention: Duration,
        metrics: ShardMetrics,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            handover: RwLock::new(HandOver::new(me, identity, virtual_nodes)),
            in_flight: Mutex::new(HashMap::new()),
            claim_ended: Notify::new(),
            gaining: AtomicUsize::new(0),
            leaving: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            plugins: Mutex::new(Vec::new()),
            retention,
            metrics,
        })
    }

    pub fn me(&self) -> String {
        self.handover.read().me().to_owned()
    }

    /// Whether this replica may work on `key` now.
    pub fn owns(&self, key: &str) -> bool {
        !self.closed.load(Ordering::Acquire) && self.handover.read().owns(key)
    }

    /// Claims `key` for a reconcile: if this replica owns it, or is releasing it and its
    /// object is `absent` (a delete this replica was told of must be reconciled before the
    /// key moves: the new owner may not have seen it). While leaving, only deletes.
    fn claim(self: &Arc<Self>, key: &str, absent: &dyn Fn() -> bool) -> Option<KeyClaim> {
        let handover = self.handover.read();
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let leaving = self.leaving.load(Ordering::Acquire);
        let granted =
            if handover.owns(key) { !leaving || absent() } else { handover.losing(key) && absent() };
        if !granted {
            return None;
        }
        // Under the read lock: a publish (write lock) either happened before, and `owns`
        // saw it, or happens after, and `released` sees this claim.
        *self.in_flight.lock().entry(key.to_owned()).or_default() += 1;
        Some(KeyClaim { gate: self.clone(), key: key.to_owned() })
    }

    /// Whether `key` is one this replica is releasing (owned before the epoch it releases,
    /// not in it).
    pub fn losing(&self, key: &str) -> bool {
        !self.closed.load(Ordering::Acquire) && self.handover.read().losing(key)
    }

    /// Takes a published assignment; if it is newer than anything held, returns its epoch
    /// (release it: wait for [`released`](Self::released), then acknowledge).
    pub fn publish(&self, assignment: Assignment) -> Option<u64> {
        self.handover.write().publish(assignment)
    }

    /// Releases `epoch` and marks it acknowledged: waits until the plugins' informers caught
    /// up with the server, no reconcile of a key this replica is losing is in flight, and
    /// none of its queues holds such a key whose object is absent (a delete: reconciled here
    /// first), and the epoch acknowledged before has completed here (its completion may
    /// queue such deletes), then acknowledges under the write lock,
    /// so no claim of a lost key can start between the last look and the acknowledgement.
    /// Deletes still queued, or an earlier epoch still not completed, after `drain_limit`
    /// are left (logged). Returns `false` if a newer epoch replaced this one meanwhile.
    pub async fn release(&self, epoch: u64, drain_limit: Duration) -> bool {
        // First every change the server made before now reaches the handlers: a replica
        // gaining keys in this epoch has watched since before it was published, so between
        // the two of them every delete is seen by one (and this one drains it below).
        let plugins = self.plugins();
        futures::future::join_all(plugins.iter().map(|p| p.keys.catch_up())).await;
        // Label mode: deletes of objects never cached here are in the directories.
        futures::future::join_all(plugins.iter().map(|p| p.sweep())).await;
        let started = Instant::now();
        loop {
            let notified = self.claim_ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let keys: Vec<String> = self.in_flight.lock().keys().cloned().collect();
            {
                let mut handover = self.handover.write();
                if handover.releasing() != Some(epoch) {
                    return false;
                }
                let in_flight =
                    keys.iter().any(|k| handover.losing(k)) || self.gaining.load(Ordering::Acquire) > 0;
                // An epoch acknowledged before but not completed here yet: its completion
                // queues the deletes this replica kept for keys it gains there and loses in
                // this one (see `Completion::passed_through`); acknowledging first would
                // skip it.
                let uncompleted = handover.acked() > handover.completed();
                let queued: Vec<String> = if in_flight {
                    Vec::new()
                } else {
                    self.plugins().iter().flat_map(|p| p.pending_deletes(|k| handover.losing(k))).collect()
                };
                let overdue = started.elapsed() >= drain_limit;
                if !in_flight && ((queued.is_empty() && !uncompleted) || overdue) {
                    if !queued.is_empty() {
                        tracing::warn!(epoch, keys = ?&queued[..queued.len().min(10)], count = queued.len(),
                            "deletes of keys this replica hands over were still queued; the new owner may not reconcile them");
                    }
                    if uncompleted {
                        tracing::warn!(epoch, acked = ?handover.acked(), completed = ?handover.completed(),
                            "an earlier epoch did not complete here in time; deletes kept for its keys may reach no replica");
                    }
                    return handover.acknowledged(epoch);
                }
            }
            // A claim ending (a reconcile done) is what changes the answer; look again at
            // most every few milliseconds, and at the drain limit.
            let limit = started + drain_limit;
            tokio::select! {
                _ = notified => tokio::time::sleep(DRAIN_LOOK).await,
                _ = tokio::time::sleep_until(limit) => {}
            }
        }
    }

    /// Before this replica leaves the ring (shutting down): from now on it claims only
    /// deletes (requests of its keys whose objects are absent); its plugins' informers catch
    /// up with the server (label mode: the directories are swept), and it waits until no
    /// such delete is queued or in flight, nor any other reconcile. Then no claim is granted
    /// any more ([`close`](Self::close)). So every delete this replica was told of before it
    /// began leaving is reconciled before its Lease is released: the key's next owner may be
    /// a replica that started after the delete (this one, restarted) and never hears of it.
    /// Deletes still queued after `drain_limit` (one failing and waiting for its retry, say)
    /// are left, logged by key; the gate closes anyway, as a shutdown must end.
    pub async fn finish_deletes(&self, drain_limit: Duration) {
        self.leaving.store(true, Ordering::Release);
        let plugins = self.plugins();
        futures::future::join_all(plugins.iter().map(|p| p.keys.catch_up())).await;
        futures::future::join_all(plugins.iter().map(|p| p.sweep())).await;
        let started = Instant::now();
        loop {
            let notified = self.claim_ended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let handover = self.handover.write();
                // A completion queueing its gains may queue deletes kept for them: counted.
                let in_flight = self.in_flight.lock().len() + self.gaining.load(Ordering::Acquire);
                let queued: Vec<String> = if in_flight > 0 {
                    Vec::new()
                } else {
                    self.plugins()
                        .iter()
                        .flat_map(|p| p.pending_deletes(|k| handover.owns(k) || handover.losing(k)))
                        .collect()
                };
                let overdue = started.elapsed() >= drain_limit;
                if (in_flight == 0 && queued.is_empty()) || overdue {
                    if overdue {
                        tracing::warn!(in_flight, keys = ?&queued[..queued.len().min(10)], count = queued.len(),
                            "leaving the ring with deletes not reconciled yet; their next owner may not reconcile them");
                    }
                    // Under the write lock: no claim is being granted now, and none is after.
                    self.closed.store(true, Ordering::Release);
                    tracing::info!(
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "the deletes this replica was told of are reconciled; no more claims"
                    );
                    return;
                }
            }
            let limit = started + drain_limit;
            tokio::select! {
                _ = notified => tokio::time::sleep(DRAIN_LOOK).await,
                _ = tokio::time::sleep(DRAIN_LOOK) => {}
                _ = tokio::time::sleep_until(limit) => {}
            }
        }
    }

    /// Whether this replica is leaving (it claims only deletes).
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    pub fn releasing(&self) -> Option<u64> {
        self.handover.read().releasing()
    }

    pub fn completed(&self) -> Option<u64> {
        self.handover.read().completed()
    }

    /// Completes the acknowledged epoch if every replica involved is done with it, and
    /// queues what each plugin gained.
    pub fn try_complete(&self, peer: &dyn Fn(&str, &str) -> Peer) -> Option<Completion> {
        let completion = {
            let mut handover = self.handover.write();
            let completion = handover.try_complete(peer)?;
            // Under the write lock: a release that looks after this sees the gains coming.
            self.gaining.fetch_add(1, Ordering::AcqRel);
            completion
        };
        let me = self.me();
        for plugin in self.plugins() {
            plugin.gained(&completion, &me);
        }
        self.gaining.fetch_sub(1, Ordering::AcqRel);
        self.claim_ended.notify_waiters();
        if let Some(members) = completion.assignment().map(|a| a.members.len()) {
            self.metrics.members.set(i64::try_from(members).unwrap_or(i64::MAX));
        }
        self.metrics.epoch.set(i64::try_from(completion.epoch()).unwrap_or(i64::MAX));
        self.metrics.handovers.inc();
        Some(completion)
    }

    /// Resolves once every plugin's directory (label mode) has listed its scope: a replica
    /// joins only then, so it has watched every object of its scopes since before any epoch
    /// that gives it keys.
    pub async fn synced(&self) {
        futures::future::join_all(self.plugins().iter().map(|p| p.synced())).await;
    }

    /// Stops every claim from now on (fenced, or leaving). Reconciles in flight are not
    /// waited for here.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn plugins(&self) -> Vec<Arc<PluginGate>> {
        let mut list = self.plugins.lock();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// Forgets retained keys older than the retention, and refreshes `wasmctrl_shard_keys`.
    pub fn tidy(&self) {
        let horizon = Instant::now().checked_sub(self.retention);
        for plugin in self.plugins() {
            if let Some(horizon) = horizon {
                plugin.retained.lock().retain(|_, at| *at >= horizon);
            }
            let owned = plugin.all_keys().iter().filter(|k| self.owns(k)).count();
            self.metrics
                .keys
                .get_or_create(&PluginLabels { plugin: plugin.plugin.clone() })
                .set(i64::try_from(owned).unwrap_or(i64::MAX));
        }
    }

    /// The gate of one plugin's controller; with `scopes` (label mode) its scope's directory
    /// is looked up on use, so a reload that changes the plugin's `for` source is followed.
    pub fn plugin(
        self: &Arc<Self>,
        plugin: &str,
        keys: Arc<dyn KeySource>,
        scopes: Option<Arc<Scopes>>,
    ) -> Arc<PluginGate> {
        let gate = Arc::new(PluginGate {
            gate: self.clone(),
            plugin: plugin.to_owned(),
            keys,
            scopes,
            current: Mutex::new(None),
            token: Arc::new(()),
            queue: Mutex::new(None),
            retained: Mutex::new(HashMap::new()),
        });
        self.plugins.lock().push(Arc::downgrade(&gate));
        gate.directory();
        gate
    }
}

/// Is the object of an owned key there to reconcile?
enum Presence {
    /// In this replica's cache, or gone from the scope: reconcile.
    Ready,
    /// Exists, but not (yet) in this replica's cache (label mode): its arrival queues it.
    Elsewhere,
    /// The scope's directory is still listing.
    Undecided,
}

/// One controller's [`Ownership`].
pub struct PluginGate {
    gate: Arc<Gate>,
    plugin: String,
    keys: Arc<dyn KeySource>,
    scopes: Option<Arc<Scopes>>,
    /// The scope in use and its directory (label mode).
    current: Mutex<Option<(LabelScope, Arc<Directory>)>>,
    /// Alive as long as this gate: marks its scope as in use.
    token: Arc<()>,
    queue: Mutex<Option<RateLimitingQueue<Request>>>,
    /// Keys refused while owned elsewhere and absent here, with when.
    retained: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for PluginGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginGate")
            .field("plugin", &self.plugin)
            .field("retained", &self.retained.lock().len())
            .finish_non_exhaustive()
    }
}

impl PluginGate {
    /// The directory of the plugin's current scope (label mode).
    fn directory(self: &Arc<Self>) -> Option<Arc<Directory>> {
        let scopes = self.scopes.as_ref()?;
        let scope = scopes.scope_of(&self.keys.source()?);
        let mut current = self.current.lock();
        if let Some((s, d)) = current.as_ref()
            && *s == scope
        {
            return Some(d.clone());
        }
        let dir = scopes.directory(&scope);
        let me: Arc<dyn Departures> = self.clone();
        dir.listen(Arc::downgrade(&me));
        *current = Some((scope.clone(), dir.clone()));
        drop(current);
        scopes.use_scope(&self.token, scope);
        Some(dir)
    }

    fn presence(self: &Arc<Self>, key: &str) -> Presence {
        if self.scopes.is_none() || self.keys.cached(key) {
            return Presence::Ready;
        }
        match self.directory().and_then(|d| d.exists(key)) {
            Some(true) => Presence::Elsewhere,
            Some(false) => Presence::Ready,
            None => Presence::Undecided,
        }
    }

    /// Whether the object of `key` is absent from the plugin's scope (as far as known; an
    /// undecided directory counts as absent, so the key is kept rather than lost).
    fn absent(self: &Arc<Self>, key: &str) -> bool {
        match &self.scopes {
            None => !self.keys.cached(key),
            Some(_) => self.directory().and_then(|d| d.exists(key)) != Some(true),
        }
    }

    fn retain_if_absent(self: &Arc<Self>, key: &str) {
        if self.absent(key) {
            self.retained.lock().insert(key.to_owned(), Instant::now());
        }
    }

    /// Adds `request` back after [`UNDECIDED_RETRY`]. The add passes the queue's admission
    /// (this gate's `admits`) as it is made: that admission lets it through undecided (see
    /// [`RETRYING`]) — deciding it again would retry it again, recursing — and the claim
    /// decides it when a worker takes it. The guard is dropped before the queue is used.
    fn retry_later(&self, request: &Request) {
        let queue = self.queue.lock().clone();
        if let Some(q) = queue {
            RETRYING.with(|r| r.set(true));
            q.add_after(request.clone(), UNDECIDED_RETRY);
            RETRYING.with(|r| r.set(false));
        }
    }

    /// Keys in this plugin's queue (waiting or processing) that pass `which` and whose
    /// objects are absent.
    fn pending_deletes(self: &Arc<Self>, which: impl Fn(&str) -> bool) -> Vec<String> {
        let Some(queue) = self.queue.lock().clone() else { return Vec::new() };
        let mut losing = Vec::new();
        queue.queue().any_pending(|r| {
            let key = r.key();
            if which(&key) {
                losing.push(key);
            }
            false
        });
        losing.retain(|k| self.absent(k));
        losing
    }

    /// Label mode: brings the scope's directory up to a consistent read (see
    /// [`Directory::sweep`]); a failure is logged, the release goes on.
    async fn sweep(self: &Arc<Self>) {
        if let Some(dir) = self.directory()
            && let Err(error) = dir.sweep().await
        {
            tracing::warn!(plugin = %self.plugin, scope = %dir.scope(), %error,
                "cannot read the scope to sweep its directory; deletes not seen yet may reach no replica");
        }
    }

    /// Resolves once the scope's directory (label mode) has listed the scope.
    async fn synced(self: &Arc<Self>) {
        if let Some(dir) = self.directory() {
            dir.wait_synced().await;
        }
    }

    /// Keys of every object of the scope this replica knows of.
    fn all_keys(self: &Arc<Self>) -> Vec<String> {
        match self.directory() {
            Some(d) => d.keys(),
            None => self.keys.keys(),
        }
    }

    /// Queues what `completion` gave this replica: every object of the scope it gained (low
    /// priority, like an initial list), and the retained keys it gained or passes through
    /// (those are reconciled here before the newer epoch's release is acknowledged).
    fn gained(self: &Arc<Self>, completion: &Completion, me: &str) {
        let Some(queue) = self.queue.lock().clone() else { return };
        let mut n = 0u64;
        for key in self.all_keys() {
            if completion.gained(me, &key) {
                queue.add_with_priority(Request::from_key(&key), Priority::Low);
                n += 1;
            }
        }
        let retained: Vec<String> = {
            let mut r = self.retained.lock();
            let gained: Vec<String> = r
                .keys()
                .filter(|k| completion.gained(me, k) || completion.passed_through(me, k))
                .cloned()
                .collect();
            for k in &gained {
                r.remove(k);
            }
            gained
        };
        let kept = retained.len();
        for key in retained {
            queue.add(Request::from_key(&key));
            n += 1;
        }
        self.gate.metrics.keys_gained.get_or_create(&PluginLabels { plugin: self.plugin.clone() }).inc_by(n);
        tracing::info!(plugin = %self.plugin, epoch = completion.epoch(), keys = n, absent = kept,
            "keys gained in a hand-over queued");
    }
}

/// A plugin gate as its controller's [`Ownership`].
pub struct PluginOwnership(pub Arc<PluginGate>);

impl Ownership for PluginOwnership {
    fn admits(&self, request: &Request) -> bool {
        if RETRYING.with(std::cell::Cell::get) {
            // An undecided key added back for later: its claim decides it.
            return true;
        }
        let this = &self.0;
        let key = request.key();
        if !this.gate.owns(&key) {
            // A delete of a key being released is reconciled here before it moves.
            if this.gate.losing(&key) && this.absent(&key) {
                return true;
            }
            this.retain_if_absent(&key);
            return false;
        }
        if this.gate.is_leaving() {
            // Only deletes now; the key's next owner reconciles every object it gains.
            return this.absent(&key);
        }
        match this.presence(&key) {
            Presence::Ready => true,
            Presence::Elsewhere => false,
            Presence::Undecided => {
                this.retry_later(request);
                false
            }
        }
    }

    fn claim(&self, request: &Request) -> Option<Claim> {
        let this = &self.0;
        let key = request.key();
        let Some(claim) = this.gate.claim(&key, &|| this.absent(&key)) else {
            if !this.gate.is_closed() {
                this.retain_if_absent(&key);
            }
            return None;
        };
        match this.presence(&key) {
            Presence::Ready => Some(Claim::new(claim)),
            Presence::Elsewhere => None,
            Presence::Undecided => {
                drop(claim);
                this.retry_later(request);
                None
            }
        }
    }

    fn attach(&self, queue: &RateLimitingQueue<Request>) {
        *self.0.queue.lock() = Some(queue.clone());
    }
}

impl Departures for PluginGate {
    /// An object left the scope (label mode: deleted, wherever it was cached): reconcile it
    /// here if this replica owns it (nobody's cache may have it), else keep it in case this
    /// replica gains it.
    fn departed(&self, key: &str) {
        if self.gate.owns(key) || self.gate.losing(key) {
            tracing::debug!(plugin = %self.plugin, key, "an object of this replica left the scope");
            // Not under the guard: the add asks this gate's admission, which may lock it again
            // (an undecided key is retried later) — a non-reentrant lock held here would
            // deadlock the directory's task and the worker thread running it.
            let queue = self.queue.lock().clone();
            if let Some(q) = queue {
                q.add(Request::from_key(key));
            }
        } else {
            tracing::debug!(plugin = %self.plugin, key, "an object of another replica left the scope; kept");
            self.retained.lock().insert(key.to_owned(), Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::queue::ItemExponential;
    use crate::shard::handover::Members;
    use crate::shard::ring::Ring;

    /// A plugin whose cache holds nothing (every request is for an absent object).
    struct NoObjects;

    impl KeySource for NoObjects {
        fn keys(&self) -> Vec<String> {
            Vec::new()
        }

        fn cached(&self, _: &str) -> bool {
            false
        }

        fn source(&self) -> Option<WatchSource> {
            None
        }

        fn catch_up(&self) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    fn members(list: &[(&str, &str)]) -> Members {
        list.iter().map(|(n, i)| ((*n).to_owned(), (*i).to_owned())).collect()
    }

    fn assignment(epoch: u64, now: &[(&str, &str)], previous: &[(&str, &str)]) -> Assignment {
        Assignment { epoch, members: members(now), previous: members(previous) }
    }

    /// A plugin whose cache holds exactly `present`.
    struct Objects(Vec<String>);

    impl KeySource for Objects {
        fn keys(&self) -> Vec<String> {
            self.0.clone()
        }

        fn cached(&self, key: &str) -> bool {
            self.0.iter().any(|k| k == key)
        }

        fn source(&self) -> Option<WatchSource> {
            None
        }

        fn catch_up(&self) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    /// Label mode: an object of this replica leaves the scope while its directory cannot
    /// decide yet. The departure queues the key; the queue's admission asks the gate, which
    /// retries an undecided key later through the same queue — the departure must not hold
    /// the gate's queue lock meanwhile (it did: the directory's task deadlocked, and with it
    /// a runtime worker, so the process never exited).
    #[tokio::test]
    async fn a_departure_whose_key_is_undecided_does_not_deadlock() {
        let metrics = ShardMetrics::register(&Metrics::new());
        let gate = Gate::new("a", "a@0", 16, Duration::from_secs(60), metrics);
        // Never contacted: the plugin has no source yet, so its directory is undecided.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let settings = super::super::lease::LeaseSettings {
            namespace: "ns".into(),
            name: "ring-shard-a".into(),
            ring: "ring".into(),
            shard: "a".into(),
            identity: "a@0".into(),
            lease_duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_secs(1),
        };
        let (_keeper, lease) = super::super::lease::ShardLease::new(client.clone(), settings);
        let scopes = Scopes::new(
            client.clone(),
            crate::source::Discovery::new(client),
            "shard.wasmctrl.dev/ring".into(),
            "a".into(),
            lease,
        );
        let plugin = gate.plugin("p", Arc::new(NoObjects), Some(scopes));
        let ownership: Arc<dyn Ownership> = Arc::new(PluginOwnership(plugin.clone()));
        let queue: RateLimitingQueue<Request> = RateLimitingQueue::new(Arc::new(ItemExponential::new(
            Duration::from_millis(5),
            Duration::from_secs(1),
        )));
        let admission = ownership.clone();
        queue.queue().set_admission(Arc::new(move |r: &Request| admission.admits(r)));
        ownership.attach(&queue);
        assert_eq!(gate.publish(assignment(1, &[("a", "a@0")], &[])), Some(1));
        assert!(gate.release(1, Duration::from_secs(10)).await);
        assert!(gate.try_complete(&|_, _| Peer { acked: Some(1), stopped: false }).is_some());

        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            plugin.departed("ns/k");
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the departure deadlocked on the gate's queue lock"
        );
    }

    /// A replica shutting down: it claims only deletes of its keys from then on, and
    /// `finish_deletes` returns only once the queued delete was reconciled; after it, no
    /// claim at all.
    #[tokio::test(start_paused = true)]
    async fn leaving_reconciles_queued_deletes_first_and_then_claims_nothing() {
        let metrics = ShardMetrics::register(&Metrics::new());
        let gate = Gate::new("a", "a@0", 16, Duration::from_secs(60), metrics);
        let present = "ns/present".to_owned();
        let ownership = PluginOwnership(gate.plugin("p", Arc::new(Objects(vec![present.clone()])), None));
        let queue = RateLimitingQueue::new(Arc::new(ItemExponential::new(
            Duration::from_millis(5),
            Duration::from_secs(1),
        )));
        ownership.attach(&queue);
        let limit = Duration::from_secs(10);
        assert_eq!(gate.publish(assignment(1, &[("a", "a@0")], &[])), Some(1));
        assert!(gate.release(1, limit).await);
        assert!(gate.try_complete(&|_, _| Peer { acked: Some(1), stopped: false }).is_some());

        let deleted = Request::from_key("ns/deleted");
        let updated = Request::from_key(&present);
        assert!(ownership.admits(&deleted) && ownership.admits(&updated), "a's keys");
        queue.add(deleted.clone());
        let leaving = tokio::spawn({
            let gate = gate.clone();
            async move { gate.finish_deletes(limit).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!leaving.is_finished(), "the queued delete is waited for");
        assert!(!ownership.admits(&updated), "leaving: an object that exists is left to the next owner");
        assert!(ownership.claim(&updated).is_none());
        assert_eq!(queue.get().await, Some(deleted.clone()));
        let claim = ownership.claim(&deleted).expect("leaving: a delete is still reconciled here");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!leaving.is_finished(), "the delete's reconcile is waited for");
        drop(claim);
        queue.done(&deleted);
        tokio::time::timeout(Duration::from_secs(1), leaving)
            .await
            .expect("left once the delete was reconciled")
            .unwrap();
        assert!(gate.is_closed());
        assert!(ownership.claim(&deleted).is_none(), "after leaving, nothing is claimed");
    }

    /// A rolling restart of `a` seen from `b`: a delete of one of a's keys reaches only `b`
    /// (kept: a owns it); epoch 2 gives a's keys to b, epoch 3 hands them to a's new
    /// incarnation (which started after the delete), and b sees 3 before completing 2. b must
    /// not acknowledge 3 before 2 completed here, and then reconciles the delete it kept
    /// before it does.
    #[tokio::test(start_paused = true)]
    async fn a_delete_kept_for_a_key_passing_through_is_reconciled_before_the_next_release() {
        let metrics = ShardMetrics::register(&Metrics::new());
        let gate = Gate::new("b", "b@0", 16, Duration::from_secs(60), metrics);
        let ownership = PluginOwnership(gate.plugin("p", Arc::new(NoObjects), None));
        let queue = RateLimitingQueue::new(Arc::new(ItemExponential::new(
            Duration::from_millis(5),
            Duration::from_secs(1),
        )));
        ownership.attach(&queue);
        let ring = Ring::new(["a", "b"], 16);
        let key = (0..).map(|i| format!("ns/k{i}")).find(|k| ring.is_owner(k, "a")).expect("a key of a");
        let request = Request::from_key(&key);
        let limit = Duration::from_secs(10);

        assert_eq!(gate.publish(assignment(1, &[("a", "a@0"), ("b", "b@0")], &[])), Some(1));
        assert!(gate.release(1, limit).await);
        assert!(gate.try_complete(&|_, _| Peer { acked: Some(1), stopped: false }).is_some());
        assert!(!ownership.admits(&request), "a's key: kept, not queued");

        assert_eq!(gate.publish(assignment(2, &[("b", "b@0")], &[("a", "a@0"), ("b", "b@0")])), Some(2));
        assert!(gate.release(2, limit).await);
        assert_eq!(gate.publish(assignment(3, &[("a", "a@1"), ("b", "b@0")], &[("b", "b@0")])), Some(3));
        let release = tokio::spawn({
            let gate = gate.clone();
            async move { gate.release(3, limit).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!release.is_finished(), "epoch 3 is not acknowledged before 2 completed here");
        assert_eq!(queue.len(), 0);

        let a_stopped = |n: &str, _: &str| Peer { acked: None, stopped: n == "a" };
        let completion = gate.try_complete(&a_stopped).expect("epoch 2 completes");
        assert!(!completion.gained("b", &key) && completion.passed_through("b", &key));
        assert_eq!(queue.get().await, Some(request.clone()), "the kept delete is queued");
        let claim = ownership.claim(&request).expect("a delete of a key b is losing is b's to reconcile");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!release.is_finished(), "epoch 3 waits for the delete's reconcile");
        drop(claim);
        queue.done(&request);
        let acked = tokio::time::timeout(Duration::from_secs(1), release).await;
        assert!(acked.expect("released once the delete was reconciled").unwrap());
        assert!(ownership.claim(&request).is_none(), "epoch 3 acknowledged: the key is a's");
    }
}
