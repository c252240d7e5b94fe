//! Taking a [`Generation`] out of service without losing anything it was sent.
//!
//! Invariants: an enqueueing handler the next generation does not need *drains* (delivers
//! its buffer into the queue, then ends) when the old generation retires, once its
//! informer has caught up with the point the next generation's informers of that kind have
//! reached (a change from before that point, say an object created and deleted, is in no
//! cache the successor lists), and after a delete for every object its informer still
//! caches that the next generation's informers of that kind no longer have (a lagging
//! informer's unprocessed delete reaches no handler once its own has left, and the
//! successor's synthetic adds never name the object). All of a version's handlers on one
//! informer leave at one instant of its stream. [`Generation::retire`] returns only once
//! none of its handlers will be called again and its version's last hook call returned
//! (listener and dispatcher). A plugin that stops (no successor) first lets its informers
//! catch up with the server ([`Generation::catch_up_with_server`]), so its handlers drain
//! every change made before the stop began into the parked queue.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::generation::Generation;
use super::leases::{InformerLeases, LeasedInformer, LeasedRegistration, WatchKey};
use crate::fifo::SourceProgress;
use crate::object::compare_resource_versions;
use crate::plugin::Gvk;

impl Generation {
    /// Keys of every object cached by the informers this generation's enqueuers of `kind`
    /// listen to (`None`: it enqueues nothing from that kind). Any later delete of one of
    /// them reaches one of those enqueuers.
    fn enqueued_keys_of_kind(&self, kind: &Gvk) -> Option<std::collections::HashSet<String>> {
        let watched: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .filter(|(id, _)| &id.key.kind == kind)
            .map(|(id, _)| id.key.clone())
            .collect();
        if watched.is_empty() {
            return None;
        }
        Some(watched.iter().filter_map(|k| self.leases.informers.get(k)).flat_map(|i| i.keys()).collect())
    }

    /// Before its handlers leave, lets each informer of this generation that the successor
    /// does not use catch up with the successor's informers of the same kind: whatever
    /// happened before the successor's informers' current point is either in their caches
    /// (the successor's synthetic adds) or must reach this generation's handlers. An object
    /// created and deleted while this informer lagged is in neither cache, so only this
    /// informer can still deliver it.
    ///
    /// Resource versions of one resource are compared as integers (Kubernetes ≥ 1.35,
    /// KEP-5504; both our servers issue them so). A watch that is open, has handed out all it
    /// received and brought nothing for [`QUIET_STREAM`] counts as caught up (a quiet
    /// informer would otherwise wait for the server's next bookmark, about a minute on
    /// kube-apiserver). The wait is bounded by [`CATCH_UP_TIMEOUT`]; then a warning names the
    /// informer and what it had not reached.
    async fn catch_up_with(&self, successor: &Generation) {
        let mine: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .map(|(id, _)| id.key.clone())
            .chain(self.hooks.lock().iter().map(|(key, _)| key.clone()))
            .filter(|key| !successor.leases.informers.contains_key(key))
            .collect();
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        for key in mine {
            let Some(informer) = self.leases.informers.get(&key) else { continue };
            let Some(target) = successor
                .leases
                .informers
                .iter()
                .filter(|(k, _)| k.kind == key.kind)
                .filter_map(|(_, i)| i.progress().received)
                .max_by(|a, b| compare_resource_versions(a, b).unwrap_or(std::cmp::Ordering::Equal))
            else {
                continue;
            };
            let outcome = catch_up(&**informer, &target, deadline).await;
            match outcome {
                CatchUp::TimedOut(progress) => tracing::warn!(
                    plugin = %self.config.name, version = %self.version, informer = %key, %target,
                    delivered = progress.delivered.as_deref().unwrap_or(""),
                    "the retiring version's informer did not catch up with its successor's in time; \
                     changes it has not processed yet may reach no version"
                ),
                outcome => tracing::debug!(plugin = %self.config.name, version = %self.version,
                    informer = %key, %target, ?outcome, "retiring informer caught up"),
            }
        }
    }

    /// Before a plugin stops (no successor): lets each informer this generation has
    /// handlers on catch up with the server's current resourceVersion of its scope, so every
    /// change made before the stop began reaches the handlers, which then drain into the
    /// parked queue (a delete whose event was still on its way would otherwise reach no
    /// handler, and the plugin's return lists the object gone). Same bounds as
    /// [`catch_up_with`](Self::catch_up_with); a failed lookup skips the informer.
    pub async fn catch_up_with_server(&self, provider: &dyn InformerLeases) {
        let keys: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .map(|(id, _)| id.key.clone())
            .chain(self.hooks.lock().iter().map(|(key, _)| key.clone()))
            .collect();
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        for key in keys {
            let Some(informer) = self.leases.informers.get(&key) else { continue };
            let target = match provider.current_resource_version(&key).await {
                Ok(rv) => rv,
                Err(error) => {
                    tracing::warn!(plugin = %self.config.name, version = %self.version, informer = %key, %error,
                        "cannot read the server's resourceVersion; stopping without waiting for the informer");
                    continue;
                }
            };
            match catch_up(&**informer, &target, deadline).await {
                CatchUp::TimedOut(progress) => tracing::warn!(
                    plugin = %self.config.name, version = %self.version, informer = %key, %target,
                    delivered = progress.delivered.as_deref().unwrap_or(""),
                    "the stopping version's informer did not reach the server's resourceVersion in time"
                ),
                outcome => tracing::debug!(plugin = %self.config.name, version = %self.version,
                    informer = %key, %target, ?outcome, "stopping informer caught up with the server"),
            }
        }
    }

