//! The WebAssembly plugin runtime: runs controller plugins (components targeting the
//! `wasmctrl:controller/plugin` world) in wasmtime sandboxes.
//!
//! Layers, each importing only the ones below it (no cycles among these modules):
//!
//! 1. Foundations, importing nothing of the runtime but each other: [`spec`] (what the runtime knows of a plugin), `bindings` (generated from
//!    `wit/`), [`metrics`] (the runtime's metric families), `call` (the call in progress),
//!    `callsites` (tracing callsites for guest log fields), [`record`] (the fixture call
//!    log), `recorder` (the Event spam filter, rate limits and aggregation), `output_limit` (a
//!    plugin's budget of guest log lines), `stdio` (guest stdout and
//!    stderr into the log), [`shared`], `slots` (the host's instance slots, shared fairly),
//!    [`pool`], `gate`, `idle`, [`compile_cache`],
//!    [`tier`] (a component's code across its tier-up from Winch to Cranelift), then
//!    `optimizer` (Cranelift through the compile cache) and `tier_up` (the background
//!    Cranelift compiles), which import only these.
//! 2. Shared pieces of the imports: `access` (a plugin's permission checks, and what of an
//!    object a guest may be sent) and
//!    [`cluster`] ([`KubeServices`], the host's cluster access, owned here so that the
//!    `client` and `events` imports both use it without importing each other).
//! 3. One module per WIT interface — [`cache`], [`client`], `events`, `log`, `config` —
//!    each with its own narrow host context (`CacheCtx`, ...) implementing that interface's
//!    generated `Host` trait through a view (`CacheCtxView`, ...), as wasmtime's WASI host
//!    code does per interface; and [`wasi`], the WASI interfaces a plugin gets.
//! 4. `state`: the store's `T`, a plain holder of those contexts (it imports them; they do
//!    not import it).
//! 5. [`engine`]: the shared engine, and the linker that links each interface with its own
//!    getter returning only that interface's view of the state.
//! 6. `code` (a loaded plugin's compiled code: resident, dropped while idle, reloaded),
//!    [`runtime`] (a loaded [`Plugin`]: instance pool, blocking calls into its exports; the
//!    admission calls of `validator` and `mutator` in its child `admit`) and
//!    [`inspect`] (`wasmctrl check`); [`adapter`] on top ([`PluginReconciler`], the plugin
//!    as the controller's `Reconciler` and as an informer event handler).
//!    [`cache_union`]: one kind's cache when several informers watch it for one plugin.
//!
//! Invariants kept across the module: a plugin never gets a capability its TOML did not
//! grant (only the WASI of [`wasi`] is linked, the filesystem and sockets granting nothing,
//! and a component importing more is refused at check and at load; `cache`, `client` and
//! `events` check declared kinds and namespaces); every object a guest receives, through an
//! import or as an export's argument, is of a kind it may read, in its namespaces (else its
//! metadata only, or nothing: see `access`); what a guest makes the host copy per host call
//! or return value is bounded (the store's hostcall fuel, see [`runtime`]); an import reaches
//! nothing but its own context and the call in progress; a trap fails one call and discards
//! one instance, never the host.

mod access;
pub mod adapter;
pub(crate) mod bindings;
pub mod cache;
pub mod cache_union;
mod call;
mod callsites;
pub mod client;
pub mod cluster;
mod code;
pub mod compile_cache;
pub mod compile_process;
mod config;
pub mod engine;
mod events;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod idle;
pub mod inspect;
mod log;
pub mod metrics;
mod optimizer;
mod output_limit;
pub mod pool;
pub mod record;
mod recorder;
pub mod runtime;
pub mod shared;
mod slots;
pub mod spec;
mod state;
mod stdio;
pub mod tier;
mod tier_up;
pub mod wasi;

pub use adapter::PluginReconciler;
pub use cache::{CacheReadError, CacheReader};
pub use cache_union::UnionCache;
pub use cluster::KubeServices;
pub use compile_cache::DEFAULT_CACHE_MAX_BYTES;
pub use compile_process::{CompileLimits, DEFAULT_COMPILE_TIMEOUT};
pub use engine::{
    CodeDrops, ComponentLoads, DEFAULT_IDLE_CODE_TIMEOUT, DEFAULT_IDLE_INSTANCE_TIMEOUT,
    DEFAULT_INSTANCE_SLOTS, DEFAULT_INSTANCES_PER_PLUGIN, EngineConfig, EngineTuning, LoadSlot,
    LoadedComponent, PluginEngine, PoolingLimits, SharedComponent, TierUps,
};
pub use inspect::{ComponentReport, inspect_component};
pub use output_limit::DEFAULT_LOG_LINES_PER_SECOND;
pub use record::{CallLog, RecordedEvent, RecordedWrite};
pub use runtime::{
    AdmissionExports, AdmissionInput, AdmissionOperation, AdmissionUser, AdmitError, CallError, FilterInput,
    GuestDenial, GuestMutation, GuestVerdict, Plugin, PluginEnv, PluginHooks, TierCalls,
};
pub use spec::{Gvk, Permissions, PluginSpec, SandboxLimits};
pub use tier::Tier;

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
