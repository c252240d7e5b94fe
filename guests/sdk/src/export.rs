//! The glue between a [`Plugin`] and the WIT `reconciler` export, which
//! [`export_plugin!`](crate::export_plugin) instantiates for one plugin type.
//!
//! Invariants:
//! - The plugin value built by [`Plugin::init`] lives for the rest of the instance (the host
//!   calls `init` once per instance, before anything else); every other export before a
//!   successful `init` fails (`reconcile`) or does nothing (hooks).
//! - `init` reports the plugin's hooks and its `For` kind; the hooks are exactly the hook
//!   traits the type implements. They are found at compile time with autoref-based
//!   specialisation (see [`Probe`]): the macro expands with the concrete plugin type, where
//!   method lookup picks the impl that requires the hook trait if it holds and the fallback
//!   otherwise. So implementing a hook is the only way to declare it.
//! - `reconcile` reads the object of the `For` kind from the host's cache first; a failed
//!   read is returned as the reconcile's error, without calling the plugin.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::thread::LocalKey;

use crate::bindings::exports::wasmctrl::controller::reconciler as wit;
use crate::bindings::wasmctrl::controller::types as wit_types;
use crate::plugin::{Filter, Map, OnAdd, OnDelete, OnUpdate};
use crate::{
    Action, FilterEvent, Gvk, Hooks, InitError, Plugin, RawObject, ReconcileError, Request, Settings, Target,
    cache,
};

/// A plugin's `map` hook as a plain function.
#[doc(hidden)]
pub type MapFn<P> = fn(&P, &Gvk, RawObject) -> Vec<Request>;

/// The hook functions one plugin type implements (`None`: not implemented).
#[doc(hidden)]
pub struct HookTable<P> {
    pub on_add: Option<fn(&P, &Gvk, RawObject, bool)>,
    pub on_update: Option<fn(&P, &Gvk, RawObject, RawObject)>,
    pub on_delete: Option<fn(&P, &Gvk, RawObject, bool)>,
    pub map: Option<MapFn<P>>,
    pub filter: Option<fn(&P, &Gvk, FilterEvent) -> bool>,
}

impl<P> HookTable<P> {
    /// The hooks present in the table.
    pub fn hooks(&self) -> Hooks {
        let mut h = Hooks::NONE;
        for (present, hook) in [
            (self.on_add.is_some(), Hooks::ON_ADD),
            (self.on_update.is_some(), Hooks::ON_UPDATE),
            (self.on_delete.is_some(), Hooks::ON_DELETE),
            (self.map.is_some(), Hooks::MAP),
            (self.filter.is_some(), Hooks::FILTER),
        ] {
            if present {
                h = h | hook;
            }
        }
        h
    }
}

/// A plugin type registered with [`export_plugin!`](crate::export_plugin): its hook table.
/// Implemented by the macro; [`crate::testing`] drives plugins through it too.
#[doc(hidden)]
pub trait Exported: Plugin {
    fn hook_table() -> HookTable<Self>;
}

/// Autoref-based specialisation. For a concrete `P`, `(&&Probe::<P>::new()).map_hook()`
/// resolves to [`HasMap`] (on `&Probe<P>`, found first) when `P: Map`, and to [`NoMap`]
/// (on `Probe<P>`, one auto-deref later) otherwise. This only works where `P` is a concrete
/// type, which is why the macro, not a generic function, builds the [`HookTable`].
#[doc(hidden)]
pub struct Probe<P>(PhantomData<P>);

impl<P> Probe<P> {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Probe(PhantomData)
    }
}

macro_rules! detect {
    ($has:ident, $no:ident, $method:ident, $hook:ident :: $call:ident, $fn:ty) => {
        #[doc(hidden)]
        pub trait $has<P> {
            fn $method(&self) -> Option<$fn>;
        }
        impl<P: $hook> $has<P> for &Probe<P> {
            fn $method(&self) -> Option<$fn> {
                Some(<P as $hook>::$call)
            }
        }
        #[doc(hidden)]
        pub trait $no<P> {
            fn $method(&self) -> Option<$fn>;
        }
        impl<P> $no<P> for Probe<P> {
            fn $method(&self) -> Option<$fn> {
                None
            }
        }
    };
}

