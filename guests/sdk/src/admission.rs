//! Admission: a plugin that validates ([`Validate`]) or defaults and mutates ([`Mutate`])
//! objects of its kind before the API server stores them — the validating and mutating
//! webhooks of a controller, in the same component as its reconciler.
//!
//! ```no_run
//! use wasmctrl_guest::admission::{AdmissionRequest, Denied, Mutate, Validate};
//! use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
//! use wasmctrl_guest::prelude::*;
//!
//! struct Tidy;
//! impl Plugin for Tidy {
//!     type For = ConfigMap;
//!     fn init(_: Settings) -> Result<Self, InitError> {
//!         Ok(Tidy)
//!     }
//!     fn reconcile(&self, _: Target<ConfigMap>) -> Result<Action, ReconcileError> {
//!         Ok(Action::Done)
//!     }
//! }
//!
//! impl Validate for Tidy {
//!     fn validate_create(&self, _: &AdmissionRequest, cm: &ConfigMap) -> Result<(), Denied> {
//!         match cm.data.as_ref().map_or(0, |d| d.len()) {
//!             0 => Err(Denied::invalid("a ConfigMap needs at least one key")),
//!             _ => Ok(()),
//!         }
//!     }
//! }
//!
//! impl Mutate for Tidy {
//!     fn mutate(&self, request: &AdmissionRequest, cm: &mut ConfigMap) -> Result<(), Denied> {
//!         let labels = cm.metadata.labels.get_or_insert_with(Default::default);
//!         if labels.insert("tidy".into(), "yes".into()).is_none() {
//!             request.warn("labelled tidy=yes");
//!         }
//!         Ok(())
//!     }
//! }
//!
//! wasmctrl_guest::export_plugin!(Tidy, admission = [validate, mutate]);
//! ```
//!
//! The plugin's TOML says which requests reach it (`[[admission]]` sections: kinds,
//! operations, selectors, failure policy, timeout); the host answers the API server.
//!
//! Invariants:
//! - The typed traits handle requests for the plugin's `For` kind; a request for another
//!   kind (a TOML naming others) is refused with a message saying so, never handed over as
//!   the wrong type. An object that does not decode as `For` is refused with code 400, as
//!   controller-runtime's webhooks answer undecodable objects.
//! - A mutation is sent as the JSON patch from the object as received to the object as
//!   [`Mutate::mutate`] left it. Fields `For` does not know are not in the typed object, so
//!   the patch never removes a field unless [`Mutate::REMOVES_FIELDS`] says so (as
//!   controller-runtime's defaulters do by default).
//! - Warnings added with [`AdmissionRequest::warn`] go to the client whatever the answer.

use std::cell::RefCell;

use crate::{Gvk, Kind, Plugin, RawObject};

/// The operation being admitted. A patch arrives as the create or update it results in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// The object is being created.
    Create,
    /// The object is being updated (replaced or patched).
    Update,
    /// The object is being deleted.
    Delete,
    /// A connect to a subresource (e.g. `pods/exec`).
    Connect,
}

/// Who sent the request, as the API server authenticated them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name (`system:serviceaccount:ns:name` for a ServiceAccount).
    pub username: String,
    /// The user's UID.
    pub uid: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// Extra attributes the authenticator provided.
    pub extra: Vec<(String, Vec<String>)>,
}

/// An admission request, as the API server sent it to the host.
#[derive(Debug)]
pub struct AdmissionRequest {
    /// Identifies this request (for logs).
    pub uid: String,
    /// The kind of `object` and `old_object`.
    pub kind: Gvk,
    /// The resource, plural (`websites`).
    pub resource: String,
    /// The subresource, if any.
    pub sub_resource: Option<String>,
    /// The object's name; empty on a create whose name the API server generates.
    pub name: String,
    /// `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    /// What is being done.
    pub operation: Operation,
    /// Who is doing it.
    pub user_info: UserInfo,
    /// The object as it would be stored (`None` on delete).
    pub object: Option<RawObject>,
    /// The object as stored now (update and delete).
    pub old_object: Option<RawObject>,
    /// Nothing of the request will be persisted.
    pub dry_run: bool,
    /// The operation's options (`CreateOptions`, ...), as JSON.
    pub options: Option<RawObject>,
    warnings: RefCell<Vec<String>>,
}

