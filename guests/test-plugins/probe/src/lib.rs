//! Test plugin that exercises every import and hook, driven by the request it reconciles.
//!
//! `request.name` is `op|apiVersion|kind|arg|arg2` (unused parts may be left out);
//! `request.namespace` is the namespace the op works in. The outcome comes back as a
//! terminal error, `ok:<payload>` or `err:<variant>:<message>`, for the test to read.
//! Hooks are recorded in the instance and reported by the `hooks-seen` op; `map` maps an
//! object to `mapped-<name>` in its namespace; `filter` drops objects named `drop*`.

use std::sync::Mutex;

wit_bindgen::generate!({ world: "plugin", path: "../../../wit" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, DeleteOptions, PatchBody as Patch, Propagation};
use wasmctrl::controller::events::{self, Event, EventType};
use wasmctrl::controller::types::{Error, Gvk, ObjectRef, Request};
use wasmctrl::controller::{cache, config, log};

struct Plugin;
export!(Plugin);

static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SETTINGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fn record(what: String) {
    if let Ok(mut s) = SEEN.lock() {
        s.push(what);
    }
}

fn name_of(object: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(object)
        .ok()
        .and_then(|v| v["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn namespace_of(object: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(object)
        .ok()
        .and_then(|v| v["metadata"]["namespace"].as_str().map(str::to_owned))
}

fn err_text(e: Error) -> String {
    match e {
        Error::NotFound(m) => format!("err:not-found:{m}"),
        Error::AlreadyExists(m) => format!("err:already-exists:{m}"),
        Error::Conflict(m) => format!("err:conflict:{m}"),
        Error::Forbidden(m) => format!("err:forbidden:{m}"),
        Error::Invalid(m) => format!("err:invalid:{m}"),
        Error::Unavailable(m) => format!("err:unavailable:{m}"),
        Error::Other((code, m)) => format!("err:other:{code}:{m}"),
    }
}

fn text(r: Result<Vec<u8>, Error>) -> String {
    match r {
        Ok(b) => format!("ok:{}", String::from_utf8_lossy(&b)),
        Err(e) => err_text(e),
    }
}

fn names(r: Result<Vec<Vec<u8>>, Error>) -> String {
    match r {
        Ok(list) => {
            let mut n: Vec<String> = list.iter().map(|o| name_of(o)).collect();
            n.sort();
            format!("ok:{}", n.join(","))
        }
        Err(e) => err_text(e),
    }
}

fn run(op: &str, kind: Gvk, ns: Option<&str>, arg: &str, arg2: &str) -> String {
    let patch = |p: &str| match arg2.split_once(':') {
        Some(("json", body)) => Patch::Json(body.as_bytes().to_vec()),
        Some(("strategic", body)) => Patch::Strategic(body.as_bytes().to_vec()),
        _ => Patch::Merge(p.as_bytes().to_vec()),
    };
    match op {
        "cache-get" => match cache::get(&kind, ns, arg) {
            Ok(Some(b)) => format!("ok:{}", String::from_utf8_lossy(&b)),
            Ok(None) => "ok:none".into(),
            Err(e) => err_text(e),
        },
        "cache-list" => names(cache::list(&kind, ns, (!arg.is_empty()).then_some(arg))),
        "cache-by-index" => names(cache::by_index(&kind, arg, arg2)),
        "client-get" => text(client::get(&kind, ns, arg)),
        "client-create" => text(client::create(arg.as_bytes())),
        "client-replace" => text(client::replace(arg.as_bytes())),
        "client-apply" => {
            // arg2: comma-separated `force`, `dry-run`, `manager=NAME`.
            let flags: Vec<&str> = arg2.split(',').collect();
            let options = client::ApplyOptions {
                force: flags.contains(&"force"),
                dry_run: flags.contains(&"dry-run"),
                field_manager: flags.iter().find_map(|f| f.strip_prefix("manager=")).map(str::to_owned),
            };
            text(client::apply(arg.as_bytes(), &options))
        }
        "client-update-status" => text(client::update_status(arg.as_bytes())),
        "client-patch" => text(client::patch(&kind, ns, arg, &patch(arg2))),
        "client-patch-status" => text(client::patch_status(&kind, ns, arg, &patch(arg2))),
        "client-delete" => {
            let options = DeleteOptions {
                uid: arg2.strip_prefix("uid=").map(str::to_owned),
                resource_version: arg2.strip_prefix("rv=").map(str::to_owned),
                propagation: Some(Propagation::Background),
            };
            match client::delete(&kind, ns, arg, &options) {
                Ok(()) => "ok:".into(),
                Err(e) => err_text(e),
            }
        }
        "event" => {
            let event = Event {
                regarding: ObjectRef { kind, namespace: ns.map(str::to_owned), name: arg.to_owned() },
                type_: EventType::Warning,
                reason: "Probed".into(),
                action: "Probe".into(),
                note: arg2.to_owned(),
            };
            match events::publish(&event) {
                Ok(()) => "ok:".into(),
                Err(e) => err_text(e),
            }
        }
        "log" => {
            let enabled = log::enabled(log::Level::Info);
            log::log(log::Level::Info, arg, &[("k".into(), arg2.into())]);
            format!("ok:{enabled}")
        }
        "config" => {
            let settings = config::settings();
            let seen_in_init = SETTINGS.lock().map(|s| s.clone()).unwrap_or_default();
            format!(
                "ok:{}|{}|{}",
                config::plugin_name(),
                String::from_utf8_lossy(&settings),
                seen_in_init == settings
            )
        }
        "hooks-seen" => format!("ok:{}", SEEN.lock().map(|s| s.join(",")).unwrap_or_default()),
        "requeue" => "requeue".into(),
        other => format!("err:unknown-op:{other}"),
    }
}

impl Guest for Plugin {
    fn init(settings: Vec<u8>) -> Result<PluginInfo, String> {
        if settings == b"{\"reject\":true}" {
            return Err("settings rejected on purpose".into());
        }
        // `{"for-kind":"apiVersion/Kind"}` makes init report that kind (the host's kind check).
        let for_kind = serde_json::from_slice::<serde_json::Value>(&settings).ok().and_then(|v| {
            v["for-kind"]
                .as_str()
                .and_then(|k| k.rsplit_once('/'))
                .map(|(a, k)| Gvk { api_version: a.to_owned(), kind: k.to_owned() })
        });
        if let Ok(mut s) = SETTINGS.lock() {
            *s = settings;
        }
        Ok(PluginInfo { hooks: Hooks::all(), for_kind })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let mut parts = request.name.splitn(5, '|');
        let op = parts.next().unwrap_or_default();
        if op == "done" {
            return Ok(ReconcileResult::Done);
        }
        if op == "panic" {
            panic!("probe panicked on request");
        }
        if op == "requeue-after" {
            return Ok(ReconcileResult::RequeueAfterMs(1500));
        }
        let kind = Gvk {
            api_version: parts.next().unwrap_or("v1").to_owned(),
            kind: parts.next().unwrap_or("ConfigMap").to_owned(),
        };
        let arg = parts.next().unwrap_or_default();
        let arg2 = parts.next().unwrap_or_default();
        let out = run(op, kind, request.namespace.as_deref(), arg, arg2);
        if out == "requeue" {
            return Ok(ReconcileResult::Requeue);
        }
        Err(ReconcileError::Terminal(out))
    }

    fn on_add(kind: Gvk, object: Vec<u8>, in_initial_list: bool) {
        record(format!("add:{}:{}:{in_initial_list}", kind.kind, name_of(&object)));
    }

    fn on_update(kind: Gvk, old: Vec<u8>, new: Vec<u8>) {
        record(format!("update:{}:{}>{}", kind.kind, name_of(&old), name_of(&new)));
    }

    fn on_delete(kind: Gvk, object: Vec<u8>, final_state_unknown: bool) {
        record(format!("delete:{}:{}:{final_state_unknown}", kind.kind, name_of(&object)));
    }

    fn map(_kind: Gvk, object: Vec<u8>) -> Vec<Request> {
        vec![Request { namespace: namespace_of(&object), name: format!("mapped-{}", name_of(&object)) }]
    }

    fn filter(_kind: Gvk, event: FilterEvent) -> bool {
        let object = match &event {
            FilterEvent::Create(o) | FilterEvent::Delete(o) => o,
            FilterEvent::Update((_, new)) => new,
        };
        !name_of(object).starts_with("drop")
    }
}
