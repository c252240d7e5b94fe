//! Host side of the `log` import: guest log lines become `tracing` events under the
//! target `wasmctrl::plugin::guest`, tagged with the plugin, its version, the export and the
//! request.
//!
//! Invariant: a message longer than the plugin's `max-output` is truncated, so a guest
//! cannot make the host format unbounded text.

use super::bindings::wasmctrl::controller::log::{Host, Level};
use super::state::HostState;

const TARGET: &str = "wasmctrl::plugin::guest";

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("… (truncated)");
    }
    s
}

impl Host for HostState {
    fn enabled(&mut self, level: Level) -> wasmtime::Result<bool> {
        Ok(match level {
            Level::Trace => tracing::enabled!(target: TARGET, tracing::Level::TRACE),
            Level::Debug => tracing::enabled!(target: TARGET, tracing::Level::DEBUG),
            Level::Info => tracing::enabled!(target: TARGET, tracing::Level::INFO),
            Level::Warn => tracing::enabled!(target: TARGET, tracing::Level::WARN),
            Level::Error => tracing::enabled!(target: TARGET, tracing::Level::ERROR),
        })
    }

    fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) -> wasmtime::Result<()> {
        let max = self.ctx.spec.limits.max_output;
        let message = truncate(message, max);
        let plugin = self.plugin_name();
        let version = self.plugin_version();
        let request = self.call.request.as_deref().unwrap_or("");
        let export = self.call.export;
        // Guest fields are dynamic, tracing's are static: render them as one `k=v` list.
        let fields =
            truncate(fields.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(" "), max);
        match level {
            Level::Trace => {
                tracing::trace!(target: TARGET, plugin, version, export, request, fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: TARGET, plugin, version, export, request, fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: TARGET, plugin, version, export, request, fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: TARGET, plugin, version, export, request, fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: TARGET, plugin, version, export, request, fields, "{message}")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn truncates_on_char_boundary() {
        let s = super::truncate("héllo".to_owned(), 2);
        assert_eq!(s, "h… (truncated)");
        assert_eq!(super::truncate("abc".to_owned(), 3), "abc");
    }
}
