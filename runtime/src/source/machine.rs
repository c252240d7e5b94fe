//! The reflector as a state machine (client-go `Reflector.ListAndWatch`, modelled the way
//! kube-runtime's `watcher` models it): a [`State`], the [`Outcome`] of the effect the
//! reflector last performed, and a pure [`transition`] giving the next state and the next
//! [`Effect`] to perform. The async driver ([`super::Reflector::run`]) only performs effects
//! (list, push into the FIFO, watch, sleep) and feeds their outcomes back.
//!
//! ```text
//!                      start ──► Listing{WatchCache}
//!
//!   Listing{from} ── list ok ───────────────────────► Replacing{rv}   (effect: replace FIFO)
//!         │  ├──── 410 Gone, from ≠ Consistent ─────► Listing{Consistent}   (at once)
//!         │  └──── other failure (or 410 when
//!         │        already Consistent) ─────────────► Backoff{then: List(from)}
//!   Replacing{rv} ── replaced ──────────────────────► Watching{rv}
//!   Watching{rv} ── closed, events or ≥ 1 s ────────► Watching{rv'}   (at once)
//!         │  ├───── closed at once, no events ──────► Backoff{then: Watch(rv')}   (anti-spin)
//!         │  ├───── 410 Gone / Expired ─────────────► Listing{Consistent}   (at once)
//!         │  ├───── transient failure
//!         │  │      (network, 5xx, 429) ────────────► Backoff{then: Watch(rv')}
//!         │  └───── other failure ──────────────────► Backoff{then: List(NotOlderThan(rv'))}
//!   Backoff{then} ── slept ─────────────────────────► Listing{..} / Watching{..} per `then`
//!   any state ── cancelled ─────────────────────────► Stopped
//! ```
//!
//! (`rv'` is the resourceVersion the watch reached: its last event or bookmark.)
//!
//! Invariants:
//! - [`transition`] is pure: no clock, no I/O, no randomness. The backoff's delay (jittered,
//!   with its 2-minute reset) is computed by the driver when it performs [`Effect::Sleep`]
//!   with [`Wait::Backoff`]; a server's `Retry-After` ([`Wait::RetryAfter`]) replaces the
//!   backoff without advancing it.
//! - The first list reads the watch cache (`resourceVersion=0`); after a 410 the list is a
//!   consistent read (no resourceVersion); after any other watch failure the relist is from
//!   the last resourceVersion seen (the watch cache again when there is none), unpaged.
//! - A watch is only opened from the resourceVersion of a list that was pushed into the FIFO
//!   or of the previous watch on it, so the FIFO never misses a change between the two.
//! - Cancellation stops the machine from every state; [`State::Stopped`] only leads to itself.

use std::sync::Arc;
use std::time::Duration;

use super::error::ReflectorError;
use crate::object::Object;

/// A watch that ends sooner than this after it was opened, without a single event, is
/// followed by a backoff before the next one (the server is closing watches at once).
pub(crate) const QUICK_CLOSE: Duration = Duration::from_secs(1);

/// Which resourceVersion a list reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListFrom {
    /// `resourceVersion=0`: any version, served from the API server's watch cache (paged).
    WatchCache,
    /// No resourceVersion: a consistent read from storage (paged); used after 410 Gone.
    Consistent,
    /// At least this resourceVersion, not paged (with `limit` the server would serve exactly
    /// that, possibly stale, version until it is compacted).
    NotOlderThan(String),
}

impl ListFrom {
    /// Relisting after a failure: from the last resourceVersion seen, else the watch cache.
    pub(crate) fn last_seen(rv: String) -> Self {
        if rv.is_empty() || rv == "0" { ListFrom::WatchCache } else { ListFrom::NotOlderThan(rv) }
    }

    /// The `resourceVersion` query value (`""`: none).
    pub(crate) fn resource_version(&self) -> &str {
        match self {
            ListFrom::WatchCache => "0",
            ListFrom::Consistent => "",
            ListFrom::NotOlderThan(rv) => rv,
        }
    }

    /// Whether the list is paged (`limit` / `continue`).
    pub(crate) fn paged(&self) -> bool {
        !matches!(self, ListFrom::NotOlderThan(_))
    }
}

/// What to do once a backoff is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resume {
    /// List from the given version.
    List(ListFrom),
    /// Re-open the watch from this resourceVersion.
    Watch(String),
}

