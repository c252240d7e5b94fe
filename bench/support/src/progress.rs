//! How far an informer consumer has read the stream, and the watch rate it reached.
//!
//! Invariants: `synced_at` is set once, when the last listed object is seen (the
//! `objects`-th add); `done_at` once, when the update with the last sequence number is seen.
//! The watch rate is the updates seen divided by the time between the two, so every consumer
//! measured with it is timed over the same part of the stream.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts what an event handler (or stream consumer) saw.
pub struct StreamProgress {
    objects: usize,
    last_seq: String,
    start: Instant,
    adds: AtomicUsize,
    updates: AtomicUsize,
    synced_at: Mutex<Option<Instant>>,
    done_at: Mutex<Option<Instant>>,
    done: tokio::sync::Notify,
}

/// The figures of a finished consumer.
#[derive(Clone, Copy, Debug)]
pub struct WatchFigures {
    /// From creating the progress to the last listed object.
    pub list: Duration,
    /// From the last listed object to the last update.
    pub watch: Duration,
    pub updates_seen: usize,
}

impl WatchFigures {
    pub fn events_per_sec(&self) -> f64 {
        self.updates_seen as f64 / self.watch.as_secs_f64()
    }
}

impl StreamProgress {
    /// Progress through a stream of `objects` listed objects and `updates` updates; the
    /// clock of the list starts now.
    pub fn new(objects: usize, updates: u64) -> Self {
        StreamProgress {
            objects,
            last_seq: updates.saturating_sub(1).to_string(),
            start: Instant::now(),
            adds: AtomicUsize::new(0),
            updates: AtomicUsize::new(0),
            synced_at: Mutex::new(None),
            done_at: Mutex::new(None),
            done: tokio::sync::Notify::new(),
        }
    }

    /// A listed object was seen.
    pub fn added(&self) {
        if self.adds.fetch_add(1, Ordering::Relaxed) + 1 == self.objects
            && let Ok(mut at) = self.synced_at.lock()
        {
            *at = Some(Instant::now());
        }
    }

    /// An update was seen; `seq` is its [`SEQ_ANNOTATION`](crate::SEQ_ANNOTATION).
    pub fn updated(&self, seq: Option<&str>) {
        self.updates.fetch_add(1, Ordering::Relaxed);
        if seq == Some(self.last_seq.as_str()) {
            if let Ok(mut at) = self.done_at.lock() {
                *at = Some(Instant::now());
            }
            self.done.notify_one();
        }
    }

    /// Listed objects seen so far.
    pub fn adds(&self) -> usize {
        self.adds.load(Ordering::Relaxed)
    }

    /// Whether the last update was seen.
    pub fn is_done(&self) -> bool {
        self.done_at.lock().map(|d| d.is_some()).unwrap_or(false)
    }

    /// Waits for the last update, at most `timeout`.
    pub async fn wait(&self, timeout: Duration) -> Result<(), String> {
        if self.is_done() {
            return Ok(());
        }
        tokio::time::timeout(timeout, self.done.notified()).await.map_err(|_| {
            format!(
                "timed out after {timeout:?}: {} of {} listed objects and {} updates seen",
                self.adds(),
                self.objects,
                self.updates.load(Ordering::Relaxed)
            )
        })
    }

    /// The figures, once the last update was seen.
    pub fn figures(&self) -> Result<WatchFigures, String> {
        let synced =
            self.synced_at.lock().ok().and_then(|s| *s).ok_or("the last listed object was never seen")?;
        let done = self.done_at.lock().ok().and_then(|d| *d).ok_or("the last update was never seen")?;
        Ok(WatchFigures {
            list: synced.duration_since(self.start),
            watch: done.duration_since(synced),
            updates_seen: self.updates.load(Ordering::Relaxed),
        })
    }
}
