//! The plugins directory manager and the offline tools built on the same validation.
//!
//! - [`PluginManager`] ([`manager`]): loads every plugin of a directory at start, then
//!   follows the directory (hot reload), handing each plugin from version to version
//!   without losing or doubling a reconcile. Its parts, along the way a change travels:
//!   [`watcher`] (directory watches that follow symlinks), [`snapshot`] (one consistent
//!   read of the directory), [`code_source`] (a TOML's code: bytes and version), `handoff`
//!   (swap, restart, first start, stop), `wiring` (one version's leases and handlers),
//!   `slot` (the version `map`/`filter` go to), `scope` (a narrowed scope is not a delete),
//!   `union_cache` (one kind's cache when several informers watch it for one plugin),
//!   `parked` (queues of stopped plugins), `predicates` (a source's event predicates, as
//!   `wasmctrl test` builds them too).
//! - [`check_paths`] ([`check`]): `wasmctrl check`, the loader's validation, offline.
//! - [`rbac_for`] ([`rbac`]): `wasmctrl rbac`, the RBAC the plugins need.
//! - [`StatusBoard`] ([`status`]): per-plugin status for `/plugins` and `/readyz`.
//! - [`webhook_configurations_for`] ([`webhook_config`]): `wasmctrl webhook-config`, the
//!   admitting plugins' webhook configurations.

pub mod check;
pub mod code_source;
mod factory;
mod handoff;
pub mod manager;
mod parked;
pub(crate) mod predicates;
pub mod rbac;
pub mod scan;
mod scope;
mod slot;
pub mod snapshot;
pub mod status;
mod union_cache;
pub mod watcher;
pub mod webhook_config;
mod wiring;

pub use check::{
    CheckOptions, CheckProgress, CheckReport, CheckedPlugin, ComponentInfo, ComponentValidator,
    EngineValidator, Hooks, check_paths, validate_plugin, version_of,
};
pub use code_source::CodeSource;
pub use factory::FactoryLeases;
pub use manager::{
    DEFAULT_PARKED_KEYS_TTL, DEFAULT_RESCAN_INTERVAL, ManagerDeps, ManagerError, ManagerOptions,
    PluginManager,
};
pub use parked::MAX_PARKED;
pub use rbac::{RbacManifests, RbacObject, RbacOptions, rbac_for};
pub use status::{PluginState, PluginStatus, StatusBoard};
pub use webhook_config::{WebhookConfigPrintError, webhook_configurations_for};
pub use wiring::{InformerLeases, LeasedInformer, Leases, WatchKey};
