//! Adversarial test plugin: makes the host allocate by holding WASI resources. When it
//! reconciles the ConfigMap named `attack`, it subscribes to the monotonic clock
//! `[settings] handles` times and keeps every pollable; each one is an entry in the host's
//! resource table. It reports `holding` before and `held` after (log lines `outcome` with
//! `step` and `result`); the host must stop it before `held`.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::config;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name != "attack" {
            return Ok(ReconcileResult::Done);
        }
        let settings: serde_json::Value =
            serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
        let handles = settings["handles"].as_u64().unwrap_or(100_000);
        report("holding", handles.to_string());
        let held: Vec<_> = (0..handles)
            .map(|_| wasip2::clocks::monotonic_clock::subscribe_duration(3_600_000_000_000))
            .collect();
        report("held", held.len().to_string());
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
