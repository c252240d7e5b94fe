//! Adversarial test plugin: tries to read Secrets through the exports the host calls with
//! objects. Every hook, `map` and `filter` reports what it was handed of a Secret: whether
//! the object carries `data`, `stringData`, the last-applied annotation (a copy of the
//! applied object) or `managedFields`. `reconcile` reports what `cache.get` of the Secret of
//! its request answers. Each report is a log line `outcome` with the fields `step` and
//! `result`, for the test to read.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::cache;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, Request};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

/// What of a Secret's content an object carries.
fn summary(object: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(object).unwrap_or(serde_json::Value::Null);
    let meta = &v["metadata"];
    let last_applied = meta["annotations"].get("kubectl.kubernetes.io/last-applied-configuration").is_some();
    format!(
        "name={} data={} string-data={} last-applied={} managed-fields={}",
        meta["name"].as_str().unwrap_or_default(),
        v.get("data").is_some(),
        v.get("stringData").is_some(),
        last_applied,
        meta.get("managedFields").is_some()
    )
}

fn is_secret(kind: &Gvk) -> bool {
    kind.api_version == "v1" && kind.kind == "Secret"
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::all(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let secret = Gvk { api_version: "v1".into(), kind: "Secret".into() };
        let result = match cache::get(&secret, request.namespace.as_deref(), &request.name) {
            Ok(Some(o)) => format!("ok: {}", summary(&o)),
            Ok(None) => "ok: none".into(),
            Err(Error::Forbidden(m)) => format!("forbidden: {m}"),
            Err(e) => format!("error: {e:?}"),
        };
        report("cache-get", result);
        Ok(ReconcileResult::Done)
    }

    fn on_add(kind: Gvk, object: Vec<u8>, _in_initial_list: bool) {
        if is_secret(&kind) {
            report("on-add", summary(&object));
        }
    }

    fn on_update(kind: Gvk, old: Vec<u8>, new: Vec<u8>) {
        if is_secret(&kind) {
            report("on-update-old", summary(&old));
            report("on-update", summary(&new));
        }
    }

    fn on_delete(kind: Gvk, object: Vec<u8>, _final_state_unknown: bool) {
        if is_secret(&kind) {
            report("on-delete", summary(&object));
        }
    }

    fn map(kind: Gvk, object: Vec<u8>) -> Vec<Request> {
        if is_secret(&kind) {
            report("map", summary(&object));
        }
        Vec::new()
    }

    fn filter(kind: Gvk, event: FilterEvent) -> bool {
        if is_secret(&kind) {
            let object = match &event {
                FilterEvent::Create(o) | FilterEvent::Delete(o) => o,
                FilterEvent::Update((_, new)) => new,
            };
            report("filter", summary(object));
        }
        true
    }
}
