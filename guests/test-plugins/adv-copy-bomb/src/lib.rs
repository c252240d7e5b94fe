//! Adversarial test plugin: hands the host far more than its `max-output`. When it
//! reconciles the ConfigMap named `attack`, it first passes `client.create` a body a little
//! over `[settings] max-output` (the import must refuse it), then logs a message of
//! `[settings] bomb` bytes: wasmtime must stop that copy before the host allocates it (the
//! call traps). Outcomes are log lines `outcome` with `step` and `result`.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client;
use wasmctrl::controller::config;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, Request};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name != "attack" {
            return Ok(ReconcileResult::Done);
        }
        let settings: serde_json::Value =
            serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
        let max_output = settings["max-output"].as_u64().unwrap_or(65536) as usize;
        let bomb = settings["bomb"].as_u64().unwrap_or(8 << 20) as usize;
        let ns = request.namespace.unwrap_or_default();
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big","namespace":"{ns}"}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(max_output + 1024)
        );
        let result = match client::create(body.as_bytes()) {
            Ok(_) => "ok".to_owned(),
            Err(Error::Invalid(m)) => format!("invalid: {m}"),
            Err(e) => format!("error: {e:?}"),
        };
        report("over-max-output", result);
        report("bomb", format!("logging {bomb} bytes"));
        log::log(Level::Info, &"b".repeat(bomb), &[]);
        report("after-bomb", "the host copied the bomb".into());
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
