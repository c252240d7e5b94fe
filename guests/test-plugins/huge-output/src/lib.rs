//! Test plugin: returns more than any sane max-output: `map` returns 200 000
//! requests, `reconcile` of `misbehave` fails with a 16 MiB message.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

/// The default for every request but `misbehave`: done, so a test sees a healthy instance.
#[allow(dead_code)]
fn done() -> Result<ReconcileResult, ReconcileError> {
    Ok(ReconcileResult::Done)
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::MAP, for_kind: None })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "misbehave" {
            return Err(ReconcileError::Retryable("x".repeat(16 << 20)));
        }
        done()
    }
    fn map(_: Gvk, _: Vec<u8>) -> Vec<Request> {
        (0..200_000).map(|i| Request { namespace: Some("default".into()), name: format!("r{i}") }).collect()
    }
    fn on_add(_: Gvk, _: Vec<u8>, _: bool) {}
    fn on_update(_: Gvk, _: Vec<u8>, _: Vec<u8>) {}
    fn on_delete(_: Gvk, _: Vec<u8>, _: bool) {}
    fn filter(_: Gvk, _: FilterEvent) -> bool {
        true
    }
}
