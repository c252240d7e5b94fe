//! What one plugin may touch: the permission checks shared by the imports (`cache`,
//! `client`, `events`) and by the calls that hand objects to the guest (hooks, `map`,
//! `filter`), so every path where object bytes reach a guest applies one rule.
//!
//! Invariants:
//! - A kind the plugin's TOML did not declare readable (writable) is refused with
//!   `forbidden` before any cache or API server is touched; so is a namespace outside the
//!   plugin's namespaces, and, for a plugin limited to namespaces, a write of a
//!   cluster-scoped kind. Every refusal is counted in `wasmctrl_plugin_forbidden_calls` and
//!   logged with the plugin, request, kind and call.
//! - An object the guest is sent (hook, `map`, `filter`, a write's response) is whole only
//!   when its kind is readable; otherwise the guest gets its metadata only
//!   ([`metadata_only`]: `apiVersion`, `kind`, `metadata` without `managedFields` and without
//!   the last-applied annotation, which copies the object). An object outside the plugin's
//!   namespaces is not sent at all ([`GuestView::Withheld`]).
//! - A guest-provided body larger than the plugin's `max-output` is refused as `invalid`.
//! - A call that may not write (an admission call without side effects, see
//!   [`CallInfo::writes_refused`]) has every write refused with `forbidden`, whatever the kind.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::call::CallInfo;
use crate::plugin::bindings::wasmctrl::controller::types::Error as WitError;
use crate::plugin::metrics::RuntimeMetrics;
use crate::plugin::spec::{Gvk, Permissions, SandboxLimits};

/// The annotation `kubectl apply` keeps a copy of the applied object in.
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// One plugin's grants, shared by every instance of it.
pub(crate) struct Access {
    plugin: String,
    permissions: Permissions,
    max_output: usize,
    /// The instance's memory limit: a list result larger than this could not be held.
    memory: usize,
    metrics: RuntimeMetrics,
}

/// What a guest may be sent of one object.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GuestView<'a> {
    /// The object as it is.
    Whole(&'a [u8]),
    /// `apiVersion`, `kind` and `metadata` only: its kind is not readable.
    MetadataOnly(Vec<u8>),
    /// Nothing: the object is outside the plugin's namespaces.
    Withheld,
}

impl GuestView<'_> {
    /// The bytes to send; `None` when withheld.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            GuestView::Whole(b) => Some(b),
            GuestView::MetadataOnly(b) => Some(b),
            GuestView::Withheld => None,
        }
    }
}

/// The part of an object's JSON the views read.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    metadata: HeadMeta<'a>,
}

#[derive(Default, Deserialize)]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
}

/// The namespace an object's JSON names (`None`: none, or not an object).
pub(crate) fn namespace_of(json: &[u8]) -> Option<String> {
    serde_json::from_slice::<Head<'_>>(json)
        .ok()
        .and_then(|h| h.metadata.namespace)
        .filter(|ns| !ns.is_empty())
        .map(Cow::into_owned)
}

/// `apiVersion`, `kind` and `metadata` of an object's JSON, without `metadata.managedFields`
/// and without the last-applied annotation (a copy of the object as applied). JSON that is
/// not an object gives `{}`.
pub(crate) fn metadata_only(json: &[u8]) -> Vec<u8> {
    let Ok(mut object) = serde_json::from_slice::<Map<String, Value>>(json) else { return b"{}".to_vec() };
    let mut out = Map::new();
    for field in ["apiVersion", "kind"] {
        if let Some(v) = object.remove(field) {
            out.insert(field.into(), v);
        }
    }
    if let Some(Value::Object(mut meta)) = object.remove("metadata") {
        meta.remove("managedFields");
        if let Some(Value::Object(annotations)) = meta.get_mut("annotations") {
            annotations.remove(LAST_APPLIED);
        }
        out.insert("metadata".into(), Value::Object(meta));
    }
    serde_json::to_vec(&Value::Object(out)).unwrap_or_else(|_| b"{}".to_vec())
}

impl Access {
    pub fn new(
        plugin: String,
        permissions: Permissions,
        limits: &SandboxLimits,
        metrics: RuntimeMetrics,
    ) -> Self {
        Access { plugin, permissions, max_output: limits.max_output, memory: limits.memory, metrics }
    }

