//! The wall clock every process of a benchmark stamps and reads (Unix nanoseconds), so a
//! stamp written by the stream server can be compared with a reading in another process.
//!
//! Invariant: monotonic only as far as the system clock is; benchmarks compare readings
//! taken milliseconds apart on one machine, where that holds.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
