//! Benchmark plugin: `reconcile` reads the requested ConfigMap from the host's cache and
//! parses it into k8s-openapi's `ConfigMap` (the native benchmark does the same).
//! To see where the time goes, other request names do parts of that work:
//! `noop` returns at once (the bare cost of a call), `get:<name>` only reads from the
//! cache, `parse:<name>` only parses a copy of the object read once before.

use std::sync::Mutex;

wit_bindgen::generate!({ world: "plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl::controller::cache;
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

static LAST_READ: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fn read(namespace: Option<&str>, name: &str) -> Result<Vec<u8>, ReconcileError> {
    let kind = Gvk { api_version: "v1".into(), kind: "ConfigMap".into() };
    cache::get(&kind, namespace, name)
        .map_err(|e| ReconcileError::Retryable(format!("{e:?}")))?
        .ok_or_else(|| ReconcileError::Terminal("not found".into()))
}

fn parse(json: &[u8]) -> Result<ReconcileResult, ReconcileError> {
    let cm: ConfigMap = serde_json::from_slice(json).map_err(|e| ReconcileError::Terminal(e.to_string()))?;
    if cm.data.as_ref().is_none_or(|d| d.is_empty()) {
        return Err(ReconcileError::Terminal("empty".into()));
    }
    Ok(ReconcileResult::Done)
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let ns = request.namespace.as_deref();
        if request.name == "noop" {
            return Ok(ReconcileResult::Done);
        }
        if let Some(name) = request.name.strip_prefix("get:") {
            let json = read(ns, name)?;
            if let Ok(mut last) = LAST_READ.lock() {
                *last = json;
            }
            return Ok(ReconcileResult::Done);
        }
        if request.name.starts_with("parse:") {
            let last = LAST_READ.lock().map(|l| l.clone()).unwrap_or_default();
            return parse(&last);
        }
        parse(&read(ns, &request.name)?)
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