    /// Takes this generation out of service without losing anything it was sent: every
    /// handler it still has is removed after delivering its buffer; returns once none of
    /// its handlers will be called again and its version's last hook call has returned.
    ///
    /// With a `successor` (the generation that follows this one), an enqueuer on a kind the
    /// successor watches too also delivers a delete for each object its informer still
    /// caches but the successor's informers of that kind no longer have: when the two
    /// watch through different informers (another scope, selector or transform), this one
    /// may lag behind, and a delete it has not processed yet when its handler leaves would
    /// otherwise reach no handler at all (the successor's synthetic adds start after it).
    ///
    /// `left` says which of those objects only left the successor's scope (see `scope`):
    /// no delete is sent for them. It applies to the successor's `for` kind.
    #[allow(clippy::type_complexity)]
    pub async fn retire(&self, successor: Option<&Generation>, left: Option<&(dyn Fn(&str) -> bool + Sync)>) {
        if let Some(successor) = successor {
            self.catch_up_with(successor).await;
        }
        type Leaving = (Box<dyn LeasedRegistration>, Option<Arc<std::collections::HashSet<String>>>);
        let mut by_informer: BTreeMap<WatchKey, Vec<Leaving>> = BTreeMap::new();
        // The successor's view of each kind, taken after its handlers were registered
        // (anything it drops later, its own handlers receive) and before these removals.
        let mut present_by_kind: HashMap<Gvk, Option<Arc<std::collections::HashSet<String>>>> =
            HashMap::new();
        for (id, r) in self.enqueuers.lock().drain(..) {
            let present = present_by_kind
                .entry(id.key.kind.clone())
                .or_insert_with(|| {
                    successor.and_then(|s| s.enqueued_keys_of_kind(&id.key.kind)).map(Arc::new)
                })
                .clone();
            by_informer.entry(id.key).or_default().push((r, present));
        }
        for (key, r) in self.hooks.lock().drain(..) {
            by_informer.entry(key).or_default().push((r, None));
        }
        let mut waits = Vec::new();
        {
            let mut leaving = self.leaving.lock();
            for (key, registrations) in by_informer {
                // All of this version's handlers on one informer leave at one instant of its
                // stream: a notification reaches all of them or none (an enqueuer must not
                // miss a delete its sibling hook handler still saw).
                let for_kind = successor.is_some_and(|s| s.config.for_source.kind == key.kind);
                let tests: Vec<Option<Box<dyn Fn(&str) -> bool + '_>>> = registrations
                    .iter()
                    .map(|(_, present)| {
                        present.as_ref().map(|p| {
                            Box::new(move |k: &str| {
                                p.contains(k) || (for_kind && left.is_some_and(|left| left(k)))
                            }) as Box<dyn Fn(&str) -> bool>
                        })
                    })
                    .collect();
                let removals: Vec<(&dyn LeasedRegistration, Option<&dyn Fn(&str) -> bool>)> =
                    registrations.iter().zip(&tests).map(|((r, _), t)| (&**r, t.as_deref())).collect();
                match self.leases.informers.get(&key) {
                    Some(informer) => informer.remove_handlers(&removals),
                    None => {
                        for &(r, present) in &removals {
                            match present {
                                Some(present) => r.remove_draining_departed(present),
                                None => r.remove_draining(),
                            }
                        }
                    }
                }
                drop(removals);
                drop(tests);
                leaving.extend(registrations.into_iter().map(|(r, _)| r));
            }
            for r in leaving.iter() {
                waits.push(r.finished());
            }
        }
        futures::future::join_all(waits).await;
        self.leaving.lock().clear();
        let plugin = self.plugin.clone();
        // The last calls queued to this version's hook dispatcher.
        if let Err(e) = tokio::task::spawn_blocking(move || plugin.drain_notifications()).await {
            tracing::warn!(plugin = %self.config.name, version = %self.version, error = %e, "waiting for the hook dispatcher failed");
        }
    }
}

/// Upper bound of [`Generation::catch_up_with`].
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an open watch that handed out everything it received must have brought nothing
/// to count as caught up (watch latency on a healthy server is milliseconds).
const QUIET_STREAM: Duration = Duration::from_secs(1);

/// How a wait for an informer to reach a resourceVersion ended.
#[derive(Debug)]
enum CatchUp {
    Reached,
    Quiet,
    /// The resource versions are not integers: nothing to wait for by them.
    Incomparable,
    TimedOut(SourceProgress),
}

/// Waits until `informer` has handed out every change up to `target` (see
/// [`Generation::catch_up_with`]).
async fn catch_up(informer: &dyn LeasedInformer, target: &str, deadline: tokio::time::Instant) -> CatchUp {
    loop {
        let seq = informer.progress_seq();
        let progress = informer.progress();
        if let Some(delivered) = &progress.delivered {
            match compare_resource_versions(delivered, target) {
                Some(std::cmp::Ordering::Less) => {}
                Some(_) => return CatchUp::Reached,
                None => return CatchUp::Incomparable,
            }
        }
        // Quiet: the stream is open, everything received was handed out, and nothing came
        // for `QUIET_STREAM` (when that is still ahead, it is a time to wake at).
        let quiet_at = match progress.quiet_since {
            Some(since) if progress.streaming && progress.delivered == progress.received => {
                Some(since + QUIET_STREAM)
            }
            _ => None,
        };
        let now = tokio::time::Instant::now();
        if quiet_at.is_some_and(|at| at <= now) {
            return CatchUp::Quiet;
        }
        if now >= deadline {
            return CatchUp::TimedOut(progress);
        }
        // Woken by the next change of the informer's progress (a signal, not a poll), or
        // when the stream would count as quiet, or at the deadline.
        let wake = quiet_at.map_or(deadline, |at| at.min(deadline));
        tokio::select! {
            () = informer.progress_after(seq) => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}
