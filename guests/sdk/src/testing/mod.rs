//! A native fake host: run a plugin's whole `reconcile` (and its hooks) under `cargo test`.
//!
//! In native builds the SDK's host calls (`cache`, `client`, `events`, `log`, `config`) are
//! answered by the [`TestHost`] installed on the calling thread. It holds:
//!
//! - an informer **cache** and an **API server**, two in-memory object stores seeded from
//!   typed objects or YAML ([`TestHost::add`], [`TestHost::add_yaml`]); writes go to the
//!   server only, as in a cluster the cache catches up later: [`TestHost::sync_cache`]
//!   copies the server into the cache (the watch events arriving);
//! - a record of every write ([`TestHost::writes`]), Event ([`TestHost::events`]) and log
//!   line ([`TestHost::logs`]);
//! - injectable failures ([`TestHost::fail`]): make the next (or every) create, replace,
//!   cache read, ... fail with a conflict, not-found, unavailable or any other [`Error`].
//!
//! ```
//! use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
//! use wasmctrl_guest::prelude::*;
//! use wasmctrl_guest::testing::{TestHost, Write};
//!
//! struct Stamp;
//! impl Plugin for Stamp {
//!     type For = ConfigMap;
//!     fn init(_: Settings) -> Result<Self, InitError> {
//!         Ok(Stamp)
//!     }
//!     fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
//!         let Target::Present(cm) = target else { return Ok(Action::Done) };
//!         let patch = wasmctrl_guest::serde_json::json!({ "data": { "stamped": "yes" } });
//!         client::patch_merge::<ConfigMap>(cm.namespace(), cm.name(), &patch)?;
//!         Ok(Action::Done)
//!     }
//! }
//! wasmctrl_guest::export_plugin!(Stamp);
//!
//! let host = TestHost::new();
//! host.add_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: default}\n").unwrap();
//! let plugin = host.init::<Stamp>().unwrap();
//! assert_eq!(plugin.reconcile(Request::new(Some("default"), "a")), Ok(Action::Done));
//! assert!(matches!(&host.writes()[..], [Write::Patch { name, .. }] if name == "a"));
//! let stored: ConfigMap = host.server_get(Some("default"), "a").unwrap();
//! assert_eq!(stored.data.unwrap()["stamped"], "yes");
//! ```
//!
//! Invariants: one `TestHost` per thread at a time (each `#[test]` runs on its own thread);
//! dropping it uninstalls it. Without one, host calls fail with `unavailable` and logs are
//! dropped. What the fake API server does not model is listed in `store`'s docs
//! (server-side apply field ownership, strategic merge patch, garbage collection);
//! `wasmctrl test` runs the real component against a real API server for those.

mod store;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::rc::Rc;

use serde_json::Value;
use wasmctrl_selectors::LabelSelector;

use crate::bindings::wasmctrl::controller::client as wit_client;
use crate::bindings::wasmctrl::controller::events as wit_events;
use crate::bindings::wasmctrl::controller::log as wit_log;
use crate::bindings::wasmctrl::controller::types as wit;
use crate::client::{ApplyParams, DeleteOptions, Propagation};
use crate::events::EventType;
use crate::export::{Exported, HookTable};
use crate::log::Level;
use crate::{Action, Error, FilterEvent, Gvk, Hooks, InitError, Kind, RawObject, ReconcileError, Request};

use store::{ObjectKey, PatchKind, Server, Store};

/// An index function: the index values of an object (its JSON).
type IndexFn = Rc<dyn Fn(&Value) -> Vec<String>>;

/// A host call that can be made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `cache::get`.
    CacheGet,
    /// `cache::list`.
    CacheList,
    /// `cache::by_index`.
    CacheByIndex,
    /// `client::get`.
    Get,
    /// `client::create`.
    Create,
    /// `client::replace`.
    Replace,
    /// `client::patch_*`.
    Patch,
    /// `client::apply`.
    Apply,
    /// `client::update_status`.
    UpdateStatus,
    /// `client::patch_status_merge`.
    PatchStatus,
    /// `client::delete`.
    Delete,
    /// `events::publish`.
    PublishEvent,
}

