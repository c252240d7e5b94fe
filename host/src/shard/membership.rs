//! Membership: what this replica sees of its ring's Leases, and when it saw each change.
//!
//! One watch on the Leases labelled with the ring (the shard Leases and the assignment
//! Lease). For each shard it records the holder, the renew time and *the instant this
//! replica saw them change* (its own monotonic clock, as client-go's leader election does:
//! no comparison of clocks across machines). A shard is:
//! - **live** while its Lease is held and changed less than its lease duration ago;
//! - **stopped** when its Lease was released (the holder cleared: a replica does that only
//!   after its work stopped), or when it has not changed for a whole lease duration (a
//!   replica stops itself at its renew deadline, which is shorter), or when it was never seen
//!   in a lease duration since this watch first synced, or was deleted and its last change
//!   is a lease duration old.
//!
//! Invariant: `stopped` is never said of a shard that may still be working, provided the
//! shard keeps its side (it stops working once a renew deadline passed since the *start* of
//! its last successful renewal; see `lease`): the change was written after that start, and
//! this replica saw it no earlier than it was written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handover::{Assignment, Members, Peer};
use super::protocol::{
    self, LabelScope, RING_LABEL, ROLE_ASSIGNMENT, ROLE_LABEL, ROLE_SHARD, SHARD_ANNOTATION,
};

/// One shard Lease as last seen.
#[derive(Clone, Debug)]
pub struct ShardSeen {
    pub lease: String,
    pub resource_version: Option<String>,
    pub holder: Option<String>,
    renew_time: Option<MicroTime>,
    pub lease_duration: Duration,
    /// When this replica saw the holder or renew time change (or the Lease appear).
    pub changed_at: Instant,
    pub acked: Option<u64>,
    /// Still there (false once its deletion was seen).
    pub present: bool,
    pub scopes: Vec<LabelScope>,
}

impl ShardSeen {
    /// When it stops counting as live (if held).
    pub fn expires_at(&self) -> Instant {
        self.changed_at + self.lease_duration
    }

    pub fn is_live(&self, now: Instant) -> bool {
        self.present && self.holder.is_some() && now < self.expires_at()
    }

    /// Whether the renew time the holder wrote, plus its lease duration, is still ahead of
    /// this machine's wall clock. Only membership uses it (a replica that started after
    /// another died must not add it to the ring for a whole lease duration); whether a
    /// replica has *stopped* never depends on clocks of other machines.
    fn renewed_recently(&self) -> bool {
        let Some(renewed) = &self.renew_time else { return true };
        let Ok(duration) = k8s_openapi::jiff::SignedDuration::try_from(self.lease_duration) else {
            return true;
        };
        renewed.0.checked_add(duration).is_ok_and(|until| until > k8s_openapi::jiff::Timestamp::now())
    }

    pub fn is_stopped(&self, now: Instant) -> bool {
        (self.present && self.holder.is_none()) || now >= self.expires_at()
    }
}

/// The ring as this replica sees it at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// By shard name.
    pub shards: BTreeMap<String, ShardSeen>,
    /// The latest readable assignment, with the identity holding the assignment Lease.
    pub assignment: Option<Assignment>,
    pub assigner: Option<String>,
    /// When the watch first listed the Leases (`None`: not yet).
    pub synced_at: Option<Instant>,
    /// The lease duration assumed for a shard never seen.
    default_duration: Duration,
}

impl Snapshot {
    fn empty(default_duration: Duration) -> Self {
        Snapshot {
            shards: BTreeMap::new(),
            assignment: None,
            assigner: None,
            synced_at: None,
            default_duration,
        }
    }

    /// What `shard`'s Lease says now about the replica holding it as `identity` (see the
    /// module doc). A Lease held by another identity, or released, says that one stopped:
    /// a new holder takes a Lease only once it was released or ran out.
    pub fn peer(&self, shard: &str, identity: &str, now: Instant) -> Peer {
        match self.shards.get(shard) {
            Some(seen) if seen.holder.as_deref() == Some(identity) => {
                Peer { acked: seen.acked, stopped: seen.is_stopped(now) }
            }
            // Released, or held by another identity (also if deleted since): that holder
            // took it after `identity` released it or ran out. (One watch carries both the
            // Leases and the assignment, in order: an assignment naming `identity` comes
            // after the Lease change that made `identity` its holder.)
            Some(_) => Peer { acked: None, stopped: true },
            None => Peer {
                acked: None,
                stopped: self.synced_at.is_some_and(|s| now >= s + self.default_duration),
            },
        }
    }

    /// The identity holding `shard`'s Lease, as last seen.
    pub fn holder(&self, shard: &str) -> Option<&str> {
        self.shards.get(shard).and_then(|s| s.holder.as_deref())
    }

    /// Shards whose Leases are live now, with their holders: as observed here, and renewed
    /// within their lease duration by this machine's clock.
    pub fn live(&self, now: Instant) -> Members {
        self.shards
            .iter()
            .filter(|(_, s)| s.is_live(now) && s.renewed_recently())
            .filter_map(|(n, s)| Some((n.clone(), s.holder.clone()?)))
            .collect()
    }

