// Shared body of the witness test plugins (included by each build's lib.rs, which defines
// `STAMP`).
//
// The witness changes nothing in the cluster: it logs every call it gets, so a test can
// replay what each version saw and when. Every line carries the build's `stamp` and the
// `edit` number of the TOML's `[settings]` (together: which generation of the plugin made
// the call); the host adds the plugin's `version`.
//
// - `reconcile` logs `reconcile-start` and `reconcile-end` with the key and the
//   `resourceVersion` of the ConfigMap of that key as the plugin's cache has it (`rv`,
//   or `not-found`). With `[settings] slow = "<name>"` the reconcile of that name sleeps
//   `slow-ms` (default 4000) between the two lines.
// - `on-add` / `on-update` / `on-delete` log `hook-start` / `hook-end` with the event, the
//   object's kind, key and resourceVersion (only with `[settings] hooks = true`); a hook
//   for the object named `[settings] slow-hook` sleeps `slow-ms` between the two.
// - `map` maps an object to the request of the same namespace and name; `filter` passes
//   everything (both exist so a TOML can use them). A filter call for the object named
//   `[settings] slow-filter` logs `filter-sleep` and sleeps `slow-ms`: it holds up the
//   informer handler that asked, so the notifications behind it stay buffered.
// - With `[settings] fail-init = true`, `init` fails: a broken version.
// - Keys and their kinds: with `[settings] for-kind = "Secret"` the plugin runs for Secrets
//   whose keys its `map` made from ConfigMaps (`map` prefixes the ConfigMap's name with
//   `[settings] map-prefix`); every reconcile checks that its key is of the kind the
//   plugin runs for (a `map-prefix` name for Secrets, any other name for ConfigMaps) and
//   logs `kind-ok`, then works on the ConfigMap the key stands for (`key` is that
//   ConfigMap's key).
// - Failures: `[settings] fail-percent = N` (fractions allowed) fails (retryable) the first
//   reconcile an instance makes of about N % of the (key, resourceVersion) pairs, at most
//   `fail-max` times per instance (no bound without it), so retries and their backoff are
//   exercised without outrunning the host's retry rate limit; `fail-gone = true` fails every
//   reconcile of a key whose ConfigMap is gone. `reconcile-end` logs `result` (`ok` or
//   `error`).
// - With `[settings] trace-calls = true`, `map` and `filter` log `map-start`/`map-end` and
//   `filter-start`/`filter-end` with the object's key, so overlapping calls of two versions
//   can be seen.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "plugin",
});

use exports::wasmctrl::controller::reconciler::{
    FilterEvent, Guest, Hooks, PluginInfo, ReconcileError, ReconcileResult,
};
use wasmctrl::controller::cache;
use wasmctrl::controller::config;
use wasmctrl::controller::log::{self, Level};
use wasmctrl::controller::types::{Gvk, Request};

struct Witness;

fn config_map() -> Gvk {
    Gvk { api_version: "v1".into(), kind: "ConfigMap".into() }
}

fn settings() -> serde_json::Value {
    serde_json::from_slice(&config::settings()).unwrap_or(serde_json::Value::Null)
}

fn edit() -> String {
    settings()["edit"].as_i64().unwrap_or(0).to_string()
}

fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// (key, resourceVersion) of an object's JSON.
fn describe(object: &[u8]) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(object).unwrap_or(serde_json::Value::Null);
    let meta = &v["metadata"];
    let key = key_of(meta["namespace"].as_str(), meta["name"].as_str().unwrap_or(""));
    (key, meta["resourceVersion"].as_str().unwrap_or("").to_owned())
}

fn line(message: &str, fields: &[(&str, String)]) {
    let mut all = vec![("stamp".to_owned(), STAMP.to_owned()), ("edit".to_owned(), edit())];
    all.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    log::log(Level::Info, message, &all);
}

/// Sleeps `slow-ms` when `setting` names the object `key` is of.
fn maybe_sleep(setting: &str, key: &str) -> bool {
    let s = settings();
    let name = key.rsplit('/').next().unwrap_or(key);
    if s[setting].as_str() != Some(name) {
        return false;
    }
    let ms = s["slow-ms"].as_u64().unwrap_or(4000);
    std::thread::sleep(std::time::Duration::from_millis(ms));
    true
}

