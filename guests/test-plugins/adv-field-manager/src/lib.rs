//! Adversarial test plugin: applies as other field managers. When it reconciles the
//! ConfigMap named `attack`, it server-side-applies the ConfigMap `[settings] target` of its
//! namespace as each manager of `[settings] managers` (another plugin's, kubectl's, its
//! own with a suffix) and as its own; each outcome is a log line `outcome` with `step` (the
//! manager, or `own`) and `result`.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, ApplyOptions};
use wasmctrl::controller::config;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, Request};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

/// Applies `target` with one data key of its own (`key`), so each manager that may apply
/// keeps its own field.
fn apply(ns: &str, target: &str, key: &str, manager: Option<&str>) -> String {
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": target, "namespace": ns },
        "data": { key: manager.unwrap_or("own") },
    });
    let options = ApplyOptions { force: true, dry_run: false, field_manager: manager.map(str::to_owned) };
    match client::apply(&serde_json::to_vec(&body).unwrap_or_default(), &options) {
        Ok(_) => "ok".into(),
        Err(Error::Forbidden(m)) => format!("forbidden: {m}"),
        Err(e) => format!("error: {e:?}"),
    }
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let (Some(ns), "attack") = (request.namespace.as_deref(), request.name.as_str()) else {
            return Ok(ReconcileResult::Done);
        };
        let settings: serde_json::Value =
            serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
        let target = settings["target"].as_str().unwrap_or("shared");
        let managers = settings["managers"].as_array().into_iter().flatten().filter_map(|m| m.as_str());
        for (i, manager) in managers.enumerate() {
            report(manager, apply(ns, target, &format!("by-{i}"), Some(manager)));
        }
        report("own", apply(ns, target, "own", None));
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