impl AdmissionRequest {
    /// A request to create `object` (tests build requests with these).
    pub fn create<K: Kind>(object: &K) -> Result<Self, crate::Error> {
        let json = crate::to_json(object)?;
        Ok(Self::of::<K>(Operation::Create, Some(json), None, object))
    }

    /// A request to replace `old` with `new`.
    pub fn update<K: Kind>(old: &K, new: &K) -> Result<Self, crate::Error> {
        let (o, n) = (crate::to_json(old)?, crate::to_json(new)?);
        Ok(Self::of::<K>(Operation::Update, Some(n), Some(o), new))
    }

    /// A request to delete `old`.
    pub fn delete<K: Kind>(old: &K) -> Result<Self, crate::Error> {
        let json = crate::to_json(old)?;
        Ok(Self::of::<K>(Operation::Delete, None, Some(json), old))
    }

    fn of<K: Kind>(operation: Operation, object: Option<Vec<u8>>, old: Option<Vec<u8>>, named: &K) -> Self {
        use crate::KindExt;
        let mut request = AdmissionRequest::blank(operation);
        request.kind = Gvk::of::<K>();
        request.name = named.name().to_owned();
        request.namespace = named.namespace().map(str::to_owned);
        request.object = object.map(RawObject::from_json);
        request.old_object = old.map(RawObject::from_json);
        request
    }

    /// A request for `operation` with every other field empty.
    pub(crate) fn blank(operation: Operation) -> Self {
        AdmissionRequest {
            uid: String::new(),
            kind: Gvk::new("", ""),
            resource: String::new(),
            sub_resource: None,
            name: String::new(),
            namespace: None,
            operation,
            user_info: UserInfo::default(),
            object: None,
            old_object: None,
            dry_run: false,
            options: None,
            warnings: RefCell::default(),
        }
    }

    /// This request, marked as a dry run.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// Adds a warning the client sees (`kubectl` prints `Warning: ...`), whatever the
    /// answer. Keep it short: the API server truncates long warnings.
    pub fn warn(&self, message: impl Into<String>) {
        self.warnings.borrow_mut().push(message.into());
    }

    /// The warnings added so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.borrow().clone()
    }

    /// `namespace/name` (or `name`).
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    pub(crate) fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut self.warnings.borrow_mut())
    }
}

/// Why a request is refused, as the client sees it: `kubectl` prints the message after
/// `admission webhook "..." denied the request: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    message: String,
    code: Option<u16>,
}

impl Denied {
    /// Refused (HTTP 403, Forbidden).
    pub fn new(message: impl Into<String>) -> Self {
        Denied { message: message.into(), code: None }
    }

    /// Refused because the object is invalid (HTTP 422, Invalid).
    pub fn invalid(message: impl Into<String>) -> Self {
        Denied::with_code(422, message)
    }