    /// The plugin's name.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// The runtime's metrics (for the imports' drop counters).
    pub fn metrics(&self) -> &RuntimeMetrics {
        &self.metrics
    }

    /// Whether the plugin may read objects of `kind`.
    pub fn can_read(&self, kind: &Gvk) -> bool {
        self.permissions.can_read(kind)
    }

    /// Whether an object in `namespace` is in the plugin's scope.
    pub fn in_scope(&self, namespace: Option<&str>) -> bool {
        self.permissions.in_scope(namespace)
    }

    /// Whether the plugin is limited to some namespaces.
    pub fn is_namespace_scoped(&self) -> bool {
        self.permissions.namespaces().is_some()
    }

    /// Refuses `kind` unless readable: counts and logs the refusal.
    pub fn check_read(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        if self.permissions.can_read(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "read"))
    }

    /// Refuses `kind` unless writable: counts and logs the refusal.
    pub fn check_write(&self, kind: &Gvk, call: &CallInfo, op: &'static str) -> Result<(), WitError> {
        check_call_may_write(&self.plugin, call)?;
        if self.permissions.can_write(kind) {
            return Ok(());
        }
        Err(self.forbidden(kind, call, op, "write"))
    }

    /// Refuses `namespace` when it is outside the plugin's namespaces (`None`, a
    /// cluster-scoped object, is refused only for writes of a namespace-limited plugin).
    pub fn check_namespace(
        &self,
        kind: &Gvk,
        namespace: Option<&str>,
        write: bool,
        call: &CallInfo,
        op: &'static str,
    ) -> Result<(), WitError> {
        let Some(scope) = self.permissions.namespaces() else { return Ok(()) };
        let verb = if write { "write" } else { "read" };
        let listed = scope.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
        let (place, why) = match namespace {
            Some(ns) if scope.contains(ns) => return Ok(()),
            Some(ns) => (format!("in namespace {ns}"), format!("it is limited to the namespaces {listed}")),
            None if !write => return Ok(()),
            None => (
                "(a cluster-scoped kind)".to_owned(),
                format!("it is limited to the namespaces {listed} and writes nothing outside them"),
            ),
        };
        self.metrics.count_forbidden(&self.plugin, op);
        tracing::warn!(
            plugin = %self.plugin,
            request = call.request.as_deref().unwrap_or(""),
            kind = %kind,
            namespace = namespace.unwrap_or(""),
            op,
            "plugin refused: namespace outside the plugin's namespaces"
        );
        Err(WitError::Forbidden(format!(
            "plugin {} may not {verb} {kind} {place}: {why} (permissions.namespaces, or [for].namespace)",
            self.plugin
        )))
    }

    fn forbidden(&self, kind: &Gvk, call: &CallInfo, op: &'static str, verb: &str) -> WitError {
        self.metrics.count_forbidden(&self.plugin, op);
        tracing::warn!(
            plugin = %self.plugin,
            request = call.request.as_deref().unwrap_or(""),
            kind = %kind,
            op,
            "plugin refused: kind not declared {verb}able"
        );
        let hint = match verb {
            "read" if kind.is_secret() => "list it in permissions.read",
            "read" => "add it to for/owns/watches or permissions.read",
            _ => "add it to permissions.write",
        };
        WitError::Forbidden(format!(
            "plugin {} may not {verb} {kind}: {hint} in the plugin's TOML",
            self.plugin
        ))
    }

    /// Refuses a guest-provided body larger than `max-output`.
    pub fn check_input_size(&self, len: usize, what: &str) -> Result<(), WitError> {
        let max = self.max_output;
        if len > max {
            return Err(WitError::Invalid(format!(
                "{what} is {len} bytes, over the plugin's max-output of {max}"
            )));
        }
        Ok(())
    }

    /// What the guest may be sent of `json`, an object of `kind` (a hook's, `map`'s or
    /// `filter`'s argument).
    pub fn guest_view<'a>(&self, kind: &Gvk, json: &'a [u8]) -> GuestView<'a> {
        if self.is_namespace_scoped() && !self.in_scope(namespace_of(json).as_deref()) {
            return GuestView::Withheld;
        }
        if self.permissions.can_read(kind) {
            GuestView::Whole(json)
        } else {
            GuestView::MetadataOnly(metadata_only(json))
        }
    }

    /// The response of a write of `kind` as the guest may see it: whole when the kind is
    /// readable, else its metadata only (writing must not be a way to read).
    pub fn write_response(&self, kind: &Gvk, body: Vec<u8>) -> Vec<u8> {
        if self.permissions.can_read(kind) { body } else { metadata_only(&body) }
    }

    /// The most bytes of objects one `cache.list` or `cache.by-index` may return: the
    /// instance's memory limit (the guest could not hold more).
    pub fn list_budget(&self) -> usize {
        self.memory
    }
}

