//! Event → reconcile-start latency samples, read from the stamps the stream server puts in
//! each object, and their percentiles.
//!
//! Invariants (the Go anchors in `bench/anchors` compute the same way):
//! - A sample is taken when a reconcile starts, from the object then in the cache:
//!   now − its [`SENT_ANNOTATION`](crate::SENT_ANNOTATION).
//! - Only updates count (objects of the initial list carry no sequence number), and the
//!   first `skip` updates are left out (warm-up).
//! - Percentile q is the sample at index ⌊(n − 1)·q⌋ of the sorted samples.
//! - A consumer keeps up with a paced stream only if it reconciles updates as fast as the
//!   server sends them, its lag does not grow, and no backlog stands in front of it
//!   ([`Delivery`]); one that does not is saturated, and its percentiles are the backlog
//!   built over the run, not a latency.

use crate::{SENT_ANNOTATION, SEQ_ANNOTATION};

/// What one reconcile start tells: the update it saw and how long ago it was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub seq: u64,
    pub nanos: u64,
}

/// Reads a sample from an object's annotations at `now` (Unix nanoseconds); `None` for an
/// object of the initial list or one without stamps.
pub fn sample<'a>(annotation: impl Fn(&str) -> Option<&'a str>, now: u64) -> Option<Sample> {
    let seq = annotation(SEQ_ANNOTATION)?.parse::<u64>().ok()?;
    let sent = annotation(SENT_ANNOTATION)?.parse::<u64>().ok()?;
    Some(Sample { seq, nanos: now.saturating_sub(sent) })
}

/// A reconcile start with both clocks: the update it saw, when the server sent it and when
/// the reconcile started (Unix nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub seq: u64,
    pub sent: u64,
    pub at: u64,
}

impl Stamp {
    pub fn sample(&self) -> Sample {
        Sample { seq: self.seq, nanos: self.at.saturating_sub(self.sent) }
    }
}

/// As [`sample`], keeping both clocks.
pub fn stamp<'a>(annotation: impl Fn(&str) -> Option<&'a str>, now: u64) -> Option<Stamp> {
    let seq = annotation(SEQ_ANNOTATION)?.parse::<u64>().ok()?;
    let sent = annotation(SENT_ANNOTATION)?.parse::<u64>().ok()?;
    Some(Stamp { seq, sent, at: now.max(sent) })
}

/// Whether a consumer kept up with a paced stream (`bench/anchors/internal/measure`'s
/// `Delivery` computes the same for the Go consumers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Delivery {
    /// Updates per second the server sent: the span of sequence numbers over the span of
    /// their sent stamps.
    pub offered_per_sec: f64,
    /// Updates per second the consumer reconciled: the sequence numbers from its first to its
    /// last reconcile, over the time between them.
    pub delivered_per_sec: f64,
    /// Median lag of the first and the last third of the updates (by sequence number), ms.
    pub lag_first_third_ms: f64,
    pub lag_last_third_ms: f64,
}

impl Delivery {
    /// Below this share of the offered rate, a consumer did not keep up.
    pub const KEPT_UP_SHARE: f64 = 0.97;
    /// A lag that grew by more than this (and more than doubled) over the run is a backlog.
    pub const LAG_GROWTH_MS: f64 = 10.0;
    /// A median lag above this over the last third of the run is a standing backlog: the
    /// consumer reconciles as fast as updates come, but no faster, so the queue built before
    /// (at every rate measured, at least 250 updates) never drains. A consumer with room to
    /// spare drains it; one at its limit only carries it along.
    pub const BACKLOG_MS: f64 = 50.0;

    /// Over the stamps with `seq` at least `skip`; `None` with fewer than 3.
    pub fn of(stamps: &[Stamp], skip: u64) -> Option<Self> {
        let mut by_seq: Vec<Stamp> = stamps.iter().filter(|s| s.seq >= skip).copied().collect();
        if by_seq.len() < 3 {
            return None;
        }
        by_seq.sort_by_key(|s| s.seq);
        let rate = |seqs: f64, nanos: u64| if nanos == 0 { 0.0 } else { seqs / (nanos as f64 / 1e9) };
        let (first, last) = (by_seq[0], by_seq[by_seq.len() - 1]);
        let offered = rate((last.seq - first.seq) as f64, last.sent.saturating_sub(first.sent));
        let a = by_seq.iter().min_by_key(|s| s.at).copied().unwrap_or(first);
        let b = by_seq.iter().max_by_key(|s| s.at).copied().unwrap_or(last);
        let delivered = rate(b.seq as f64 - a.seq as f64, b.at.saturating_sub(a.at));
        let third = by_seq.len() / 3;
        let median_ms = |part: &[Stamp]| {
            let mut nanos: Vec<u64> = part.iter().map(|s| s.sample().nanos).collect();
            nanos.sort_unstable();
            nanos[(nanos.len() - 1) / 2] as f64 / 1e6
        };
        Some(Delivery {
            offered_per_sec: offered,
            delivered_per_sec: delivered,
            lag_first_third_ms: median_ms(&by_seq[..third]),
            lag_last_third_ms: median_ms(&by_seq[by_seq.len() - third..]),
        })
    }