/// Where the reflector is: the effect in flight and what it needs to continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Listing from `from`.
    Listing { from: ListFrom },
    /// A list at `rv` is being pushed into the FIFO.
    Replacing { rv: String },
    /// Watching from `rv`.
    Watching { rv: String },
    /// Waiting out a delay, then `then`.
    Backoff { then: Resume },
    /// Cancelled: nothing more to do.
    Stopped,
}

/// How long a [`Effect::Sleep`] lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The backoff's next (jittered, growing) delay.
    Backoff,
    /// What the server asked for (`Retry-After`).
    RetryAfter(Duration),
}

/// What the driver does next; each effect yields exactly one [`Outcome`].
#[derive(Debug)]
pub(crate) enum Effect {
    /// A full (paged when [`ListFrom::paged`]) list → [`Outcome::Listed`] /
    /// [`Outcome::ListFailed`].
    List(ListFrom),
    /// Replace the FIFO's contents with `objects` and note progress at `rv` →
    /// [`Outcome::Replaced`].
    Replace { objects: Vec<Arc<Object>>, rv: String },
    /// Watch from `rv`, pushing each frame's changes into the FIFO → [`Outcome::WatchClosed`]
    /// / [`Outcome::WatchFailed`].
    Watch { rv: String },
    /// Sleep → [`Outcome::Slept`].
    Sleep(Wait),
    /// Return.
    Stop,
}

/// What the last effect came to.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The list succeeded at resourceVersion `rv`.
    Listed { objects: Vec<Arc<Object>>, rv: String },
    /// The list failed.
    ListFailed(ReflectorError),
    /// The list is in the FIFO.
    Replaced,
    /// The server closed the watch normally, `elapsed` after it was opened, having sent
    /// `events` events; `rv` is the resourceVersion it reached.
    WatchClosed { rv: String, events: usize, elapsed: Duration },
    /// The watch could not be opened or failed; `rv` is the resourceVersion it reached.
    WatchFailed { rv: String, error: ReflectorError },
    /// The sleep is over.
    Slept,
    /// The reflector was cancelled during the effect.
    Cancelled,
}

/// The first state and effect: list from the watch cache.
pub(crate) fn start() -> (State, Effect) {
    list(ListFrom::WatchCache)
}

/// The next state and effect after `outcome` in `state`.
///
/// The driver feeds each effect's own outcome; any other pairing is a bug in the driver,
/// answered (never with a panic) by starting over with a consistent list.
pub(crate) fn transition(state: State, outcome: Outcome) -> (State, Effect) {
    match (state, outcome) {
        (_, Outcome::Cancelled) | (State::Stopped, _) => (State::Stopped, Effect::Stop),
        (State::Listing { .. }, Outcome::Listed { objects, rv }) => {
            (State::Replacing { rv: rv.clone() }, Effect::Replace { objects, rv })
        }
        (State::Listing { from }, Outcome::ListFailed(error)) => {
            if error.is_gone() && from != ListFrom::Consistent {
                list(ListFrom::Consistent)
            } else {
                backoff(wait_for(&error), Resume::List(from))
            }
        }
        (State::Replacing { rv }, Outcome::Replaced) => watch(rv),
        (State::Watching { .. }, Outcome::WatchClosed { rv, events, elapsed }) => {
            if events == 0 && elapsed < QUICK_CLOSE {
                backoff(Wait::Backoff, Resume::Watch(rv))
            } else {
                watch(rv)
            }
        }
        (State::Watching { .. }, Outcome::WatchFailed { rv, error }) => {
            if error.is_gone() {
                list(ListFrom::Consistent)
            } else if error.is_transient() {
                backoff(wait_for(&error), Resume::Watch(rv))
            } else {
                backoff(wait_for(&error), Resume::List(ListFrom::last_seen(rv)))
            }
        }
        (State::Backoff { then: Resume::List(from) }, Outcome::Slept) => list(from),
        (State::Backoff { then: Resume::Watch(rv) }, Outcome::Slept) => watch(rv),
        (state, outcome) => {
            tracing::error!(?state, ?outcome, "reflector: outcome does not match its state; relisting");
            list(ListFrom::Consistent)
        }
    }
}

fn list(from: ListFrom) -> (State, Effect) {
    (State::Listing { from: from.clone() }, Effect::List(from))
}

