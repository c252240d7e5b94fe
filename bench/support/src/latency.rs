//! Event → reconcile-start latency samples, read from the stamps the stream server puts in
//! each object, and their percentiles.
//!
//! Invariants (the Go anchors in `bench/anchors` compute the same way):
//! - A sample is taken when a reconcile starts, from the object then in the cache:
//!   now − its [`SENT_ANNOTATION`](crate::SENT_ANNOTATION).
//! - Only updates count (objects of the initial list carry no sequence number), and the
//!   first `skip` updates are left out (warm-up).
//! - Percentile q is the sample at index ⌊(n − 1)·q⌋ of the sorted samples.

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
