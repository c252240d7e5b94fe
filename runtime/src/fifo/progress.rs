//! How far the source feeding a [`DeltaFifo`] has got, and how much of it the consumer has
//! processed ([`SourceProgress`]), with a signal for each change of it.
//!
//! Invariants:
//! - every change the source pushed before it noted `delivered` has been popped and
//!   processed (`delivered` is the `received` of the last moment the queue was empty after a
//!   batch, or when progress was noted on an empty queue);
//! - every change of the progress moves [`DeltaFifo::progress_seq`] and wakes
//!   [`DeltaFifo::progress_after`], so a wait for progress is a wait on a signal.

use std::sync::Arc;

use super::DeltaFifo;

/// How far the source feeding a FIFO has got, and how much of it the consumer has processed.
///
/// Invariant: every change the source pushed before it noted `delivered` has been popped and
/// processed (`delivered` is the `received` of the last moment the queue was empty after a
/// batch, or when progress was noted on an empty queue). Resource versions are the source's.
/// Every change of it moves [`DeltaFifo::progress_seq`] and wakes
/// [`DeltaFifo::progress_after`], so a wait for progress is a wait on a signal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceProgress {
    /// The newest resourceVersion the source has pushed everything up to (a list's, an
    /// event's or a bookmark's).
    pub received: Option<Arc<str>>,
    /// The newest resourceVersion up to which everything has been processed.
    pub delivered: Option<Arc<str>>,
    /// Whether the source's watch is open now.
    pub streaming: bool,
    /// Since when the source has pushed no change (nor reopened its watch).
    pub quiet_since: Option<tokio::time::Instant>,
}

impl DeltaFifo {
    /// Records that the source has pushed every change up to `resource_version`
    /// (`changed`: this step pushed some). Call after the push.
    pub fn note_progress(&self, resource_version: &str, changed: bool) {
        let mut s = self.state.lock();
        if s.received.as_deref() != Some(resource_version) {
            s.received = Some(Arc::from(resource_version));
        }
        if changed {
            s.quiet_since = Some(tokio::time::Instant::now());
        }
        if s.queue.is_empty() {
            s.delivered = s.received.clone();
        }
        drop(s);
        self.progressed();
    }

    /// Records whether the source's watch is open.
    pub fn note_streaming(&self, open: bool) {
        let mut s = self.state.lock();
        s.streaming = open;
        if open {
            s.quiet_since = Some(tokio::time::Instant::now());
        }
        drop(s);
        self.progressed();
    }

    /// Wakes the waiters of [`progress_after`](Self::progress_after).
    pub(super) fn progressed(&self) {
        self.progress_seq.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.progress_changed.notify_waiters();
    }

    /// A number that changes whenever [`progress`](Self::progress) may have: read it before
    /// the progress, then [`progress_after`](Self::progress_after) it to wait for the next
    /// change.
    pub fn progress_seq(&self) -> u64 {
        self.progress_seq.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once [`progress_seq`](Self::progress_seq) is no longer `seq` (at once if it
    /// already moved on).
    pub async fn progress_after(&self, seq: u64) {
        loop {
            let changed = self.progress_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.progress_seq() != seq {
                return;
            }
            changed.await;
        }
    }

    /// The source's progress and how much of it has been processed.
    pub fn progress(&self) -> SourceProgress {
        let s = self.state.lock();
        SourceProgress {
            received: s.received.clone(),
            delivered: s.delivered.clone(),
            streaming: s.streaming,
            quiet_since: s.quiet_since,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::fifo::PopOutcome;

    #[tokio::test]
    async fn delivered_progress_waits_until_everything_pushed_before_it_is_processed() {
        let f = DeltaFifo::new(None);
        assert_eq!(f.progress(), SourceProgress::default());
        f.add(obj("a", 5));
        f.add(obj("b", 6));
        f.note_progress("6", true);
        let p = f.progress();
        assert_eq!((p.received.as_deref(), p.delivered), (Some("6"), None), "nothing processed yet");
        assert!(p.quiet_since.is_some());
        f.pop(|_, _, _| PopOutcome::Processed).await.unwrap();
        assert_eq!(f.progress().delivered, None, "b is still queued");
        // A bookmark while b is queued moves what was received, not what was delivered.
        f.note_progress("9", false);
        f.pop(|_, _, _| PopOutcome::Processed).await.unwrap();
        assert_eq!(f.progress().delivered.as_deref(), Some("9"), "the queue emptied after the bookmark");
        // Progress noted on an empty queue is delivered at once.
        f.note_progress("12", false);
        assert_eq!(f.progress().delivered.as_deref(), Some("12"));
        // A requeued key keeps the queue non-empty: nothing more is delivered.
        f.add(obj("c", 13));
        f.note_progress("13", true);
        f.pop(|_, _, _| PopOutcome::Requeue).await.unwrap();
        assert_eq!(f.progress().delivered.as_deref(), Some("12"));
        f.note_streaming(true);
        assert!(f.progress().streaming);
        f.note_streaming(false);
        assert!(!f.progress().streaming);
    }

    /// A waiter for the next change of progress is woken by the delivery that empties the
    /// queue (not before), and one asking after a change already made returns at once.
    #[tokio::test]
    async fn progress_waiters_wake_at_the_next_change() {
        let f = Arc::new(DeltaFifo::new(None));
        f.add(obj("a", 5));
        f.note_progress("5", true);
        let seq = f.progress_seq();
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.progress_after(seq).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing changed yet");
        f.pop(|_, _, _| PopOutcome::Processed).await.unwrap();
        waiter.await.unwrap();
        assert_eq!(f.progress().delivered.as_deref(), Some("5"));
        // Already moved on: no wait.
        f.progress_after(seq).await;
        // A pop that delivers nothing new is no change.
        let seq = f.progress_seq();
        f.add(obj("b", 6));
        f.pop(|_, _, _| PopOutcome::Processed).await.unwrap();
        assert_eq!(f.progress_seq(), seq, "delivered stayed at 5: no progress");
    }
}