/// A failure to inject: calls of `op` (optionally only on one kind and name) fail with
/// `error`, `times` times (every time when unset).
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    op: Op,
    kind: Option<Gvk>,
    name: Option<String>,
    error: Error,
    times: Option<usize>,
}

impl Failure {
    /// Every call of `op` fails with `error`.
    pub fn new(op: Op, error: Error) -> Self {
        Failure { op, kind: None, name: None, error, times: None }
    }
    /// Only calls about kind `K`.
    pub fn kind<K: Kind>(mut self) -> Self {
        self.kind = Some(Gvk::of::<K>());
        self
    }
    /// Only calls about objects named `name`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Only the next `n` matching calls.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }
    /// Only the next matching call.
    pub fn once(self) -> Self {
        self.times(1)
    }
}

/// A patch as the plugin sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum Patch {
    /// RFC 7386 JSON merge patch.
    Merge(Value),
    /// RFC 6902 JSON patch.
    Json(Value),
    /// Kubernetes strategic merge patch.
    Strategic(Value),
}

/// A write the plugin made that the fake API server accepted, with the body it sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// `client::create`.
    Create {
        /// The object sent.
        object: Value,
    },
    /// `client::replace`.
    Replace {
        /// The object sent.
        object: Value,
    },
    /// `client::patch_*` (`status`: `client::patch_status_merge`).
    Patch {
        /// The patched object's kind.
        kind: Gvk,
        /// Its namespace.
        namespace: Option<String>,
        /// Its name.
        name: String,
        /// The patch.
        patch: Patch,
        /// Whether the status subresource was patched.
        status: bool,
    },
    /// `client::apply`.
    Apply {
        /// The (partial) object applied.
        object: Value,
        /// Force, dry run, field manager.
        params: ApplyParams,
    },
    /// `client::update_status`.
    UpdateStatus {
        /// The object sent.
        object: Value,
    },
    /// `client::delete` / `delete_with`.
    Delete {
        /// The deleted object's kind.
        kind: Gvk,
        /// Its namespace.
        namespace: Option<String>,
        /// Its name.
        name: String,
        /// Preconditions and propagation.
        options: DeleteOptions,
    },
}

impl Write {
    /// `create`, `replace`, `patch`, `apply`, `update-status`, `patch-status` or `delete`.
    pub fn verb(&self) -> &'static str {
        match self {
            Write::Create { .. } => "create",
            Write::Replace { .. } => "replace",
            Write::Patch { status: false, .. } => "patch",
            Write::Patch { status: true, .. } => "patch-status",
            Write::Apply { .. } => "apply",
            Write::UpdateStatus { .. } => "update-status",
            Write::Delete { .. } => "delete",
        }
    }

    /// `namespace/name` (or `name`) of the object written.
    pub fn key(&self) -> String {
        let (ns, name) = match self {
            Write::Create { object }
            | Write::Replace { object }
            | Write::UpdateStatus { object }
            | Write::Apply { object, .. } => (
                object["metadata"]["namespace"].as_str().map(str::to_owned),
                object["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            ),
            Write::Patch { namespace, name, .. } | Write::Delete { namespace, name, .. } => {
                (namespace.clone(), name.clone())
            }
        };
        Request { namespace: ns, name }.key()
    }

    /// The object sent by a create, replace, apply or status update, parsed as `K`.
    pub fn object<K: Kind>(&self) -> Option<K> {
        match self {
            Write::Create { object }
            | Write::Replace { object }
            | Write::UpdateStatus { object }
            | Write::Apply { object, .. } => serde_json::from_value(object.clone()).ok(),
            _ => None,
        }
    }
}

/// An Event the plugin published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The kind of the object it is about.
    pub kind: Gvk,
    /// Its namespace.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Normal or Warning.
    pub event_type: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// What the plugin did.
    pub action: String,
    /// The message.
    pub note: String,
}

