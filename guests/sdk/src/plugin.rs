//! The [`Plugin`] trait a controller implements, the values its exports take and return,
//! and the glue [`export_plugin!`](crate::export_plugin) wires to the WIT exports.
//!
//! Invariants: the plugin value built by [`Plugin::init`] lives for the rest of the
//! instance (the host calls `init` once per instance, before anything else); a hook the
//! plugin did not declare in [`Plugin::HOOKS`] is never called by the host.

use std::cell::RefCell;
use std::rc::Rc;
use std::thread::LocalKey;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::bindings::exports::wasmctrl::controller::reconciler as wit;
use crate::bindings::wasmctrl::controller::types as wit_types;
use crate::{Gvk, Kind, KindExt, RawObject, ReconcileError};

/// The object a reconcile is for. `namespace` is `None` for cluster-scoped kinds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    /// The object's namespace.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl Request {
    /// A request for `name` in `namespace`.
    pub fn new(namespace: Option<&str>, name: impl Into<String>) -> Self {
        Request { namespace: namespace.map(str::to_owned), name: name.into() }
    }

    /// The request that reconciles `object`.
    pub fn for_object<K: Kind>(object: &K) -> Self {
        Request::new(object.namespace(), object.name())
    }

    /// `namespace/name` (or `name`).
    pub fn key(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// How a reconcile ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Done until something changes.
    Done,
    /// Reconcile again after the rate limiter's backoff.
    Requeue,
    /// Reconcile again after this delay (millisecond resolution).
    RequeueAfter(Duration),
}

/// The optional hooks a plugin implements (the WIT `hooks` flags). The host calls only
/// the hooks set here, so declaring exactly what you override saves calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hooks(u8);

impl Hooks {
    /// No optional hook: only `reconcile` is called.
    pub const NONE: Hooks = Hooks(0);
    /// [`Plugin::on_add`].
    pub const ON_ADD: Hooks = Hooks(1);
    /// [`Plugin::on_update`].
    pub const ON_UPDATE: Hooks = Hooks(1 << 1);
    /// [`Plugin::on_delete`].
    pub const ON_DELETE: Hooks = Hooks(1 << 2);
    /// [`Plugin::map`], needed when the plugin's TOML has `[[watches]]`.
    pub const MAP: Hooks = Hooks(1 << 3);
    /// [`Plugin::filter`], needed when a TOML predicate says `filter = true`.
    pub const FILTER: Hooks = Hooks(1 << 4);

    /// Whether every hook in `other` is in `self`.
    pub const fn contains(self, other: Hooks) -> bool {
        self.0 & other.0 == other.0
    }
    /// Both sets of hooks.
    pub const fn union(self, other: Hooks) -> Hooks {
        Hooks(self.0 | other.0)
    }

    fn to_wit(self) -> wit::Hooks {
        let mut flags = wit::Hooks::empty();
        for (hook, flag) in [
            (Hooks::ON_ADD, wit::Hooks::ON_ADD),
            (Hooks::ON_UPDATE, wit::Hooks::ON_UPDATE),
            (Hooks::ON_DELETE, wit::Hooks::ON_DELETE),
            (Hooks::MAP, wit::Hooks::MAP),
            (Hooks::FILTER, wit::Hooks::FILTER),
        ] {
            if self.contains(hook) {
                flags |= flag;
            }
        }
        flags
    }
}

impl std::ops::BitOr for Hooks {
    type Output = Hooks;
    fn bitor(self, rhs: Hooks) -> Hooks {
        self.union(rhs)
    }
}

/// An event a [`Plugin::filter`] is asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterEvent {
    /// An object appeared.
    Create(RawObject),
    /// An object changed: `(old, new)`.
    Update(RawObject, RawObject),
    /// An object went away (its last known state).
    Delete(RawObject),
}

impl FilterEvent {
    /// The object the event is about (the new state for updates).
    pub fn object(&self) -> &RawObject {
        match self {
            FilterEvent::Create(o) | FilterEvent::Delete(o) | FilterEvent::Update(_, o) => o,
        }
    }
}

/// The plugin's `[settings]` table, as handed to [`Plugin::init`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    json: Vec<u8>,
}

