//! Host side of the `log` import: guest log lines become `tracing` events under the
//! target `wasmctrl::plugin::guest`, each guest field a field of the event, tagged with the
//! plugin, its version, the export and the request.
//!
//! Invariants:
//! - A message or field value longer than the plugin's `max-output` is truncated, so a
//!   guest cannot make the host format unbounded text; at most [`MAX_FIELDS`] fields become
//!   event fields.
//! - Context is not repeated: `plugin` and `request` are added only when the current span
//!   (the controller's `reconcile` span carries `controller` and `request`) does not already
//!   say them; `export` only outside `reconcile`.
//! - Guest fields whose names cannot be event fields (unusable characters, a name the host
//!   uses, a duplicate, over [`MAX_FIELDS`], or the callsite bounds of [`super::callsites`]
//!   reached) are kept, rendered together as one `fields` string.
//!
//! Layering: [`LogCtx`] (the plugin's name, version and `max-output`) is this interface's
//! whole host context, reached through [`LogCtxView`] with the call in progress; this module
//! knows nothing of the store's state or the other imports. The log target belongs to
//! [`super::callsites`], which this module builds on.

use wasmtime::component::HasData;

use super::bindings::wasmctrl::controller::log::{Host, Level};
use super::call::CallInfo;
use super::callsites::{self, TARGET};

/// The `log` import's host context.
pub(crate) struct LogCtx {
    pub plugin: String,
    /// The plugin's short version, as `/plugins` shows it.
    pub version: String,
    pub max_output: usize,
}

/// What a `log` call sees: the plugin's context and the call in progress.
pub(crate) struct LogCtxView<'a> {
    pub ctx: &'a LogCtx,
    pub call: &'a CallInfo,
}

/// Links `log` with [`LogCtxView`] as its host.
pub(crate) struct HasLog;

impl HasData for HasLog {
    type Data<'a> = LogCtxView<'a>;
}

/// Guest fields that become event fields, at most.
pub(crate) const MAX_FIELDS: usize = 24;

/// Names the host sets itself.
const RESERVED: [&str; 6] = ["message", "plugin", "version", "request", "export", "fields"];

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

fn tracing_level(level: Level) -> tracing::Level {
    match level {
        Level::Trace => tracing::Level::TRACE,
        Level::Debug => tracing::Level::DEBUG,
        Level::Info => tracing::Level::INFO,
        Level::Warn => tracing::Level::WARN,
        Level::Error => tracing::Level::ERROR,
    }
}

/// Whether the current span has a field named `name`.
fn span_has(name: &str) -> bool {
    tracing::Span::current().metadata().is_some_and(|m| m.fields().field(name).is_some())
}

impl Host for LogCtxView<'_> {
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
        let max = self.ctx.max_output;
        let message = truncate(message, max);
        let mut names: Vec<&str> = vec!["message"];
        let mut values: Vec<String> = vec![message];
        if !span_has("controller") && !span_has("plugin") {
            names.push("plugin");
            values.push(self.ctx.plugin.clone());
        }
        if !span_has("version") {
            names.push("version");
            values.push(self.ctx.version.clone());
        }
        if let Some(request) = &self.call.request
            && !span_has("request")
        {
            names.push("request");
            values.push(request.clone());
        }
        if self.call.export != "reconcile" {
            names.push("export");
            values.push(self.call.export.to_owned());
        }
        let context = names.len();
        // Each guest field on its own, unless it cannot be one.
        let mut rest = Vec::new();
        for (k, v) in &fields {
            let own = names.len() - context < MAX_FIELDS
                && callsites::usable_name(k)
                && !RESERVED.contains(&k.as_str())
                && !names[context..].contains(&k.as_str());
            if own {
                names.push(k);
                values.push(truncate(v.clone(), max));
            } else {
                rest.push(format!("{k}={v:?}"));
            }
        }
        if !rest.is_empty() {
            names.push("fields");
            values.push(truncate(rest.join(" "), max));
        }
        let level = tracing_level(level);
        if let Some(meta) = callsites::intern(level, &names) {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            callsites::emit(meta, &values);
        } else {
            // A bound of the callsite interner is reached: the shape every line had before
            // guest fields became event fields.
            let all =
                truncate(fields.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(" "), max);
            let (message, plugin, request) =
                (&values[0], self.ctx.plugin.as_str(), self.call.request.as_deref().unwrap_or(""));
            let export = self.call.export;
            let version = self.ctx.version.as_str();
            match level {
                tracing::Level::TRACE => {
                    tracing::trace!(target: TARGET, plugin, version, export, request, fields = all, "{message}")
                }
                tracing::Level::DEBUG => {
                    tracing::debug!(target: TARGET, plugin, version, export, request, fields = all, "{message}")
                }
                tracing::Level::INFO => {
                    tracing::info!(target: TARGET, plugin, version, export, request, fields = all, "{message}")
                }
                tracing::Level::WARN => {
                    tracing::warn!(target: TARGET, plugin, version, export, request, fields = all, "{message}")
                }
                _ => {
                    tracing::error!(target: TARGET, plugin, version, export, request, fields = all, "{message}")
                }
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
