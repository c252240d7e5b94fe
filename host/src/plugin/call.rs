//! The call in progress on one plugin instance, as the host imports see it.
//!
//! Invariants: the runtime resets [`CallInfo`] before every call into the guest (and before
//! `init`), so an import never sees the request or deadline of an earlier call; imports only
//! read it (to tag logs and to bound their own waiting by the deadline).

use std::time::Instant;

/// The call in progress on an instance.
#[derive(Clone, Debug)]
pub(crate) struct CallInfo {
    /// The export being called (`reconcile`, `on-add`, ...).
    pub export: &'static str,
    /// `namespace/name` of the request being reconciled, if any.
    pub request: Option<String>,
    /// When the call's deadline expires.
    pub deadline: Instant,
    /// Why this call may not write (create, update, patch, delete, publish an Event), if it
    /// may not: an admission call of a webhook with no side effects (or of a dry run).
    pub writes_refused: Option<String>,
}

impl CallInfo {
    /// No call yet (an instance being created).
    pub fn idle() -> Self {
        CallInfo { export: "", request: None, deadline: Instant::now(), writes_refused: None }
    }
}
