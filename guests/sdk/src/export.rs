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
//! - The admission exports (`validator`, `mutator`) are emitted exactly for the names listed
//!   in `export_plugin!(.., admission = [..])`, each requiring its trait; a plugin that
//!   implements [`Validate`] or [`Mutate`] without listing it fails `init` with a message
//!   saying what to write, so a webhook is never silently left out.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::thread::LocalKey;

use crate::admission::{AdmissionRequest, Mutate, Operation, UserInfo, Validate, Verdict};
use crate::admission_bindings::mutator::exports::wasmctrl::controller::mutator as wit_mutator;
use crate::admission_bindings::validator::wasmctrl::controller::admission as wit_admission;
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

/// A plugin's `validate` as a plain function.
#[doc(hidden)]
pub type ValidateFn<P> = fn(&P, &AdmissionRequest) -> Verdict;

/// A plugin's `mutate` as a plain function.
#[doc(hidden)]
pub type MutateFn<P> = fn(&P, &AdmissionRequest) -> (Verdict, Option<json_patch::Patch>);

/// The hook functions one plugin type implements (`None`: not implemented).
#[doc(hidden)]
pub struct HookTable<P> {
    pub on_add: Option<fn(&P, &Gvk, RawObject, bool)>,
    pub on_update: Option<fn(&P, &Gvk, RawObject, RawObject)>,
    pub on_delete: Option<fn(&P, &Gvk, RawObject, bool)>,
    pub map: Option<MapFn<P>>,
    pub filter: Option<fn(&P, &Gvk, FilterEvent) -> bool>,
    /// [`Validate`], when implemented.
    pub validate: Option<ValidateFn<P>>,
    /// [`Mutate`], when implemented.
    pub mutate: Option<MutateFn<P>>,
    /// The admission exports `export_plugin!` emits: `(validator, mutator)`.
    pub exported: (bool, bool),
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

/// [`Validate`] (the trait has several methods: its hook is the SDK's dispatch over them).
#[doc(hidden)]
pub trait HasValidate<P> {
    fn validate_hook(&self) -> Option<ValidateFn<P>>;
}
impl<P: Validate> HasValidate<P> for &Probe<P> {
    fn validate_hook(&self) -> Option<ValidateFn<P>> {
        Some(crate::admission::validate::<P>)
    }
}
#[doc(hidden)]
pub trait NoValidate<P> {
    fn validate_hook(&self) -> Option<ValidateFn<P>>;
}
impl<P> NoValidate<P> for Probe<P> {
    fn validate_hook(&self) -> Option<ValidateFn<P>> {
        None
    }
}

/// [`Mutate`], as [`HasValidate`].
#[doc(hidden)]
pub trait HasMutate<P> {
    fn mutate_hook(&self) -> Option<MutateFn<P>>;
}
impl<P: Mutate> HasMutate<P> for &Probe<P> {
    fn mutate_hook(&self) -> Option<MutateFn<P>> {
        Some(crate::admission::mutate::<P>)
    }
}
#[doc(hidden)]
pub trait NoMutate<P> {
    fn mutate_hook(&self) -> Option<MutateFn<P>>;
}
impl<P> NoMutate<P> for Probe<P> {
    fn mutate_hook(&self) -> Option<MutateFn<P>> {
        None
    }
}

/// Registers `$ty` (a [`Plugin`]) as this component's `reconciler` export, and as its
/// `validator` and `mutator` exports when listed: `export_plugin!(MyPlugin, admission =
/// [validate, mutate])` (each needs its trait, [`Validate`] or [`Mutate`]; the host reads
/// from the component's exports which webhooks it can answer).
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
/// The allocator comes before `admission`: `export_plugin!(P, allocator = system, admission = [validate])`.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty, allocator = arena $(, admission = [$($admit:ident),* $(,)?])?) => {
        #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
        #[global_allocator]
        static __WASMCTRL_ALLOCATOR: $crate::arena::GlobalCallArena = $crate::arena::GlobalCallArena;