/// A log line the plugin wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// The message.
    pub message: String,
    /// Key/value fields.
    pub fields: Vec<(String, String)>,
}

impl LogLine {
    /// The value of field `key`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// The state behind a [`TestHost`].
pub(crate) struct FakeHost {
    plugin_name: String,
    settings: Vec<u8>,
    cache: Store,
    server: Server,
    indexes: HashMap<(Gvk, String), IndexFn>,
    writes: Vec<Write>,
    events: Vec<RecordedEvent>,
    logs: Vec<LogLine>,
    failures: Vec<Failure>,
}

thread_local! {
    static HOST: RefCell<Option<FakeHost>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread's fake host; `None` when there is none (or it is busy, which
/// cannot happen for a plugin's calls: the host never calls back into the plugin).
pub(crate) fn with_host<R>(f: impl FnOnce(&mut FakeHost) -> R) -> Option<R> {
    HOST.with(|h| h.try_borrow_mut().ok().and_then(|mut h| h.as_mut().map(f)))
}

/// The error of a host call made without a [`TestHost`].
pub(crate) fn no_host<T>() -> Result<T, wit::Error> {
    Err(wit::Error::Unavailable(
        "no host: outside a Wasm instance, create a wasmctrl_guest::testing::TestHost first".into(),
    ))
}

fn to_wit_error(e: Error) -> wit::Error {
    match e {
        Error::NotFound(m) => wit::Error::NotFound(m),
        Error::AlreadyExists(m) => wit::Error::AlreadyExists(m),
        Error::Conflict(m) => wit::Error::Conflict(m),
        Error::Forbidden(m) => wit::Error::Forbidden(m),
        Error::Invalid(m) | Error::Json(m) => wit::Error::Invalid(m),
        Error::Unavailable(m) => wit::Error::Unavailable(m),
        Error::Other { status, message } => wit::Error::Other((status, message)),
    }
}

fn gvk(kind: &wit::Gvk) -> Gvk {
    Gvk::new(kind.api_version.clone(), kind.kind.clone())
}

fn parse_body(body: &[u8], what: &str) -> Result<Value, wit::Error> {
    serde_json::from_slice(body).map_err(|e| wit::Error::Invalid(format!("{what} is not valid JSON: {e}")))
}

fn encode(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

impl FakeHost {
    fn new() -> Self {
        FakeHost {
            plugin_name: "test-plugin".into(),
            settings: b"{}".to_vec(),
            cache: Store::default(),
            server: Server::default(),
            indexes: HashMap::new(),
            writes: Vec::new(),
            events: Vec::new(),
            logs: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// The injected failure for this call, if any (consuming one use of it).
    fn injected(&mut self, op: Op, kind: Option<&Gvk>, name: Option<&str>) -> Result<(), wit::Error> {
        let hit = self.failures.iter().position(|f| {
            f.op == op
                && f.kind.as_ref().is_none_or(|k| Some(k) == kind)
                && f.name.as_deref().is_none_or(|n| Some(n) == name)
                && f.times != Some(0)
        });
        let Some(i) = hit else { return Ok(()) };
        let f = &mut self.failures[i];
        if let Some(t) = &mut f.times {
            *t -= 1;
        }
        Err(to_wit_error(f.error.clone()))
    }

    pub(crate) fn cache_get(
        &mut self,
        kind: &wit::Gvk,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Vec<u8>>, wit::Error> {
        let kind = gvk(kind);
        self.injected(Op::CacheGet, Some(&kind), Some(name))?;
        Ok(self.cache.get(&ObjectKey::new(&kind, ns, name)).map(encode))
    }

    pub(crate) fn cache_list(
        &mut self,
        kind: &wit::Gvk,
        ns: Option<&str>,
        selector: Option<&str>,
    ) -> Result<Vec<Vec<u8>>, wit::Error> {
        let kind = gvk(kind);
        self.injected(Op::CacheList, Some(&kind), None)?;
        let selector = LabelSelector::parse(selector.unwrap_or_default())
            .map_err(|e| wit::Error::Invalid(e.to_string()))?;
        Ok(self.cache.of_kind(&kind, ns).filter(|o| selector.matches(&labels_of(o))).map(encode).collect())
    }

    pub(crate) fn cache_by_index(
        &mut self,
        kind: &wit::Gvk,
        index: &str,
        value: &str,
    ) -> Result<Vec<Vec<u8>>, wit::Error> {
        let kind = gvk(kind);
        self.injected(Op::CacheByIndex, Some(&kind), None)?;
        if index == "namespace" {
            return Ok(self.cache.of_kind(&kind, Some(value)).map(encode).collect());
        }
        let Some(f) = self.indexes.get(&(kind.clone(), index.to_owned())) else {
            return Err(wit::Error::Invalid(format!(
                "{kind} has no index {index:?}: declare it with TestHost::add_index (as the plugin's TOML does)"
            )));
        };
        Ok(self.cache.of_kind(&kind, None).filter(|o| f(o).iter().any(|v| v == value)).map(encode).collect())
    }

    pub(crate) fn client_get(
        &mut self,
        kind: &wit::Gvk,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Vec<u8>, wit::Error> {
        let kind = gvk(kind);
        self.injected(Op::Get, Some(&kind), Some(name))?;
        self.server.get(&ObjectKey::new(&kind, ns, name)).map(|o| encode(&o)).map_err(to_wit_error)
    }

    /// Checks for an injected failure, runs `f` on the server, records `write` on success.
    fn write(
        &mut self,
        op: Op,
        key: &ObjectKey,
        write: Write,
        f: impl FnOnce(&mut Server) -> Result<Value, Error>,
    ) -> Result<Vec<u8>, wit::Error> {
        self.injected(op, Some(&key.kind), Some(&key.name))?;
        let stored = f(&mut self.server).map_err(to_wit_error)?;
        self.writes.push(write);
        Ok(encode(&stored))
    }

    pub(crate) fn client_create(&mut self, object: &[u8]) -> Result<Vec<u8>, wit::Error> {
        let object = parse_body(object, "the object")?;
        let key = ObjectKey::of(&object).map_err(to_wit_error)?;
        let body = object.clone();
        self.write(Op::Create, &key, Write::Create { object: body }, |s| s.create(object, false))
    }

    pub(crate) fn client_replace(&mut self, object: &[u8]) -> Result<Vec<u8>, wit::Error> {
        let object = parse_body(object, "the object")?;
        let key = ObjectKey::of(&object).map_err(to_wit_error)?;
        let body = object.clone();
        self.write(Op::Replace, &key, Write::Replace { object: body }, |s| s.replace(object, false))
    }

    pub(crate) fn client_update_status(&mut self, object: &[u8]) -> Result<Vec<u8>, wit::Error> {
        let object = parse_body(object, "the object")?;
        let key = ObjectKey::of(&object).map_err(to_wit_error)?;
        let body = object.clone();
        self.write(Op::UpdateStatus, &key, Write::UpdateStatus { object: body }, |s| s.replace(object, true))
    }

    pub(crate) fn client_patch(
        &mut self,
        kind: &wit::Gvk,
        ns: Option<&str>,
        name: &str,
        patch: &wit_client::PatchBody,
        status: bool,
    ) -> Result<Vec<u8>, wit::Error> {
        let kind = gvk(kind);
        let key = ObjectKey::new(&kind, ns, name);
        let (patch, sent) = match patch {
            wit_client::PatchBody::Merge(b) => {
                let v = parse_body(b, "the patch")?;
                (PatchKind::Merge(v.clone()), Patch::Merge(v))
            }
            wit_client::PatchBody::Json(b) => {
                let v = parse_body(b, "the patch")?;
                (PatchKind::Json(v.clone()), Patch::Json(v))
            }
            wit_client::PatchBody::Strategic(b) => {
                let v = parse_body(b, "the patch")?;
                (PatchKind::Strategic(v.clone()), Patch::Strategic(v))
            }
        };
        let write = Write::Patch {
            kind,
            namespace: ns.map(str::to_owned),
            name: name.to_owned(),
            patch: sent,
            status,
        };
        let op = if status { Op::PatchStatus } else { Op::Patch };
        self.write(op, &key.clone(), write, |s| s.patch(&key, &patch, status))
    }

    pub(crate) fn client_apply(
        &mut self,
        object: &[u8],
        options: &wit_client::ApplyOptions,
    ) -> Result<Vec<u8>, wit::Error> {
        let object = parse_body(object, "the object")?;
        let key = ObjectKey::of(&object).map_err(to_wit_error)?;
        let params = ApplyParams {
            force: options.force,
            dry_run: options.dry_run,
            field_manager: options.field_manager.clone(),
        };
        let dry_run = options.dry_run;
        let body = object.clone();
        self.write(Op::Apply, &key, Write::Apply { object: body, params }, |s| s.apply(object, dry_run))
    }

    pub(crate) fn client_delete(
        &mut self,
        kind: &wit::Gvk,
        ns: Option<&str>,
        name: &str,
        options: &wit_client::DeleteOptions,
    ) -> Result<(), wit::Error> {
        let kind = gvk(kind);
        let key = ObjectKey::new(&kind, ns, name);
        let recorded = DeleteOptions {
            uid: options.uid.clone(),
            resource_version: options.resource_version.clone(),
            propagation: options.propagation.map(|p| match p {
                wit_client::Propagation::Background => Propagation::Background,
                wit_client::Propagation::Foreground => Propagation::Foreground,
                wit_client::Propagation::Orphan => Propagation::Orphan,
            }),
        };
        let write = Write::Delete {
            kind,
            namespace: ns.map(str::to_owned),
            name: name.to_owned(),
            options: recorded,
        };
        let (uid, rv) = (options.uid.clone(), options.resource_version.clone());
        self.write(Op::Delete, &key.clone(), write, |s| {
            s.delete(&key, uid.as_deref(), rv.as_deref()).map(|()| Value::Null)
        })
        .map(|_| ())
    }

    pub(crate) fn publish_event(&mut self, event: &wit_events::Event) -> Result<(), wit::Error> {
        let kind = gvk(&event.regarding.kind);
        self.injected(Op::PublishEvent, Some(&kind), Some(&event.regarding.name))?;
        self.events.push(RecordedEvent {
            kind,
            namespace: event.regarding.namespace.clone(),
            name: event.regarding.name.clone(),
            event_type: match event.type_ {
                wit_events::EventType::Normal => EventType::Normal,
                wit_events::EventType::Warning => EventType::Warning,
            },
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        });
        Ok(())
    }

    pub(crate) fn log_enabled(&mut self, _level: wit_log::Level) -> bool {
        true
    }

    pub(crate) fn log(&mut self, level: wit_log::Level, message: &str, fields: &[(String, String)]) {
        let level = match level {
            wit_log::Level::Trace => Level::Trace,
            wit_log::Level::Debug => Level::Debug,
            wit_log::Level::Info => Level::Info,
            wit_log::Level::Warn => Level::Warn,
            wit_log::Level::Error => Level::Error,
        };
        self.logs.push(LogLine { level, message: message.to_owned(), fields: fields.to_vec() });
    }

    pub(crate) fn plugin_name(&mut self) -> String {
        self.plugin_name.clone()
    }

    pub(crate) fn settings_json(&mut self) -> Vec<u8> {
        self.settings.clone()
    }
}

/// The fake host of this thread; see the module docs. Not `Send`: it lives on the thread
/// whose host calls it answers.
pub struct TestHost {
    _not_send: PhantomData<Rc<()>>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost::new()
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        HOST.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                *h = None;
            }
        });
    }
}

impl TestHost {
    /// Installs an empty fake host on this thread (replacing any previous one). The plugin
    /// is named `test-plugin` and its settings are `{}`.
    pub fn new() -> Self {
        HOST.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                *h = Some(FakeHost::new());
            }
        });
        TestHost { _not_send: PhantomData }
    }

