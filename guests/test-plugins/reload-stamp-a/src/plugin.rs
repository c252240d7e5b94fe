// Shared body of the reload-stamp test plugins (included by each build's lib.rs, which
// defines `STAMP` and `FAIL_INIT`).
//
// For every ConfigMap `src-N` it reconciles, it server-side-applies `out-N` with
// `data.stamp` = this build's stamp and `data.value` = the source's `data.value`; when the
// source is gone it deletes `out-N`. Every reconcile logs `reconcile-start` and
// `reconcile-end` with the stamp and key, so the test can check that no key is ever
// reconciled by two calls (or two versions) at once.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "plugin",
});

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, DeleteOptions};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, Request};
use wasmctrl::controller::cache;

struct Stamp;

fn config_map() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "ConfigMap".into() }
}

fn describe(e: &Error) -> String {
    format!("{e:?}")
}

fn sync(request: &Request) -> Result<(), String> {
    let Some(namespace) = request.namespace.clone() else {
        return Err("ConfigMaps are namespaced".into());
    };
    let out_name = format!("out-{}", request.name);
    let source = cache::get(&config_map(), Some(&namespace), &request.name).map_err(|e| describe(&e))?;
    match source {
        None => match client::delete(
            &config_map(),
            Some(&namespace),
            &out_name,
            &DeleteOptions { uid: None, resource_version: None, propagation: None },
        ) {
            Ok(()) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(describe(&e)),
        },
        Some(json) => {
            let source: serde_json::Value = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
            let value = source["data"]["value"].as_str().unwrap_or_default();
            let out = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": out_name, "namespace": namespace },
                "data": { "stamp": STAMP, "value": value },
            });
            let body = serde_json::to_vec(&out).map_err(|e| e.to_string())?;
            client::apply(&body, &client::ApplyOptions { force: true, dry_run: false, field_manager: None }).map(|_| ()).map_err(|e| describe(&e))
        }
    }
}

impl Guest for Stamp {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        if FAIL_INIT {
            return Err(format!("build {STAMP} refuses to start"));
        }
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let key = format!("{}/{}", request.namespace.as_deref().unwrap_or(""), request.name);
        let fields = vec![("stamp".to_string(), STAMP.to_string()), ("key".to_string(), key)];
        log::log(Level::Info, "reconcile-start", &fields);
        let result = sync(&request);
        log::log(Level::Info, "reconcile-end", &fields);
        result.map(|()| ReconcileResult::Done).map_err(ReconcileError::Retryable)
    }

    fn on_add(_kind: Gvk, _object: Vec<u8>, _in_initial_list: bool) {}

    fn on_update(_kind: Gvk, _old: Vec<u8>, _new: Vec<u8>) {}

    fn on_delete(_kind: Gvk, _object: Vec<u8>, _final_state_unknown: bool) {}

    fn map(_kind: Gvk, _object: Vec<u8>) -> Vec<Request> {
        Vec::new()
    }

    fn filter(_kind: Gvk, _event: FilterEvent) -> bool {
        true
    }
}

export!(Stamp);
