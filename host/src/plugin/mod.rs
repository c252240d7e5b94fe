//! The WebAssembly plugin runtime: runs controller plugins (components targeting the
//! `wasmctrl:controller/plugin` world) in wasmtime sandboxes.
//!
//! - [`engine`]: the shared engine (Cranelift, epoch ticker, pooling allocator) and the
//!   on-disk compile cache; [`shared`]: compiled components shared by content hash;
//!   `idle`: releasing instances that stayed idle; `gate`: a bound on compiles at once.
//! - [`spec`]: what the runtime needs to know about a plugin ([`PluginSpec`]).
//! - [`runtime`]: a loaded [`Plugin`] with its instance pool and blocking calls into its exports.
//! - [`adapter`]: [`PluginReconciler`], the plugin as the controller's `Reconciler` and as
//!   an informer event handler; it moves calls off the tokio workers.
//! - [`inspect`]: what a `.wasm` targets and whether it fits (`wasmctrl check`).
//! - `cache`, `client`, `events`, `log`, `config`: the host side of each WIT import;
//!   [`cache_union`]: one kind's cache when several informers watch it for one plugin.
//!   `callsites`: tracing callsites for guest log fields named at run time.
//!
//! Invariants kept across the module: a plugin never gets a capability its TOML did not
//! grant (WASI grants nothing; `cache`/`client` check declared kinds); a trap fails one
//! call and discards one instance, never the host.

mod access;
pub mod adapter;
pub(crate) mod bindings;
pub mod cache;
pub mod cache_union;
mod call;
mod callsites;
pub mod client;
pub mod cluster;
pub mod compile_cache;
mod config;
pub mod engine;
mod events;
mod gate;
mod idle;
pub mod inspect;
mod log;
pub mod metrics;
pub mod pool;
pub mod record;
mod recorder;
pub mod runtime;
pub mod shared;
pub mod spec;
mod state;
mod stdio;
pub mod wasi;

pub use adapter::PluginReconciler;
pub use cache::{CacheReadError, CacheReader};
pub use cache_union::UnionCache;
pub use cluster::KubeServices;
pub use compile_cache::DEFAULT_CACHE_MAX_BYTES;
pub use engine::{
    ComponentLoads, DEFAULT_IDLE_INSTANCE_TIMEOUT, EngineConfig, EngineTuning, LoadedComponent, PluginEngine,
    PoolingLimits, SharedComponent,
};
pub use inspect::{ComponentReport, inspect_component};
pub use record::{CallLog, RecordedEvent, RecordedWrite};
pub use runtime::{CallError, FilterInput, Plugin, PluginEnv, PluginHooks};
pub use spec::{Gvk, Permissions, PluginSpec, SandboxLimits};

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