    fn with<R>(&self, f: impl FnOnce(&mut FakeHost) -> R) -> R {
        match with_host(f) {
            Some(r) => r,
            // `new` installed it and only `drop` removes it; a host call in progress
            // cannot call back here.
            None => panic!("the TestHost of this thread is gone or busy"),
        }
    }

    /// Sets the plugin's `[settings]` (what `init` and `config::settings` get).
    pub fn set_settings(&self, settings: serde_json::Value) {
        self.with(|h| h.settings = encode(&settings));
    }

    /// Sets the plugin's name (`config::plugin_name`).
    pub fn set_plugin_name(&self, name: impl Into<String>) {
        let name = name.into();
        self.with(|h| h.plugin_name = name);
    }

    /// Adds `object` to the API server and the cache (a UID and resourceVersion are
    /// assigned when it has none). Returns it as stored.
    pub fn add<K: Kind>(&self, object: &K) -> Result<K, Error> {
        let json = crate::kind::to_json(object)?;
        let stored =
            self.add_json(serde_json::from_slice(&json).map_err(|e| Error::json("encoding object", e))?)?;
        serde_json::from_value(stored).map_err(|e| Error::json("decoding object", e))
    }

    /// Adds an object given as JSON to the API server and the cache.
    pub fn add_json(&self, object: Value) -> Result<Value, Error> {
        self.with(|h| {
            let stored = h.server.seed(object)?;
            h.cache.put(stored.clone())?;
            Ok(stored)
        })
    }

