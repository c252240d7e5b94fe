//! Label mode, the assignment role's half: every object of every scope the replicas asked
//! for (their shard Leases list the scopes) carries the label naming its owner in the
//! published epoch.
//!
//! An object is (re)labelled only when that cannot take it from a replica still working on
//! it: when it has no label, or its label names a replica that has acknowledged the current
//! epoch (so it has let go of every key it does not own in it) or has stopped. Labels decide
//! only what a replica *caches*; whether it works on a key is decided by the hand-over alone,
//! and a replica reconciles an owned key only once the object is in its cache or gone from
//! the scope (see `ownership`), so a label written late, early or twice costs time, never
//! correctness.
//!
//! Invariants: at most [`IN_FLIGHT`] label writes at once; a key is written again only after
//! its last write finished, and is looked at again then if it changed meanwhile (a newer
//! epoch included); the work queue holds each key once.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::directory::{self, Directory};
use super::handover::{Assignment, View};
use super::membership::{Membership, Snapshot};
use super::metrics::ShardMetrics;
use super::protocol::LabelScope;
use crate::source::Discovery;

/// Label writes in flight at once.
pub const IN_FLIGHT: usize = 16;

/// Finds (or starts) the directory of a scope; shared with the replica's own gates.
pub type DirectoryOf = Arc<dyn Fn(&LabelScope) -> Arc<Directory> + Send + Sync>;

/// The labelling half of the assignment role.
pub struct Labeler {
    pub client: kube::Client,
    pub discovery: Discovery,
    pub label_key: String,
    pub virtual_nodes: u32,
    pub directory_of: DirectoryOf,
    pub metrics: ShardMetrics,
}

/// A key to label in one scope.
type Job = (LabelScope, String);

