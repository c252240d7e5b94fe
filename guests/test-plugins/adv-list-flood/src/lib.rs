//! Adversarial test plugin: asks the host to copy more objects than it could ever hold.
//! When it reconciles the ConfigMap named `attack`, it lists every ConfigMap of its
//! namespace (the test fills it with more than the plugin's memory limit), looks them up
//! through the built-in `namespace` index, and lists with a selector that matches nothing.
//! Each outcome is a log line `outcome` with `step` and `result` (`ok: <count>` or the
//! error).

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

fn outcome(r: Result<Vec<Vec<u8>>, Error>) -> String {
    match r {
        Ok(list) => format!("ok: {}", list.len()),
        Err(Error::Invalid(m)) => format!("invalid: {m}"),
        Err(e) => format!("error: {e:?}"),
    }
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "attack" {
            let cm = Gvk { api_version: "v1".into(), kind: "ConfigMap".into() };
            let ns = request.namespace.as_deref();
            report("list", outcome(cache::list(&cm, ns, None)));
            report("list-everywhere", outcome(cache::list(&cm, None, None)));
            report("by-index", outcome(cache::by_index(&cm, "namespace", ns.unwrap_or_default())));
            report("list-selected", outcome(cache::list(&cm, ns, Some("matches=nothing"))));
        }
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
