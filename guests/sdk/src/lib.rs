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
//! | [`client`] | writes and live reads: `create`, `replace`, `apply` (server-side, [`client::ApplyParams`]), `patch_merge`/`patch_json`/`patch_strategic`, `update_status`, `patch_status_merge`, `delete` |
//! | [`events`] | Kubernetes Events: `normal`, `warning` |
//! | [`log`] | structured logs: `info!("msg"; key = value)`, … (each key a field of the host's log) |
//! | [`config`] | the plugin's name and `[settings]` |
//! | [`admission`] | validating and mutating webhooks on the plugin's kind: [`Validate`](admission::Validate), [`Mutate`](admission::Mutate) |
//! | [`owner`], [`finalizer`], [`conditions`], [`diff`], [`time`] | pure helpers for owner references, finalizers, status conditions, "is a write needed?" checks and time |
//! | [`arena`] | the per-call arena, every plugin's global allocator unless it opts out with `export_plugin!(MyPlugin, allocator = system)` |
//! | `testing` (native builds only) | a fake host: run a plugin's whole `reconcile` under `cargo test` |
//!
//! Types: [`Kind`] maps a Rust type to `apiVersion`/`kind` (every k8s-openapi type has
//! it; CRDs use [`impl_kind!`]); [`Error`] mirrors the WIT `error` variant; a
//! [`Plugin`] names its kind as [`Plugin::For`], receives a [`Target`] of it and returns
//! `Result<`[`Action`]`, `[`ReconcileError`]`>`; `?` turns an [`Error`] into a
//! [`ReconcileError`] (retryable unless the input itself was invalid).
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
//! crate-type = ["cdylib", "rlib"]
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
//!     type For = ConfigMap;
//!
//!     fn init(settings: Settings) -> Result<Self, InitError> {
//!         Ok(settings.parse()?)
//!     }
//!
//!     fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
//!         // Deleted since it was queued: nothing to do.
//!         let Target::Present(cm) = target else { return Ok(Action::Done) };
//!         if cm.data.as_ref().and_then(|d| d.get("greeting")) == Some(&self.greeting) {
//!             return Ok(Action::Done);
//!         }
//!         let patch = serde_json::json!({ "data": { "greeting": self.greeting } });
//!         client::patch_merge::<ConfigMap>(cm.namespace(), cm.name(), &patch).context("stamping greeting")?;
//!         events::normal(&cm, "Greeted", "Patch", &format!("set greeting={}", self.greeting))?;
//!         log::info!("greeted {}", cm.key(); greeting = self.greeting);
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
//! `target/wasm32-wasip2/release/` is the component. At `init` the SDK reports `For`
//! (`v1/ConfigMap`) to the host, which refuses the component if its TOML's `[for]` names
//! another kind.
//!
//! ## Hooks
//!
//! Besides `reconcile`, a plugin may implement [`OnAdd`], [`OnUpdate`], [`OnDelete`],
//! [`Map`] (required for `[[watches]]`) and [`Filter`] (for `filter = true` predicates).
//! [`export_plugin!`] declares exactly the implemented ones to the host, which calls only
//! those: there is nothing else to keep in sync.
//!
//! ## Time
//!
//! See [`time`] for how `lastTransitionTime` gets a value (std's clock, which the host
//! grants like the rest of what std links).
//!
//! ## Testing natively
//!
//! In native builds (`cargo test`) the host calls are answered by `testing::TestHost`,
//! an in-memory fake with a cache, an API server that records every write, Events, logs
//! and injectable failures, so a test runs the plugin's whole `reconcile`.

#![warn(missing_docs)]

// Lets the generated bindings name this crate as `wasmctrl_guest::…` from inside it too.
extern crate self as wasmctrl_guest;

pub use k8s_openapi;
pub use serde_json;

pub mod admission;
pub mod arena;
mod error;
mod export;
mod host;
mod kind;
#[cfg(any(target_arch = "wasm32", test))]
mod memcmp;
mod plugin;
mod sys;

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

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use error::{Error, ReconcileError, ResultExt};
pub use kind::{Gvk, Kind, KindExt, RawObject, from_json, to_json};
pub use plugin::{
    Action, Filter, FilterEvent, Hooks, InitError, Map, OnAdd, OnDelete, OnUpdate, Plugin, Request, Settings,
    Target,
};

