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

#[inline(never)]
fn descend(depth: u64, frame: [u64; 16]) -> u64 {
    let frame = std::hint::black_box(frame);
    // Never true in practice; keeps the recursion formally terminating.
    if depth == u64::MAX {
        return 0;
    }
    frame[(depth % 16) as usize] + descend(depth + 1, frame) + 1
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty() })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "misbehave" {
            let n = descend(0, [7; 16]);
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
