//! The call in progress on one plugin instance, as the host imports see it, and what ends a
//! call that is blocked in a host call.
//!
//! Invariants: the runtime resets [`CallInfo`] before every call into the guest (and before
//! `init`), so an import never sees the request or deadline of an earlier call; imports only
//! read it (to tag logs and to bound their own waiting by the deadline). A host call that
//! waits ([`Interrupts::block_on`]) returns at the call's deadline, when the host shuts down
//! or when this replica loses its leader lease, whichever comes first, with a trap naming
//! the host call it was blocked in ([`BlockedCallEnded`]).

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

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
    /// The call runs as a future on an async runtime's thread (`call_async`): at each epoch
    /// tick it yields to the executor, so it holds the thread for one tick at most at a
    /// time. A blocking call (`call`) continues instead.
    pub yields: bool,
}

impl CallInfo {
    /// No call yet (an instance being created).
    pub fn idle() -> Self {
        CallInfo { export: "", request: None, deadline: Instant::now(), writes_refused: None, yields: false }
    }
}

/// Runs `wait`, which blocks its thread until a host call's work is done. On a
/// multi-threaded tokio runtime's worker (a call running as a future in a task, see
/// [`CallInfo::yields`]) the worker first hands its other tasks to another thread
/// (`block_in_place`), so they, and the work `wait` waits for, keep running; on any other
/// thread (a blocking-pool thread, a thread of no runtime) it runs as it is.
pub(crate) fn blocking_wait<R>(wait: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

/// What ends calls besides their deadline; shared by every instance of a plugin.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interrupts {
    /// Cancelled when the host shuts down: calls blocked in a host call end.
    pub shutdown: CancellationToken,
    /// Cancelled when this replica lost its leader lease (the plugin's cluster access was
    /// revoked): every call ends, running or blocked.
    pub revoked: Option<CancellationToken>,
}

impl Interrupts {
    /// Whether calls must stop now, wherever they are (checked at each epoch tick).
    pub fn revoked(&self) -> bool {
        self.revoked.as_ref().is_some_and(CancellationToken::is_cancelled)
    }

    /// Runs the wait `wait` of the host call `host_call` until it is done or, first, the
    /// call's `deadline` passes, the host shuts down or the lease is lost: then the call
    /// traps with a [`BlockedCallEnded`] naming `host_call`. Blocks the thread (on the
    /// ambient tokio runtime, or wasmtime-wasi's own when there is none).
    pub fn block_on<R>(
        &self,
        host_call: &'static str,
        deadline: Instant,
        wait: impl Future<Output = wasmtime::Result<R>>,
    ) -> wasmtime::Result<R> {
        let ended = |why| Err(wasmtime::Error::new(BlockedCallEnded { why, host_call }));
        if self.revoked() {
            return ended(Why::Revoked);
        }
        if self.shutdown.is_cancelled() {
            return ended(Why::Shutdown);
        }
        let revoked = self.revoked.clone().unwrap_or_default();
        let shutdown = self.shutdown.clone();
        blocking_wait(|| {
            wasmtime_wasi::runtime::in_tokio(async move {
                tokio::select! {
                    biased;
                    () = revoked.cancelled() => ended(Why::Revoked),
                    () = shutdown.cancelled() => ended(Why::Shutdown),
                    r = wait => r,
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => ended(Why::Deadline),
                }
            })
        })
    }
}

/// Why a blocked host call ended early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    Deadline,
    Shutdown,
    Revoked,
}

/// A call trapped while blocked in a host call.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe(None))]
pub(crate) struct BlockedCallEnded {
    pub why: Why,
    pub host_call: &'static str,
}

impl BlockedCallEnded {
    /// The reason, with the call's deadline when known.
    pub fn describe(&self, deadline: Option<Duration>) -> String {
        let call = self.host_call;
        match (self.why, deadline) {
            (Why::Deadline, Some(d)) => {
                format!("deadline exceeded while blocked in {call} (the call's deadline is {d:?})")
            }
            (Why::Deadline, None) => format!("deadline exceeded while blocked in {call}"),
            (Why::Shutdown, _) => format!("cancelled: the host is shutting down, while blocked in {call}"),
            (Why::Revoked, _) => {
                format!("cancelled: this replica lost its leader lease, while blocked in {call}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> impl Future<Output = wasmtime::Result<()>> {
        std::future::pending()
    }

    fn reason(r: wasmtime::Result<()>) -> BlockedCallEnded {
        let e = r.unwrap_err();
        let ended = e.downcast_ref::<BlockedCallEnded>().unwrap_or_else(|| panic!("{e:#}"));
        BlockedCallEnded { why: ended.why, host_call: ended.host_call }
    }

    #[test]
    fn a_wait_ends_at_the_deadline_naming_the_host_call() {
        let i = Interrupts::default();
        let ended =
            reason(i.block_on("wasi:io/poll.poll", Instant::now() + Duration::from_millis(20), never()));
        assert_eq!(ended.why, Why::Deadline);
        assert_eq!(
            ended.describe(Some(Duration::from_millis(20))),
            "deadline exceeded while blocked in wasi:io/poll.poll (the call's deadline is 20ms)"
        );
    }

    #[test]
    fn a_wait_that_finishes_first_returns_its_result() {
        let i = Interrupts::default();
        let r = i.block_on("x", Instant::now() + Duration::from_secs(3600), async { Ok(7) });
        assert_eq!(r.unwrap(), 7);
    }

    #[test]
    fn shutdown_and_lease_loss_end_a_wait_at_once() {
        let far = Instant::now() + Duration::from_secs(3600);
        let i = Interrupts { shutdown: CancellationToken::new(), revoked: Some(CancellationToken::new()) };
        // Cancelled while the wait is under way.
        std::thread::scope(|s| {
            let waiting = s.spawn(|| reason(i.block_on("wasi:io/poll.poll", far, never())));
            i.shutdown.cancel();
            let ended = waiting.join().unwrap_or_else(|_| panic!("panicked"));
            assert_eq!(ended.why, Why::Shutdown);
            assert!(ended.describe(None).contains("shutting down, while blocked in wasi:io/poll.poll"));
        });
        let i = Interrupts { shutdown: CancellationToken::new(), revoked: Some(CancellationToken::new()) };
        if let Some(r) = &i.revoked {
            r.cancel();
        }
        assert!(i.revoked());
        assert_eq!(reason(i.block_on("wasi:io/poll.pollable.block", far, never())).why, Why::Revoked);
    }
}