    /// Refused with this HTTP error code (400–599).
    pub fn with_code(code: u16, message: impl Into<String>) -> Self {
        Denied { message: message.into(), code: Some(code) }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP code, when not the default 403.
    pub fn code(&self) -> Option<u16> {
        self.code
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// `?` on a host call while admitting: the request is refused with the error's message and
/// its HTTP code (500 when it has none).
impl From<crate::Error> for Denied {
    fn from(e: crate::Error) -> Self {
        Denied::with_code(e.status_code().filter(|c| *c >= 400).unwrap_or(500), e.to_string())
    }
}

/// A validating webhook on the plugin's kind. Each method admits by default: implement
/// the operations that need checking. List `validate` in
/// [`export_plugin!`](crate::export_plugin)'s `admission = [...]`.
pub trait Validate: Plugin {
    /// `object` is being created.
    fn validate_create(&self, request: &AdmissionRequest, object: &Self::For) -> Result<(), Denied> {
        let _ = (request, object);
        Ok(())
    }

    /// `old` is being replaced by `new`.
    fn validate_update(
        &self,
        request: &AdmissionRequest,
        old: &Self::For,
        new: &Self::For,
    ) -> Result<(), Denied> {
        let _ = (request, old, new);
        Ok(())
    }

    /// `old` is being deleted.
    fn validate_delete(&self, request: &AdmissionRequest, old: &Self::For) -> Result<(), Denied> {
        let _ = (request, old);
        Ok(())
    }
}

/// A mutating (defaulting) webhook on the plugin's kind, called on create and update (a
/// delete is admitted unchanged). List `mutate` in
/// [`export_plugin!`](crate::export_plugin)'s `admission = [...]`.
pub trait Mutate: Plugin {
    /// Whether the patch may remove fields. Off by default: `For` may not know every field
    /// of the object (a newer API version, a CRD field the Rust type lacks), and removing
    /// what it does not know would drop it from the stored object. On, a field set to
    /// `None` by [`Mutate::mutate`] is removed too.
    const REMOVES_FIELDS: bool = false;

    /// Changes `object` (defaults, normalisation); what changed is sent as a JSON patch.
    /// `request.old_object` holds the stored object on update.
    fn mutate(&self, request: &AdmissionRequest, object: &mut Self::For) -> Result<(), Denied>;
}

/// A plugin's answer to an admission request, as [`crate::testing`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `None`: admitted.
    pub denied: Option<Denied>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether the request was admitted.
    pub fn allowed(&self) -> bool {
        self.denied.is_none()
    }
}

/// Validates `request` with `plugin`'s typed methods.
pub(crate) fn validate<P: Validate>(plugin: &P, request: &AdmissionRequest) -> Verdict {
    let outcome = typed::<P>(request).and_then(|()| {
        let decode = |o: &Option<RawObject>, what: &str| decode_object::<P::For>(o.as_ref(), what);
        match request.operation {
            Operation::Create => plugin.validate_create(request, &decode(&request.object, "object")?),
            Operation::Update => plugin.validate_update(
                request,
                &decode(&request.old_object, "old object")?,
                &decode(&request.object, "object")?,
            ),
            Operation::Delete => plugin.validate_delete(request, &decode(&request.old_object, "old object")?),
            Operation::Connect => Ok(()),
        }
    });
    Verdict { denied: outcome.err(), warnings: request.take_warnings() }
}

/// Mutates `request`'s object with `plugin`: the verdict and, when admitted and changed,
/// the JSON patch.
pub(crate) fn mutate<P: Mutate>(
    plugin: &P,
    request: &AdmissionRequest,
) -> (Verdict, Option<json_patch::Patch>) {
    let outcome = typed::<P>(request).and_then(|()| match request.operation {
        Operation::Create | Operation::Update => {
            let raw = request.object.as_ref();
            let before: serde_json::Value = raw
                .ok_or_else(|| Denied::with_code(400, "the request has no object"))?
                .parse_as()
                .map_err(|e| Denied::with_code(400, format!("decoding the object: {e}")))?;
            let mut object = decode_object::<P::For>(raw, "object")?;
            plugin.mutate(request, &mut object)?;
            let after = crate::to_json(&object)
                .and_then(|json| {
                    crate::kind::parse_json::<serde_json::Value>(&json).map_err(crate::Error::from)
                })
                .map_err(|e| Denied::with_code(500, format!("encoding the mutated object: {e}")))?;
            let mut patch = json_patch::diff(&before, &after);
            if !P::REMOVES_FIELDS {
                patch.0.retain(|op| !matches!(op, json_patch::PatchOperation::Remove(_)));
            }
            Ok((!patch.0.is_empty()).then_some(patch))
        }
        Operation::Delete | Operation::Connect => Ok(None),
    });
    let warnings = request.take_warnings();
    match outcome {
        Ok(patch) => (Verdict { denied: None, warnings }, patch),
        Err(denied) => (Verdict { denied: Some(denied), warnings }, None),
    }
}

/// Refuses a request for another kind than the plugin's.
fn typed<P: Plugin>(request: &AdmissionRequest) -> Result<(), Denied> {
    if request.kind.is::<P::For>() {
        return Ok(());
    }
    Err(Denied::with_code(
        500,
        format!(
            "this plugin admits {} objects only (its Validate/Mutate are on its `For` kind); the request is for {}: \
             admit only `For` in its [[admission]] sections",
            Gvk::of::<P::For>(),
            request.kind
        ),
    ))
}

fn decode_object<K: Kind>(raw: Option<&RawObject>, what: &str) -> Result<K, Denied> {
    let raw = raw.ok_or_else(|| Denied::with_code(400, format!("the request has no {what}")))?;
    raw.parse::<K>().map_err(|e| Denied::with_code(400, format!("decoding the {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};

    use super::*;
    use crate::{Action, InitError, ReconcileError, Settings, Target};

    struct Policy;
    impl Plugin for Policy {
        type For = ConfigMap;
        fn init(_: Settings) -> Result<Self, InitError> {
            Ok(Policy)
        }
        fn reconcile(&self, _: Target<ConfigMap>) -> Result<Action, ReconcileError> {
            Ok(Action::Done)
        }
    }
    impl Validate for Policy {
        fn validate_create(&self, request: &AdmissionRequest, cm: &ConfigMap) -> Result<(), Denied> {
            request.warn("checked");
            if cm.data.is_none() {
                return Err(Denied::invalid("data is required"));
            }
            Ok(())
        }
        fn validate_update(
            &self,
            _: &AdmissionRequest,
            old: &ConfigMap,
            new: &ConfigMap,
        ) -> Result<(), Denied> {
            if old.data != new.data {
                return Err(Denied::new("data is immutable"));
            }
            Ok(())
        }
    }
    impl Mutate for Policy {
        fn mutate(&self, _: &AdmissionRequest, cm: &mut ConfigMap) -> Result<(), Denied> {
            cm.metadata.labels.get_or_insert_with(Default::default).insert("tier".into(), "gold".into());
            cm.metadata.annotations = None;
            Ok(())
        }
    }

    fn cm(data: Option<&str>) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.annotations = Some([("note".to_owned(), "keep".to_owned())].into());
        cm.data = data.map(|d| [("k".to_owned(), d.to_owned())].into());
        cm
    }

    #[test]
    fn each_operation_reaches_its_method_with_typed_objects_and_warnings() {
        let v = validate(&Policy, &AdmissionRequest::create(&cm(None)).unwrap());
        assert_eq!(v.denied, Some(Denied::invalid("data is required")));
        assert_eq!(v.warnings, ["checked"]);
        assert!(validate(&Policy, &AdmissionRequest::create(&cm(Some("x"))).unwrap()).allowed());
        let v = validate(&Policy, &AdmissionRequest::update(&cm(Some("x")), &cm(Some("y"))).unwrap());
        assert_eq!(v.denied.unwrap().code(), None);
        assert!(validate(&Policy, &AdmissionRequest::delete(&cm(None)).unwrap()).allowed());
    }

    #[test]
    fn other_kinds_and_undecodable_objects_are_refused_with_a_reason() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        let v = validate(&Policy, &AdmissionRequest::create(&pod).unwrap());
        let denied = v.denied.unwrap();
        assert!(denied.message().contains("v1/ConfigMap objects only"), "{denied}");
        let mut request = AdmissionRequest::create(&cm(Some("x"))).unwrap();
        request.object = Some(RawObject::from_json(br#"{"data":{"k":1}}"#.to_vec()));
        let denied = validate(&Policy, &request).denied.unwrap();
        assert_eq!(denied.code(), Some(400));
    }

    #[test]
    fn a_mutation_is_the_patch_from_the_object_received_and_removes_nothing_by_default() {
        let (v, patch) = mutate(&Policy, &AdmissionRequest::create(&cm(Some("x"))).unwrap());
        assert!(v.allowed());
        let patch = serde_json::to_value(patch.unwrap()).unwrap();
        assert_eq!(
            patch,
            serde_json::json!([{"op": "add", "path": "/metadata/labels", "value": {"tier": "gold"}}])
        );
        // Nothing to change on delete.
        let (v, patch) = mutate(&Policy, &AdmissionRequest::delete(&cm(Some("x"))).unwrap());
        assert!(v.allowed() && patch.is_none());
    }

    #[test]
    fn host_errors_deny_with_their_code() {
        assert_eq!(Denied::from(crate::Error::Unavailable("down".into())).code(), Some(503));
        assert_eq!(Denied::from(crate::Error::Json("bad".into())).code(), Some(500));
    }
}
