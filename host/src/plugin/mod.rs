//! The WebAssembly plugin runtime: runs controller plugins (components targeting the
//! `wasmctrl:controller/plugin` world) in wasmtime sandboxes.
//!
//! Layers, each importing only the ones below it (no cycles among these modules):
//!
//! 1. Foundations, importing nothing of the runtime but each other: [`spec`] (what the runtime knows of a plugin), `bindings` (generated from
//!    `wit/`), [`metrics`] (the runtime's metric families), `call` (the call in progress),
//!    `callsites` (tracing callsites for guest log fields), [`record`] (the fixture call
//!    log), `recorder` (the Event spam filter and aggregation), `stdio` (guest stdout and
//!    stderr into the log), [`shared`], [`pool`], `gate`, `idle`, [`compile_cache`],
//!    [`tier`] (a component's code across its tier-up from Winch to Cranelift), then
//!    `optimizer` (Cranelift through the compile cache) and `tier_up` (the background
//!    Cranelift compiles), which import only these.
//! 2. Shared pieces of the imports: `access` (a plugin's permission checks) and
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
//!    [`runtime`] (a loaded [`Plugin`]: instance pool, blocking calls into its exports) and
//!    [`inspect`] (`wasmctrl check`); [`adapter`] on top ([`PluginReconciler`], the plugin
//!    as the controller's `Reconciler` and as an informer event handler).
//!    [`cache_union`]: one kind's cache when several informers watch it for one plugin.
//!
//! Invariants kept across the module: a plugin never gets a capability its TOML did not
//! grant (only the WASI of [`wasi`] is linked, the filesystem and sockets granting nothing,
//! and a component importing more is refused at check and at load; `cache`/`client` check
//! declared kinds); an import reaches nothing but its own context and the call in progress;
//! a trap fails one call and discards one instance, never the host.

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
pub mod pool;
pub mod record;
mod recorder;
pub mod runtime;
pub mod shared;
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
pub use engine::{
    CodeDrops, ComponentLoads, DEFAULT_IDLE_CODE_TIMEOUT, DEFAULT_IDLE_INSTANCE_TIMEOUT, EngineConfig,
    EngineTuning, LoadSlot, LoadedComponent, PluginEngine, PoolingLimits, SharedComponent, TierUps,
};
pub use inspect::{ComponentReport, inspect_component};
pub use record::{CallLog, RecordedEvent, RecordedWrite};
pub use runtime::{CallError, FilterInput, Plugin, PluginEnv, PluginHooks, TierCalls};
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
    #[error("plugin {plugin}: starting an instance failed: {reason}")]
    Init { plugin: String, reason: String },
    /// The component was written for another kind than its TOML's `[for]`.
    #[error(
        "plugin {plugin} was written for {written_for} (its init reports it) but its TOML's [for] is {toml}: \
         point [for] at {written_for}, or build the plugin for {toml}"
    )]
    KindMismatch { plugin: String, written_for: Gvk, toml: Gvk },
}
