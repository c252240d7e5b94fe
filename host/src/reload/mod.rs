//! The plugins directory manager and the offline tools built on the same validation.
//!
//! - [`PluginManager`] ([`manager`]): loads every plugin of a directory at start, then
//!   follows the directory (hot reload), handing each plugin from version to version
//!   without losing or doubling a reconcile.
//! - [`check_paths`] ([`check`]): `wasmctrl check`, the loader's validation, offline.
//! - [`rbac_for`] ([`rbac`]): `wasmctrl rbac`, the RBAC the plugins need.
//! - [`StatusBoard`] ([`status`]): per-plugin status for `/plugins` and `/readyz`.
//! - [`webhook_configurations_for`] ([`webhook_config`]): `wasmctrl webhook-config`, the
//!   admitting plugins' webhook configurations.
//!
//! The modules, from the bottom up: a module uses only modules listed before it (the
//! manager's steps, from `plan` on, each add the methods of one step to the `ManagerCore`
//! of `manager_core`, and call only the steps listed before them).
//!
//! 1. Files: [`scan`] (a directory's plugin files, read once settled), [`check`],
//!    [`watcher`] (directory watches that follow symlinks), [`snapshot`] (one consistent
//!    read of the directory), [`code_source`] (a TOML's code: bytes and version, from a file
//!    or a registry).
//! 2. Records: [`status`], `parked` (queues of stopped plugins).
//! 3. One version's informers and handlers: `slot` (the version `map`/`filter` go to),
//!    `predicates` (a source's event predicates, as `wasmctrl test` builds them too),
//!    `union_cache` (one kind's cache when several informers watch it for one plugin),
//!    `leases` (the informers a version needs, leased from the factory), `factory` (the
//!    host's informer factory as those leases), `map_filter` (the plugin's `map` and
//!    `filter` exports as the controller's mapper and filter), `generation` (one version's
//!    handlers, wired from its predecessor's), `retire` (a generation taken out of service
//!    without losing what it was sent), `current_generation` (what a plugin's controller
//!    sees of its current generation: its `for` source, its keys for sharding), `scope` (a
//!    narrowed scope is not a delete).
//! 4. The manager: `options` (what it is started with), `manager_core` (its state: what runs
//!    under each name), `plan` (which file each name runs from), `handoff` (swap, restart,
//!    first start, stop), `candidate` (a new version built and checked, then handed the
//!    plugin), `load` (one name brought in line with the plan), `rounds` (when a round
//!    runs: file events, SIGHUP, rescans, registry tags), [`manager`] (the handle).
//! 5. Offline tools on their own: [`rbac`], [`webhook_config`].

pub mod scan;

pub mod check;
pub mod code_source;
pub mod snapshot;
pub mod watcher;

mod parked;
pub mod status;

mod current_generation;
mod factory;
mod generation;
mod leases;
mod map_filter;
pub(crate) mod predicates;
mod retire;
mod scope;
mod slot;
mod union_cache;

mod candidate;
mod handoff;
mod load;
pub mod manager;
mod manager_core;
mod options;
mod plan;
mod rounds;

pub mod rbac;
pub mod webhook_config;

pub use check::{
    CheckOptions, CheckProgress, CheckReport, CheckedPlugin, ComponentInfo, ComponentValidator,
    EngineValidator, Hooks, check_paths, validate_plugin, version_of,
};
pub use code_source::CodeSource;
pub use factory::FactoryLeases;
pub use leases::{InformerLeases, LeasedInformer, Leases, WatchKey};
pub use manager::{
    DEFAULT_PARKED_KEYS_TTL, DEFAULT_RESCAN_INTERVAL, ManagerDeps, ManagerError, ManagerOptions,
    PluginManager,
};
pub use parked::MAX_PARKED;
pub use rbac::{RbacManifests, RbacObject, RbacOptions, rbac_for};
pub use status::{PluginState, PluginStatus, StatusBoard};
pub use webhook_config::{WebhookConfigPrintError, webhook_configurations_for};
