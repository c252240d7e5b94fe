//! Test plugin that behaves: it runs beside the adversarial plugins of
//! `host/tests/sandbox.rs` to show they leave it alone. For each ConfigMap `<name>` it
//! reconciles it server-side-applies `copy-<name>` (the source's `data.value`), publishes a
//! Normal Event `Copied` about the source, and logs `bystander reconciled` with the key;
//! when the source is gone it deletes the copy.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::cache;
use wasmctrl::controller::client::{self, ApplyOptions, DeleteOptions};
use wasmctrl::controller::events::{self, Event, EventType};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, ObjectRef, Request};

struct Plugin;
export!(Plugin);

fn cm() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "ConfigMap".into() }
}

fn sync(ns: &str, name: &str) -> Result<(), Error> {
    let copy = format!("copy-{name}");
    let Some(source) = cache::get(&cm(), Some(ns), name)? else {
        let options = DeleteOptions { uid: None, resource_version: None, propagation: None };
        return match client::delete(&cm(), Some(ns), &copy, &options) {
            Ok(()) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        };
    };
    let source: serde_json::Value = serde_json::from_slice(&source).unwrap_or(serde_json::Value::Null);
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": copy, "namespace": ns },
        "data": { "value": source["data"]["value"].as_str().unwrap_or_default() },
    });
    let options = ApplyOptions { force: true, dry_run: false, field_manager: None };
    client::apply(&serde_json::to_vec(&body).unwrap_or_default(), &options)?;
    events::publish(&Event {
        regarding: ObjectRef { kind: cm(), namespace: Some(ns.into()), name: name.into() },
        type_: EventType::Normal,
        reason: "Copied".into(),
        action: "Copy".into(),
        note: format!("copied to {copy}"),
    })
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let ns = request.namespace.clone().unwrap_or_default();
        sync(&ns, &request.name).map_err(|e| ReconcileError::Retryable(format!("{e:?}")))?;
        log::log(Level::Info, "bystander reconciled", &[("key".into(), format!("{ns}/{}", request.name))]);
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