impl Settings {
    /// Wraps the settings JSON (an empty body counts as `{}`).
    pub fn from_json(json: Vec<u8>) -> Self {
        Settings { json }
    }
    /// The raw JSON.
    pub fn json(&self) -> &[u8] {
        &self.json
    }
    /// Parses the settings into `T`; use `#[serde(default)]` for optional keys and
    /// `#[serde(rename_all = "kebab-case")]` to match TOML style.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, crate::Error> {
        let json: &[u8] = if self.json.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &self.json };
        serde_json::from_slice(json).map_err(|e| crate::Error::json("decoding [settings]", e))
    }
}

/// A controller's business logic.
///
/// Only [`init`](Plugin::init) and [`reconcile`](Plugin::reconcile) are required. Override
/// any optional hook and list it in [`HOOKS`](Plugin::HOOKS) so the host calls it.
/// Register the type with [`export_plugin!`](crate::export_plugin).
pub trait Plugin: Sized + 'static {
    /// The optional hooks this plugin overrides.
    const HOOKS: Hooks = Hooks::NONE;

    /// Builds the plugin from its `[settings]`. Called once per instance, before anything
    /// else; an error rejects this version of the plugin (the message is shown to the user).
    fn init(settings: Settings) -> Result<Self, String>;

    /// Brings the world in line with the object named by `request`, which may no longer
    /// exist. Must be idempotent: it is called again after every change and on resync.
    fn reconcile(&self, request: Request) -> Result<Action, ReconcileError>;

    /// Notification: an object of `kind` was added (`in_initial_list` during the first list).
    fn on_add(&self, kind: &Gvk, object: RawObject, in_initial_list: bool) {
        let _ = (kind, object, in_initial_list);
    }

    /// Notification: an object of `kind` changed.
    fn on_update(&self, kind: &Gvk, old: RawObject, new: RawObject) {
        let _ = (kind, old, new);
    }

    /// Notification: an object of `kind` was deleted. With `final_state_unknown` the delete
    /// was missed while the watch was down and `object` is the last state the cache knew.
    fn on_delete(&self, kind: &Gvk, object: RawObject, final_state_unknown: bool) {
        let _ = (kind, object, final_state_unknown);
    }

    /// For a `[[watches]]` kind: the requests of the `for` kind that `object` affects.
    fn map(&self, kind: &Gvk, object: RawObject) -> Vec<Request> {
        let _ = (kind, object);
        Vec::new()
    }

    /// A predicate: `false` drops the event before it reaches the queue.
    fn filter(&self, kind: &Gvk, event: FilterEvent) -> bool {
        let _ = (kind, event);
        true
    }
}

/// Registers `$ty` (a [`Plugin`]) as this component's `reconciler` export.
///
/// Use it once, at the top level of the plugin crate (a `cdylib` or a `bin`).
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        const _: () = {
            ::std::thread_local! {
                static __WASMCTRL_PLUGIN: $crate::__private::Slot<$ty> = $crate::__private::Slot::new();
            }

            #[allow(dead_code)] // Only exported on wasm32; native builds (tests) just type-check it.
            struct __WasmctrlExports;

            impl $crate::__private::Guest for __WasmctrlExports {
                fn init(settings: ::std::vec::Vec<u8>) -> ::std::result::Result<$crate::__private::PluginInfo, ::std::string::String> {
                    $crate::__private::init(&__WASMCTRL_PLUGIN, settings)
                }
                fn reconcile(request: $crate::__private::WitRequest) -> ::std::result::Result<$crate::__private::ReconcileResult, $crate::__private::WitReconcileError> {
                    $crate::__private::reconcile(&__WASMCTRL_PLUGIN, request)
                }
                fn on_add(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>, in_initial_list: bool) {
                    $crate::__private::on_add(&__WASMCTRL_PLUGIN, kind, object, in_initial_list)
                }
                fn on_update(kind: $crate::__private::WitGvk, old: ::std::vec::Vec<u8>, new: ::std::vec::Vec<u8>) {
                    $crate::__private::on_update(&__WASMCTRL_PLUGIN, kind, old, new)
                }
                fn on_delete(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>, final_state_unknown: bool) {
                    $crate::__private::on_delete(&__WASMCTRL_PLUGIN, kind, object, final_state_unknown)
                }
                fn map(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>) -> ::std::vec::Vec<$crate::__private::WitRequest> {
                    $crate::__private::map(&__WASMCTRL_PLUGIN, kind, object)
                }
                fn filter(kind: $crate::__private::WitGvk, event: $crate::__private::WitFilterEvent) -> bool {
                    $crate::__private::filter(&__WASMCTRL_PLUGIN, kind, event)
                }
            }

            // The component export names (`wasmctrl:controller/reconciler@0.2.0#init`) are not
            // valid symbols for native linkers, so native builds (unit tests of a plugin
            // crate) skip the export and keep the rest.
            #[cfg(target_arch = "wasm32")]
            $crate::__private::bindings::__export_plugin_world!(__WasmctrlExports with_types_in $crate::__private::bindings);
        };
    };
}