    /// Adds an object to the API server only (the cache has not seen it yet).
    pub fn add_to_server<K: Kind>(&self, object: &K) -> Result<(), Error> {
        let json = crate::kind::to_json(object)?;
        let value = serde_json::from_slice(&json).map_err(|e| Error::json("encoding object", e))?;
        self.with(|h| h.server.seed(value).map(|_| ()))
    }

    /// Adds an object to the cache only (the server has deleted it, the watch lags).
    pub fn add_to_cache<K: Kind>(&self, object: &K) -> Result<(), Error> {
        let json = crate::kind::to_json(object)?;
        let value = serde_json::from_slice(&json).map_err(|e| Error::json("encoding object", e))?;
        self.with(|h| h.cache.put(value))
    }

    /// Adds every object of a (multi-document) YAML text to the server and the cache.
    /// Returns how many were added.
    pub fn add_yaml(&self, yaml: &str) -> Result<usize, Error> {
        let mut n = 0;
        for doc in serde_norway::Deserializer::from_str(yaml) {
            let value = <Value as serde::Deserialize>::deserialize(doc)
                .map_err(|e| Error::Invalid(format!("YAML: {e}")))?;
            if value.is_null() {
                continue;
            }
            self.add_json(value)?;
            n += 1;
        }
        Ok(n)
    }

