//! Adversarial test plugin: may write Secrets but not read them, and tries to read one
//! anyway, through the responses of its writes. When it reconciles the ConfigMap named
//! `attack`, it aims at the Secret named `[settings] target` in its namespace, whose data
//! holds the base64 value `[settings] needle`, and reports (a log line `outcome` with
//! `step` and `result`) for each write whether its response leaked anything: `leaked=true`
//! when it carries `data`, `stringData`, or the needle anywhere.

wit_bindgen::generate!({ path: "../../../wit", world: "plugin" });

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::client::{self, ApplyOptions, PatchBody};
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Error, Gvk, Request};
use wasmctrl::controller::{cache, config};

struct Plugin;
export!(Plugin);

fn report(step: &str, result: String) {
    log::log(Level::Info, "outcome", &[("step".into(), step.into()), ("result".into(), result)]);
}

fn err_text(e: &Error) -> String {
    match e {
        Error::Forbidden(m) => format!("forbidden: {m}"),
        Error::Invalid(m) => format!("invalid: {m}"),
        Error::NotFound(m) => format!("not-found: {m}"),
        other => format!("error: {other:?}"),
    }
}

fn secret() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "Secret".into() }
}

/// `leaked=<bool>` for a write's response, or the error.
fn leak(r: Result<Vec<u8>, Error>, needle: &str) -> String {
    match r {
        Ok(body) => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            let text = String::from_utf8_lossy(&body);
            let leaked = v.get("data").is_some() || v.get("stringData").is_some() || text.contains(needle);
            format!("leaked={leaked} kind={}", v["kind"].as_str().unwrap_or_default())
        }
        Err(e) => err_text(&e),
    }
}

fn attack(ns: &str) {
    let settings: serde_json::Value =
        serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null);
    let target = settings["target"].as_str().unwrap_or("target");
    let needle = settings["needle"].as_str().unwrap_or("needle");
    let secret = secret();

    report("client-get", leak(client::get(&secret, Some(ns), target), needle));
    report(
        "cache-get",
        match cache::get(&secret, Some(ns), target) {
            Ok(_) => "ok".into(),
            Err(e) => err_text(&e),
        },
    );
    report(
        "merge-patch",
        leak(client::patch(&secret, Some(ns), target, &PatchBody::Merge(b"{}".to_vec())), needle),
    );
    report(
        "strategic-patch",
        leak(client::patch(&secret, Some(ns), target, &PatchBody::Strategic(b"{}".to_vec())), needle),
    );
    report(
        "json-patch-add",
        leak(
            client::patch(
                &secret,
                Some(ns),
                target,
                &PatchBody::Json(
                    br#"[{"op":"add","path":"/metadata/labels","value":{"touched":"yes"}}]"#.to_vec(),
                ),
            ),
            needle,
        ),
    );
    let copy = br#"[{"op":"copy","from":"/data/password","path":"/metadata/annotations/leak"}]"#;
    report(
        "json-patch-copy",
        leak(client::patch(&secret, Some(ns), target, &PatchBody::Json(copy.to_vec())), needle),
    );
    let test = format!(r#"[{{"op":"test","path":"/data/password","value":"{needle}"}}]"#);
    report(
        "json-patch-test",
        leak(client::patch(&secret, Some(ns), target, &PatchBody::Json(test.into_bytes())), needle),
    );
    let dup = br#"[{"op":"add","op":"move","from":"/data/password","path":"/metadata/annotations/leak"}]"#;
    report(
        "json-patch-duplicate-op",
        leak(client::patch(&secret, Some(ns), target, &PatchBody::Json(dup.to_vec())), needle),
    );
    let partial = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": target, "namespace": ns },
    });
    let body = serde_json::to_vec(&partial).unwrap_or_default();
    let dry = ApplyOptions { force: true, dry_run: true, field_manager: None };
    report("apply-dry-run", leak(client::apply(&body, &dry), needle));
    let labelled = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": target, "namespace": ns, "labels": { "applied": "yes" } },
    });
    let body = serde_json::to_vec(&labelled).unwrap_or_default();
    let apply = ApplyOptions { force: true, dry_run: false, field_manager: None };
    report("apply", leak(client::apply(&body, &apply), needle));
    let made = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "made-by-attacker", "namespace": ns },
        "data": { "mine": needle },
    });
    let body = serde_json::to_vec(&made).unwrap_or_default();
    report("create", leak(client::create(&body), needle));
    report("replace", leak(client::replace(&body), needle));
    report("done", String::new());
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
