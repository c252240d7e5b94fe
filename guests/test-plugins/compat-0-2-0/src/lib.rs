//! Test plugin built against `wasmctrl:controller@0.2.0` — `wit/` here is that release's
//! WIT, kept as it was — so a test shows that a host of a later `0.2.x` loads and runs a
//! component of an earlier one unchanged. It uses imports and exports of every kind:
//! `config` and `cache` reads, a `client` patch, a `log` line and an `on-add` hook.
//!
//! `reconcile` labels the ConfigMap `compat=<plugin name>`; `on-add` logs each object.

wit_bindgen::generate!({ world: "plugin", path: "wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, PatchBody};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Gvk, Request};
use wasmctrl::controller::{cache, config};

struct Plugin;
export!(Plugin);

fn config_map() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "ConfigMap".into() }
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::ON_ADD, for_kind: Some(config_map()) })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let cached = cache::get(&config_map(), request.namespace.as_deref(), &request.name)
            .map_err(|e| ReconcileError::Retryable(format!("{e:?}")))?;
        if cached.is_none() {
            return Ok(ReconcileResult::Done);
        }
        let patch = serde_json::json!({ "metadata": { "labels": { "compat": config::plugin_name() } } });
        client::patch(
            &config_map(),
            request.namespace.as_deref(),
            &request.name,
            &PatchBody::Merge(patch.to_string().into_bytes()),
        )
        .map_err(|e| ReconcileError::Retryable(format!("{e:?}")))?;
        log::log(Level::Info, "labelled by a 0.2.0 component", &[("request".into(), request.name)]);
        Ok(ReconcileResult::Done)
    }

    fn on_add(_: Gvk, _: Vec<u8>, in_initial_list: bool) {
        log::log(Level::Debug, "on-add", &[("initial".into(), in_initial_list.to_string())]);
    }
    fn on_update(_: Gvk, _: Vec<u8>, _: Vec<u8>) {}
    fn on_delete(_: Gvk, _: Vec<u8>, _: bool) {}
    fn filter(_: Gvk, _: FilterEvent) -> bool {
        true
    }
    fn map(_: Gvk, _: Vec<u8>) -> Vec<Request> {
        Vec::new()
    }
}
