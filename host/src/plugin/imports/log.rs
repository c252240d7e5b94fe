//! Host side of the `log` import: guest log lines become `tracing` events under the
//! target `wasmctrl::plugin::guest`, each guest field a field of the event, tagged with the
//! plugin, its version, the export and the request.
//!
//! Invariants:
//! - A line is bounded whatever the guest passes: the message is cut at [`MAX_MESSAGE`]
//!   bytes, each field value at [`MAX_VALUE`], the field names and values that cannot be
//!   event fields are rendered together into at most [`MAX_MESSAGE`] bytes (each cut before
//!   it is formatted), and at most [`MAX_FIELDS`] fields become event fields. (What the guest
//!   can make the host copy in the first place is bounded by the store's hostcall fuel.)
//! - Lines are rate-limited per plugin ([`super::output_limit`]), together with the guest's
//!   stdout and stderr; only a line the subscriber would record spends the budget.
//! - Context is not repeated: `plugin` and `request` are added only when the current span
//!   (the controller's `reconcile` span carries `controller` and `request`) does not already
//!   say them; `export` only outside `reconcile`.
//! - Guest fields whose names cannot be event fields (unusable characters, a name the host
//!   uses, a duplicate, over [`MAX_FIELDS`], or the callsite bounds of [`super::callsites`]
//!   reached) are kept, rendered together as one `fields` string.
//!
//! Layering: [`LogCtx`] (the plugin's name, version and line budget) is this interface's
//! whole host context, reached through [`LogCtxView`] with the call in progress; this module
//! knows nothing of the store's state or the other imports. The log target belongs to
//! [`super::callsites`], which this module builds on.

use std::sync::Arc;

use wasmtime::component::HasData;

use super::call::CallInfo;
use super::callsites::{self, TARGET};
use super::output_limit::GuestOutputLimit;
use crate::plugin::bindings::wasmctrl::controller::log::{Host, Level};

/// The `log` import's host context.
pub(crate) struct LogCtx {
    pub plugin: String,
    /// The plugin's short version, as `/plugins` shows it.
    pub version: String,
    /// The plugin's line budget, shared with its stdout and stderr.
    pub limit: Arc<GuestOutputLimit>,
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
/// Longest message (and longest rendering of the fields that are not event fields).
pub(crate) const MAX_MESSAGE: usize = 8 << 10;
/// Longest field value (and field name, where a name is rendered into the message).
pub(crate) const MAX_VALUE: usize = 1 << 10;

/// Names the host sets itself.
const RESERVED: [&str; 6] = ["message", "plugin", "version", "request", "export", "fields"];

/// `s` cut at `max` bytes (on a character boundary), without copying more than that.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

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
        let level = tracing_level(level);
        let recorded = match level {
            tracing::Level::TRACE => tracing::enabled!(target: TARGET, tracing::Level::TRACE),
            tracing::Level::DEBUG => tracing::enabled!(target: TARGET, tracing::Level::DEBUG),
            tracing::Level::INFO => tracing::enabled!(target: TARGET, tracing::Level::INFO),
            tracing::Level::WARN => tracing::enabled!(target: TARGET, tracing::Level::WARN),
            _ => tracing::enabled!(target: TARGET, tracing::Level::ERROR),
        };
        if !recorded || !self.ctx.limit.admit("log") {
            return Ok(());
        }
        let message = truncate(message, MAX_MESSAGE);
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
        let mut rest = String::new();
        for (k, v) in &fields {
            let own = names.len() - context < MAX_FIELDS
                && callsites::usable_name(k)
                && !RESERVED.contains(&k.as_str())
                && !names[context..].contains(&k.as_str());
            if own {
                names.push(k);
                values.push(cut(v, MAX_VALUE).to_owned());
            } else {
                render_field(&mut rest, k, v);
            }
        }
        if !rest.is_empty() {
            names.push("fields");
            values.push(rest);
        }
        if let Some(meta) = callsites::intern(level, &names) {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            callsites::emit(meta, &values);
        } else {
            // A bound of the callsite interner is reached: the shape every line had before
            // guest fields became event fields.
            let mut all = String::new();
            for (k, v) in &fields {
                render_field(&mut all, k, v);
            }
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

/// Appends ` k="v"` to `out`, name and value each cut first, while `out` has room under
/// [`MAX_MESSAGE`]; past it, nothing more is appended.
fn render_field(out: &mut String, k: &str, v: &str) {
    use std::fmt::Write as _;
    if out.len() >= MAX_MESSAGE {
        return;
    }
    if !out.is_empty() {
        out.push(' ');
    }
    let _ = write!(out, "{}={:?}", cut(k, MAX_VALUE), cut(v, MAX_VALUE));
    if out.len() > MAX_MESSAGE {
        let end = cut(out, MAX_MESSAGE).len();
        out.truncate(end);
        out.push_str("… (truncated)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundary() {
        let s = truncate("héllo".to_owned(), 2);
        assert_eq!(s, "h… (truncated)");
        assert_eq!(truncate("abc".to_owned(), 3), "abc");
        assert_eq!(cut("héllo", 2), "h");
    }

    #[test]
    fn rendered_fields_are_bounded() {
        let mut out = String::new();
        let huge = "v".repeat(1 << 20);
        for i in 0..1000 {
            render_field(&mut out, &format!("k{i}"), &huge);
        }
        assert!(out.len() <= MAX_MESSAGE + "… (truncated)".len(), "{}", out.len());
        let mut one = String::new();
        render_field(&mut one, &"n".repeat(5000), "x");
        assert!(one.len() <= MAX_VALUE + 8);
    }
}