fn watch(rv: String) -> (State, Effect) {
    (State::Watching { rv: rv.clone() }, Effect::Watch { rv })
}

fn backoff(wait: Wait, then: Resume) -> (State, Effect) {
    (State::Backoff { then }, Effect::Sleep(wait))
}

fn wait_for(error: &ReflectorError) -> Wait {
    error.retry_after().map_or(Wait::Backoff, Wait::RetryAfter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> ReflectorError {
        ReflectorError::Status { code, reason: reason.into(), message: String::new(), retry_after: None }
    }

    fn gone() -> ReflectorError {
        status(410, "Expired")
    }

    fn transport() -> ReflectorError {
        ReflectorError::Transport(kube::Error::LinesCodecMaxLineLengthExceeded)
    }

    fn listing(from: ListFrom) -> State {
        State::Listing { from }
    }

    fn watching(rv: &str) -> State {
        State::Watching { rv: rv.into() }
    }

    /// The next state, and the effect as something comparable.
    fn step(state: State, outcome: Outcome) -> (State, String) {
        let (next, effect) = transition(state, outcome);
        let effect = match effect {
            Effect::List(from) => format!("list {from:?}"),
            Effect::Replace { objects, rv } => format!("replace {} at {rv}", objects.len()),
            Effect::Watch { rv } => format!("watch {rv}"),
            Effect::Sleep(wait) => format!("sleep {wait:?}"),
            Effect::Stop => "stop".into(),
        };
        (next, effect)
    }

    #[test]
    fn starts_by_listing_the_watch_cache() {
        let (state, effect) = start();
        assert_eq!(state, listing(ListFrom::WatchCache));
        assert!(matches!(effect, Effect::List(ListFrom::WatchCache)));
        assert_eq!(ListFrom::WatchCache.resource_version(), "0");
        assert!(ListFrom::WatchCache.paged() && ListFrom::Consistent.paged());
        assert_eq!(ListFrom::Consistent.resource_version(), "");
        assert!(!ListFrom::NotOlderThan("7".into()).paged());
    }

    #[test]
    fn list_ok_replaces_then_watches_from_the_list_version() {
        let listed = Outcome::Listed { objects: Vec::new(), rv: "10".into() };
        for from in [ListFrom::WatchCache, ListFrom::Consistent, ListFrom::NotOlderThan("5".into())] {
            assert_eq!(
                step(listing(from), Outcome::Listed { objects: Vec::new(), rv: "10".into() }),
                (State::Replacing { rv: "10".into() }, "replace 0 at 10".into())
            );
        }
        let (state, _) = transition(listing(ListFrom::WatchCache), listed);
        assert_eq!(step(state, Outcome::Replaced), (watching("10"), "watch 10".into()));
    }

    #[test]
    fn list_failure_backs_off_and_retries_the_same_list() {
        for from in [ListFrom::WatchCache, ListFrom::Consistent, ListFrom::NotOlderThan("5".into())] {
            let (state, effect) = step(listing(from.clone()), Outcome::ListFailed(status(500, "")));
            assert_eq!(state, State::Backoff { then: Resume::List(from.clone()) });
            assert_eq!(effect, "sleep Backoff");
            assert_eq!(step(state, Outcome::Slept), (listing(from.clone()), format!("list {from:?}")));
        }
        let throttled = ReflectorError::Status {
            code: 429,
            reason: String::new(),
            message: String::new(),
            retry_after: Some(Duration::from_secs(4)),
        };
        let (_, effect) = step(listing(ListFrom::WatchCache), Outcome::ListFailed(throttled));
        assert_eq!(effect, "sleep RetryAfter(4s)", "Retry-After replaces the backoff");
    }

    #[test]
    fn list_gone_relists_consistently_at_once() {
        for from in [ListFrom::WatchCache, ListFrom::NotOlderThan("5".into())] {
            assert_eq!(
                step(listing(from), Outcome::ListFailed(gone())),
                (listing(ListFrom::Consistent), "list Consistent".into())
            );
        }
        // A consistent list cannot be too old: 410 there is retried after a backoff.
        assert_eq!(
            step(listing(ListFrom::Consistent), Outcome::ListFailed(gone())),
            (State::Backoff { then: Resume::List(ListFrom::Consistent) }, "sleep Backoff".into())
        );
    }

    #[test]
    fn watch_closed_with_events_rewatches_at_once_from_where_it_got() {
        let closed = |events, elapsed| Outcome::WatchClosed { rv: "17".into(), events, elapsed };
        assert_eq!(step(watching("10"), closed(3, Duration::ZERO)), (watching("17"), "watch 17".into()));
        assert_eq!(step(watching("10"), closed(0, QUICK_CLOSE)), (watching("17"), "watch 17".into()));
        assert_eq!(
            step(watching("10"), closed(0, Duration::from_secs(300))),
            (watching("17"), "watch 17".into())
        );
    }

    #[test]
    fn watch_closed_at_once_without_events_backs_off() {
        let closed = Outcome::WatchClosed { rv: "10".into(), events: 0, elapsed: Duration::from_millis(20) };
        let (state, effect) = step(watching("10"), closed);
        assert_eq!(
            (&state, effect.as_str()),
            (&State::Backoff { then: Resume::Watch("10".into()) }, "sleep Backoff")
        );
        assert_eq!(step(state, Outcome::Slept), (watching("10"), "watch 10".into()), "no relist");
    }

    #[test]
    fn watch_transient_failure_backs_off_and_rewatches() {
        for error in [transport(), status(503, ""), status(429, ""), ReflectorError::Decode("x".into())] {
            let (state, effect) = step(watching("10"), Outcome::WatchFailed { rv: "12".into(), error });
            assert_eq!(state, State::Backoff { then: Resume::Watch("12".into()) });
            assert_eq!(effect, "sleep Backoff");
            assert_eq!(step(state, Outcome::Slept), (watching("12"), "watch 12".into()));
        }
        let throttled = ReflectorError::Status {
            code: 503,
            reason: String::new(),
            message: String::new(),
            retry_after: Some(Duration::from_secs(2)),
        };
        let (_, effect) = step(watching("10"), Outcome::WatchFailed { rv: "10".into(), error: throttled });
        assert_eq!(effect, "sleep RetryAfter(2s)");
    }

    #[test]
    fn watch_other_failure_backs_off_and_relists_from_the_last_version() {
        for error in [
            status(403, "Forbidden"),
            ReflectorError::UndecodableEvent("x".into()),
            ReflectorError::Request("x".into()),
        ] {
            let (state, effect) = step(watching("10"), Outcome::WatchFailed { rv: "12".into(), error });
            assert_eq!(state, State::Backoff { then: Resume::List(ListFrom::NotOlderThan("12".into())) });
            assert_eq!(effect, "sleep Backoff");
            assert_eq!(
                step(state, Outcome::Slept),
                (listing(ListFrom::NotOlderThan("12".into())), "list NotOlderThan(\"12\")".into())
            );
        }
        // With no resourceVersion at all, the relist reads the watch cache.
        let (state, _) =
            step(watching(""), Outcome::WatchFailed { rv: String::new(), error: status(400, "") });
        assert_eq!(state, State::Backoff { then: Resume::List(ListFrom::WatchCache) });
    }

    #[test]
    fn watch_gone_relists_consistently_at_once() {
        for error in [gone(), status(410, ""), status(500, "Expired")] {
            assert_eq!(
                step(watching("10"), Outcome::WatchFailed { rv: "11".into(), error }),
                (listing(ListFrom::Consistent), "list Consistent".into())
            );
        }
    }

    #[test]
    fn cancel_stops_from_every_state() {
        let states = [
            listing(ListFrom::WatchCache),
            State::Replacing { rv: "1".into() },
            watching("1"),
            State::Backoff { then: Resume::Watch("1".into()) },
            State::Stopped,
        ];
        for state in states {
            assert_eq!(step(state, Outcome::Cancelled), (State::Stopped, "stop".into()));
        }
        assert_eq!(step(State::Stopped, Outcome::Slept), (State::Stopped, "stop".into()));
    }

    #[test]
    fn mismatched_outcome_starts_over_consistently() {
        assert_eq!(
            step(watching("1"), Outcome::Slept),
            (listing(ListFrom::Consistent), "list Consistent".into())
        );
        assert_eq!(
            step(State::Replacing { rv: "1".into() }, Outcome::ListFailed(gone())),
            (listing(ListFrom::Consistent), "list Consistent".into())
        );
    }
}
