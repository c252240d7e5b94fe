//! Test plugin: `reconcile` tries every write on a Secret and a Deployment, which it
//! did not declare writable, and reports each outcome as a terminal error.

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

fn outcome<T>(r: Result<T, wasmctrl::controller::types::Error>) -> &'static str {
    use wasmctrl::controller::types::Error as E;
    match r {
        Ok(_) => "ok",
        Err(E::Forbidden(_)) => "forbidden",
        Err(_) => "other",
    }
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }
    fn reconcile(_request: Request) -> Result<ReconcileResult, ReconcileError> {
        use wasmctrl::controller::client::{self, DeleteOptions, PatchBody as Patch};
        let secret = br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"default"}}"#;
        let deploy = Gvk { api_version: "apps/v1".into(), kind: "Deployment".into() };
        let outcomes = [
            outcome(client::create(secret)),
            outcome(client::replace(secret)),
            outcome(client::apply(
                secret,
                &client::ApplyOptions { force: true, dry_run: false, field_manager: None },
            )),
            outcome(client::update_status(secret)),
            outcome(client::patch(&deploy, Some("default"), "d", &Patch::Merge(b"{}".to_vec()))),
            outcome(client::patch_status(&deploy, Some("default"), "d", &Patch::Merge(b"{}".to_vec()))),
            outcome(client::delete(
                &deploy,
                Some("default"),
                "d",
                &DeleteOptions { uid: None, resource_version: None, propagation: None },
            )),
        ];
        Err(ReconcileError::Terminal(outcomes.join(",")))
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
