//! Test plugin: `reconcile` of `misbehave` recurses until the stack overflows.

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

/// Plain scalar recursion: every frame lives on wasm's own stack, so the host's
/// `max_wasm_stack` is what stops it.
#[inline(never)]
fn descend(depth: u64) -> u64 {
    // Never true in practice; keeps the recursion formally terminating.
    if depth == u64::MAX {
        return 0;
    }
    std::hint::black_box(descend(depth + 1)).wrapping_add(depth)
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "misbehave" {
            let n = descend(0);
            return Err(ReconcileError::Retryable(format!("unreachable: {n}")));
        }
        done()
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
