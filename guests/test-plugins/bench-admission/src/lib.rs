//! Bench plugin: a validating webhook that admits every request without reading it — the
//! fixed cost of an admission call through the host (`host/benches/admission.rs`'s no-op
//! policy). Raw bindings, no SDK: nothing is parsed on either side of the call.

wit_bindgen::generate!({ world: "validating-plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest as Reconciler, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use exports::wasmctrl::controller::validator::Guest as Validator;
use wasmctrl::controller::admission::{AdmissionRequest, Verdict};
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

impl Validator for Plugin {
    fn validate(_request: AdmissionRequest) -> Verdict {
        Verdict { denial: None, warnings: Vec::new() }
    }
}

impl Reconciler for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(_: Request) -> Result<ReconcileResult, ReconcileError> {
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