impl Labeler {
    /// Labels until `leading` is cancelled, following the published assignment.
    pub async fn run(
        &self,
        membership: Arc<Membership>,
        mut published: watch::Receiver<Option<Assignment>>,
        leading: CancellationToken,
    ) {
        let mut held: BTreeMap<LabelScope, Arc<Directory>> = BTreeMap::new();
        let mut resources: BTreeMap<LabelScope, kube::core::ApiResource> = BTreeMap::new();
        // What a full look at every object was last based on.
        let mut looked: Option<(u64, BTreeSet<String>, BTreeSet<LabelScope>)> = None;
        let mut queue: VecDeque<Job> = VecDeque::new();
        let mut queued: HashSet<Job> = HashSet::new();
        let mut writing: HashSet<Job> = HashSet::new();
        // Jobs skipped while being written: looked at again once the write returns.
        let mut recheck: HashSet<Job> = HashSet::new();
        // The ring of the published assignment, built once per epoch.
        let mut view: Option<View> = None;
        let mut writes: JoinSet<(Job, Result<(), kube::Error>)> = JoinSet::new();
        let mut snapshots = membership.subscribe();
        loop {
            let snapshot = snapshots.borrow_and_update().clone();
            let assignment = published.borrow_and_update().clone();
            let now = Instant::now();
            // The scopes the live replicas ask for.
            let scopes: BTreeSet<LabelScope> = snapshot
                .shards
                .values()
                .filter(|s| s.is_live(now))
                .flat_map(|s| s.scopes.iter().cloned())
                .collect();
            held.retain(|scope, dir| {
                let keep = scopes.contains(scope);
                if !keep {
                    dir.track_changes(false);
                }
                keep
            });
            for scope in &scopes {
                if !held.contains_key(scope) {
                    let dir = (self.directory_of)(scope);
                    dir.track_changes(true);
                    held.insert(scope.clone(), dir);
                    // A new scope: look at all of it.
                    looked = None;
                }
                if !resources.contains_key(scope) {
                    match directory::resolve(&self.discovery, scope, &leading).await {
                        Some((resource, _)) => resources.insert(scope.clone(), resource),
                        None => return,
                    };
                }
            }
            if let Some(assignment) = &assignment {
                if view.as_ref().is_none_or(|v| v.assignment != *assignment) {
                    view = Some(View::new(assignment.clone(), self.virtual_nodes));
                }
                let Some(view) = view.as_ref() else { continue };
                let done: BTreeSet<String> =
                    snapshot.shards.keys().filter(|s| free(s, assignment, &snapshot, now)).cloned().collect();
                let synced: BTreeSet<LabelScope> =
                    held.iter().filter(|(_, d)| d.is_synced()).map(|(s, _)| s.clone()).collect();
                let basis = (assignment.epoch, done, synced);
                let full = looked.as_ref() != Some(&basis);
                for (scope, dir) in &held {
                    if !dir.is_synced() {
                        continue;
                    }
                    let changed = dir.take_changed();
                    let candidates: Vec<String> = if full { dir.keys() } else { changed };
                    for key in candidates {
                        let job = (scope.clone(), key);
                        if writing.contains(&job) {
                            recheck.insert(job);
                            continue;
                        }
                        if queued.contains(&job) {
                            continue;
                        }
                        if self.wanted(dir, &job.1, view, &snapshot, now).is_some() {
                            queued.insert(job.clone());
                            queue.push_back(job);
                        }
                    }
                }
                if full {
                    tracing::debug!(epoch = assignment.epoch, done = ?basis.1, scopes = basis.2.len(), queued = queue.len(),
                        "looked at every object to label");
                    looked = Some(basis);
                }
                // Start writes, re-checking each job against the latest view.
                while writes.len() < IN_FLIGHT {
                    let Some(job) = queue.pop_front() else { break };
                    queued.remove(&job);
                    let (Some(dir), Some(resource)) = (held.get(&job.0), resources.get(&job.0)) else {
                        continue;
                    };
                    let Some(owner) = self.wanted(dir, &job.1, view, &snapshot, now) else {
                        tracing::debug!(key = %job.1, label = ?dir.label(&job.1), "no label to write any more");
                        continue;
                    };
                    writing.insert(job.clone());
                    let api = object_api(&self.client, resource, &job.1);
                    let label_key = self.label_key.clone();
                    writes.spawn(async move {
                        let result = write_label(&api, &job.1, &label_key, &owner).await;
                        (job, result)
                    });
                }
            }
            let dir_changed = async {
                if held.is_empty() {
                    return std::future::pending().await;
                }
                let waits = held.values().map(|d| Box::pin(d.changed()));
                futures::future::select_all(waits).await;
            };
            let wake = snapshot.next_change(now);
            tokio::select! {
                _ = leading.cancelled() => return,
                changed = snapshots.changed() => if changed.is_err() { return },
                changed = published.changed() => if changed.is_err() { return },
                () = dir_changed => {}
                Some(done) = writes.join_next(), if !writes.is_empty() => {
                    if let Ok((job, result)) = done {
                        writing.remove(&job);
                        // A change seen while it was being written (a newer epoch, say) was
                        // skipped then: look at it again now.
                        if recheck.remove(&job) && queued.insert(job.clone()) {
                            queue.push_back(job.clone());
                        }
                        match result {
                            Ok(()) => {
                                tracing::debug!(key = %job.1, "labelled");
                                self.metrics.labels_written.inc();
                            }
                            // Gone meanwhile: its directory reports the delete.
                            Err(kube::Error::Api(s)) if s.code == 404 => {}
                            Err(error) => {
                                tracing::warn!(scope = %job.0, key = %job.1, %error, "labelling an object failed; will retry");
                                looked = None;
                            }
                        }
                    }
                }
                _ = async { match wake { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {}
            }
        }
    }

    /// The owner to label `key` with, if its label should change now.
    fn wanted(
        &self,
        dir: &Directory,
        key: &str,
        view: &View,
        snapshot: &Snapshot,
        now: Instant,
    ) -> Option<String> {
        let label = dir.label(key)?;
        let owner = view.ring.owner(key)?;
        if label.as_deref() == Some(owner) {
            return None;
        }
        let free = match &label {
            None => true,
            Some(current) => free(current, &view.assignment, snapshot, now),
        };
        free.then(|| owner.to_owned())
    }
}

/// Whether shard `label` can no longer be working on a key it does not own in
/// `assignment`: the replica the assignment (or the one before) names for it acknowledged
/// the epoch or stopped; one it names in neither works on nothing of this ring (the epoch
/// before was finished before this one was published).
fn free(label: &str, assignment: &Assignment, snapshot: &Snapshot, now: Instant) -> bool {
    [assignment.members.get(label), assignment.previous.get(label)]
        .into_iter()
        .flatten()
        .all(|identity| snapshot.peer(label, identity, now).done_with(assignment.epoch))
}

/// The API of the object of `key` (in its namespace, if it has one).
fn object_api(client: &kube::Client, resource: &kube::core::ApiResource, key: &str) -> Api<DynamicObject> {
    match key.split_once('/') {
        Some((ns, _)) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

async fn write_label(
    api: &Api<DynamicObject>,
    key: &str,
    label_key: &str,
    owner: &str,
) -> Result<(), kube::Error> {
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    let patch = serde_json::json!({"metadata": {"labels": {label_key: owner}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}
