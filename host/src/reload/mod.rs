//! The plugins directory manager and the offline tools built on the same validation.
//!
//! - [`PluginManager`] ([`manager`]): loads every plugin of a directory at start, then
//!   follows the directory (hot reload: debounced file events and SIGHUP), swapping plugin
//!   versions without losing or doubling a reconcile.
//! - [`check_paths`] ([`check`]): `wasmctrl check`, the loader's validation, offline.
//! - [`rbac_for`] ([`rbac`]): `wasmctrl rbac`, the RBAC the plugins need.
//! - [`StatusBoard`] ([`status`]): per-plugin status for `/plugins` and `/readyz`.
//! - [`webhook_configurations_for`] ([`webhook_config`]): `wasmctrl webhook-config`, the
//!   admitting plugins' webhook configurations.

pub mod check;
mod factory;
pub mod manager;
pub mod rbac;
pub mod scan;
pub mod status;
pub mod webhook_config;
mod wiring;

pub use check::{
    CheckOptions, CheckReport, CheckedPlugin, ComponentInfo, ComponentValidator, EngineValidator, Hooks,
    check_paths, validate_plugin, version_of,
};
pub use factory::FactoryLeases;
pub use manager::{ManagerDeps, ManagerError, ManagerOptions, PluginManager};
pub use rbac::{RbacManifests, RbacObject, RbacOptions, rbac_for};
pub use status::{PluginState, PluginStatus, StatusBoard};
pub use webhook_config::{WebhookConfigPrintError, webhook_configurations_for};
pub use wiring::{InformerLeases, LeasedInformer, Leases, WatchKey};
