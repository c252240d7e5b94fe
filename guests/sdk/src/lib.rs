//! # wasmctrl-guest: write Kubernetes controllers as wasmctrl plugins
//!
//! A wasmctrl plugin is a WebAssembly component that holds only a controller's business
//! logic: the host owns every watch, cache and work queue, calls the plugin's `reconcile`
//! for each key, and lets it read the host's caches and write through the host's client.
//! This crate hides the raw WIT bindings (`wit/wasmctrl.wit`, world `plugin`) behind
//! typed APIs over [k8s-openapi](k8s_openapi) types and serde.
//!
//! | module | what |
//! | --- | --- |
//! | [`cache`] | typed reads from the host's informer caches: `get`, `list` (label selector), `by_index` |
//! | [`client`] | writes and live reads: `create`, `replace`, `apply` (server-side), `patch_merge`/`patch_json`/`patch_strategic`, `update_status`, `patch_status_merge`, `delete` |
//! | [`events`] | Kubernetes Events: `normal`, `warning` |
//! | [`log`] | structured logs: `info!("msg"; key = value)`, … |
//! | [`config`] | the plugin's name and `[settings]` |
//! | [`owner`], [`finalizer`], [`conditions`], [`diff`], [`time`] | pure helpers for owner references, finalizers, status conditions, "is a write needed?" checks and time |
//!
//! Types: [`Kind`] maps a Rust type to `apiVersion`/`kind` (every k8s-openapi type has
//! it; CRDs use [`impl_kind!`]); [`Error`] mirrors the WIT `error` variant; a
//! [`Plugin`] returns `Result<`[`Action`]`, `[`ReconcileError`]`>`, and `?` turns an
//! [`Error`] into a [`ReconcileError`] (retryable unless the input itself was invalid).
//!
//! ## A complete plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "hello-plugin"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! wasmctrl-guest = { path = "../../sdk" }
//! serde = { version = "1", features = ["derive"] }
//! ```
//!
//! `src/lib.rs` — stamps every ConfigMap with a `greeting` key and says so in an Event:
//!
//! ```no_run
//! use serde::Deserialize;
//! use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
//! use wasmctrl_guest::prelude::*;
//!
//! #[derive(Deserialize)]
//! #[serde(rename_all = "kebab-case")]
//! struct Hello {
//!     #[serde(default = "default_greeting")]
//!     greeting: String,
//! }
//!
//! fn default_greeting() -> String {
//!     "hello".into()
//! }
//!
//! impl Plugin for Hello {
//!     fn init(settings: Settings) -> Result<Self, String> {
//!         settings.parse().map_err(|e| e.to_string())
//!     }
//!
//!     fn reconcile(&self, request: Request) -> Result<Action, ReconcileError> {
//!         let ns = request.namespace.as_deref();
//!         // Gone since it was queued: nothing to do.
//!         let Some(cm) = cache::get::<ConfigMap>(ns, &request.name)? else {
//!             return Ok(Action::Done);
//!         };
//!         if cm.data.as_ref().and_then(|d| d.get("greeting")) == Some(&self.greeting) {
//!             return Ok(Action::Done);
//!         }
//!         let patch = serde_json::json!({ "data": { "greeting": self.greeting } });
//!         client::patch_merge::<ConfigMap>(ns, &request.name, &patch).context("stamping greeting")?;
//!         events::normal(&cm, "Greeted", "Patch", &format!("set greeting={}", self.greeting))?;
//!         log::info!("greeted {}", request; greeting = self.greeting);
//!         Ok(Action::Done)
//!     }
//! }
//!
//! wasmctrl_guest::export_plugin!(Hello);
//! ```
//!
//! `plugins/hello.toml`, next to `plugins/hello.wasm`:
//!
//! ```toml
//! [for]
//! api-version = "v1"
//! kind = "ConfigMap"
//! namespace = "default"
//! [permissions]
//! write = ["v1/ConfigMap"]
//! [settings]
//! greeting = "hi"
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is the component.
//!
//! ## Hooks
//!
//! Besides `reconcile`, a plugin may override [`Plugin::on_add`], [`on_update`](Plugin::on_update),
//! [`on_delete`](Plugin::on_delete), [`map`](Plugin::map) (required for `[[watches]]`)
//! and [`filter`](Plugin::filter) (for `filter = true` predicates), and must list them in
//! [`Plugin::HOOKS`]: the host only calls declared hooks.
//!
//! ## Time
//!
//! The WIT world grants no clock; see [`time`] for how `lastTransitionTime` gets a value.
//!
//! ## Testing natively
//!
//! Everything except the calls into the host is plain Rust and runs under `cargo test` on
//! the build machine (the import functions themselves only exist inside a Wasm instance).
//! Keep decisions in pure functions that take the objects read from the cache, and call
//! `cache`/`client` around them.

#![warn(missing_docs)]

// Lets the generated bindings name this crate as `wasmctrl_guest::…` from inside it too.
extern crate self as wasmctrl_guest;

pub use k8s_openapi;
pub use serde_json;

mod error;
mod host;
mod kind;
mod plugin;

pub mod cache;
pub mod client;
pub mod conditions;
pub mod config;
pub mod diff;
pub mod events;
pub mod finalizer;
pub mod log;
pub mod owner;
pub mod time;

pub use error::{Error, ReconcileError, ResultExt};
pub use kind::{Gvk, Kind, KindExt, RawObject, from_json, to_json};
pub use plugin::{Action, FilterEvent, Hooks, Plugin, Request, Settings};

/// The names most plugins need: `use wasmctrl_guest::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Action, Error, FilterEvent, Gvk, Hooks, Kind, KindExt, Plugin, RawObject, ReconcileError, Request,
        ResultExt, Settings, cache, client, conditions, config, diff, events, finalizer, log, owner,
    };
}

#[doc(hidden)]
pub mod bindings {
    //! Raw wit-bindgen output for world `plugin`. Not a stable API: use the typed modules.
    #![allow(missing_docs, clippy::all)]
    wit_bindgen::generate!({
        // Relative to this crate's manifest, so it resolves the same whichever crate
        // depends on the SDK.
        path: "../../wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        runtime_path: "wasmctrl_guest::__private::wit_bindgen::rt",
        bitflags_path: "wasmctrl_guest::__private::wit_bindgen::rt::bitflags",
    });
}

/// Implementation details of [`export_plugin!`]; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    pub use crate::bindings::exports::wasmctrl::controller::reconciler::{
        FilterEvent as WitFilterEvent, Guest, PluginInfo, ReconcileError as WitReconcileError,
        ReconcileResult,
    };
    pub use crate::bindings::wasmctrl::controller::types::{Gvk as WitGvk, Request as WitRequest};
    pub use crate::plugin::{Slot, filter, init, map, on_add, on_delete, on_update, reconcile};
    pub use wit_bindgen;
}
