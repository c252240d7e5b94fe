//! The WebAssembly plugin runtime: runs controller plugins (components targeting the
//! `wasmctrl:controller/plugin` world) in wasmtime sandboxes.
//!
//! Three rooms on a floor, each room importing only the floor and the rooms below it, and
//! within a room each module only those its room's `mod.rs` lists before it (the tests of
//! `rooms_tests.rs` read the sources and fail on an import against either order):
//!
//! ```text
//!            runtime            instances, pool, calls, the engine and its linker
//!            /     \
//!      imports     compile      WIT host imports  |  compile pipeline
//!            \     /
//!             floor             spec, bindings, metrics, PluginError (this file)
//! ```
//!
//! - The floor: `spec` (what the runtime knows of a plugin), `bindings` (generated from
//!   `wit/`), `metrics` (the runtime's metric families) and [`PluginError`]; it imports
//!   nothing of the rooms.
//! - `compile`: turning a `.wasm` into code. `settings` (the engine settings,
//!   [`EngineConfig`]: a leaf importing nothing of `plugin`), the compile cache, the compile
//!   child process, the compile permits, Cranelift through the cache (`optimizer`), Winch
//!   (`baseline`), a component's code across its tier-up (`tier`), the background tier-ups
//!   and the single-flight loading of components shared by content hash. It imports neither
//!   `imports` nor `runtime`.
//! - `imports`: the host side of the plugin's imports, one module with its own narrow host
//!   context per WIT interface (`cache`, `client`, `events`, `log`, `config`, as wasmtime's
//!   WASI host code does per interface) and the WASI a plugin gets (`wasi`, `stdio`), with
//!   what they share: the call in progress (`call`), permission checks (`access`), cluster
//!   access ([`KubeServices`]), the Event recorder, the fixture call log and the guest
//!   output budget. It imports neither `compile` nor `runtime`.
//! - `runtime`: running plugins. The store's data (holding each import's context), the
//!   shared engine and its linker ([`PluginEngine`], built on `compile`), instance slots,
//!   the instance pool, idle release, a loaded [`Plugin`] and its calls (admission calls
//!   included), [`inspect_component`] (`wasmctrl check`) and [`PluginReconciler`] (the
//!   plugin as the controller's `Reconciler` and as an informer event handler).
//!
//! The rooms are internal (`pub(crate)`); what the binary, tests, benchmarks and fuzz
//! targets use is re-exported here.
//!
//! Invariants kept across the module: a plugin never gets a capability its TOML did not
//! grant (only the WASI of `imports::wasi` is linked, the filesystem and sockets granting
//! nothing, and a component importing more is refused at check and at load; `cache`,
//! `client` and `events` check declared kinds and namespaces); every object a guest
//! receives, through an import or as an export's argument, is of a kind it may read, in its
//! namespaces (else its metadata only, or nothing: see `imports::access`); what a guest
//! makes the host copy per host call or return value is bounded (the store's hostcall fuel,
//! see `runtime::plugin`); an import reaches nothing but its own context and the call in
//! progress; a trap fails one call and discards one instance, never the host.

pub(crate) mod bindings;
pub(crate) mod compile;
pub(crate) mod imports;
pub(crate) mod metrics;
pub(crate) mod runtime;
pub(crate) mod spec;

#[cfg(test)]
mod rooms_tests;

pub use compile::child::serve_compile;
pub use compile::settings::{
    CompileLimits, DEFAULT_CACHE_MAX_BYTES, DEFAULT_COMPILE_TIMEOUT, DEFAULT_IDLE_CODE_TIMEOUT,
    DEFAULT_IDLE_INSTANCE_TIMEOUT, DEFAULT_INSTANCE_SLOTS, DEFAULT_INSTANCES_PER_PLUGIN, EngineConfig,
    EngineTuning, PoolingLimits,
};
pub use compile::tier::Tier;
pub use imports::cache::{CacheReadError, CacheReader};
pub use imports::call_log::{CallLog, RecordedEvent, RecordedWrite};
pub use imports::cluster::KubeServices;
pub use runtime::admission_exports::AdmissionExports;
pub use runtime::engine::{
    CodeDrops, ComponentLoads, LoadSlot, LoadedComponent, PluginEngine, SharedComponent, TierUps,
};
pub use runtime::inspect::{ComponentReport, inspect_component};
pub use runtime::plugin::{
    AdmissionInput, AdmissionOperation, AdmissionUser, AdmitError, CallError, FilterInput, GuestDenial,
    GuestMutation, GuestVerdict, Plugin, PluginEnv, PluginHooks, TierCalls,
};
pub use runtime::pool::Pool;
pub use runtime::reconciler::PluginReconciler;
pub use spec::{DEFAULT_LOG_LINES_PER_SECOND, Gvk, Permissions, PluginSpec, SandboxLimits};

/// Why a plugin could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PluginError {
    #[error("configuring the wasm engine: {0}")]
    Engine(String),
    #[error("compiling the component: {0}")]
    Compile(String),
    #[error("compile cache: {0}")]
    Cache(String),
    #[error("plugin {plugin} does not fit the wasmctrl:controller/plugin world: {reason}")]
    Incompatible { plugin: String, reason: String },
    /// The component imports a WASI interface the host does not grant (`reason` names it).
    #[error("plugin {plugin} {reason}")]
    Ungranted { plugin: String, reason: String },
    /// The plugin cannot have the instance slots it needs (`reason` says how many and why).
    #[error("plugin {plugin}: {reason}")]
    Slots { plugin: String, reason: String },
    #[error("plugin {plugin}: starting an instance failed: {reason}")]
    Init { plugin: String, reason: String },
    /// The component was written for another kind than its TOML's `[for]`.
    #[error(
        "plugin {plugin} was written for {written_for} (its init reports it) but its TOML's [for] is {toml}: \
         point [for] at {written_for}, or build the plugin for {toml}"
    )]
    KindMismatch { plugin: String, written_for: Gvk, toml: Gvk },
}
