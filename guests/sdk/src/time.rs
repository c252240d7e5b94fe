//! Wall-clock time for status fields (`lastTransitionTime`).
//!
//! The WIT world grants no clock of its own. A component built for `wasm32-wasip2` reads
//! the time through std (`SystemTime::now`), which imports `wasi:clocks/wall-clock`. The
//! wasmctrl host links the WASI 0.2 interfaces std imports (`wasi:cli` and `wasi:io` to
//! start at all, the clocks, random) with wasmtime-wasi's default clocks, so the import
//! resolves to the host's real wall clock; a component that never reads the time does not import it. That link is
//! the only way time enters a plugin, and the host decides what it returns. The SDK
//! therefore keeps time explicit: the pure helpers in [`conditions`](crate::conditions)
//! take `now` as an argument, and only [`now`] (and `conditions::set_now`) read the clock.
//!
//! A clock that reports a time before 1970 reads as the Unix epoch, the value
//! [`is_unset`] recognises (Go's zero time is also before it).

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The current time, truncated to whole seconds (Kubernetes serialises `Time` with
/// second precision, so a truncated value survives a round trip through the API server
/// unchanged and compares equal to what comes back).
pub fn now() -> Time {
    from_system_time(SystemTime::now())
}

/// Converts a [`SystemTime`] to a Kubernetes [`Time`], truncated to seconds; times before
/// 1970 become the Unix epoch.
pub fn from_system_time(time: SystemTime) -> Time {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    Time(Timestamp::new(secs, 0).unwrap_or(Timestamp::MAX))
}

/// Whether `time` is "unset" (at or before the Unix epoch, as Go's zero time also is).
pub fn is_unset(time: &Time) -> bool {
    time.0 <= Timestamp::UNIX_EPOCH
}

/// The "unset" time: the Unix epoch.
pub fn unset() -> Time {
    Time(Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn truncates_to_seconds_and_clamps_pre_epoch() {
        let t = from_system_time(UNIX_EPOCH + Duration::from_millis(1_700_000_000_999));
        assert_eq!(t.0, Timestamp::new(1_700_000_000, 0).unwrap());
        assert!(is_unset(&from_system_time(UNIX_EPOCH - Duration::from_secs(5))));
        assert!(!is_unset(&t));
        assert!(is_unset(&unset()));
    }

    #[test]
    fn now_round_trips_through_json() {
        let t = now();
        let json = serde_json::to_string(&t).unwrap();
        let back: Time = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }
}
