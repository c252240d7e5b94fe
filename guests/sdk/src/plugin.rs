//! The [`Plugin`] trait a controller implements, its optional hook traits, and the values
//! its exports take and return. The glue to the WIT exports is in `export`.
//!
//! Invariants: a plugin names the kind it reconciles once, as [`Plugin::For`]; its hooks
//! are the hook traits it implements ([`OnAdd`], [`OnUpdate`], [`OnDelete`], [`Map`],
//! [`Filter`]) — there is no separate list of them that could disagree with the code.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::bindings::exports::wasmctrl::controller::reconciler as wit;
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

/// A set of optional hooks (the WIT `hooks` flags). [`export_plugin!`](crate::export_plugin)
/// computes it from the hook traits a plugin implements; the host calls only those.
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

    pub(crate) fn to_wit(self) -> wit::Hooks {
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
        crate::kind::parse_json(json).map_err(|e| crate::Error::json("decoding [settings]", e))
    }
}

/// What [`Plugin::reconcile`] is handed: the object of the plugin's `for` kind as the
/// host's cache has it, or — when the cache has no object under the queued key — the
/// request alone, because the object was deleted (or never existed).
#[derive(Clone, Debug, PartialEq)]
pub enum Target<K> {
    /// The object, as cached when the reconcile started.
    Present(K),
    /// No such object any more: clean up whatever it left behind.
    Gone(Request),
}

impl<K: Kind> Target<K> {
    /// The request being reconciled (`namespace/name`).
    pub fn request(&self) -> Request {
        match self {
            Target::Present(object) => Request::for_object(object),
            Target::Gone(request) => request.clone(),
        }
    }

    /// The object, when it exists.
    pub fn present(self) -> Option<K> {
        match self {
            Target::Present(object) => Some(object),
            Target::Gone(_) => None,
        }
    }

    /// The object by reference, when it exists.
    pub fn as_present(&self) -> Option<&K> {
        match self {
            Target::Present(object) => Some(object),
            Target::Gone(_) => None,
        }
    }
}

/// Why [`Plugin::init`] refused to start; the host rejects this version of the plugin and
/// shows the message (in its log, `/readyz`, and `wasmctrl check`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitError {
    message: String,
}

impl InitError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        InitError { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InitError {}

/// `settings.parse()?` in `init`: the settings did not decode.
impl From<crate::Error> for InitError {
    fn from(err: crate::Error) -> Self {
        InitError::new(err.to_string())
    }
}

impl From<String> for InitError {
    fn from(message: String) -> Self {
        InitError::new(message)
    }
}

impl From<&str> for InitError {
    fn from(message: &str) -> Self {
        InitError::new(message)
    }
}

/// A controller's business logic.
///
/// The host calls [`init`](Plugin::init) once per instance, then
/// [`reconcile`](Plugin::reconcile) for each queued key of the `for` kind. The SDK reads
/// the object from the host's cache before calling `reconcile`, and reports
/// [`For`](Plugin::For) to the host at `init`: a component whose `For` differs from its
/// TOML's `[for]` is rejected, with both kinds named.
///
/// Optional hooks are separate traits — implement [`Map`] (needed for `[[watches]]`),
/// [`Filter`] (for `filter = true` predicates), [`OnAdd`], [`OnUpdate`] or [`OnDelete`]
/// and [`export_plugin!`](crate::export_plugin) declares exactly those to the host.
pub trait Plugin: Sized + 'static {
    /// The kind this plugin reconciles: a k8s-openapi type or a CRD type with [`Kind`]
    /// (see [`impl_kind!`](crate::impl_kind)).
    type For: Kind;

    /// Builds the plugin from its TOML's `[settings]` (called once per instance, before
    /// anything else). An error rejects this version of the plugin.
    fn init(settings: Settings) -> Result<Self, InitError>;

    /// Brings the world in line with `target`: the object of the `for` kind, or
    /// [`Target::Gone`] when it was deleted. Must be idempotent: it is called again after
    /// every change and on resync.
    fn reconcile(&self, target: Target<Self::For>) -> Result<Action, ReconcileError>;
}

/// Hook: an object of a watched kind was added (`in_initial_list` during the first list).
pub trait OnAdd: Plugin {
    /// Called for every kind the plugin watches (`for`, `owns`, `watches`).
    fn on_add(&self, kind: &Gvk, object: RawObject, in_initial_list: bool);
}

/// Hook: an object of a watched kind changed.
pub trait OnUpdate: Plugin {
    /// Called with the old and new state.
    fn on_update(&self, kind: &Gvk, old: RawObject, new: RawObject);
}

/// Hook: an object of a watched kind was deleted.
pub trait OnDelete: Plugin {
    /// With `final_state_unknown` the delete was missed while the watch was down and
    /// `object` is the last state the cache knew.
    fn on_delete(&self, kind: &Gvk, object: RawObject, final_state_unknown: bool);
}

/// Hook, required by `[[watches]]`: which requests of the `for` kind an object of a
/// watched kind affects.
pub trait Map: Plugin {
    /// The requests to enqueue for `object` (of `kind`).
    fn map(&self, kind: &Gvk, object: RawObject) -> Vec<Request>;
}

/// Hook, required by a `filter = true` predicate: `false` drops the event before it
/// reaches the queue.
pub trait Filter: Plugin {
    /// Whether `event` (about an object of `kind`) goes on to the queue.
    fn filter(&self, kind: &Gvk, event: FilterEvent) -> bool;
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

    #[test]
    fn target_knows_its_request() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.namespace = Some("ns".into());
        let present = Target::Present(cm.clone());
        assert_eq!(present.request(), Request::new(Some("ns"), "a"));
        assert_eq!(present.as_present(), Some(&cm));
        let gone: Target<ConfigMap> = Target::Gone(Request::new(Some("ns"), "b"));
        assert_eq!(gone.request().key(), "ns/b");
        assert_eq!(gone.present(), None);
    }

    #[test]
    fn init_error_from_settings_error_keeps_the_message() {
        let err: InitError = Settings::from_json(b"[1]".to_vec())
            .parse::<std::collections::BTreeMap<String, String>>()
            .unwrap_err()
            .into();
        assert!(err.message().contains("decoding [settings]"), "{err}");
        assert_eq!(InitError::from("no").to_string(), "no");
    }
}
