//! Which keys a controller may work on when replicas share the work (the `wasmctrl` host's `shard`
//! implements it): the controller asks its [`Ownership`] before a request enters its queue
//! and again before a reconcile starts.
//!
//! Invariants the controller keeps:
//! - a request the ownership does not admit is not queued (the queue's admission filter);
//! - a reconcile starts only under a [`Claim`] the ownership granted for its key, and the
//!   claim is held until the reconcile's result has been handled; a request the ownership
//!   refuses to claim is dropped from the queue (`forget` + `done`), not reconciled;
//! - requests the ownership hands back later (keys this replica gained) go into the queue
//!   given to [`Ownership::attach`].

use super::Request;
use crate::queue::RateLimitingQueue;

/// Decides, per key, whether this replica works on it now.
pub trait Ownership: Send + Sync + 'static {
    /// Whether `request` may be queued now. A request refused here is not lost: the
    /// ownership keeps what it needs to queue it again if this replica gains its key.
    fn admits(&self, request: &Request) -> bool;
    /// Claims `request` for a reconcile that starts now; `None`: do not reconcile it here.
    fn claim(&self, request: &Request) -> Option<Claim>;
    /// The queue to add requests to when this replica gains their keys.
    fn attach(&self, queue: &RateLimitingQueue<Request>);
}

/// The right to reconcile one key, until dropped.
pub struct Claim(#[allow(dead_code)] Box<dyn Send + Sync>);

impl Claim {
    /// A claim released by dropping `guard`.
    pub fn new(guard: impl Send + Sync + 'static) -> Claim {
        Claim(Box::new(guard))
    }
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Claim")
    }
}
