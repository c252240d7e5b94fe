//! Structured logs into the host's tracing, tagged by the host with the plugin's name and
//! the request being reconciled.
//!
//! ```no_run
//! use wasmctrl_guest::log;
//! let (ns, copies) = ("team-a", 2);
//! log::info!("mirrored {copies} copies"; namespace = ns, copies = copies);
//! log::warn!("namespace missing");
//! log::log(log::Level::Debug, "raw call", &[("key", "value".to_owned())]);
//! ```
//!
//! The macros check [`enabled`] first, so a message below the host's level costs one
//! call and no formatting.

use crate::sys::log as wit;

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very verbose.
    Trace,
    /// Diagnostics.
    Debug,
    /// What the plugin did.
    Info,
    /// Something odd that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    fn to_wit(self) -> wit::Level {
        match self {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        }
    }
}

/// Whether a message at `level` would be recorded.
pub fn enabled(level: Level) -> bool {
    wit::enabled(level.to_wit())
}

/// Logs `message` with key/value fields.
pub fn log<K: AsRef<str>>(level: Level, message: &str, fields: &[(K, String)]) {
    let fields: Vec<(String, String)> =
        fields.iter().map(|(k, v)| (k.as_ref().to_owned(), v.clone())).collect();
    wit::log(level.to_wit(), message, &fields);
}

/// Logs at `level`: `log_at!(Level::Info, "format {}", args; key = value, ...)`.
/// Values are formatted with `Display`.
#[macro_export]
macro_rules! log_at {
    ($level:expr, $fmt:literal $(, $arg:expr)* $(,)? $(; $($key:ident = $value:expr),* $(,)?)?) => {{
        let level = $level;
        if $crate::log::enabled(level) {
            $crate::log::log(
                level,
                &::std::format!($fmt $(, $arg)*),
                &[$($((::std::stringify!($key), ::std::string::ToString::to_string(&$value))),*)?] as &[(&str, ::std::string::String)],
            );
        }
    }};
}

/// Logs at trace level; see [`log_at!`](crate::log_at).
#[macro_export]
macro_rules! trace {
    ($($t:tt)*) => { $crate::log_at!($crate::log::Level::Trace, $($t)*) };
}
/// Logs at debug level; see [`log_at!`](crate::log_at).
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::log_at!($crate::log::Level::Debug, $($t)*) };
}
/// Logs at info level; see [`log_at!`](crate::log_at).
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log_at!($crate::log::Level::Info, $($t)*) };
}
/// Logs at warn level; see [`log_at!`](crate::log_at).
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log_at!($crate::log::Level::Warn, $($t)*) };
}
/// Logs at error level; see [`log_at!`](crate::log_at).
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::log_at!($crate::log::Level::Error, $($t)*) };
}

pub use crate::{debug, error, info, log_at, trace, warn};
