//! Adversarial test plugin: `reconcile` of `sleep` sleeps for an hour. On wasm32-wasip2 a
//! sleep is a `wasi:clocks/monotonic-clock` `subscribe-duration` waited for in
//! `wasi:io/poll`: the guest is blocked in the host, where epoch interruption cannot reach
//! it. The host must end the call at its deadline (or on shutdown, or when the leader lease
//! is lost). Every other request is done at once.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "sleep" {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            return Err(ReconcileError::Terminal("woke up: the host let a call sleep for an hour".into()));
        }
        Ok(ReconcileResult::Done)
    }
    fn on_add(_: Gvk, _: Vec<u8>, _: bool) {}
    fn on_update(_: Gvk, _: Vec<u8>, _: Vec<u8>) {}
    fn on_delete(_: Gvk, _: Vec<u8>, _: bool) {}
    fn filter(_: Gvk, _: FilterEvent) -> bool {
        true
    }
    fn map(_: Gvk, _: Vec<u8>) -> Vec<Request> {
        Vec::new()
    }
}