        $crate::export_plugin!($ty, allocator = system, admission = [$($($admit),*)?]);
    };
    ($ty:ty $(, admission = [$($admit:ident),* $(,)?])?) => {
        $crate::export_plugin!($ty, allocator = arena, admission = [$($($admit),*)?]);
    };
    ($ty:ty, allocator = system) => {
        $crate::export_plugin!($ty, allocator = system, admission = []);
    };
    ($ty:ty, allocator = system, admission = [$($admit:ident),* $(,)?]) => {
        impl $crate::__private::Exported for $ty {
            fn hook_table() -> $crate::__private::HookTable<Self> {
                #[allow(unused_imports)]
                use $crate::__private::{
                    HasFilter as _, HasMap as _, HasMutate as _, HasOnAdd as _, HasOnDelete as _, HasOnUpdate as _,
                    HasValidate as _, NoFilter as _, NoMap as _, NoMutate as _, NoOnAdd as _, NoOnDelete as _,
                    NoOnUpdate as _, NoValidate as _,
                };
                let probe = $crate::__private::Probe::<$ty>::new();
                let listed: &[&str] = &[$(::std::stringify!($admit)),*];
                $crate::__private::HookTable {
                    on_add: (&&probe).on_add_hook(),
                    on_update: (&&probe).on_update_hook(),
                    on_delete: (&&probe).on_delete_hook(),
                    map: (&&probe).map_hook(),
                    filter: (&&probe).filter_hook(),
                    validate: (&&probe).validate_hook(),
                    mutate: (&&probe).mutate_hook(),
                    exported: (listed.contains(&"validate"), listed.contains(&"mutate")),
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

            // The component export names (`wasmctrl:controller/reconciler@0.2.1#init`) are not
            // valid symbols for native linkers, so native builds (unit tests of a plugin
            // crate) skip the export and keep the rest.
            #[cfg(target_arch = "wasm32")]
            $crate::__private::bindings::__export_plugin_world!(__WasmctrlExports with_types_in $crate::__private::bindings);

            $($crate::__export_admission!($ty, $admit, __WASMCTRL_PLUGIN);)*
        };
    };
}

/// One admission export of [`export_plugin!`]: `validate` or `mutate`, over the plugin's
/// slot. Not a stable API.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_admission {
    ($ty:ty, validate, $slot:ident) => {
        #[allow(dead_code)]
        struct __WasmctrlValidator;

        impl $crate::__private::ValidatorGuest for __WasmctrlValidator {
            fn validate(request: $crate::__private::WitAdmissionRequest) -> $crate::__private::WitVerdict {
                $crate::__private::export_call(|| $crate::__private::validate_slot(&$slot, request))
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::__private::validator_bindings::__export_validator!(__WasmctrlValidator with_types_in $crate::__private::validator_bindings);
    };
    ($ty:ty, mutate, $slot:ident) => {
        #[allow(dead_code)]
        struct __WasmctrlMutator;

        impl $crate::__private::MutatorGuest for __WasmctrlMutator {
            fn mutate(request: $crate::__private::WitAdmissionRequest) -> $crate::__private::WitMutation {
                $crate::__private::export_call(|| $crate::__private::mutate_slot(&$slot, request))
            }
        }

        #[cfg(target_arch = "wasm32")]
        $crate::__private::mutator_bindings::__export_mutator!(__WasmctrlMutator with_types_in $crate::__private::mutator_bindings);
    };
    ($ty:ty, $other:ident, $slot:ident) => {
        ::std::compile_error!(::std::concat!(
            "export_plugin!: unknown admission export `",
            ::std::stringify!($other),
            "`: write `validate`, `mutate` or both"
        ));
    };
}

// ---- SDK-level calls (shared by the wasm exports and `testing`) ----

/// Runs `P::init`; on success also returns what `init` reports to the host. A plugin that
/// implements an admission trait without exporting it is refused before `P::init` runs.
pub(crate) fn init<P: Exported>(settings: Vec<u8>) -> Result<(P, Hooks), InitError> {
    let table = P::hook_table();
    for (implemented, exported, name, export) in [
        (table.validate.is_some(), table.exported.0, "Validate", "validate"),
        (table.mutate.is_some(), table.exported.1, "Mutate", "mutate"),
    ] {
        if implemented && !exported {
            return Err(InitError::new(format!(
                "the plugin implements {name} but does not export it: list it in the macro, \
                 `export_plugin!({}, admission = [{export}, ..])`",
                std::any::type_name::<P>().rsplit("::").next().unwrap_or("Plugin")
            )));
        }
    }
    let plugin = P::init(Settings::from_json(settings))?;
    Ok((plugin, table.hooks()))
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

fn request_from_wit(r: wit_admission::AdmissionRequest) -> AdmissionRequest {
    let mut request = match r.operation {
        wit_admission::Operation::Create => AdmissionRequest::blank(Operation::Create),
        wit_admission::Operation::Update => AdmissionRequest::blank(Operation::Update),
        wit_admission::Operation::Delete => AdmissionRequest::blank(Operation::Delete),
        wit_admission::Operation::Connect => AdmissionRequest::blank(Operation::Connect),
    };
    request.uid = r.uid;
    request.kind = gvk_from_wit(r.kind);
    request.resource = r.resource;
    request.sub_resource = r.sub_resource;
    request.name = r.name;
    request.namespace = r.namespace;
    request.user_info = UserInfo {
        username: r.user_info.username,
        uid: r.user_info.uid,
        groups: r.user_info.groups,
        extra: r.user_info.extra,
    };
    request.object = r.object.map(RawObject::from_json);
    request.old_object = r.old_object.map(RawObject::from_json);
    request.dry_run = r.dry_run;
    request.options = r.options.map(RawObject::from_json);
    request
}

fn verdict_to_wit(v: Verdict) -> wit_admission::Verdict {
    wit_admission::Verdict {
        denial: v.denied.map(|d| wit_admission::Denial { message: d.message().to_owned(), code: d.code() }),
        warnings: v.warnings,
    }
}

fn not_ready() -> Verdict {
    Verdict {
        denied: Some(crate::admission::Denied::with_code(500, "plugin called before init")),
        warnings: Vec::new(),
    }
}

#[doc(hidden)]
pub fn validate_slot<P: Validate>(
    slot: &'static SlotKey<P>,
    request: wit_admission::AdmissionRequest,
) -> wit_admission::Verdict {
    let verdict = match loaded(slot) {
        Some(p) => crate::admission::validate(&p.0, &request_from_wit(request)),
        None => not_ready(),
    };
    verdict_to_wit(verdict)
}

#[doc(hidden)]
pub fn mutate_slot<P: Mutate>(
    slot: &'static SlotKey<P>,
    request: wit_admission::AdmissionRequest,
) -> wit_mutator::Mutation {
    let (verdict, patch) = match loaded(slot) {
        Some(p) => crate::admission::mutate(&p.0, &request_from_wit(request)),
        None => (not_ready(), None),
    };
    wit_mutator::Mutation {
        verdict: verdict_to_wit(verdict),
        // A patch of JSON values always encodes.
        patch: patch.map(|p| serde_json::to_vec(&p).unwrap_or_else(|_| b"[]".to_vec())),
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
