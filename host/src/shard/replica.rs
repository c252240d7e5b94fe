//! The replica's side of the protocol, driven by what membership sees: take each newly
//! published epoch ([`Gate::publish`]), release it (wait for the lost keys in flight,
//! acknowledge it in the shard Lease), and complete it as soon as every replica involved is
//! done with it — re-checked at every Lease change and at the instant a silent replica's
//! Lease runs out.
//!
//! Invariant: an acknowledgement is written only after [`Gate::released`] returned for that
//! epoch; a completion is decided only from a membership snapshot and the time it is
//! decided at (a replica counts as stopped only by the rules of `membership`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handover::Assignment;
use super::lease::LeaseHandle;
use super::membership::{Membership, Snapshot};
use super::metrics::ShardMetrics;
use super::ownership::Gate;
use super::scopes::Scopes;

/// How often retained keys are pruned and `wasmctrl_shard_keys` refreshed.
const TIDY_EVERY: Duration = Duration::from_secs(5);

/// Runs the replica's protocol until `stop` is cancelled.
pub async fn drive(
    gate: Arc<Gate>,
    membership: Arc<Membership>,
    lease: LeaseHandle,
    scopes: Option<Arc<Scopes>>,
    drain_limit: Duration,
    metrics: ShardMetrics,
    stop: CancellationToken,
) {
    let mut snapshots = membership.subscribe();
    let (acked_tx, mut acked_rx) = mpsc::unbounded_channel::<u64>();
    // When each epoch was first seen, for the hand-over time.
    let mut seen_at: Option<(u64, Instant)> = None;
    let mut tidy = tokio::time::interval(TIDY_EVERY);
    tidy.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let snapshot: Arc<Snapshot> = snapshots.borrow_and_update().clone();
        let now = Instant::now();
        if let Some(assignment) = &snapshot.assignment
            && let Some(epoch) = gate.publish(assignment.clone())
        {
            seen_at = Some((epoch, now));
            let members: Vec<&String> = assignment.members.keys().collect();
            tracing::info!(
                epoch,
                ?members,
                "ring epoch published: releasing the keys this replica no longer owns"
            );
            let (gate, lease, acked) = (gate.clone(), lease.clone(), acked_tx.clone());
            tokio::spawn(async move {
                if gate.release(epoch, drain_limit).await && lease.ack(epoch).await {
                    tracing::info!(epoch, "ring epoch acknowledged");
                    let _ = acked.send(epoch);
                }
            });
        }
        let peer = |shard: &str, identity: &str| snapshot.peer(shard, identity, now);
        if let Some(completion) = gate.try_complete(&peer) {
            let epoch = completion.epoch();
            if let Some((e, at)) = seen_at
                && e == epoch
            {
                metrics.handover_seconds.observe(at.elapsed().as_secs_f64());
            }
            let assignment = completion.assignment().cloned().unwrap_or_else(|| Assignment {
                epoch,
                members: Default::default(),
                previous: Default::default(),
            });
            // Stopped replicas whose keys this epoch hands to the others: time since their
            // Lease last changed (for a crash: about when it died).
            for (gone, identity) in &assignment.previous {
                if assignment.members.get(gone) != Some(identity)
                    && let Some(seen) = snapshot.shards.get(gone)
                    && snapshot.peer(gone, identity, now).stopped
                    && seen.holder.as_deref() != assignment.members.get(gone).map(String::as_str)
                {
                    metrics
                        .takeover_seconds
                        .observe(now.saturating_duration_since(seen.changed_at).as_secs_f64());
                }
            }
            let members: Vec<&String> = assignment.members.keys().collect();
            tracing::info!(epoch, ?members, "ring epoch completed: working on this replica's keys of it");
        }
        let wake = snapshot.next_change(now);
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            Some(_) = acked_rx.recv() => {}
            _ = tidy.tick() => {
                gate.tidy();
                if let Some(scopes) = &scopes {
                    scopes.publish();
                }
            }
            _ = async { match wake { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {}
        }
    }
}
