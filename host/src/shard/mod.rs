//! Sharding: several replicas share the work of every plugin, each key owned by exactly one
//! live replica, on Kubernetes Leases (`[sharding]` in the host TOML; `docs/sharding.md` has
//! the design and the argument).
//!
//! - [`ring`]: consistent hashing with virtual nodes (SHA-256 positions).
//! - [`handover`]: the protocol as pure state machines — what a replica works on, when it
//!   acknowledges and completes an epoch, when the assignment role publishes the next.
//! - [`protocol`]: Lease names, labels and annotations the replicas agree on.
//! - [`membership`]: the ring's Leases as this replica sees them, with its own clock.
//! - [`lease`]: this replica's shard Lease (membership, acknowledgements, fencing).
//! - [`ownership`]: the gate each controller asks before queueing and reconciling a key.
//! - [`replica`]: drives the replica's side of the protocol.
//! - [`assigner`]: the elected assignment role (epochs; label mode: [`labeler`]).
//! - [`scopes`], [`directory`]: label mode — `for` sources narrowed to this shard's label,
//!   and a metadata-only directory of every object of each scope.
//!
//! The key hashed is the request's `namespace/name` (the object's cache key): an object's
//! reconciles land on one replica for every plugin, and what it owns (`owns`) or what maps to
//! it (`watches`) enqueues *its* request, so that work lands there too.
//!
//! Invariants: a reconcile starts only on the replica that owns its key and only under a
//! claim the gate granted; a replica whose Lease it cannot renew stops every reconcile and
//! revokes its plugins' cluster access before its Lease could expire; see `handover` for why
//! no key is reconciled by two replicas at once.

pub mod assigner;
pub mod directory;
pub mod handover;
pub mod labeler;
pub mod lease;
pub mod membership;
pub mod metrics;
pub mod ownership;
pub mod protocol;
pub mod replica;
pub mod ring;
pub mod scopes;

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::assigner::AssignerSettings;
use self::labeler::Labeler;
use self::lease::{LeaseError, LeaseHandle, LeaseSettings, ShardLease};
use self::membership::Membership;
use self::metrics::ShardMetrics;
use self::ownership::{Gate, PluginOwnership};
use self::scopes::Scopes;
use crate::config::{PluginConfig, ShardingConfig, ShardingMode};
use crate::controller::Ownership;
use crate::metrics::Metrics;
use crate::source::Discovery;

pub use self::ownership::KeySource;

/// A request refused on a replica that does not own its key, for an object that is absent
/// there (a delete, say), is remembered this many lease durations: if the replica gains the
/// key meanwhile (its owner died or left), it reconciles it.
pub const RETENTION_LEASES: u32 = 4;

/// Why sharding could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("{0}")]
    InvalidShardName(String),
}

/// What runs when the shard Lease is lost.
type Fence = Box<dyn FnOnce() + Send>;

/// This replica's membership of a ring. Cheap to clone.
#[derive(Clone)]
pub struct Sharding {
    inner: Arc<Inner>,
}

