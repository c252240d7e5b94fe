//! Adversarial test plugin: floods the host's log. When it reconciles the ConfigMap named
//! `attack`, it logs `[settings] lines` lines through the `log` import, prints as many to
//! stdout, and writes one line of `[settings] long` bytes without a newline to stderr, as
//! fast as it can; then it reports `flooded` (a log line `outcome` with `step` and
//! `result`).

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use std::io::Write as _;

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::config;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Gvk, Request};

struct Plugin;
export!(Plugin);

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
        let lines = settings["lines"].as_u64().unwrap_or(30_000);
        let long = settings["long"].as_u64().unwrap_or(1 << 20) as usize;
        for i in 0..lines {
            log::log(Level::Info, "flood", &[("i".into(), i.to_string())]);
        }
        let mut out = std::io::stdout().lock();
        for i in 0..lines {
            let _ = writeln!(out, "flood {i}");
        }
        drop(out);
        let _ = std::io::stderr().write_all("l".repeat(long).as_bytes());
        log::log(
            Level::Info,
            "outcome",
            &[("step".into(), "flooded".into()), ("result".into(), lines.to_string())],
        );
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