    /// The next instant (after `now`) at which some shard's liveness changes by the clock
    /// alone, if any.
    pub fn next_change(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> =
            self.shards.values().map(ShardSeen::expires_at).filter(|t| *t > now).min();
        if let Some(s) = self.synced_at {
            let unseen = s + self.default_duration;
            if unseen > now {
                next = Some(next.map_or(unseen, |n| n.min(unseen)));
            }
        }
        next
    }
}

/// Follows the Leases of one ring.
pub struct Membership {
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl Membership {
    /// Starts watching the Leases of `ring` in `namespace` until `stop` is cancelled.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        ring: &str,
        default_duration: Duration,
        stop: CancellationToken,
    ) -> Membership {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::empty(default_duration)));
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(&format!("{RING_LABEL}={ring}"));
        let ring = ring.to_owned();
        tokio::spawn(async move {
            let mut state = State { snapshot: Snapshot::empty(default_duration), listing: None };
            let stream = watcher(api, config).default_backoff();
            tokio::pin!(stream);
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = stream.next() => e,
                };
                match event {
                    Some(Ok(event)) => {
                        if state.apply(event, Instant::now()) {
                            tx.send_replace(Arc::new(state.snapshot.clone()));
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%ring, %error, "watching the ring's Leases failed; retrying")
                    }
                    None => return,
                }
            }
        });
        Membership { snapshot: rx }
    }

    /// The latest snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// Follows snapshots.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }
}

/// The watch's state: the snapshot, and the Leases of a relist in progress.
struct State {
    snapshot: Snapshot,
    listing: Option<BTreeSet<String>>,
}