struct Inner {
    config: ShardingConfig,
    shard: String,
    gate: Arc<Gate>,
    scopes: Option<Arc<Scopes>>,
    /// The shard Lease keeper and the fence hook, until [`Sharding::join`] runs them.
    keeper: Mutex<Option<(ShardLease, Fence)>>,
    keeper_task: Mutex<Option<JoinHandle<Result<(), LeaseError>>>>,
    /// The campaign for the assignment role (it releases that Lease when stopped).
    campaign: Mutex<Option<JoinHandle<()>>>,
    lease: LeaseHandle,
    /// Cancelled to release the Lease (after the plugins drained).
    leave: CancellationToken,
    /// Cancelled to stop the background tasks.
    stop: CancellationToken,
    /// Cancelled when the Lease is lost.
    lost: CancellationToken,
}

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharding")
            .field("ring", &self.inner.config.ring)
            .field("shard", &self.inner.shard)
            .field("mode", &self.inner.config.mode)
            .field("gate", &self.inner.gate)
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Sharding {
    /// Starts following the ring (membership, the hand-over, the campaign for the
    /// assignment role) as shard `shard`, holder `identity` (unique to this process). The
    /// ring's Leases are read and written through `lease_client` (best a client of its own,
    /// so other traffic never delays a renewal), objects through `client`. The shard Lease is
    /// taken by [`join`](Self::join). When the Lease is lost, `fence` runs at once (after
    /// every claim was stopped): it must cut the plugins' cluster access.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        client: kube::Client,
        lease_client: kube::Client,
        discovery: Discovery,
        config: ShardingConfig,
        shard: &str,
        identity: &str,
        metrics: &Metrics,
        fence: impl FnOnce() + Send + 'static,
    ) -> Result<Sharding, ShardError> {
        protocol::check_shard_name(shard).map_err(ShardError::InvalidShardName)?;
        let metrics = ShardMetrics::register(metrics);
        let stop = CancellationToken::new();
        let membership = Arc::new(Membership::start(
            lease_client.clone(),
            &config.namespace,
            &config.ring,
            config.lease_duration,
            stop.clone(),
        ));
        let retention = config.lease_duration * RETENTION_LEASES;
        let gate = Gate::new(shard, identity, config.virtual_nodes, retention, metrics.clone());
        let (keeper, lease) = ShardLease::new(
            lease_client.clone(),
            LeaseSettings {
                namespace: config.namespace.clone(),
                name: protocol::shard_lease_name(&config.ring, shard),
                ring: config.ring.clone(),
                shard: shard.to_owned(),
                identity: identity.to_owned(),
                lease_duration: config.lease_duration,
                renew_deadline: config.renew_deadline,
                retry_period: config.retry_period,
            },
        );
        let label_key = protocol::object_label(&config.ring);
        let scopes = (config.mode == ShardingMode::Label).then(|| {
            Scopes::new(client.clone(), discovery.clone(), label_key.clone(), shard.to_owned(), lease.clone())
        });
        tokio::spawn(replica::drive(
            gate.clone(),
            membership.clone(),
            lease.clone(),
            scopes.clone(),
            config.renew_deadline,
            metrics.clone(),
            stop.clone(),
        ));
        let labeler = scopes.as_ref().map(|s| {
            let s = s.clone();
            Labeler {
                client: client.clone(),
                discovery: discovery.clone(),
                label_key: label_key.clone(),
                virtual_nodes: config.virtual_nodes,
                directory_of: Arc::new(move |scope: &protocol::LabelScope| s.directory(scope)),
                metrics: metrics.clone(),
            }
        });
        let campaign = tokio::spawn(assigner::campaign(
            lease_client,
            AssignerSettings {
                namespace: config.namespace.clone(),
                ring: config.ring.clone(),
                identity: identity.to_owned(),
                lease_duration: config.lease_duration,
                renew_deadline: config.renew_deadline,
                retry_period: config.retry_period,
            },
            membership,
            labeler,
            metrics,
            stop.clone(),
        ));
        tracing::info!(ring = %config.ring, shard, mode = ?config.mode, "sharding: following the ring");
        Ok(Sharding {
            inner: Arc::new(Inner {
                config,
                shard: shard.to_owned(),
                gate,
                scopes,
                keeper: Mutex::new(Some((keeper, Box::new(fence)))),
                keeper_task: Mutex::new(None),
                campaign: Mutex::new(Some(campaign)),
                lease,
                leave: CancellationToken::new(),
                stop,
                lost: CancellationToken::new(),
            }),
        })
    }

    /// This replica's shard name.
    pub fn shard(&self) -> &str {
        &self.inner.shard
    }

    pub fn mode(&self) -> ShardingMode {
        self.inner.config.mode
    }

    /// Label mode: narrows the plugin's `for` source to the objects labelled with this
    /// shard (what its informer lists and watches). No-write mode: nothing changes.
    pub fn scope(&self, config: &mut PluginConfig) {
        if let Some(scopes) = &self.inner.scopes {
            scopes.narrow(&mut config.for_source);
        }
    }

    /// The [`Ownership`] of one plugin's controller, over its `for` cache.
    pub fn ownership(&self, plugin: &str, keys: Arc<dyn KeySource>) -> Arc<dyn Ownership> {
        Arc::new(PluginOwnership(self.inner.gate.plugin(plugin, keys, self.inner.scopes.clone())))
    }

    /// Takes the shard Lease: from now on this replica is a member of the ring (call it once
    /// the plugins are loaded). Idempotent.
    pub fn join(&self) {
        let Some((keeper, fence)) = self.inner.keeper.lock().take() else { return };
        let gate = self.inner.gate.clone();
        let (leave, lost) = (self.inner.leave.clone(), self.inner.lost.clone());
        let task = tokio::spawn(async move {
            tokio::select! {
                () = gate.synced() => {}
                _ = leave.cancelled() => return Ok(()),
            }
            let result = keeper
                .run(leave, move || {
                    gate.close();
                    fence();
                })
                .await;
            if result.is_err() {
                lost.cancel();
            }
            result
        });
        *self.inner.keeper_task.lock() = Some(task);
    }

    /// Resolves once the shard Lease is held.
    pub async fn joined(&self) {
        self.inner.lease.held().await;
    }

    /// Resolves if the shard Lease is lost (this replica fenced itself: exit).
    pub async fn lost(&self) {
        self.inner.lost.cancelled().await;
    }

    /// Before leaving the ring (call it on shutdown, while the plugins still run): claims
    /// only deletes from now on, and returns once every delete this replica was told of is
    /// reconciled (bounded by `renew-deadline`; see [`Gate::finish_deletes`]). Then no claim
    /// is granted any more.
    pub async fn finish_deletes(&self) {
        self.inner.gate.finish_deletes(self.inner.config.renew_deadline).await;
    }

    /// Leaves the ring: no claim is granted from now on, the shard Lease is released (call
    /// it after the plugins drained, so nothing is in flight), and so is the assignment
    /// role's if this replica holds it. Stops the background tasks.
    pub async fn leave(&self) {
        self.inner.gate.close();
        self.inner.leave.cancel();
        let task = self.inner.keeper_task.lock().take();
        if let Some(task) = task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "the shard lease was lost while leaving"),
                Err(error) => tracing::warn!(%error, "the shard lease keeper failed"),
            }
        }
        self.inner.stop.cancel();
        let campaign = self.inner.campaign.lock().take();
        if let Some(campaign) = campaign
            && tokio::time::timeout(self.inner.config.renew_deadline, campaign).await.is_err()
        {
            tracing::warn!("the assignment role did not stop in time; its Lease will run out instead");
        }
    }
}
