//! Host side of the `client` import: live reads and writes through the host's
//! `kube::Client`, for any kind the API server serves (resolved by discovery).
//!
//! Layering: [`ClientCtx`] (the plugin's grants, field manager and cluster access) is this
//! interface's whole host context, reached through [`ClientCtxView`] with the call in
//! progress. Cluster access itself ([`KubeServices`]) lives in [`super::cluster`], shared
//! with the `events` import; this module imports neither `events` nor the store's state.
//!
//! Invariants:
//! - Reads need the kind readable, writes writable (else `forbidden`, logged), checked
//!   before any request is sent; so is the namespace, which must be one of the plugin's
//!   namespaces when it is limited to some (and such a plugin writes no cluster-scoped
//!   kind). Bodies larger than `max-output` are refused as `invalid`.
//! - Writing is no way to read: the response of a write of a kind the plugin may not read
//!   carries its metadata only ([`Access::write_response`]), dry runs included, and the JSON
//!   patch operations that read the stored object (`copy`, `move`, `test`) are refused on
//!   such a kind.
//! - Bodies go to the API server as the guest wrote them and responses of readable kinds
//!   come back as the server sent them (no serde round trip), so unknown fields survive.
//! - Every write carries the plugin's field manager; `apply` may name another manager only
//!   of the form `<own manager>/<suffix>` (1–128 printable ASCII characters, as the API
//!   server requires), so no plugin writes as another.
//! - A guest blocks in these calls (it runs on a blocking thread); the request itself runs
//!   on the tokio runtime and is bounded by what is left of the call's deadline.
//! - Once cluster access is revoked (leader lease lost) every call fails at once as
//!   `unavailable` (see [`super::cluster`]; running plugin calls are interrupted too, see
//!   the runtime).

use std::sync::Arc;

use kube::api::{DeleteParams, GetParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use serde::Deserialize;
use serde_json::value::RawValue;
use wasmtime::component::HasData;

use super::access::Access;
use super::call::CallInfo;
use super::call_log::{CallLog, RecordedWrite, body_value};
use super::cluster::KubeServices;
use crate::plugin::bindings::wasmctrl::controller::client::{
    ApplyOptions as WitApplyOptions, DeleteOptions, Host, PatchBody as WitPatch, Propagation,
};
use crate::plugin::bindings::wasmctrl::controller::types::{Error as WitError, Gvk as WitGvk};
use crate::plugin::spec::{Gvk, owns_field_manager};

/// Where a body says it belongs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(borrow, default)]
    api_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    metadata: HeadMeta<'a>,
}

#[derive(Default, Deserialize)]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<std::borrow::Cow<'a, str>>,
}

struct Target {
    kind: Gvk,
    namespace: Option<String>,
    name: String,
}

fn target_of(object: &[u8]) -> Result<Target, WitError> {
    let head: Head<'_> = serde_json::from_slice(object)
        .map_err(|e| WitError::Invalid(format!("object is not valid JSON: {e}")))?;
    let api_version = head
        .api_version
        .filter(|s| !s.is_empty())
        .ok_or_else(|| WitError::Invalid("object has no apiVersion".into()))?;
    let kind =
        head.kind.filter(|s| !s.is_empty()).ok_or_else(|| WitError::Invalid("object has no kind".into()))?;
    let name = head
        .metadata
        .name
        .filter(|s| !s.is_empty())
        .ok_or_else(|| WitError::Invalid("object has no metadata.name".into()))?;
    Ok(Target {
        kind: Gvk::new(api_version, kind),
        namespace: head.metadata.namespace.filter(|s| !s.is_empty()).map(|s| s.into_owned()),
        name: name.into_owned(),
    })
}

fn validate_segment(what: &str, s: &str) -> Result<(), WitError> {
    if s.is_empty() || s.contains(['/', '?', '#', '%']) || s == "." || s == ".." {
        return Err(WitError::Invalid(format!("{what} {s:?} is not a valid path segment")));
    }
    Ok(())
}

/// The API server accepts field managers of at most 128 printable characters; a plugin
/// may name only its own manager or `<own>/<suffix>`.
fn validate_field_manager<'a>(own: &str, m: &'a str) -> Result<&'a str, WitError> {
    if m.is_empty() || m.len() > 128 || !m.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(WitError::Invalid(format!(
            "field manager {m:?} must be 1 to 128 printable ASCII characters"
        )));
    }
    if !owns_field_manager(own, m) {
        return Err(WitError::Forbidden(format!(
            "field manager {m:?} is not this plugin's: a plugin applies as its own manager {own:?} or as \
             {own:?} followed by `/` and a suffix"
        )));
    }
    Ok(m)
}

