//! Host side of the `client` import: live reads and writes through the host's
//! `kube::Client`, for any kind the API server serves (resolved by discovery).
//!
//! Invariants:
//! - Reads need the kind readable, writes writable (else `forbidden`, logged), checked
//!   before any request is sent. Bodies larger than `max-output` are refused as `invalid`.
//! - Bodies go to the API server as the guest wrote them and responses come back as the
//!   server sent them (no serde round trip), so unknown fields survive.
//! - Every write carries the plugin's field manager; `apply` is server-side apply and may
//!   name another manager (1–128 printable ASCII characters, as the API server requires).
//! - A guest blocks in these calls (it runs on a blocking thread); the request itself runs
//!   on the tokio runtime and is bounded by what is left of the call's deadline.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use kube::api::{DeleteParams, GetParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::bindings::wasmctrl::controller::client::{
    ApplyOptions as WitApplyOptions, DeleteOptions, Host, PatchBody as WitPatch, Propagation,
};
use super::bindings::wasmctrl::controller::types::{Error as WitError, Gvk as WitGvk};
use super::events::EventRecorder;
use super::spec::Gvk;
use super::state::HostState;

/// A kind the API server serves, as discovery described it.
#[derive(Clone, Debug)]
pub(crate) struct ResolvedKind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// The host's cluster access shared by every plugin: client, runtime, discovery cache,
/// event recorder.
pub struct KubeServices {
    pub(crate) client: kube::Client,
    runtime: tokio::runtime::Handle,
    kinds: Mutex<HashMap<Gvk, ResolvedKind>>,
    pub(crate) events: EventRecorder,
}

impl KubeServices {
    /// Cluster access for plugins through `client`; requests run on `runtime` (which must
    /// be a multi-threaded runtime: plugin calls block while they wait).
    pub fn new(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        reporting_instance: impl Into<String>,
    ) -> Arc<Self> {
        Arc::new(KubeServices {
            events: EventRecorder::new(reporting_instance.into()),
            client,
            runtime,
            kinds: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Runs `fut` on the runtime and waits for it, at most until `deadline`.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        deadline: Instant,
        fut: impl Future<Output = Result<T, WitError>> + Send + 'static,
    ) -> Result<T, WitError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let until = tokio::time::Instant::from_std(deadline);
        self.runtime.spawn(async move {
            let result = match tokio::time::timeout_at(until, fut).await {
                Ok(r) => r,
                Err(_) => Err(WitError::Unavailable(
                    "the call's deadline passed while waiting for the API server".into(),
                )),
            };
            let _ = tx.send(result);
        });
        // Bounded even if the runtime cannot run the task (e.g. a current-thread runtime
        // whose only thread is the one waiting here).
        let wait = deadline.saturating_duration_since(Instant::now()) + std::time::Duration::from_secs(1);
        match rx.recv_timeout(wait) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(WitError::Unavailable(
                "the runtime did not run the request before the call's deadline".into(),
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(WitError::Unavailable("the host is shutting down".into()))
            }
        }
    }

    /// The resource serving `kind` (discovery, cached).
    pub(crate) fn resolve(&self, kind: &Gvk, deadline: Instant) -> Result<ResolvedKind, WitError> {
        if let Some(r) = self.kinds.lock().get(kind) {
            return Ok(r.clone());
        }
        let client = self.client.clone();
        let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind);
        let shown = kind.to_string();
        let resolved = self.block_on(deadline, async move {
            match kube::discovery::pinned_kind(&client, &gvk).await {
                Ok((resource, caps)) => {
                    Ok(ResolvedKind { resource, namespaced: caps.scope == Scope::Namespaced })
                }
                Err(kube::Error::Discovery(_)) => {
                    Err(WitError::Invalid(format!("the API server does not serve {shown}")))
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    Err(WitError::Invalid(format!("the API server does not serve {shown}")))
                }
                Err(e) => Err(map_kube_error(e)),
            }
        })?;
        self.kinds.lock().insert(kind.clone(), resolved.clone());
        Ok(resolved)
    }

    fn send(&self, deadline: Instant, request: http::Request<Vec<u8>>) -> Result<String, WitError> {
        let client = self.client.clone();
        self.block_on(deadline, async move { client.request_text(request).await.map_err(map_kube_error) })
    }
}

/// Maps a client error onto the WIT error variants by HTTP status.
pub(crate) fn map_kube_error(e: kube::Error) -> WitError {
    match e {
        kube::Error::Api(s) => {
            let msg = if s.message.is_empty() { s.reason.clone() } else { s.message.clone() };
            match s.code {
                404 => WitError::NotFound(msg),
                409 if s.reason == "AlreadyExists" => WitError::AlreadyExists(msg),
                409 => WitError::Conflict(msg),
                401 | 403 => WitError::Forbidden(msg),
                400 | 415 | 422 => WitError::Invalid(msg),
                429 | 500 | 502 | 503 | 504 => WitError::Unavailable(msg),
                code => WitError::Other((code, msg)),
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            WitError::Unavailable(e.to_string())
        }
        other => WitError::Other((0, other.to_string())),
    }
}

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

/// The API server accepts field managers of at most 128 printable characters.
fn validate_field_manager(m: &str) -> Result<&str, WitError> {
    if m.is_empty() || m.len() > 128 || !m.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(WitError::Invalid(format!(
            "field manager {m:?} must be 1 to 128 printable ASCII characters"
        )));
    }
    Ok(m)
}

fn raw_json(bytes: &[u8], what: &str) -> Result<Box<RawValue>, WitError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| WitError::Invalid(format!("{what} is not UTF-8: {e}")))?;
    RawValue::from_string(text.to_owned())
        .map_err(|e| WitError::Invalid(format!("{what} is not valid JSON: {e}")))
}