/// Refuses any write of a call that may not write (see [`CallInfo::writes_refused`]).
pub(crate) fn check_call_may_write(plugin: &str, call: &CallInfo) -> Result<(), WitError> {
    match &call.writes_refused {
        None => Ok(()),
        Some(why) => {
            tracing::warn!(plugin, export = call.export, request = call.request.as_deref().unwrap_or(""), reason = %why, "plugin write refused during an admission call");
            Err(WitError::Forbidden(format!("plugin {plugin} may not write during this call: {why}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(permissions: Permissions) -> Access {
        Access::new("p".into(), permissions, &SandboxLimits::default(), RuntimeMetrics::default())
    }

    const SECRET: &[u8] = br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"a","annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"k\":\"djE=\"}}","team":"x"},"managedFields":[{"manager":"m","fieldsV1":{"f:data":{"f:k":{}}}}]},"data":{"k":"djE="},"type":"Opaque"}"#;

    #[test]
    fn metadata_only_keeps_the_envelope_and_drops_every_copy_of_the_content() {
        let v: Value = serde_json::from_slice(&metadata_only(SECRET)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"a","annotations":{"team":"x"}}})
        );
        assert_eq!(metadata_only(b"[1,2]"), b"{}");
        assert_eq!(metadata_only(b"not json"), b"{}");
    }

    #[test]
    fn unreadable_kinds_are_sent_as_metadata_and_other_namespaces_not_at_all() {
        let secret = Gvk::new("v1", "Secret");
        let a = access(Permissions::new([secret.clone()], [], []));
        assert!(
            matches!(a.guest_view(&secret, SECRET), GuestView::MetadataOnly(b) if !String::from_utf8_lossy(&b).contains("djE="))
        );
        let a = access(Permissions::new([secret.clone()], [secret.clone()], []));
        assert_eq!(a.guest_view(&secret, SECRET), GuestView::Whole(SECRET));
        let a = access(Permissions::new([secret.clone()], [secret.clone()], []).with_namespaces(["b"]));
        assert_eq!(a.guest_view(&secret, SECRET), GuestView::Withheld);
        let node = br#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}"#;
        let a = access(Permissions::new([Gvk::new("v1", "Node")], [], []).with_namespaces(["b"]));
        assert_eq!(a.guest_view(&Gvk::new("v1", "Node"), node), GuestView::Whole(node));
    }

    #[test]
    fn namespace_checks_name_the_scope() {
        let a = access(Permissions::new([Gvk::new("v1", "ConfigMap")], [], []).with_namespaces(["a", "b"]));
        let call = CallInfo::idle();
        let cm = Gvk::new("v1", "ConfigMap");
        assert!(a.check_namespace(&cm, Some("a"), true, &call, "t").is_ok());
        assert!(a.check_namespace(&cm, None, false, &call, "t").is_ok());
        match a.check_namespace(&cm, Some("c"), false, &call, "t") {
            Err(WitError::Forbidden(m)) => assert!(m.contains("namespace c") && m.contains("a, b"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(a.check_namespace(&cm, None, true, &call, "t"), Err(WitError::Forbidden(_))));
        let open = access(Permissions::new([cm.clone()], [], []));
        assert!(open.check_namespace(&cm, Some("c"), true, &call, "t").is_ok());
    }
}