/// (key, resourceVersion) pairs this instance already failed once.
static FAILED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// How many reconciles this instance failed under `fail-percent`.
static FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// FNV-1a: a stable hash of `text`.
fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether this reconcile fails (see the file's doc).
fn should_fail(s: &serde_json::Value, key: &str, rv: &str) -> bool {
    if rv == "not-found" && s["fail-gone"].as_bool() == Some(true) {
        return true;
    }
    let percent = s["fail-percent"].as_f64().unwrap_or(0.0);
    if percent <= 0.0 || rv == "not-found" {
        return false;
    }
    let h = hash(&format!("{key}@{rv}"));
    // In hundredths of a percent.
    if (h % 10_000) as f64 >= percent * 100.0 {
        return false;
    }
    let max = s["fail-max"].as_u64().unwrap_or(u64::MAX);
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if failed.contains(&h) || FAILURES.load(std::sync::atomic::Ordering::Relaxed) >= max {
        return false;
    }
    if failed.len() >= 4096 {
        failed.clear();
    }
    failed.push(h);
    FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    true
}

fn traced<R>(s: &serde_json::Value, what: &str, key: &str, f: impl FnOnce() -> R) -> R {
    let trace = s["trace-calls"].as_bool() == Some(true);
    if trace {
        line(&format!("{what}-start"), &[("key", key.to_owned())]);
    }
    let r = f();
    if trace {
        line(&format!("{what}-end"), &[("key", key.to_owned())]);
    }
    r
}

fn hook(event: &str, kind: &Gvk, object: &[u8]) {
    let (key, rv) = describe(object);
    let fields = [("event", event.to_owned()), ("kind", kind.kind.clone()), ("key", key.clone()), ("rv", rv)];
    line("hook-start", &fields);
    maybe_sleep("slow-hook", &key);
    line("hook-end", &fields);
}

impl Guest for Witness {
    fn init(settings: Vec<u8>) -> Result<PluginInfo, String> {
        let s: serde_json::Value = serde_json::from_slice(&settings).unwrap_or(serde_json::Value::Null);
        if s["fail-init"].as_bool() == Some(true) {
            return Err(format!("witness {STAMP} is told to refuse to start"));
        }
        let mut hooks = Hooks::MAP | Hooks::FILTER;
        if s["hooks"].as_bool() == Some(true) {
            hooks |= Hooks::ON_ADD | Hooks::ON_UPDATE | Hooks::ON_DELETE;
        }
        // The chaos test moves this plugin between `for` kinds, so it names none.
        Ok(PluginInfo { hooks, for_kind: None })
    }

    fn reconcile(request: Request) -> Result<ReconcileResult, ReconcileError> {
        let s = settings();
        let prefix = s["map-prefix"].as_str().unwrap_or("");
        let for_secrets = s["for-kind"].as_str() == Some("Secret");
        // The ConfigMap this key stands for, and whether the key is of the kind run for.
        let (name, kind_ok) = match request.name.strip_prefix(prefix).filter(|_| !prefix.is_empty()) {
            Some(cm) => (cm.to_owned(), for_secrets),
            None => (request.name.clone(), !for_secrets),
        };
        let key = key_of(request.namespace.as_deref(), &name);
        let rv = match cache::get(&config_map(), request.namespace.as_deref(), &name) {
            Ok(Some(json)) => describe(&json).1,
            Ok(None) => "not-found".to_owned(),
            Err(e) => return Err(ReconcileError::Retryable(format!("cache read failed: {e:?}"))),
        };
        let kind_ok = if kind_ok { "yes" } else { "no" }.to_owned();
        line("reconcile-start", &[("key", key.clone()), ("rv", rv.clone()), ("kind-ok", kind_ok)]);
        maybe_sleep("slow", &name);
        let fail = should_fail(&s, &key, &rv);
        let result = if fail { "error" } else { "ok" }.to_owned();
        line("reconcile-end", &[("key", key.clone()), ("rv", rv.clone()), ("result", result)]);
        if fail {
            return Err(ReconcileError::Retryable(format!("witness {STAMP} fails {key}@{rv} as told")));
        }
        Ok(ReconcileResult::Done)
    }

    fn on_add(kind: Gvk, object: Vec<u8>, _in_initial_list: bool) {
        hook("add", &kind, &object);
    }

    fn on_update(kind: Gvk, _old: Vec<u8>, new: Vec<u8>) {
        hook("update", &kind, &new);
    }

    fn on_delete(kind: Gvk, object: Vec<u8>, _final_state_unknown: bool) {
        hook("delete", &kind, &object);
    }

    fn map(_kind: Gvk, object: Vec<u8>) -> Vec<Request> {
        let s = settings();
        let v: serde_json::Value = serde_json::from_slice(&object).unwrap_or(serde_json::Value::Null);
        let meta = &v["metadata"];
        let key = key_of(meta["namespace"].as_str(), meta["name"].as_str().unwrap_or(""));
        traced(&s, "map", &key, || match meta["name"].as_str() {
            Some(name) => vec![Request {
                namespace: meta["namespace"].as_str().map(str::to_owned),
                name: format!("{}{name}", s["map-prefix"].as_str().unwrap_or("")),
            }],
            None => Vec::new(),
        })
    }

    fn filter(_kind: Gvk, event: FilterEvent) -> bool {
        let object = match &event {
            FilterEvent::Create(o) | FilterEvent::Delete(o) => o,
            FilterEvent::Update((_, new)) => new,
        };
        let (key, _) = describe(object);
        let s = settings();
        traced(&s, "filter", &key, || {
            let name = key.rsplit('/').next().unwrap_or(&key).to_owned();
            if s["slow-filter"].as_str() == Some(name.as_str()) {
                line("filter-sleep", &[("key", key.clone())]);
                maybe_sleep("slow-filter", &key);
            }
            true
        })
    }
}

export!(Witness);