/// The names most plugins need: `use wasmctrl_guest::prelude::*;`.
pub mod prelude {
    pub use crate::admission::{AdmissionRequest, Denied, Mutate, Validate};
    pub use crate::{
        Action, Error, Filter, FilterEvent, Gvk, InitError, Kind, KindExt, Map, OnAdd, OnDelete, OnUpdate,
        Plugin, RawObject, ReconcileError, Request, ResultExt, Settings, Target, cache, client, conditions,
        config, diff, events, finalizer, log, owner,
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

#[doc(hidden)]
pub mod admission_bindings {
    //! Raw wit-bindgen output for the admission exports, one world each, so a plugin exports
    //! exactly the ones it lists in `export_plugin!` (the host reads its exports). Not a
    //! stable API: use [`crate::admission`].
    #![allow(missing_docs, clippy::all)]

    pub mod validator {
        wit_bindgen::generate!({
            path: "../../wit",
            inline: "package wasmctrl:guest-sdk;\nworld validator-export { export wasmctrl:controller/validator@0.2.1; }",
            world: "wasmctrl:guest-sdk/validator-export",
            pub_export_macro: true,
            export_macro_name: "__export_validator",
            with: {
                "wasmctrl:controller/types@0.2.1": crate::bindings::wasmctrl::controller::types,
                "wasmctrl:controller/admission@0.2.1": generate,
            },
            runtime_path: "wasmctrl_guest::__private::wit_bindgen::rt",
            bitflags_path: "wasmctrl_guest::__private::wit_bindgen::rt::bitflags",
        });
    }

    pub mod mutator {
        wit_bindgen::generate!({
            path: "../../wit",
            inline: "package wasmctrl:guest-sdk;\nworld mutator-export { export wasmctrl:controller/mutator@0.2.1; }",
            world: "wasmctrl:guest-sdk/mutator-export",
            pub_export_macro: true,
            export_macro_name: "__export_mutator",
            with: {
                "wasmctrl:controller/types@0.2.1": crate::bindings::wasmctrl::controller::types,
                "wasmctrl:controller/admission@0.2.1": crate::admission_bindings::validator::wasmctrl::controller::admission,
            },
            runtime_path: "wasmctrl_guest::__private::wit_bindgen::rt",
            bitflags_path: "wasmctrl_guest::__private::wit_bindgen::rt::bitflags",
        });
    }
}

/// Implementation details of [`export_plugin!`]; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::admission_bindings::mutator::exports::wasmctrl::controller::mutator::{
        Guest as MutatorGuest, Mutation as WitMutation,
    };
    pub use crate::admission_bindings::validator::exports::wasmctrl::controller::validator::Guest as ValidatorGuest;
    pub use crate::admission_bindings::validator::wasmctrl::controller::admission::{
        AdmissionRequest as WitAdmissionRequest, Verdict as WitVerdict,
    };
    pub use crate::admission_bindings::{mutator as mutator_bindings, validator as validator_bindings};
    pub use crate::arena::export_call;
    pub use crate::bindings;
    pub use crate::bindings::exports::wasmctrl::controller::reconciler::{
        FilterEvent as WitFilterEvent, Guest, PluginInfo, ReconcileError as WitReconcileError,
        ReconcileResult,
    };
    pub use crate::bindings::wasmctrl::controller::types::{Gvk as WitGvk, Request as WitRequest};
    pub use crate::export::{
        Exported, HasFilter, HasMap, HasMutate, HasOnAdd, HasOnDelete, HasOnUpdate, HasValidate, HookTable,
        NoFilter, NoMap, NoMutate, NoOnAdd, NoOnDelete, NoOnUpdate, NoValidate, Probe, Slot, filter_slot,
        init_slot, map_slot, mutate_slot, on_add_slot, on_delete_slot, on_update_slot, reconcile_slot,
        validate_slot,
    };
    pub use wit_bindgen;
}