/// Per-instance storage of the plugin value. Wasm instances are single-threaded and the
/// component model forbids re-entry, so a thread-local `RefCell` is never contended.
#[doc(hidden)]
pub struct Slot<P>(RefCell<Option<Rc<P>>>);

impl<P> Slot<P> {
    #[doc(hidden)]
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Slot(RefCell::new(None))
    }
}

type SlotKey<P> = LocalKey<Slot<P>>;

fn plugin<P: Plugin>(slot: &'static SlotKey<P>) -> Option<Rc<P>> {
    slot.with(|s| s.0.borrow().clone())
}

fn gvk_from_wit(kind: wit_types::Gvk) -> Gvk {
    Gvk { api_version: kind.api_version, kind: kind.kind }
}

pub(crate) fn request_to_wit(request: Request) -> wit_types::Request {
    wit_types::Request { namespace: request.namespace, name: request.name }
}

#[doc(hidden)]
pub fn init<P: Plugin>(slot: &'static SlotKey<P>, settings: Vec<u8>) -> Result<wit::PluginInfo, String> {
    let plugin = P::init(Settings::from_json(settings))?;
    slot.with(|s| *s.0.borrow_mut() = Some(Rc::new(plugin)));
    Ok(wit::PluginInfo { hooks: P::HOOKS.to_wit(), for_kind: None })
}

#[doc(hidden)]
pub fn reconcile<P: Plugin>(
    slot: &'static SlotKey<P>,
    request: wit_types::Request,
) -> Result<wit::ReconcileResult, wit::ReconcileError> {
    let Some(plugin) = plugin(slot) else {
        return Err(wit::ReconcileError::Terminal("plugin called before init".to_owned()));
    };
    match plugin.reconcile(Request { namespace: request.namespace, name: request.name }) {
        Ok(Action::Done) => Ok(wit::ReconcileResult::Done),
        Ok(Action::Requeue) => Ok(wit::ReconcileResult::Requeue),
        Ok(Action::RequeueAfter(after)) => {
            Ok(wit::ReconcileResult::RequeueAfterMs(u64::try_from(after.as_millis()).unwrap_or(u64::MAX)))
        }
        Err(ReconcileError::Retryable(m)) => Err(wit::ReconcileError::Retryable(m)),
        Err(ReconcileError::Terminal(m)) => Err(wit::ReconcileError::Terminal(m)),
    }
}

#[doc(hidden)]
pub fn on_add<P: Plugin>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
    in_initial_list: bool,
) {
    if let Some(p) = plugin(slot) {
        p.on_add(&gvk_from_wit(kind), RawObject::from_json(object), in_initial_list);
    }
}

#[doc(hidden)]
pub fn on_update<P: Plugin>(slot: &'static SlotKey<P>, kind: wit_types::Gvk, old: Vec<u8>, new: Vec<u8>) {
    if let Some(p) = plugin(slot) {
        p.on_update(&gvk_from_wit(kind), RawObject::from_json(old), RawObject::from_json(new));
    }
}

#[doc(hidden)]
pub fn on_delete<P: Plugin>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
    final_state_unknown: bool,
) {
    if let Some(p) = plugin(slot) {
        p.on_delete(&gvk_from_wit(kind), RawObject::from_json(object), final_state_unknown);
    }
}

#[doc(hidden)]
pub fn map<P: Plugin>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
) -> Vec<wit_types::Request> {
    match plugin(slot) {
        Some(p) => {
            p.map(&gvk_from_wit(kind), RawObject::from_json(object)).into_iter().map(request_to_wit).collect()
        }
        None => Vec::new(),
    }
}