    /// Removes an object from the server and the cache (deleted, and the watch caught up).
    pub fn remove<K: Kind>(&self, namespace: Option<&str>, name: &str) {
        let key = ObjectKey::new(&Gvk::of::<K>(), namespace, name);
        self.with(|h| {
            h.server.store.objects.remove(&key);
            h.cache.objects.remove(&key);
        });
    }

    /// Declares index `name` on kind `K`, as the plugin's TOML does: `f` gives an object's
    /// index values. (`namespace` is built in.)
    pub fn add_index<K: Kind>(&self, name: &str, f: impl Fn(&K) -> Vec<String> + 'static) {
        let f: IndexFn = Rc::new(move |v: &Value| match serde_json::from_value::<K>(v.clone()) {
            Ok(o) => f(&o),
            Err(_) => Vec::new(),
        });
        self.with(|h| h.indexes.insert((Gvk::of::<K>(), name.to_owned()), f));
    }

    /// Makes host calls fail; see [`Failure`].
    pub fn fail(&self, failure: Failure) {
        self.with(|h| h.failures.push(failure));
    }

    /// Removes every injected failure.
    pub fn clear_failures(&self) {
        self.with(|h| h.failures.clear());
    }

    /// The cache catches up with the server (the watch events arrive).
    pub fn sync_cache(&self) {
        self.with(|h| h.cache = h.server.store.clone());
    }

