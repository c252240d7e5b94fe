//! Test plugin: on `misbehave` a panic hook calls imports (log, cache) while the
//! instance is going down, then the guest traps; every other request calls the same
//! imports on a healthy instance and is done.

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

fn touch_imports() -> bool {
    use wasmctrl::controller::{cache, log};
    log::log(log::Level::Info, "touching imports", &[("phase".into(), "probe".into())]);
    let kind = Gvk { api_version: "v1".into(), kind: "ConfigMap".into() };
    cache::get(&kind, Some("default"), "anything").is_ok()
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "misbehave" {
            std::panic::set_hook(Box::new(|info| {
                touch_imports();
                eprintln!("panic hook ran: {info}");
            }));
            panic!("trapping with imports in flight");
        }
        if touch_imports() { done() } else { Err(ReconcileError::Retryable("cache refused".into())) }
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