#[doc(hidden)]
pub fn filter<P: Plugin>(slot: &'static SlotKey<P>, kind: wit_types::Gvk, event: wit::FilterEvent) -> bool {
    let event = match event {
        wit::FilterEvent::Create(o) => FilterEvent::Create(RawObject::from_json(o)),
        wit::FilterEvent::Update((old, new)) => {
            FilterEvent::Update(RawObject::from_json(old), RawObject::from_json(new))
        }
        wit::FilterEvent::Delete(o) => FilterEvent::Delete(RawObject::from_json(o)),
    };
    match plugin(slot) {
        Some(p) => p.filter(&gvk_from_wit(kind), event),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_map_to_wit_flags() {
        assert_eq!(Hooks::NONE.to_wit(), wit::Hooks::empty());
        let h = Hooks::MAP | Hooks::ON_DELETE;
        assert!(h.contains(Hooks::MAP) && h.contains(Hooks::ON_DELETE) && !h.contains(Hooks::FILTER));
        assert_eq!(h.to_wit(), wit::Hooks::MAP | wit::Hooks::ON_DELETE);
        let all = Hooks::ON_ADD | Hooks::ON_UPDATE | Hooks::ON_DELETE | Hooks::MAP | Hooks::FILTER;
        assert_eq!(all.to_wit(), wit::Hooks::all());
    }

    #[test]
    fn request_display_is_cache_key() {
        assert_eq!(Request::new(Some("ns"), "a").key(), "ns/a");
        assert_eq!(Request::new(None, "node-1").key(), "node-1");
    }

    #[test]
    fn settings_parse_empty_as_empty_object() {
        #[derive(serde::Deserialize, Default, Debug, PartialEq)]
        #[serde(default, rename_all = "kebab-case")]
        struct S {
            target_namespaces: Vec<String>,
        }
        assert_eq!(Settings::from_json(Vec::new()).parse::<S>().unwrap(), S::default());
        let s: S = Settings::from_json(br#"{"target-namespaces":["a"]}"#.to_vec()).parse().unwrap();
        assert_eq!(s.target_namespaces, vec!["a"]);
        assert!(Settings::from_json(b"[1]".to_vec()).parse::<S>().unwrap_err().is_json());
    }

    struct Counter {
        start: u32,
    }
    impl Plugin for Counter {
        const HOOKS: Hooks = Hooks::MAP;
        fn init(settings: Settings) -> Result<Self, String> {
            let v: serde_json::Value = settings.parse().map_err(|e| e.to_string())?;
            match v["start"].as_u64() {
                Some(s) => Ok(Counter { start: s as u32 }),
                None => Err("settings.start is required".into()),
            }
        }
        fn reconcile(&self, request: Request) -> Result<Action, ReconcileError> {
            match request.name.as_str() {
                "later" => Ok(Action::RequeueAfter(Duration::from_millis(u64::from(self.start)))),
                "again" => Ok(Action::Requeue),
                "bad" => Err(ReconcileError::terminal("bad")),
                _ => Ok(Action::Done),
            }
        }
        fn map(&self, _kind: &Gvk, object: RawObject) -> Vec<Request> {
            let meta = object.meta().unwrap_or_default();
            vec![Request::new(meta.namespace.as_deref(), "owner")]
        }
    }

    thread_local! {
        static SLOT: Slot<Counter> = const { Slot::new() };
    }

    /// Records which hooks ran, to check the glue routes every export.
    struct Recorder {
        seen: RefCell<Vec<String>>,
    }
    impl Plugin for Recorder {
        const HOOKS: Hooks =
            Hooks::ON_ADD.union(Hooks::ON_UPDATE).union(Hooks::ON_DELETE).union(Hooks::FILTER);
        fn init(_: Settings) -> Result<Self, String> {
            Ok(Recorder { seen: RefCell::new(Vec::new()) })
        }
        fn reconcile(&self, _: Request) -> Result<Action, ReconcileError> {
            Ok(Action::Done)
        }
        fn on_add(&self, kind: &Gvk, object: RawObject, in_initial_list: bool) {
            let name = object.meta().unwrap().name.unwrap();
            self.seen.borrow_mut().push(format!("add {kind} {name} {in_initial_list}"));
        }
        fn on_update(&self, kind: &Gvk, old: RawObject, new: RawObject) {
            let (old, new) = (
                old.meta().unwrap().resource_version.unwrap(),
                new.meta().unwrap().resource_version.unwrap(),
            );
            self.seen.borrow_mut().push(format!("update {kind} {old}->{new}"));
        }
        fn on_delete(&self, kind: &Gvk, _: RawObject, final_state_unknown: bool) {
            self.seen.borrow_mut().push(format!("delete {kind} {final_state_unknown}"));
        }
        fn filter(&self, _: &Gvk, event: FilterEvent) -> bool {
            // Keep only objects labelled keep=yes (the new state for updates).
            event
                .object()
                .meta()
                .ok()
                .and_then(|m| m.labels)
                .is_some_and(|l| l.get("keep").is_some_and(|v| v == "yes"))
        }
    }

    thread_local! {
        static RECORDER: Slot<Recorder> = const { Slot::new() };
    }

    #[test]
    fn glue_routes_notifications_and_filter() {
        let pod = || wit_types::Gvk { api_version: "v1".into(), kind: "Pod".into() };
        let info = init(&RECORDER, Vec::new()).unwrap();
        assert_eq!(
            info.hooks,
            wit::Hooks::ON_ADD | wit::Hooks::ON_UPDATE | wit::Hooks::ON_DELETE | wit::Hooks::FILTER
        );
        on_add(&RECORDER, pod(), br#"{"metadata":{"name":"p1"}}"#.to_vec(), true);
        on_update(
            &RECORDER,
            pod(),
            br#"{"metadata":{"resourceVersion":"1"}}"#.to_vec(),
            br#"{"metadata":{"resourceVersion":"2"}}"#.to_vec(),
        );
        on_delete(&RECORDER, pod(), b"{}".to_vec(), true);
        let seen = RECORDER.with(|s| s.0.borrow().as_ref().unwrap().seen.borrow().clone());
        assert_eq!(seen, ["add v1/Pod p1 true", "update v1/Pod 1->2", "delete v1/Pod true"]);

        let keep = br#"{"metadata":{"labels":{"keep":"yes"}}}"#.to_vec();
        let drop = br#"{"metadata":{"labels":{"keep":"no"}}}"#.to_vec();
        assert!(filter(&RECORDER, pod(), wit::FilterEvent::Create(keep.clone())));
        assert!(!filter(&RECORDER, pod(), wit::FilterEvent::Delete(drop.clone())));
        assert!(filter(&RECORDER, pod(), wit::FilterEvent::Update((drop.clone(), keep.clone()))));
        assert!(!filter(&RECORDER, pod(), wit::FilterEvent::Update((keep, drop))));
    }

    #[test]
    fn glue_routes_exports_to_the_plugin() {
        let req = |name: &str| wit_types::Request { namespace: Some("ns".into()), name: name.into() };
        // Before init nothing is reachable and nothing panics.
        assert!(matches!(reconcile(&SLOT, req("x")), Err(wit::ReconcileError::Terminal(_))));
        assert!(filter(
            &SLOT,
            wit_types::Gvk { api_version: "v1".into(), kind: "Pod".into() },
            wit::FilterEvent::Delete(b"{}".to_vec())
        ));

        assert_eq!(init(&SLOT, b"{}".to_vec()).unwrap_err(), "settings.start is required");
        let info = init(&SLOT, br#"{"start":250}"#.to_vec()).unwrap();
        assert_eq!(info.hooks, wit::Hooks::MAP);
        assert!(matches!(reconcile(&SLOT, req("x")), Ok(wit::ReconcileResult::Done)));
        assert!(matches!(reconcile(&SLOT, req("again")), Ok(wit::ReconcileResult::Requeue)));
        assert!(matches!(reconcile(&SLOT, req("later")), Ok(wit::ReconcileResult::RequeueAfterMs(250))));
        assert!(matches!(reconcile(&SLOT, req("bad")), Err(wit::ReconcileError::Terminal(m)) if m == "bad"));
        let mapped = map(
            &SLOT,
            wit_types::Gvk { api_version: "v1".into(), kind: "Pod".into() },
            br#"{"metadata":{"name":"p","namespace":"team-a"}}"#.to_vec(),
        );
        assert_eq!(mapped.len(), 1);
        assert_eq!(mapped[0].namespace.as_deref(), Some("team-a"));
        assert_eq!(mapped[0].name, "owner");
    }
}
