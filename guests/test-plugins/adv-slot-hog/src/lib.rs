//! Adversarial test plugin: `reconcile` of `hog` computes until its deadline traps it, so a
//! host running it at its full concurrency has every one of its instances busy for the
//! whole deadline. The host must keep it to its share of the instance slots: other plugins
//! keep getting instances. Every other request is done at once.

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
        if request.name == "hog" {
            let mut n = 0u64;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
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
