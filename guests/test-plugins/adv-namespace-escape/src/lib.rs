//! Adversarial test plugin: its TOML limits it to its own namespace, and it reaches for
//! `[settings] other` (and the client's default namespace) through every import. When it
//! reconciles the ConfigMap named `attack`, each attempt's outcome is a log line `outcome`
//! with `step` and `result`: `ok`, or the error. Its `map` maps every object to the
//! ConfigMap `victim` of `[settings] other`, a request the host must not enqueue.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, ApplyOptions, DeleteOptions, PatchBody};
use wasmctrl::controller::events::{self, Event, EventType};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, ObjectRef, Request};
use wasmctrl::controller::{cache, config};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

fn outcome<T>(r: Result<T, Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(Error::Forbidden(m)) => format!("forbidden: {m}"),
        Err(e) => format!("error: {e:?}"),
    }
}

fn cm() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "ConfigMap".into() }
}

fn body(name: &str, ns: Option<&str>) -> Vec<u8> {
    let mut meta = serde_json::json!({ "name": name });
    if let Some(ns) = ns {
        meta["namespace"] = ns.into();
    }
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": { "escaped": "yes" },
    }))
    .unwrap_or_default()
}

fn attack(own: &str) {
    let settings: serde_json::Value =
        serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
    let other = settings["other"].as_str().unwrap_or("default");
    let target = settings["target"].as_str().unwrap_or("victim");
    let o = Some(other);
    report("cache-get", outcome(cache::get(&cm(), o, target)));
    report("cache-list", outcome(cache::list(&cm(), o, None)));
    report(
        "cache-list-everywhere",
        match cache::list(&cm(), None, None) {
            Ok(list) => {
                let foreign = list.iter().filter(|b| !String::from_utf8_lossy(b).contains(own)).count();
                format!("ok: foreign={foreign}")
            }
            Err(e) => outcome::<()>(Err(e)),
        },
    );
    report("client-get", outcome(client::get(&cm(), o, target)));
    report("client-get-default-namespace", outcome(client::get(&cm(), None, target)));
    report("client-create", outcome(client::create(&body("escaped", o))));
    report("client-create-default-namespace", outcome(client::create(&body("escaped", None))));
    report("client-replace", outcome(client::replace(&body(target, o))));
    report(
        "client-patch",
        outcome(client::patch(
            &cm(),
            o,
            target,
            &PatchBody::Merge(br#"{"data":{"escaped":"yes"}}"#.to_vec()),
        )),
    );
    report(
        "client-apply",
        outcome(client::apply(
            &body(target, o),
            &ApplyOptions { force: true, dry_run: false, field_manager: None },
        )),
    );
    report(
        "client-delete",
        outcome(client::delete(
            &cm(),
            o,
            target,
            &DeleteOptions { uid: None, resource_version: None, propagation: None },
        )),
    );
    let event = Event {
        regarding: ObjectRef { kind: cm(), namespace: o.map(str::to_owned), name: target.into() },
        type_: EventType::Warning,
        reason: "Escaped".into(),
        action: "Escape".into(),
        note: "from another namespace".into(),
    };
    report("event", outcome(events::publish(&event)));
    report("own-namespace-create", outcome(client::create(&body("stayed", Some(own)))));
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
        let settings: serde_json::Value =
            serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
        let other = settings["other"].as_str().unwrap_or("default");
        vec![Request { namespace: Some(other.into()), name: "victim".into() }]
    }
    fn filter(_: Gvk, _: FilterEvent) -> bool {
        true
    }
}