/// The JSON patch operations that read the stored object: refused on kinds the plugin may
/// not read (`copy`/`move` would put stored values where the metadata-only response shows
/// them, `test` answers whether a stored value is a guess).
const READING_PATCH_OPS: [&str; 3] = ["copy", "move", "test"];

/// The first operation of a JSON patch that reads the stored object, if any. A body this
/// cannot read as an array of operations counts as reading (it cannot be shown not to): the
/// API server's decoder might still find operations in it. A key given twice counts once,
/// its last value, as the API server's decoder reads it.
fn reading_patch_op(body: &[u8]) -> Option<String> {
    let Ok(ops) = serde_json::from_slice::<Vec<serde_json::Map<String, serde_json::Value>>>(body) else {
        return Some("not an array of operations the host can check".to_owned());
    };
    ops.iter()
        .filter_map(|o| o.get("op").and_then(|v| v.as_str()))
        .find(|op| READING_PATCH_OPS.contains(op))
        .map(|op| format!("its `{op}` operation"))
}

fn raw_json(bytes: &[u8], what: &str) -> Result<Box<RawValue>, WitError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| WitError::Invalid(format!("{what} is not UTF-8: {e}")))?;
    RawValue::from_string(text.to_owned())
        .map_err(|e| WitError::Invalid(format!("{what} is not valid JSON: {e}")))
}

/// The content type of RFC 6902 JSON patches.
const JSON_PATCH: &str = "application/json-patch+json";

fn build_error(e: kube::core::request::Error) -> WitError {
    WitError::Invalid(format!("cannot build the request: {e}"))
}

/// The `client` import's host context.
pub(crate) struct ClientCtx {
    pub access: Arc<Access>,
    /// Field manager of every write.
    pub field_manager: String,
    /// Cluster access; `None` when the host runs plugins without one.
    pub kube: Option<Arc<KubeServices>>,
}

/// What a `client` call sees: the plugin's context and the call in progress.
pub(crate) struct ClientCtxView<'a> {
    pub ctx: &'a ClientCtx,
    pub call: &'a CallInfo,
}

/// Links `client` with [`ClientCtxView`] as its host.
pub(crate) struct HasClient;

impl HasData for HasClient {
    type Data<'a> = ClientCtxView<'a>;
}