fn build_error(e: kube::core::request::Error) -> WitError {
    WitError::Invalid(format!("cannot build the request: {e}"))
}

impl HostState {
    fn kube(&self) -> Result<Arc<super::client::KubeServices>, WitError> {
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
            self.ctx.check_write(kind, &self.call, op)?;
        } else {
            self.ctx.check_read(kind, &self.call, op)?;
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
        let ar = &resolved.resource;
        let base = if ar.group.is_empty() {
            format!("/api/{}", ar.version)
        } else {
            format!("/apis/{}/{}", ar.group, ar.version)
        };
        let path = match &namespace {
            Some(ns) => format!("{base}/namespaces/{ns}/{}", ar.plural),
            None => format!("{base}/{}", ar.plural),
        };
        Ok((kube, kube::core::Request::new(path), namespace))
    }

    fn post_params(&self) -> PostParams {
        PostParams { dry_run: false, field_manager: Some(self.ctx.spec.field_manager.clone()) }
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
        self.ctx.check_input_size(object.len(), "the object")?;
        let target = target_of(&object)?;
        validate_segment("name", &target.name)?;
        let (kube, req, _) = self.collection(&target.kind, target.namespace.as_deref(), true, op)?;
        let http = build(&req, &target, &self.post_params(), object).map_err(build_error)?;
        kube.send(self.call.deadline, http).map(String::into_bytes)
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
        validate_segment("name", &name)?;
        let (body, content_type) = match patch {
            WitPatch::Merge(b) => (b, "application/merge-patch+json"),
            WitPatch::Json(b) => (b, "application/json-patch+json"),
            WitPatch::Strategic(b) => (b, "application/strategic-merge-patch+json"),
        };
        self.ctx.check_input_size(body.len(), "the patch")?;
        let raw = raw_json(&body, "the patch")?;
        let (kube, req, _) = self.collection(&kind, namespace.as_deref(), true, op)?;
        let pp =
            PatchParams { field_manager: Some(self.ctx.spec.field_manager.clone()), ..Default::default() };
        // kube builds merge patches; the body is the same bytes for every patch type, only
        // the content type tells the server how to read it.
        let patch = Patch::Merge(raw);
        let mut http = match subresource {
            Some(sub) => req.patch_subresource(sub, &name, &pp, &patch),
            None => req.patch(&name, &pp, &patch),
        }
        .map_err(build_error)?;
        http.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
        kube.send(self.call.deadline, http).map(String::into_bytes)
    }
}

impl Host for HostState {
    fn get(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
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
        Ok(self.body_call(object, "client.create", |req, _, pp, body| req.create(pp, body)))
    }

    fn replace(&mut self, object: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        Ok(self.body_call(object, "client.replace", |req, t, pp, body| req.replace(&t.name, pp, body)))
    }

    fn patch(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        patch: WitPatch,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        Ok(self.patch_call(kind, namespace, name, patch, None, "client.patch"))
    }

    fn apply(
        &mut self,
        object: Vec<u8>,
        options: WitApplyOptions,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let result = (|| {
            self.ctx.check_input_size(object.len(), "the object")?;
            let target = target_of(&object)?;
            validate_segment("name", &target.name)?;
            let raw = raw_json(&object, "the object")?;
            let (kube, req, _) =
                self.collection(&target.kind, target.namespace.as_deref(), true, "client.apply")?;
            let manager = match options.field_manager.as_deref() {
                Some(m) => validate_field_manager(m)?,
                None => &self.ctx.spec.field_manager,
            };
            let mut pp = PatchParams::apply(manager);
            pp.force = options.force;
            pp.dry_run = options.dry_run;
            let http = req.patch(&target.name, &pp, &Patch::Apply(raw)).map_err(build_error)?;
            kube.send(self.call.deadline, http).map(String::into_bytes)
        })();
        Ok(result)
    }

    fn update_status(&mut self, object: Vec<u8>) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        Ok(self.body_call(object, "client.update-status", |req, t, pp, body| {
            req.replace_subresource("status", &t.name, pp, body)
        }))
    }

    fn patch_status(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        patch: WitPatch,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        Ok(self.patch_call(kind, namespace, name, patch, Some("status"), "client.patch-status"))
    }

    fn delete(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
        options: DeleteOptions,
    ) -> wasmtime::Result<Result<(), WitError>> {
        let kind = Gvk { api_version: kind.api_version, kind: kind.kind };
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
    fn api_errors_map_by_status() {
        let status = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.into(),
                message: "m".into(),
                ..Default::default()
            }))
        };
        assert!(matches!(map_kube_error(status(404, "NotFound")), WitError::NotFound(_)));
        assert!(matches!(map_kube_error(status(409, "AlreadyExists")), WitError::AlreadyExists(_)));
        assert!(matches!(map_kube_error(status(409, "Conflict")), WitError::Conflict(_)));
        assert!(matches!(map_kube_error(status(403, "Forbidden")), WitError::Forbidden(_)));
        assert!(matches!(map_kube_error(status(422, "Invalid")), WitError::Invalid(_)));
        assert!(matches!(map_kube_error(status(429, "TooManyRequests")), WitError::Unavailable(_)));
        assert!(matches!(map_kube_error(status(418, "Teapot")), WitError::Other((418, _))));
    }

    #[test]
    fn path_segments_are_validated() {
        assert!(validate_segment("name", "a-b.c").is_ok());
        assert!(validate_segment("name", "a/b").is_err());
        assert!(validate_segment("name", "..").is_err());
        assert!(validate_segment("name", "").is_err());
    }
}