    /// The writes the server accepted so far, in order.
    pub fn writes(&self) -> Vec<Write> {
        self.with(|h| h.writes.clone())
    }

    /// The writes so far, forgetting them (to look only at the next reconcile's).
    pub fn take_writes(&self) -> Vec<Write> {
        self.with(|h| std::mem::take(&mut h.writes))
    }

    /// The Events published so far.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.with(|h| h.events.clone())
    }

    /// The Events so far, forgetting them.
    pub fn take_events(&self) -> Vec<RecordedEvent> {
        self.with(|h| std::mem::take(&mut h.events))
    }

    /// The log lines so far.
    pub fn logs(&self) -> Vec<LogLine> {
        self.with(|h| h.logs.clone())
    }

    /// The object as the server has it.
    pub fn server_get<K: Kind>(&self, namespace: Option<&str>, name: &str) -> Option<K> {
        let key = ObjectKey::new(&Gvk::of::<K>(), namespace, name);
        self.with(|h| h.server.store.get(&key).cloned()).and_then(|v| serde_json::from_value(v).ok())
    }

    /// Every object of kind `K` on the server.
    pub fn server_list<K: Kind>(&self) -> Vec<K> {
        let kind = Gvk::of::<K>();
        self.with(|h| h.server.store.of_kind(&kind, None).cloned().collect::<Vec<_>>())
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// Runs the plugin's `init` with the settings, as the host does for each instance.
    pub fn init<P: Exported>(&self) -> Result<TestPlugin<P>, InitError> {
        let settings = self.with(|h| h.settings.clone());
        let (plugin, hooks) = crate::export::init::<P>(settings)?;
        Ok(TestPlugin { plugin, table: P::hook_table(), hooks })
    }
}

/// A plugin initialised on a [`TestHost`]: call its exports as the host would.
pub struct TestPlugin<P> {
    plugin: P,
    table: HookTable<P>,
    hooks: Hooks,
}

impl<P: Exported> TestPlugin<P> {
    /// The plugin value.
    pub fn plugin(&self) -> &P {
        &self.plugin
    }

    /// The hooks `init` declares to the host.
    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// A reconcile of `request`: the object is read from the cache first, as in the host.
    pub fn reconcile(&self, request: Request) -> Result<Action, ReconcileError> {
        crate::export::reconcile(&self.plugin, request)
    }

    /// A reconcile of the request for `object` (which need not be in the cache).
    pub fn reconcile_object<K: Kind>(&self, object: &K) -> Result<Action, ReconcileError> {
        self.reconcile(Request::for_object(object))
    }

    /// The plugin's `map` for `object`; `None` when the plugin does not implement it (the
    /// host then maps nothing).
    pub fn map<K: Kind>(&self, object: &K) -> Option<Vec<Request>> {
        let f = self.table.map?;
        let json = crate::kind::to_json(object).ok()?;
        Some(f(&self.plugin, &Gvk::of::<K>(), RawObject::from_json(json)))
    }

    /// The plugin's `filter`; `None` when it does not implement one (the host passes
    /// everything then).
    pub fn filter(&self, kind: &Gvk, event: FilterEvent) -> Option<bool> {
        let f = self.table.filter?;
        Some(f(&self.plugin, kind, event))
    }