detect!(HasOnAdd, NoOnAdd, on_add_hook, OnAdd::on_add, fn(&P, &Gvk, RawObject, bool));
detect!(HasOnUpdate, NoOnUpdate, on_update_hook, OnUpdate::on_update, fn(&P, &Gvk, RawObject, RawObject));
detect!(HasOnDelete, NoOnDelete, on_delete_hook, OnDelete::on_delete, fn(&P, &Gvk, RawObject, bool));
detect!(HasMap, NoMap, map_hook, Map::map, fn(&P, &Gvk, RawObject) -> Vec<Request>);
detect!(HasFilter, NoFilter, filter_hook, Filter::filter, fn(&P, &Gvk, FilterEvent) -> bool);

/// Registers `$ty` (a [`Plugin`]) as this component's `reconciler` export.
///
/// Use it once, at the top level of the plugin crate (a `cdylib` with an `rlib` for native
/// tests). On `wasm32` it emits the component exports; everywhere it implements the
/// registration [`crate::testing`] needs.
///
/// By default it also installs the per-call arena ([`crate::arena`]) as the component's
/// global allocator (`export_plugin!(MyPlugin)` is `export_plugin!(MyPlugin, allocator =
/// arena)`): inside each export but `init`, allocations are bumped from a region rewound
/// between calls when none of them is still live. Faster for plugins that allocate a lot per
/// call (parsing objects), safe whatever the plugin keeps across calls.
/// `export_plugin!(MyPlugin, allocator = system)` keeps Rust's system allocator (wasi-libc's
/// dlmalloc) instead, or whatever `#[global_allocator]` the crate sets itself (a crate that
/// sets one must say `allocator = system`, or the two allocators collide at compile time).
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty, allocator = arena) => {
        #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
        #[global_allocator]
        static __WASMCTRL_ALLOCATOR: $crate::arena::GlobalCallArena = $crate::arena::GlobalCallArena;

        $crate::export_plugin!($ty, allocator = system);
    };
    ($ty:ty) => {
        $crate::export_plugin!($ty, allocator = arena);
    };
    ($ty:ty, allocator = system) => {
        impl $crate::__private::Exported for $ty {
            fn hook_table() -> $crate::__private::HookTable<Self> {
                #[allow(unused_imports)]
                use $crate::__private::{
                    HasFilter as _, HasMap as _, HasOnAdd as _, HasOnDelete as _, HasOnUpdate as _,
                    NoFilter as _, NoMap as _, NoOnAdd as _, NoOnDelete as _, NoOnUpdate as _,
                };
                let probe = $crate::__private::Probe::<$ty>::new();
                $crate::__private::HookTable {
                    on_add: (&&probe).on_add_hook(),
                    on_update: (&&probe).on_update_hook(),
                    on_delete: (&&probe).on_delete_hook(),
                    map: (&&probe).map_hook(),
                    filter: (&&probe).filter_hook(),
                }
            }
        }

        const _: () = {
            ::std::thread_local! {
                static __WASMCTRL_PLUGIN: $crate::__private::Slot<$ty> = $crate::__private::Slot::new();
            }

            #[allow(dead_code)] // Only exported on wasm32; native builds (tests) just type-check it.
            struct __WasmctrlExports;

            impl $crate::__private::Guest for __WasmctrlExports {
                fn init(settings: ::std::vec::Vec<u8>) -> ::std::result::Result<$crate::__private::PluginInfo, ::std::string::String> {
                    $crate::__private::init_slot(&__WASMCTRL_PLUGIN, settings)
                }
                fn reconcile(request: $crate::__private::WitRequest) -> ::std::result::Result<$crate::__private::ReconcileResult, $crate::__private::WitReconcileError> {
                    $crate::__private::export_call(|| $crate::__private::reconcile_slot(&__WASMCTRL_PLUGIN, request))
                }
                fn on_add(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>, in_initial_list: bool) {
                    $crate::__private::export_call(|| $crate::__private::on_add_slot(&__WASMCTRL_PLUGIN, kind, object, in_initial_list))
                }
                fn on_update(kind: $crate::__private::WitGvk, old: ::std::vec::Vec<u8>, new: ::std::vec::Vec<u8>) {
                    $crate::__private::export_call(|| $crate::__private::on_update_slot(&__WASMCTRL_PLUGIN, kind, old, new))
                }
                fn on_delete(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>, final_state_unknown: bool) {
                    $crate::__private::export_call(|| $crate::__private::on_delete_slot(&__WASMCTRL_PLUGIN, kind, object, final_state_unknown))
                }
                fn map(kind: $crate::__private::WitGvk, object: ::std::vec::Vec<u8>) -> ::std::vec::Vec<$crate::__private::WitRequest> {
                    $crate::__private::export_call(|| $crate::__private::map_slot(&__WASMCTRL_PLUGIN, kind, object))
                }
                fn filter(kind: $crate::__private::WitGvk, event: $crate::__private::WitFilterEvent) -> bool {
                    $crate::__private::export_call(|| $crate::__private::filter_slot(&__WASMCTRL_PLUGIN, kind, event))
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

// ---- SDK-level calls (shared by the wasm exports and `testing`) ----

/// Runs `P::init`; on success also returns what `init` reports to the host.
pub(crate) fn init<P: Exported>(settings: Vec<u8>) -> Result<(P, Hooks), InitError> {
    let plugin = P::init(Settings::from_json(settings))?;
    Ok((plugin, P::hook_table().hooks()))
}

/// Reads the `For` object from the cache and reconciles it.
pub(crate) fn reconcile<P: Plugin>(plugin: &P, request: Request) -> Result<Action, ReconcileError> {
    let target = match cache::get::<P::For>(request.namespace.as_deref(), &request.name) {
        Ok(Some(object)) => Target::Present(object),
        Ok(None) => Target::Gone(request),
        Err(e) => {
            let message = format!("reading {} {request} from the cache: {e}", <P::For as crate::Kind>::KIND);
            return Err(if e.is_retryable() {
                ReconcileError::Retryable(message)
            } else {
                ReconcileError::Terminal(message)
            });
        }
    };
    plugin.reconcile(target)
}

// ---- WIT-level wrappers over a per-instance slot ----

/// Per-instance storage of the plugin value and its hooks. Wasm instances are
/// single-threaded and the component model forbids re-entry, so a thread-local `RefCell`
/// is never contended.
#[doc(hidden)]
pub struct Slot<P>(RefCell<Option<Rc<Loaded<P>>>>);

/// A plugin value with its hook table.
#[doc(hidden)]
pub type Loaded<P> = (P, HookTable<P>);

impl<P> Slot<P> {
    #[doc(hidden)]
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Slot(RefCell::new(None))
    }
}

type SlotKey<P> = LocalKey<Slot<P>>;

fn loaded<P>(slot: &'static SlotKey<P>) -> Option<Rc<(P, HookTable<P>)>> {
    slot.with(|s| s.0.borrow().clone())
}

pub(crate) fn gvk_from_wit(kind: wit_types::Gvk) -> Gvk {
    Gvk { api_version: kind.api_version, kind: kind.kind }
}

pub(crate) fn request_to_wit(request: Request) -> wit_types::Request {
    wit_types::Request { namespace: request.namespace, name: request.name }
}

pub(crate) fn action_to_wit(action: Action) -> wit::ReconcileResult {
    match action {
        Action::Done => wit::ReconcileResult::Done,
        Action::Requeue => wit::ReconcileResult::Requeue,
        Action::RequeueAfter(after) => {
            wit::ReconcileResult::RequeueAfterMs(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
        }
    }
}

pub(crate) fn filter_event_from_wit(event: wit::FilterEvent) -> FilterEvent {
    match event {
        wit::FilterEvent::Create(o) => FilterEvent::Create(RawObject::from_json(o)),
        wit::FilterEvent::Update((old, new)) => {
            FilterEvent::Update(RawObject::from_json(old), RawObject::from_json(new))
        }
        wit::FilterEvent::Delete(o) => FilterEvent::Delete(RawObject::from_json(o)),
    }
}

#[doc(hidden)]
pub fn init_slot<P: Exported>(
    slot: &'static SlotKey<P>,
    settings: Vec<u8>,
) -> Result<wit::PluginInfo, String> {
    let (plugin, hooks) = init::<P>(settings).map_err(|e| e.to_string())?;
    slot.with(|s| *s.0.borrow_mut() = Some(Rc::new((plugin, P::hook_table()))));
    Ok(wit::PluginInfo { hooks: hooks.to_wit(), for_kind: Some(crate::host::gvk_of::<P::For>()) })
}

#[doc(hidden)]
pub fn reconcile_slot<P: Exported>(
    slot: &'static SlotKey<P>,
    request: wit_types::Request,
) -> Result<wit::ReconcileResult, wit::ReconcileError> {
    let Some(p) = loaded(slot) else {
        return Err(wit::ReconcileError::Terminal("plugin called before init".to_owned()));
    };
    match reconcile(&p.0, Request { namespace: request.namespace, name: request.name }) {
        Ok(action) => Ok(action_to_wit(action)),
        Err(ReconcileError::Retryable(m)) => Err(wit::ReconcileError::Retryable(m)),
        Err(ReconcileError::Terminal(m)) => Err(wit::ReconcileError::Terminal(m)),
    }
}

#[doc(hidden)]
pub fn on_add_slot<P>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
    in_initial_list: bool,
) {
    if let Some(p) = loaded(slot)
        && let Some(f) = p.1.on_add
    {
        f(&p.0, &gvk_from_wit(kind), RawObject::from_json(object), in_initial_list);
    }
}

#[doc(hidden)]
pub fn on_update_slot<P>(slot: &'static SlotKey<P>, kind: wit_types::Gvk, old: Vec<u8>, new: Vec<u8>) {
    if let Some(p) = loaded(slot)
        && let Some(f) = p.1.on_update
    {
        f(&p.0, &gvk_from_wit(kind), RawObject::from_json(old), RawObject::from_json(new));
    }
}

#[doc(hidden)]
pub fn on_delete_slot<P>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
    final_state_unknown: bool,
) {
    if let Some(p) = loaded(slot)
        && let Some(f) = p.1.on_delete
    {
        f(&p.0, &gvk_from_wit(kind), RawObject::from_json(object), final_state_unknown);
    }
}

#[doc(hidden)]
pub fn map_slot<P>(
    slot: &'static SlotKey<P>,
    kind: wit_types::Gvk,
    object: Vec<u8>,
) -> Vec<wit_types::Request> {
    match loaded(slot) {
        Some(p) => match p.1.map {
            Some(f) => f(&p.0, &gvk_from_wit(kind), RawObject::from_json(object))
                .into_iter()
                .map(request_to_wit)
                .collect(),
            None => Vec::new(),
        },
        None => Vec::new(),
    }
}

#[doc(hidden)]
pub fn filter_slot<P>(slot: &'static SlotKey<P>, kind: wit_types::Gvk, event: wit::FilterEvent) -> bool {
    match loaded(slot) {
        Some(p) => match p.1.filter {
            Some(f) => f(&p.0, &gvk_from_wit(kind), filter_event_from_wit(event)),
            None => true,
        },
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::testing::{Failure, Op, TestHost};
    use crate::{Error, KindExt};

    /// Implements `Map` and `OnAdd` only.
    struct Recorder {
        seen: RefCell<Vec<String>>,
    }

    impl Plugin for Recorder {
        type For = ConfigMap;
        fn init(settings: Settings) -> Result<Self, InitError> {
            let v: serde_json::Value = settings.parse()?;
            if v["reject"] == true {
                return Err("rejected".into());
            }
            Ok(Recorder { seen: RefCell::new(Vec::new()) })
        }
        fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
            match target {
                Target::Present(cm) => self.seen.borrow_mut().push(format!("present {}", cm.key())),
                Target::Gone(r) => self.seen.borrow_mut().push(format!("gone {r}")),
            }
            Ok(Action::RequeueAfter(std::time::Duration::from_millis(250)))
        }
    }

    impl Map for Recorder {
        fn map(&self, _kind: &Gvk, object: RawObject) -> Vec<Request> {
            let meta = object.meta().unwrap_or_default();
            vec![Request::new(meta.namespace.as_deref(), "owner")]
        }
    }

    impl OnAdd for Recorder {
        fn on_add(&self, kind: &Gvk, object: RawObject, in_initial_list: bool) {
            let name = object.meta().ok().and_then(|m| m.name).unwrap_or_default();
            self.seen.borrow_mut().push(format!("add {kind} {name} {in_initial_list}"));
        }
    }

    crate::export_plugin!(Recorder);

    /// No hooks at all.
    struct Bare;
    impl Plugin for Bare {
        type For = k8s_openapi::api::apps::v1::Deployment;
        fn init(_: Settings) -> Result<Self, InitError> {
            Ok(Bare)
        }
        fn reconcile(&self, _: Target<Self::For>) -> Result<Action, ReconcileError> {
            Ok(Action::Done)
        }
    }
    crate::export_plugin!(Bare);

    thread_local! {
        static SLOT: Slot<Recorder> = const { Slot::new() };
    }

    fn wit_pod() -> wit_types::Gvk {
        wit_types::Gvk { api_version: "v1".into(), kind: "Pod".into() }
    }

    #[test]
    fn implemented_hook_traits_are_the_declared_hooks() {
        assert_eq!(Recorder::hook_table().hooks(), Hooks::MAP | Hooks::ON_ADD);
        assert_eq!(Bare::hook_table().hooks(), Hooks::NONE);
    }

    #[test]
    fn init_reports_hooks_and_the_for_kind() {
        let _host = TestHost::new();
        assert_eq!(init_slot(&SLOT, br#"{"reject":true}"#.to_vec()).unwrap_err(), "rejected");
        let info = init_slot(&SLOT, b"{}".to_vec()).unwrap();
        assert_eq!(info.hooks, wit::Hooks::MAP | wit::Hooks::ON_ADD);
        let kind = info.for_kind.unwrap();
        assert_eq!((kind.api_version.as_str(), kind.kind.as_str()), ("v1", "ConfigMap"));
    }

    #[test]
    fn glue_reads_the_object_then_routes_exports() {
        let host = TestHost::new();
        let req = |name: &str| wit_types::Request { namespace: Some("ns".into()), name: name.into() };
        // Before init nothing is reachable and nothing panics.
        assert!(matches!(reconcile_slot(&SLOT, req("x")), Err(wit::ReconcileError::Terminal(_))));
        assert!(filter_slot(&SLOT, wit_pod(), wit::FilterEvent::Delete(b"{}".to_vec())));

        host.add_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: here, namespace: ns}\n").unwrap();
        init_slot(&SLOT, Vec::new()).unwrap();
        assert!(matches!(reconcile_slot(&SLOT, req("here")), Ok(wit::ReconcileResult::RequeueAfterMs(250))));
        assert!(reconcile_slot(&SLOT, req("gone")).is_ok());
        on_add_slot(&SLOT, wit_pod(), br#"{"metadata":{"name":"p1"}}"#.to_vec(), true);
        // Not implemented: never reaches the plugin.
        on_update_slot(&SLOT, wit_pod(), b"{}".to_vec(), b"{}".to_vec());
        let seen = SLOT.with(|s| s.0.borrow().as_ref().unwrap().0.seen.borrow().clone());
        assert_eq!(seen, ["present ns/here", "gone ns/gone", "add v1/Pod p1 true"]);

        let mapped =
            map_slot(&SLOT, wit_pod(), br#"{"metadata":{"name":"p","namespace":"team-a"}}"#.to_vec());
        assert_eq!(mapped.len(), 1);
        assert_eq!((mapped[0].namespace.as_deref(), mapped[0].name.as_str()), (Some("team-a"), "owner"));
        // No filter: everything passes.
        assert!(filter_slot(&SLOT, wit_pod(), wit::FilterEvent::Create(b"{}".to_vec())));

        // A failed cache read is the reconcile's error, and the plugin is not called.
        host.fail(Failure::new(Op::CacheGet, Error::Unavailable("cache down".into())).once());
        match reconcile_slot(&SLOT, req("here")) {
            Err(wit::ReconcileError::Retryable(m)) => assert!(m.contains("cache down"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