impl ClientCtxView<'_> {
    /// The call log, when this host records calls.
    fn call_log(&self) -> Option<Arc<CallLog>> {
        self.ctx.kube.as_ref().and_then(|k| k.call_log.clone())
    }

    /// Records a write whose target is read from its body.
    fn record_body_write(
        &self,
        verb: &'static str,
        body: &[u8],
        result: &Result<Vec<u8>, WitError>,
        options: serde_json::Value,
    ) {
        let Some(log) = self.call_log() else { return };
        let (kind, namespace, name) = match target_of(body) {
            Ok(t) => (t.kind, t.namespace, t.name),
            Err(_) => (Gvk::new("", ""), None, String::new()),
        };
        log.push_write(RecordedWrite {
            verb,
            kind,
            namespace,
            name,
            body: Some(body_value(body)),
            patch_type: None,
            options,
            error: result.as_ref().err().map(|e| format!("{e:?}")),
        });
    }

    fn kube(&self) -> Result<Arc<KubeServices>, WitError> {
        self.ctx
            .kube
            .clone()
            .ok_or_else(|| WitError::Unavailable("this host runs plugins without cluster access".into()))
    }

    /// The collection URL of `kind` in `namespace`, after the permission check.
    fn collection(
        &self,
        kind: &Gvk,
        namespace: Option<&str>,
        write: bool,
        op: &'static str,
    ) -> Result<(Arc<KubeServices>, kube::core::Request, Option<String>), WitError> {
        if write {
            self.ctx.access.check_write(kind, self.call, op)?;
        } else {
            self.ctx.access.check_read(kind, self.call, op)?;
        }
        let kube = self.kube()?;
        let resolved = kube.resolve(kind, self.call.deadline)?;
        let namespace = if resolved.namespaced {
            let ns =
                namespace.map(str::to_owned).unwrap_or_else(|| kube.client.default_namespace().to_owned());
            validate_segment("namespace", &ns)?;
            Some(ns)
        } else {
            None
        };
        self.ctx.access.check_namespace(kind, namespace.as_deref(), write, self.call, op)?;
        let path = resolved.collection_path(namespace.as_deref());
        Ok((kube, kube::core::Request::new(path), namespace))
    }

    fn post_params(&self) -> PostParams {
        PostParams { dry_run: false, field_manager: Some(self.ctx.field_manager.clone()) }
    }

    fn body_call(
        &self,
        object: Vec<u8>,
        op: &'static str,
        build: impl FnOnce(
            &kube::core::Request,
            &Target,
            &PostParams,
            Vec<u8>,
        ) -> Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<Vec<u8>, WitError> {
        self.ctx.access.check_input_size(object.len(), "the object")?;
        let target = target_of(&object)?;
        validate_segment("name", &target.name)?;
        let (kube, req, _) = self.collection(&target.kind, target.namespace.as_deref(), true, op)?;
        let http = build(&req, &target, &self.post_params(), object).map_err(build_error)?;
        let body = kube.send(self.call.deadline, http)?.into_bytes();
        Ok(self.ctx.access.write_response(&target.kind, body))
    }

    fn patch_call(
        &self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        patch: WitPatch,
        subresource: Option<&str>,
        op: &'static str,
    ) -> Result<Vec<u8>, WitError> {
        let kind = Gvk { api_version: kind.api_version, kind: kind.kind };
        let (body, content_type, patch_type) = match patch {
            WitPatch::Merge(b) => (b, "application/merge-patch+json", "merge"),
            WitPatch::Json(b) => (b, JSON_PATCH, "json"),
            WitPatch::Strategic(b) => (b, "application/strategic-merge-patch+json", "strategic"),
        };
        let recorded = self.call_log().map(|log| (log, body.clone()));
        let result = self.send_patch(&kind, namespace.as_deref(), &name, body, content_type, subresource, op);
        if let Some((log, body)) = recorded {
            log.push_write(RecordedWrite {
                verb: if subresource.is_some() { "patch-status" } else { "patch" },
                kind,
                namespace,
                name,
                body: Some(body_value(&body)),
                patch_type: Some(patch_type),
                options: serde_json::json!({}),
                error: result.as_ref().err().map(|e| format!("{e:?}")),
            });
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn send_patch(
        &self,
        kind: &Gvk,
        namespace: Option<&str>,
        name: &str,
        body: Vec<u8>,
        content_type: &'static str,
        subresource: Option<&str>,
        op: &'static str,
    ) -> Result<Vec<u8>, WitError> {
        validate_segment("name", name)?;
        self.ctx.access.check_input_size(body.len(), "the patch")?;
        let raw = raw_json(&body, "the patch")?;
        let (kube, req, _) = self.collection(kind, namespace, true, op)?;
        if content_type == JSON_PATCH
            && !self.ctx.access.can_read(kind)
            && let Some(read_op) = reading_patch_op(&body)
        {
            self.ctx.access.metrics().count_forbidden(self.ctx.access.plugin(), op);
            tracing::warn!(plugin = self.ctx.access.plugin(), request = self.call.request.as_deref().unwrap_or(""), kind = %kind, op, patch_op = %read_op, "plugin refused: a JSON patch operation that reads an unreadable kind");
            return Err(WitError::Forbidden(format!(
                "plugin {} may write {kind} but not read it, and this JSON patch could read the stored object \
                 ({read_op}): use only add, remove and replace, or list {kind} in permissions.read",
                self.ctx.access.plugin()
            )));
        }
        let pp = PatchParams { field_manager: Some(self.ctx.field_manager.clone()), ..Default::default() };
        // kube builds merge patches; the body is the same bytes for every patch type, only
        // the content type tells the server how to read it.
        let patch = Patch::Merge(raw);
        let mut http = match subresource {
            Some(sub) => req.patch_subresource(sub, name, &pp, &patch),
            None => req.patch(name, &pp, &patch),
        }
        .map_err(build_error)?;
        http.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
        let response = kube.send(self.call.deadline, http)?.into_bytes();
        Ok(self.ctx.access.write_response(kind, response))
    }
}

impl Host for ClientCtxView<'_> {
    fn get(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.get").entered();
        let kind = Gvk { api_version: kind.api_version, kind: kind.kind };
        let result = (|| {
            validate_segment("name", &name)?;
            let (kube, req, _) = self.collection(&kind, namespace.as_deref(), false, "client.get")?;
            let http = req.get(&name, &GetParams::default()).map_err(build_error)?;
            kube.send(self.call.deadline, http).map(String::into_bytes)
        })();
        Ok(result)
    }

    fn create(&mut self, object: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.create").entered();
        let sent = self.call_log().map(|_| object.clone());
        let result = self.body_call(object, "client.create", |req, _, pp, body| req.create(pp, body));
        if let Some(body) = sent {
            self.record_body_write("create", &body, &result, serde_json::json!({}));
        }
        Ok(result)
    }

    fn replace(&mut self, object: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.replace").entered();
        let sent = self.call_log().map(|_| object.clone());
        let result =
            self.body_call(object, "client.replace", |req, t, pp, body| req.replace(&t.name, pp, body));
        if let Some(body) = sent {
            self.record_body_write("replace", &body, &result, serde_json::json!({}));
        }
        Ok(result)
    }

    fn patch(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        patch: WitPatch,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.patch").entered();
        Ok(self.patch_call(kind, namespace, name, patch, None, "client.patch"))
    }

    fn apply(
        &mut self,
        object: Vec<u8>,
        options: WitApplyOptions,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.apply").entered();
        let result = (|| {
            self.ctx.access.check_input_size(object.len(), "the object")?;
            let target = target_of(&object)?;
            validate_segment("name", &target.name)?;
            let raw = raw_json(&object, "the object")?;
            let (kube, req, _) =
                self.collection(&target.kind, target.namespace.as_deref(), true, "client.apply")?;
            let manager = match options.field_manager.as_deref() {
                Some(m) => validate_field_manager(&self.ctx.field_manager, m).inspect_err(|_| {
                    self.ctx.access.metrics().count_forbidden(self.ctx.access.plugin(), "client.apply");
                    tracing::warn!(
                        plugin = self.ctx.access.plugin(),
                        request = self.call.request.as_deref().unwrap_or(""),
                        field_manager = m,
                        "plugin refused: a field manager that is not its own"
                    );
                })?,
                None => &self.ctx.field_manager,
            };
            let mut pp = PatchParams::apply(manager);
            pp.force = options.force;
            pp.dry_run = options.dry_run;
            let http = req.patch(&target.name, &pp, &Patch::Apply(raw)).map_err(build_error)?;
            let body = kube.send(self.call.deadline, http)?.into_bytes();
            Ok(self.ctx.access.write_response(&target.kind, body))
        })();
        if self.call_log().is_some() {
            let mut opts = serde_json::Map::new();
            if options.force {
                opts.insert("force".into(), true.into());
            }
            if options.dry_run {
                opts.insert("dry-run".into(), true.into());
            }
            if let Some(m) = &options.field_manager {
                opts.insert("field-manager".into(), m.clone().into());
            }
            self.record_body_write("apply", &object, &result, serde_json::Value::Object(opts));
        }
        Ok(result)
    }

    fn update_status(&mut self, object: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.update-status").entered();
        let sent = self.call_log().map(|_| object.clone());
        let result = self.body_call(object, "client.update-status", |req, t, pp, body| {
            req.replace_subresource("status", &t.name, pp, body)
        });
        if let Some(body) = sent {
            self.record_body_write("update-status", &body, &result, serde_json::json!({}));
        }
        Ok(result)
    }

    fn patch_status(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        patch: WitPatch,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.patch-status").entered();
        Ok(self.patch_call(kind, namespace, name, patch, Some("status"), "client.patch-status"))
    }

    fn delete(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        options: DeleteOptions,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let _span = tracing::debug_span!(target: crate::telemetry::TARGET, "client.delete").entered();
        let kind = Gvk { api_version: kind.api_version, kind: kind.kind };
        let recorded_options = (
            options.uid.clone(),
            options.resource_version.clone(),
            options.propagation.map(|p| match p {
                Propagation::Background => "Background",
                Propagation::Foreground => "Foreground",
                Propagation::Orphan => "Orphan",
            }),
        );
        let result = (|| {
            validate_segment("name", &name)?;
            let (kube, req, _) = self.collection(&kind, namespace.as_deref(), true, "client.delete")?;
            let preconditions = (options.uid.is_some() || options.resource_version.is_some())
                .then_some(Preconditions { uid: options.uid, resource_version: options.resource_version });
            let dp = DeleteParams {
                preconditions,
                propagation_policy: options.propagation.map(|p| match p {
                    Propagation::Background => PropagationPolicy::Background,
                    Propagation::Foreground => PropagationPolicy::Foreground,
                    Propagation::Orphan => PropagationPolicy::Orphan,
                }),
                ..Default::default()
            };
            let http = req.delete(&name, &dp).map_err(build_error)?;
            kube.send(self.call.deadline, http).map(|_| ())
        })();
        if let Some(log) = self.call_log() {
            let mut opts = serde_json::Map::new();
            if let Some(uid) = recorded_options.0 {
                opts.insert("uid".into(), uid.into());
            }
            if let Some(rv) = recorded_options.1 {
                opts.insert("resource-version".into(), rv.into());
            }
            if let Some(p) = recorded_options.2 {
                opts.insert("propagation".into(), p.into());
            }
            log.push_write(RecordedWrite {
                verb: "delete",
                kind,
                namespace,
                name,
                body: None,
                patch_type: None,
                options: serde_json::Value::Object(opts),
                error: result.as_ref().err().map(|e| format!("{e:?}")),
            });
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_reads_where_an_object_belongs() {
        let t = target_of(
            br#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"a","namespace":"ns"}}"#,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(t.kind, Gvk::new("apps/v1", "Deployment"));
        assert_eq!(t.namespace.as_deref(), Some("ns"));
        assert_eq!(t.name, "a");
        assert!(matches!(target_of(br#"{"kind":"X","metadata":{"name":"a"}}"#), Err(WitError::Invalid(_))));
        assert!(matches!(target_of(b"not json"), Err(WitError::Invalid(_))));
    }

    #[test]
    fn field_managers_are_the_plugins_own() {
        assert!(validate_field_manager("wasmctrl-a", "wasmctrl-a").is_ok());
        assert!(validate_field_manager("wasmctrl-a", "wasmctrl-a/status").is_ok());
        assert!(matches!(validate_field_manager("wasmctrl-a", "wasmctrl-b"), Err(WitError::Forbidden(_))));
        assert!(matches!(validate_field_manager("wasmctrl-a", "kubectl"), Err(WitError::Forbidden(_))));
        assert!(matches!(validate_field_manager("wasmctrl-a", ""), Err(WitError::Invalid(_))));
        assert!(matches!(validate_field_manager("wasmctrl-a", "wasmctrl-a/\n"), Err(WitError::Invalid(_))));
    }

    #[test]
    fn json_patch_operations_that_read_are_found() {
        assert_eq!(reading_patch_op(br#"[{"op":"add","path":"/a","value":1},{"op":"copy","from":"/data/k","path":"/metadata/annotations/x"}]"#).as_deref(), Some("its `copy` operation"));
        assert_eq!(
            reading_patch_op(br#"[{"op":"test","path":"/data/k","value":"guess"}]"#).as_deref(),
            Some("its `test` operation")
        );
        assert_eq!(
            reading_patch_op(br#"[{"op":"move","from":"/a","path":"/b"}]"#).as_deref(),
            Some("its `move` operation")
        );
        assert_eq!(
            reading_patch_op(br#"[{"op":"replace","path":"/a","value":1},{"op":"remove","path":"/b"}]"#),
            None
        );
        assert_eq!(
            reading_patch_op(br#"[{"op":"add","op":"copy","from":"/data/k","path":"/x"}]"#).as_deref(),
            Some("its `copy` operation")
        );
        assert!(reading_patch_op(br#"{"op":"copy"}"#).is_some());
        let deep =
            format!("[{{\"op\":\"add\",\"path\":\"/a\",\"value\":{}1{}}}]", "[".repeat(200), "]".repeat(200));
        assert!(reading_patch_op(deep.as_bytes()).is_some(), "what cannot be read is not let through");
    }

    #[test]
    fn path_segments_are_validated() {
        assert!(validate_segment("name", "a-b.c").is_ok());
        assert!(validate_segment("name", "a/b").is_err());
        assert!(validate_segment("name", "..").is_err());
        assert!(validate_segment("name", "").is_err());
    }
}
