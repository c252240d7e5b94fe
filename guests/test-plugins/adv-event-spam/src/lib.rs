//! Adversarial test plugin: abuses the `events` import. When it reconciles the ConfigMap
//! named `attack`, it publishes Events about objects it may not read (a Pod, a ConfigMap in
//! `[settings] other`), with a name that is a path, with a reason and a note over the API
//! server's caps, and then `[settings] spam` Events about made-up objects of its own
//! namespace, as fast as it can. Each step's outcome is a log line `outcome` with `step`
//! and `result`.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::config;
use wasmctrl::controller::events::{self, Event, EventType};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, ObjectRef, Request};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

fn outcome(r: Result<(), Error>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(Error::Forbidden(m)) => format!("forbidden: {m}"),
        Err(Error::Invalid(m)) => format!("invalid: {m}"),
        Err(e) => format!("error: {e:?}"),
    }
}

fn event(api_version: &str, kind: &str, namespace: &str, name: &str) -> Event {
    Event {
        regarding: ObjectRef {
            kind: Gvk { api_version: api_version.into(), kind: kind.into() },
            namespace: Some(namespace.into()),
            name: name.into(),
        },
        type_: EventType::Warning,
        reason: "Spam".into(),
        action: "Spam".into(),
        note: "spam".into(),
    }
}

fn attack(ns: &str) {
    let settings: serde_json::Value =
        serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
    let other = settings["other"].as_str().unwrap_or("kube-system");
    let spam = settings["spam"].as_u64().unwrap_or(2000);

    report("unreadable-kind", outcome(events::publish(&event("v1", "Pod", ns, "web"))));
    report("other-namespace", outcome(events::publish(&event("v1", "ConfigMap", other, "kube-root-ca.crt"))));
    report("path-name", outcome(events::publish(&event("v1", "ConfigMap", ns, "../../secrets/x"))));
    report("bad-namespace", outcome(events::publish(&event("v1", "ConfigMap", "a/b", "x"))));
    let mut long_reason = event("v1", "ConfigMap", ns, "attack");
    long_reason.reason = "R".repeat(200);
    report("long-reason", outcome(events::publish(&long_reason)));
    let mut long_note = event("v1", "ConfigMap", ns, "attack");
    long_note.reason = "Oversized".into();
    long_note.note = "n".repeat(100 << 10);
    report("long-note", outcome(events::publish(&long_note)));
    let mut ok = 0;
    for i in 0..spam {
        if events::publish(&event("v1", "ConfigMap", ns, &format!("made-up-{i}"))).is_ok() {
            ok += 1;
        }
    }
    report("spam", format!("published={spam} accepted={ok}"));
}

impl Guest for Plugin {
    fn init(_settings: Vec<u8>) -> Result<PluginInfo, String> {
        Ok(PluginInfo { hooks: Hooks::empty(), for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        if request.name == "attack"
            && let Some(ns) = request.namespace.as_deref()
        {
            attack(ns);
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