impl State {
    /// Applies one watch event; returns whether the snapshot changed.
    fn apply(&mut self, event: watcher::Event<Lease>, now: Instant) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeSet::new());
                false
            }
            watcher::Event::InitApply(lease) => {
                let name = lease.metadata.name.clone().unwrap_or_default();
                if let Some(listing) = &mut self.listing {
                    listing.insert(name);
                }
                self.upsert(&lease, now);
                false
            }
            watcher::Event::InitDone => {
                // A Lease seen before and missing from the relist was deleted meanwhile.
                let listed = self.listing.take().unwrap_or_default();
                for seen in self.snapshot.shards.values_mut() {
                    if !listed.contains(&seen.lease) {
                        seen.present = false;
                    }
                }
                if self.snapshot.synced_at.is_none() {
                    self.snapshot.synced_at = Some(now);
                }
                true
            }
            watcher::Event::Apply(lease) => {
                self.upsert(&lease, now);
                true
            }
            watcher::Event::Delete(lease) => {
                let name = lease.metadata.name.unwrap_or_default();
                for seen in self.snapshot.shards.values_mut() {
                    if seen.lease == name {
                        seen.present = false;
                    }
                }
                true
            }
        }
    }

    fn upsert(&mut self, lease: &Lease, now: Instant) {
        let labels = lease.metadata.labels.clone().unwrap_or_default();
        let annotations = lease.metadata.annotations.clone().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        match labels.get(ROLE_LABEL).map(String::as_str) {
            Some(ROLE_ASSIGNMENT) => {
                if let Some(a) = protocol::decode_assignment(&annotations)
                    && self.snapshot.assignment.as_ref().is_none_or(|old| a.epoch >= old.epoch)
                {
                    self.snapshot.assignment = Some(a);
                }
                self.snapshot.assigner = holder;
            }
            Some(ROLE_SHARD) => {
                let Some(shard) = annotations.get(SHARD_ANNOTATION).cloned() else { return };
                let name = lease.metadata.name.clone().unwrap_or_default();
                let lease_duration = spec
                    .lease_duration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .filter(|s| *s > 0)
                    .map_or(self.snapshot.default_duration, Duration::from_secs);
                let acked = protocol::decode_acked(&annotations);
                let scopes = protocol::decode_scopes(&annotations);
                let renew_time = spec.renew_time;
                let resource_version = lease.metadata.resource_version.clone();
                match self.snapshot.shards.get_mut(&shard) {
                    Some(seen) => {
                        if seen.holder != holder
                            || seen.renew_time != renew_time
                            || !seen.present
                            || seen.lease != name
                        {
                            seen.changed_at = now;
                        }
                        seen.lease = name;
                        seen.resource_version = resource_version;
                        seen.holder = holder;
                        seen.renew_time = renew_time;
                        seen.lease_duration = lease_duration;
                        seen.acked = acked;
                        seen.present = true;
                        seen.scopes = scopes;
                    }
                    None => {
                        self.snapshot.shards.insert(
                            shard,
                            ShardSeen {
                                lease: name,
                                resource_version,
                                holder,
                                renew_time,
                                lease_duration,
                                changed_at: now,
                                acked,
                                present: true,
                                scopes,
                            },
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn base() -> k8s_openapi::jiff::Timestamp {
        static BASE: std::sync::OnceLock<k8s_openapi::jiff::Timestamp> = std::sync::OnceLock::new();
        *BASE.get_or_init(k8s_openapi::jiff::Timestamp::now)
    }

    fn lease(shard: &str, holder: Option<&str>, renew: i64, acked: Option<u64>) -> Lease {
        let mut annotations = BTreeMap::from([(SHARD_ANNOTATION.to_owned(), shard.to_owned())]);
        if let Some(a) = acked {
            annotations.insert(protocol::ACKED_ANNOTATION.into(), a.to_string());
        }
        Lease {
            metadata: ObjectMeta {
                name: Some(protocol::shard_lease_name("r", shard)),
                labels: Some(BTreeMap::from([
                    (RING_LABEL.to_owned(), "r".to_owned()),
                    (ROLE_LABEL.to_owned(), ROLE_SHARD.to_owned()),
                ])),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                // `renew - 100` seconds from when the tests first asked (wall clock).
                renew_time: Some(MicroTime(
                    base()
                        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(renew - 100))
                        .expect("a valid time"),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    fn state() -> State {
        State { snapshot: Snapshot::empty(Duration::from_secs(15)), listing: None }
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_follows_the_changes_this_replica_saw() {
        let mut s = state();
        let t0 = Instant::now();
        s.apply(watcher::Event::Init, t0);
        s.apply(watcher::Event::InitApply(lease("a", Some("a_1"), 100, Some(3))), t0);
        s.apply(watcher::Event::InitDone, t0);
        let snap = &s.snapshot;
        assert_eq!(snap.live(t0), Members::from([("a".to_owned(), "a_1".to_owned())]));
        assert_eq!(snap.peer("a", "a_1", t0), Peer { acked: Some(3), stopped: false });
        assert_eq!(
            snap.peer("a", "a_0", t0),
            Peer { acked: None, stopped: true },
            "another incarnation holds it"
        );
        // Written too long ago by the writer's clock: not a member, though not stopped.
        let mut old = state();
        old.apply(watcher::Event::Apply(lease("z", Some("z_1"), 80, None)), t0);
        assert!(old.snapshot.live(t0).is_empty());
        assert!(!old.snapshot.peer("z", "z_1", t0).stopped);
        // Not renewed: live until a lease duration after it was seen, then stopped.
        let later = t0 + Duration::from_secs(15);
        assert!(snap.live(later - Duration::from_millis(1)).contains_key("a"));
        assert!(snap.peer("a", "a_1", later).stopped);
        assert_eq!(snap.next_change(t0), Some(later));
        // A renewal (new renew time) seen at t1 moves the expiry; a re-delivery of the same
        // record does not.
        let t1 = t0 + Duration::from_secs(10);
        s.apply(watcher::Event::Apply(lease("a", Some("a_1"), 102, Some(3))), t1);
        s.apply(watcher::Event::Apply(lease("a", Some("a_1"), 102, Some(4))), t1 + Duration::from_secs(5));
        assert_eq!(s.snapshot.shards["a"].expires_at(), t1 + Duration::from_secs(15));
        assert_eq!(s.snapshot.peer("a", "a_1", t1).acked, Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn released_deleted_and_unseen_shards() {
        let mut s = state();
        let t0 = Instant::now();
        s.apply(watcher::Event::Init, t0);
        s.apply(watcher::Event::InitApply(lease("a", Some("a_1"), 100, Some(1))), t0);
        s.apply(watcher::Event::InitDone, t0);
        // Never seen: stopped only a lease duration after the first list.
        assert!(!s.snapshot.peer("ghost", "ghost_1", t0).stopped);
        assert!(s.snapshot.peer("ghost", "ghost_1", t0 + Duration::from_secs(15)).stopped);
        // Released: stopped at once, and its acknowledgement no longer counts.
        s.apply(watcher::Event::Apply(lease("a", None, 101, Some(1))), t0);
        assert_eq!(s.snapshot.peer("a", "a_1", t0), Peer { acked: None, stopped: true });
        assert!(s.snapshot.live(t0).is_empty());
        // Deleted while held: stopped a lease duration after its last change.
        s.apply(watcher::Event::Apply(lease("b", Some("b_1"), 100, None)), t0);
        s.apply(watcher::Event::Delete(lease("b", Some("b_1"), 100, None)), t0 + Duration::from_secs(1));
        assert!(!s.snapshot.peer("b", "b_1", t0 + Duration::from_secs(14)).stopped);
        assert!(s.snapshot.peer("b", "b_1", t0 + Duration::from_secs(15)).stopped);
        // Missing from a relist: deleted.
        s.apply(watcher::Event::Apply(lease("c", Some("c_1"), 100, None)), t0);
        s.apply(watcher::Event::Init, t0);
        s.apply(watcher::Event::InitDone, t0);
        assert!(!s.snapshot.shards["c"].present);
    }
}