    /// Did not keep up: delivered below [`Self::KEPT_UP_SHARE`] of the offered rate, a lag
    /// that grew by more than [`Self::LAG_GROWTH_MS`] and more than doubled, or a median lag
    /// over the last third above [`Self::BACKLOG_MS`].
    pub fn saturated(&self) -> bool {
        let growth = self.lag_last_third_ms - self.lag_first_third_ms;
        self.delivered_per_sec < Self::KEPT_UP_SHARE * self.offered_per_sec
            || (growth > Self::LAG_GROWTH_MS && growth > self.lag_first_third_ms)
            || self.lag_last_third_ms > Self::BACKLOG_MS
    }
}

/// p50, p99 and max, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Percentiles {
    pub count: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

/// Percentiles of the samples whose `seq` is at least `skip`; `None` if there are none.
pub fn percentiles(samples: &[Sample], skip: u64) -> Option<Percentiles> {
    let mut nanos: Vec<u64> = samples.iter().filter(|s| s.seq >= skip).map(|s| s.nanos).collect();
    if nanos.is_empty() {
        return None;
    }
    nanos.sort_unstable();
    let pick = |q: f64| nanos[((nanos.len() - 1) as f64 * q) as usize];
    Some(Percentiles { count: nanos.len(), p50: pick(0.50), p99: pick(0.99), max: pick(1.0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_come_from_updates_only() {
        let listed = |k: &str| match k {
            SEQ_ANNOTATION => Some("list"),
            SENT_ANNOTATION => Some("100"),
            _ => None,
        };
        assert_eq!(sample(listed, 150), None);
        let update = |k: &str| match k {
            SEQ_ANNOTATION => Some("7"),
            SENT_ANNOTATION => Some("100"),
            _ => None,
        };
        assert_eq!(sample(update, 150), Some(Sample { seq: 7, nanos: 50 }));
    }

    /// Updates sent at `rate`/s for 3 s, reconciled `lag(u)` ns later.
    fn paced(rate: u64, lag: impl Fn(u64) -> u64) -> Vec<Stamp> {
        (0..3 * rate)
            .map(|u| {
                let sent = 1_000_000_000 + u * 1_000_000_000 / rate;
                Stamp { seq: u, sent, at: sent + lag(u) }
            })
            .collect()
    }

    #[test]
    fn a_consumer_that_keeps_up_is_not_saturated() {
        let d = Delivery::of(&paced(1000, |u| 200_000 + (u % 7) * 50_000), 300).expect("delivery");
        assert!((d.offered_per_sec - 1000.0).abs() < 1.0, "{d:?}");
        assert!((d.delivered_per_sec - 1000.0).abs() < 20.0, "{d:?}");
        assert!(!d.saturated(), "{d:?}");
        // A single long stall does not make a backlog.
        let stalled = paced(1000, |u| if u == 2500 { 40_000_000 } else { 300_000 });
        assert!(!Delivery::of(&stalled, 300).expect("delivery").saturated());
    }

    #[test]
    fn a_consumer_that_falls_behind_is_saturated_at_its_own_rate() {
        // It handles 800 of the 1000 updates per second: each update waits 0.25 ms longer
        // than the one before.
        let d = Delivery::of(&paced(1000, |u| u * 250_000), 300).expect("delivery");
        assert!(d.saturated(), "{d:?}");
        assert!((d.delivered_per_sec - 800.0).abs() < 5.0, "{d:?}");
        assert!(d.lag_last_third_ms > d.lag_first_third_ms + 100.0, "{d:?}");
        assert_eq!(Delivery::of(&paced(1000, |_| 0)[..2], 0), None);
    }

    #[test]
    fn a_consumer_carrying_a_standing_backlog_is_saturated() {
        // It reconciles every update, at the rate they come, 200 ms after it was sent: the
        // lag never grows, but a queue of 200 updates never drains.
        let d = Delivery::of(&paced(1000, |_| 200_000_000), 300).expect("delivery");
        assert!((d.delivered_per_sec - 1000.0).abs() < 5.0, "{d:?}");
        assert!((d.lag_last_third_ms - d.lag_first_third_ms).abs() < 1.0, "{d:?}");
        assert!(d.saturated(), "{d:?}");
        // A lag of a few ms, as steady, is a latency.
        assert!(!Delivery::of(&paced(1000, |_| 5_000_000), 300).expect("delivery").saturated());
    }

    #[test]
    fn a_stamp_is_a_sample_with_both_clocks() {
        let update = |k: &str| match k {
            SEQ_ANNOTATION => Some("7"),
            SENT_ANNOTATION => Some("100"),
            _ => None,
        };
        let s = stamp(update, 150).expect("stamp");
        assert_eq!(s, Stamp { seq: 7, sent: 100, at: 150 });
        assert_eq!(s.sample(), Sample { seq: 7, nanos: 50 });
    }

    #[test]
    fn percentiles_skip_the_warm_up_and_pick_by_rank() {
        let samples: Vec<Sample> =
            (0..110).map(|i| Sample { seq: i, nanos: if i < 10 { 1_000_000 } else { i } }).collect();
        let p = percentiles(&samples, 10).expect("samples");
        assert_eq!(p.count, 100);
        assert_eq!(p.p50, 59); // rank ⌊99 × 0.5⌋ = 49 → seq 59
        assert_eq!(p.p99, 108);
        assert_eq!(p.max, 109);
        assert_eq!(percentiles(&samples, 1000), None);
    }
}
