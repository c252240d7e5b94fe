//! Running plugins: the store's data, the shared engine and its linker, instances and
//! their pool, the calls into a plugin's exports, and the plugin as the rest of the host
//! sees it.
//!
//! Modules, each importing only those listed before it (besides the floor, the compile
//! pipeline and the host imports):
//! 1. `store_data` (the store's `T`, a plain holder of each import's context),
//!    `instance_slots` (the host's instance slots, shared fairly), `pool` (a plugin's
//!    bounded pool of instances), `idle` (releasing idle instances and code).
//! 2. `engine` ([`PluginEngine`](engine::PluginEngine): the engines, the linker that links
//!    each interface with a getter returning only its view of the store's data, the epoch
//!    ticker, loads through the compile pipeline).
//! 3. `admission_exports` (which of `validator` and `mutator` a component exports),
//!    `plugin_code` (a loaded plugin's code: resident, dropped while idle, loaded again),
//!    then `plugin` (a loaded [`Plugin`](plugin::Plugin): instance pool, blocking calls into
//!    its exports; its child `admit` makes the admission calls).
//! 4. `inspect` (`wasmctrl check`) and `reconciler`
//!    ([`PluginReconciler`](reconciler::PluginReconciler), the plugin as the controller's
//!    `Reconciler` and as an informer event handler).
//!
//! Invariant of the room: it is the top of the plugin runtime: nothing in `compile` or
//! `imports` imports it.

pub(crate) mod admission_exports;
pub(crate) mod engine;
pub(crate) mod idle;
pub(crate) mod inspect;
pub(crate) mod instance_slots;
pub(crate) mod plugin;
pub(crate) mod plugin_code;
pub(crate) mod pool;
pub(crate) mod reconciler;
pub(crate) mod store_data;