    /// Delivers an add notification; `false` when the plugin has no `OnAdd` (not called).
    pub fn on_add<K: Kind>(&self, object: &K, in_initial_list: bool) -> bool {
        match (self.table.on_add, crate::kind::to_json(object)) {
            (Some(f), Ok(json)) => {
                f(&self.plugin, &Gvk::of::<K>(), RawObject::from_json(json), in_initial_list);
                true
            }
            _ => false,
        }
    }

    /// Delivers an update notification; `false` when the plugin has no `OnUpdate`.
    pub fn on_update<K: Kind>(&self, old: &K, new: &K) -> bool {
        match (self.table.on_update, crate::kind::to_json(old), crate::kind::to_json(new)) {
            (Some(f), Ok(old), Ok(new)) => {
                f(&self.plugin, &Gvk::of::<K>(), RawObject::from_json(old), RawObject::from_json(new));
                true
            }
            _ => false,
        }
    }

    /// The plugin's answer to an admission `request` (build one with
    /// [`AdmissionRequest::create`](crate::admission::AdmissionRequest::create), ...);
    /// `None` when it does not implement [`Validate`](crate::admission::Validate).
    pub fn validate(
        &self,
        request: &crate::admission::AdmissionRequest,
    ) -> Option<crate::admission::Verdict> {
        Some((self.table.validate?)(&self.plugin, request))
    }

    /// The plugin's mutation of `request`'s object: the verdict and the object with the
    /// patch applied (the object unchanged when there is no patch); `None` when it does not
    /// implement [`Mutate`](crate::admission::Mutate).
    pub fn mutate<K: Kind>(
        &self,
        request: &crate::admission::AdmissionRequest,
    ) -> Option<Result<(crate::admission::Verdict, Option<K>), Error>> {
        let (verdict, patch) = (self.table.mutate?)(&self.plugin, request);
        let mutated = || -> Result<Option<K>, Error> {
            let Some(object) = &request.object else { return Ok(None) };
            let mut doc: Value = object.parse_as()?;
            if let Some(patch) = &patch {
                json_patch::patch(&mut doc, patch)
                    .map_err(|e| Error::Invalid(format!("the patch does not apply: {e}")))?;
            }
            Ok(Some(serde_json::from_value(doc)?))
        };
        Some(mutated().map(|object| (verdict, object)))
    }

    /// Delivers a delete notification; `false` when the plugin has no `OnDelete`.
    pub fn on_delete<K: Kind>(&self, object: &K, final_state_unknown: bool) -> bool {
        match (self.table.on_delete, crate::kind::to_json(object)) {
            (Some(f), Ok(json)) => {
                f(&self.plugin, &Gvk::of::<K>(), RawObject::from_json(json), final_state_unknown);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::TestHost;
    use crate::{Error, cache};

    /// `cache::list` selects with the host's own parser: the API server's operators, and
    /// what the host refuses is refused here too.
    #[test]
    fn cache_list_selects_as_the_host_does() {
        let host = TestHost::new();
        host.add_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: ns, labels: {app: web, tier: \"5\"}}\n\
             ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: ns, labels: {app: db}}\n",
        )
        .unwrap();
        let names = |selector: &str| {
            cache::list::<ConfigMap>(None, Some(selector))
                .map(|list| list.into_iter().filter_map(|c| c.metadata.name).collect::<Vec<_>>())
        };
        assert_eq!(names("").unwrap(), ["a", "b"]);
        assert_eq!(names("app=web").unwrap(), ["a"]);
        assert_eq!(names("app in (web, db),!legacy").unwrap(), ["a", "b"]);
        assert_eq!(names("app notin (web),tier").unwrap(), Vec::<String>::new());
        assert_eq!(names("tier>3").unwrap(), ["a"]);
        for bad in ["a b c", "=x", "app=web,", "-app=x", "tier>high"] {
            assert!(matches!(names(bad), Err(Error::Invalid(_))), "{bad}: {:?}", names(bad));
        }
    }
}
