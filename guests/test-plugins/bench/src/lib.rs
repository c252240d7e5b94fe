//! Benchmark plugin: `reconcile` reads the requested ConfigMap from the host's cache and
//! parses it into k8s-openapi's `ConfigMap` (the native benchmark does the same); a
//! request named `noop` returns at once, measuring the bare cost of a call.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl::controller::cache;
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty() })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "noop" {
            return Ok(ReconcileResult::Done);
        }
        let kind = Gvk { api_version: "v1".into(), kind: "ConfigMap".into() };
        let json = cache::get(&kind, request.namespace.as_deref(), &request.name)
            .map_err(|e| ReconcileError::Retryable(format!("{e:?}")))?
            .ok_or_else(|| ReconcileError::Terminal("not found".into()))?;
        let cm: ConfigMap = serde_json::from_slice(&json).map_err(|e| ReconcileError::Terminal(e.to_string()))?;
        let entries = cm.data.as_ref().map_or(0, |d| d.len());
        if entries == 0 {
            return Err(ReconcileError::Terminal("empty".into()));
        }
        Ok(ReconcileResult::Done)
    }

    fn on_add(_: Gvk, _: Vec<u8>, _: bool) {}
    fn on_update(_: Gvk, _: Vec<u8>, _: Vec<u8>) {}
    fn on_delete(_: Gvk, _: Vec<u8>, _: bool) {}
    fn map(_: Gvk, _: Vec<u8>) -> Vec<Request> {
        Vec::new()
    }
    fn filter(_: Gvk, _: FilterEvent) -> bool {
        true
    }
}
