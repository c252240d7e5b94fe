//! Test plugin: `reconcile` reads kinds given by the request (`namespace` = apiVersion,
//! `name` = kind) from the cache and the live client and reports the outcome as a
//! terminal error `cache=<outcome>;client=<outcome>` (the host must refuse).

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

fn outcome<T>(r: Result<T, wasmctrl::controller::types::Error>) -> String {
    use wasmctrl::controller::types::Error as E;
    match r {
        Ok(_) => "ok".into(),
        Err(E::Forbidden(m)) => format!("forbidden({m})"),
        Err(e) => format!("other({e:?})"),
    }
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let kind = Gvk { api_version: request.namespace.unwrap_or_default(), kind: request.name };
        let cache = outcome(wasmctrl::controller::cache::get(&kind, Some("default"), "x"));
        let list = outcome(wasmctrl::controller::cache::list(&kind, None, None));
        let client = outcome(wasmctrl::controller::client::get(&kind, Some("default"), "x"));
        Err(ReconcileError::Terminal(format!("cache={cache};list={list};client={client}")))
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
