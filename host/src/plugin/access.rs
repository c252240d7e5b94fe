//! What one plugin may touch: the permission checks shared by the `cache` and `client`
//! imports.
//!
//! Invariants:
//! - A kind the plugin's TOML did not declare readable (writable) is refused with
//!   `forbidden` before any cache or API server is touched; every refusal is counted in
//!   `wasmctrl_plugin_forbidden_calls` and logged with the plugin, request, kind and call.
//! - A guest-provided body larger than the plugin's `max-output` is refused as `invalid`.
//! - A call that may not write (an admission call without side effects, see
//!   [`CallInfo::writes_refused`]) has every write refused with `forbidden`, whatever the kind.

use super::bindings::wasmctrl::controller::types::Error as WitError;
use super::call::CallInfo;
use super::metrics::RuntimeMetrics;
use super::spec::{Gvk, Permissions};

/// One plugin's grants, shared by every instance of it.
pub(crate) struct Access {
    plugin: String,
    permissions: Permissions,
    max_output: usize,
    metrics: RuntimeMetrics,
}

impl Access {
    pub fn new(plugin: String, permissions: Permissions, max_output: usize, metrics: RuntimeMetrics) -> Self {
        Access { plugin, permissions, max_output, metrics }
    }

    /// The plugin's name.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Refuses `kind` unless readable: counts and logs the refusal.
    pub fn check_read(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        if self.permissions.can_read(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "read"))
    }

    /// Refuses `kind` unless writable: counts and logs the refusal.
    pub fn check_write(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        check_call_may_write(&self.plugin, call)?;
        if self.permissions.can_write(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "write"))
    }

    fn forbidden(&self, kind: &Gvk, call: &CallInfo, op: &'static str, verb: &str) -> WitError {
        self.metrics.count_forbidden(&self.plugin, op);
        tracing::warn!(
            plugin = %self.plugin,
            request = call.request.as_deref().unwrap_or(""),
            kind = %kind,
            op,
            "plugin refused: kind not declared {verb}able"
        );
        let hint = if verb == "read" {
            "add it to for/owns/watches or permissions.read"
        } else {
            "add it to permissions.write"
        };
        WitError::Forbidden(format!(
            "plugin {} may not {verb} {kind}: {hint} in the plugin's TOML",
            self.plugin
        ))
    }

    /// Refuses a guest-provided body larger than `max-output`.
    pub fn check_input_size(&self, len: usize, what: &str) -> Result<(), WitError> {
        let max = self.max_output;
        if len > max {
            return Err(WitError::Invalid(format!(
                "{what} is {len} bytes, over the plugin's max-output of {max}"
            )));
        }
        Ok(())
    }
}

/// Refuses any write of a call that may not write (see [`CallInfo::writes_refused`]).
pub(crate) fn check_call_may_write(plugin: &str, call: &CallInfo) -> Result<(), WitError> {
    match &call.writes_refused {
        None => Ok(()),
        Some(why) => {
            tracing::warn!(plugin, export = call.export, request = call.request.as_deref().unwrap_or(""), reason = %why, "plugin write refused during an admission call");
            Err(WitError::Forbidden(format!("plugin {plugin} may not write during this call: {why}")))
        }
    }
}
