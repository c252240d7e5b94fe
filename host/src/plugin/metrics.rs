//! The plugin runtime's own metric families: traps, instantiations, refused host calls,
//! live instances, component loads, tier-ups, code dropped while idle and reloaded, and
//! compile cache artifacts rejected, and what a plugin's guest output and Events lost to
//! their rate limits.
//!
//! Invariants: one [`RuntimeMetrics`] per engine, registered at most once (by the engine,
//! when given the host's registry); every other module only increments what it is handed.
//! This module imports nothing of the runtime, so any stage may count.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::Metrics;

/// `{plugin, call}` labels of the runtime's own counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PluginCallLabels {
    pub plugin: String,
    pub call: String,
}

/// `{plugin, stream}` labels of `wasmctrl_plugin_guest_lines_dropped`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct GuestStreamLabels {
    pub plugin: String,
    /// `log` (the `log` import), `stdout` or `stderr`.
    pub stream: &'static str,
}

/// `{plugin, reason}` labels of `wasmctrl_plugin_events_dropped`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct EventDropLabels {
    pub plugin: String,
    /// `rate-limit` (the plugin's own budget), `spam-filter` (too many about one object)
    /// or `queue-full` (the host's send queue).
    pub reason: &'static str,
}

/// `{origin}` label of `wasmctrl_plugin_component_loads`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ComponentLoadLabels {
    /// `compiled` (Cranelift ran), `baseline` (Winch ran; Cranelift runs in the
    /// background), `cache` (read from the compile cache) or `shared` (the compiled code
    /// another plugin uses, or a concurrent load's).
    pub origin: &'static str,
}

/// `{result}` label of `wasmctrl_plugin_tier_ups`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct TierUpLabels {
    /// `done` (the plugins switched to the optimised code), `abandoned` (no plugin ran
    /// the component any more) or `failed` (Cranelift refused it; plugins stay on Winch).
    pub result: &'static str,
}

/// `{reason}` label of `wasmctrl_compile_cache_rejected_artifacts`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct RejectedArtifactLabels {
    /// `not-regular` (a link, FIFO, directory...), `owner`, `mode`, `links`,
    /// `unauthenticated` (no trailer: written by something else), `mac` (the MAC does not
    /// match: changed, or another name's or engine's artifact), `unloadable` (the MAC
    /// matched but wasmtime refused it).
    pub reason: &'static str,
}

/// The runtime's own metric families, registered once per engine.
#[derive(Clone, Default)]
pub(crate) struct RuntimeMetrics {
    /// Traps by plugin and export (reconcile traps are also counted by the controller).
    pub traps: Family<PluginCallLabels, Counter>,
    /// Instances created (each runs `init`).
    pub instantiations: Family<PluginCallLabels, Counter>,
    /// Host calls refused for lack of a permission.
    pub forbidden: Family<PluginCallLabels, Counter>,
    /// Instances alive now, every plugin and version together.
    pub live_instances: Gauge,
    /// Instances alive now, per plugin (every version together).
    pub instances: Family<crate::metrics::PluginLabels, Gauge>,
    /// Component loads by where the code came from (`compiled`, `baseline`, `cache`, `shared`).
    pub component_loads: Family<ComponentLoadLabels, Counter>,
    /// Background Cranelift compiles of components loaded with Winch, by result.
    pub tier_ups: Family<TierUpLabels, Counter>,
    /// Plugins that dropped their compiled code after the idle-code timeout.
    pub code_drops: Counter,
    /// Plugins that loaded their dropped code again for a call (each also counts as a
    /// component load: from the cache, shared, or compiled).
    pub code_reloads: Counter,
    /// Compile cache artifacts rejected (never loaded), by reason.
    pub rejected_artifacts: Family<RejectedArtifactLabels, Counter>,
    /// Guest log lines (the `log` import, stdout, stderr) dropped by the plugin's rate limit.
    pub guest_lines_dropped: Family<GuestStreamLabels, Counter>,
    /// Events a plugin published that were not sent, by reason.
    pub events_dropped: Family<EventDropLabels, Counter>,
}

impl RuntimeMetrics {
    /// Registers every family in the host's registry.
    pub fn register(&self, m: &Metrics) {
        // Every tier-up result is a series from the start (at 0): dashboards and alerts see
        // the family before the first background compile ends.
        for result in ["done", "abandoned", "failed"] {
            let _ = self.tier_ups.get_or_create(&TierUpLabels { result });
        }
        m.register("wasmctrl_plugin_traps", "Plugin calls that trapped", self.traps.clone());
        m.register(
            "wasmctrl_plugin_instantiations",
            "Plugin instances created (each runs init)",
            self.instantiations.clone(),
        );
        m.register(
            "wasmctrl_plugin_live_instances",
            "Plugin instances alive now (every plugin and version)",
            self.live_instances.clone(),
        );
        m.register(
            "wasmctrl_plugin_instances",
            "Plugin instances alive now, per plugin (every version together)",
            self.instances.clone(),
        );
        m.register(
            "wasmctrl_plugin_forbidden_calls",
            "Host calls refused because the plugin did not declare the kind",
            self.forbidden.clone(),
        );
        m.register(
            "wasmctrl_plugin_component_loads",
            "Component loads by origin: compiled (Cranelift), baseline (Winch, optimised in the background), read from the compile cache, or shared with another plugin",
            self.component_loads.clone(),
        );
        m.register(
            "wasmctrl_plugin_tier_ups",
            "Background Cranelift compiles of components first loaded with Winch, by result: done (plugins switched to the optimised code), abandoned (no plugin ran it any more), failed",
            self.tier_ups.clone(),
        );
        m.register(
            "wasmctrl_plugin_code_drops",
            "Plugins that dropped their compiled code after idle-code-timeout without a call",
            self.code_drops.clone(),
        );
        m.register(
            "wasmctrl_plugin_code_reloads",
            "Plugins that loaded their dropped code again for a call (see wasmctrl_plugin_component_loads for where from)",
            self.code_reloads.clone(),
        );
        m.register(
            "wasmctrl_compile_cache_rejected_artifacts",
            "Compile cache artifacts rejected and removed, never loaded, by reason (not-regular, owner, mode, links, unauthenticated, mac, unloadable)",
            self.rejected_artifacts.clone(),
        );
        m.register(
            "wasmctrl_plugin_guest_lines_dropped",
            "Guest log lines (log import, stdout, stderr) dropped by the plugin's log rate limit",
            self.guest_lines_dropped.clone(),
        );
        m.register(
            "wasmctrl_plugin_events_dropped",
            "Events a plugin published that were not sent: rate-limit (the plugin's budget), spam-filter (too many about one object), queue-full (the host's send queue)",
            self.events_dropped.clone(),
        );
    }

    /// Counts `n` guest lines of `stream` dropped for `plugin`.
    pub fn count_guest_lines_dropped(&self, plugin: &str, stream: &'static str, n: u64) {
        self.guest_lines_dropped
            .get_or_create(&GuestStreamLabels { plugin: plugin.to_owned(), stream })
            .inc_by(n);
    }

    /// Counts one Event of `plugin` dropped for `reason`.
    pub fn count_event_dropped(&self, plugin: &str, reason: &'static str) {
        self.events_dropped.get_or_create(&EventDropLabels { plugin: plugin.to_owned(), reason }).inc();
    }

    /// Counts one call of `call` refused to `plugin` for lack of a permission.
    pub fn count_forbidden(&self, plugin: &str, call: &str) {
        self.forbidden
            .get_or_create(&PluginCallLabels { plugin: plugin.to_owned(), call: call.to_owned() })
            .inc();
    }
}
