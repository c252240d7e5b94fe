//! HTTP layer: authentication, fault injection, path routing, discovery and the REST verbs
//! (get/list/watch/create/update/patch/delete/deletecollection) over the generic store.
//!
//! Every resource path is routed by one handler that parses `/api/v1/...` and
//! `/apis/{group}/{version}/...` itself, so kinds added by CRDs are served without
//! registering routes. Responses are JSON; objects go out as the bytes the store encoded
//! (re-encoded only for another API version, Table or PartialObjectMetadata output).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::error::ApiError;
#[cfg(feature = "faults")]
use crate::faults::Faults;
use crate::managed;
use crate::patch::{self, PatchType};
use crate::resources::ResourceInfo;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{
    DeleteOpts, Event, ListOpts, Store, Subresource, WatchFilter, WatchItem, WatchStart, WriteOpts,
};
use crate::util::meta_str;

/// The Kubernetes version the server reports (kubectl picks its behaviour from it).
pub const KUBE_VERSION: (&str, &str) = ("1", "32");

/// Largest request body accepted.
const MAX_BODY: usize = 64 << 20;
/// Default watch duration when the client sets no `timeoutSeconds`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often watches with `allowWatchBookmarks` get a BOOKMARK.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// Upper bound on bytes batched into one watch chunk.
const WATCH_BATCH_BYTES: usize = 256 << 10;

/// Shared state of the HTTP handlers.
#[derive(Debug)]
pub struct AppState {
    /// The object store.
    pub store: Arc<Store>,
    /// The bearer token clients must present.
    pub token: String,
    /// Fault injection (the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: Faults,
    /// `host:port` for discovery's serverAddressByClientCIDRs.
    pub address: String,
}

/// The axum router serving everything.
pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

fn json_response(code: StatusCode, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, e.status_bytes());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

async fn handle(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        let mut r = Response::new(Body::from("ok"));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        return r;
    }
    let authorized = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .is_some_and(|t| t.trim() == st.token);
    if !authorized {
        return error_response(&ApiError::unauthorized());
    }
    let query = parse_query(parts.uri.query());
    #[cfg(feature = "faults")]
    {
        let is_watch =
            query.get("watch").is_some_and(|w| w == "true" || w == "1") || path.contains("/watch/");
        if let Err(e) = st.faults.before(&parts.method, &path, is_watch).await {
            return error_response(&e);
        }
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let ctx = Ctx { st: &st, method: &parts.method, headers: &parts.headers, query: &query, body };
    let result = route(&ctx, &path);
    match result {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(method = %parts.method, %path, code = e.code, reason = e.reason, message = %e.message, "request failed");
            error_response(&e)
        }
    }
}

struct Ctx<'a> {
    st: &'a Arc<AppState>,
    method: &'a Method,
    headers: &'a HeaderMap,
    query: &'a HashMap<String, String>,
    body: Bytes,
}

impl Ctx<'_> {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    fn flag(&self, k: &str) -> bool {
        self.q(k).is_some_and(|v| v == "true" || v == "1")
    }

    fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }

    /// The field manager of a non-apply write: `fieldManager`, else the User-Agent's
    /// product token, as the API server derives it.
    fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self.headers.get(header::USER_AGENT).and_then(|h| h.to_str().ok()).unwrap_or("unknown");
        let m = ua.split('/').next().unwrap_or(ua);
        m.chars().take(128).collect()
    }

    fn format(&self) -> Format {
        let accept = self.headers.get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or("");
        for media in accept.split(',') {
            let media = media.trim();
            let mut parts = media.split(';').map(str::trim);
            let base = parts.next().unwrap_or("");
            if base != "application/json" && base != "*/*" && !base.is_empty() {
                continue;
            }
            let mut as_ = None;
            let mut group = None;
            for p in parts {
                if let Some(v) = p.strip_prefix("as=") {
                    as_ = Some(v);
                } else if let Some(v) = p.strip_prefix("g=") {
                    group = Some(v);
                }
            }
            match (as_, group) {
                (None, _) => return Format::Full,
                (Some("Table"), Some("meta.k8s.io")) => return Format::Table,
                (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                    return Format::Metadata;
                }
                _ => continue,
            }
        }
        Format::Full
    }

    fn body_json(&self) -> Result<Value, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("application/json");
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/yaml" | "application/apply-patch+yaml" => {
                serde_norway::from_slice::<Value>(&self.body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
            }
            "application/vnd.kubernetes.protobuf" => crate::proto::decode(&self.body),
            "application/json" | "" | "*/*" => serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON body: {e}"))),
            _ if PatchType::from_content_type(base).is_some() => serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}"))),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// How objects are rendered, from the Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Full,
    Table,
    Metadata,
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

/// A resolved resource request.
struct ResReq {
    info: Arc<ResourceInfo>,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch_path: bool,
}

fn route(ctx: &Ctx<'_>, path: &str) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let get = ctx.method == Method::GET;
    match segs.as_slice() {
        ["version"] if get => return Ok(value_response(StatusCode::OK, &version_info())),
        ["api"] if get => {
            return Ok(value_response(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ctx.st.address}]}),
            ));
        }
        ["apis"] if get => return Ok(value_response(StatusCode::OK, &group_list(&ctx.st.store))),
        ["api", "v1"] if get => {
            return Ok(value_response(StatusCode::OK, &resource_list(&ctx.st.store, "", "v1")));
        }
        ["apis", g] if get => {
            return group_list(&ctx.st.store)["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["name"] == *g).cloned())
                .map(|mut v| {
                    v["kind"] = json!("APIGroup");
                    v["apiVersion"] = json!("v1");
                    value_response(StatusCode::OK, &v)
                })
                .ok_or_else(ApiError::path_not_found);
        }
        ["apis", g, v] if get => {
            let list = resource_list(&ctx.st.store, g, v);
            if list["resources"].as_array().is_none_or(|r| r.is_empty()) {
                return Err(ApiError::path_not_found());
            }
            return Ok(value_response(StatusCode::OK, &list));
        }
        ["openapi", "v3"] if get => return Ok(value_response(StatusCode::OK, &openapi_index(&ctx.st.store))),
        ["openapi", "v3", "api", v] if get => return openapi_doc(&ctx.st.store, "", v),
        ["openapi", "v3", "apis", g, v] if get => return openapi_doc(&ctx.st.store, g, v),
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let registry = ctx.st.store.registry();
    let lookup = |r: &str| registry.get(group, version, r).ok_or_else(ApiError::path_not_found);
    let (resource, namespace, name, sub) = match rest {
        ["namespaces", ns, r, tail @ ..]
            if group.is_empty() && !matches!(*r, "status" | "finalize") || !group.is_empty() =>
        {
            let info = lookup(r)?;
            if !info.namespaced {
                return Err(ApiError::path_not_found());
            }
            match tail {
                [] => (info, Some(ns.to_string()), None, None),
                [n] => (info, Some(ns.to_string()), Some(n.to_string()), None),
                [n, s] => (info, Some(ns.to_string()), Some(n.to_string()), Some(s.to_string())),
                _ => return Err(ApiError::path_not_found()),
            }
        }
        [r] => (lookup(r)?, None, None, None),
        [r, n] => {
            let info = lookup(r)?;
            if info.namespaced {
                return Err(ApiError::path_not_found());
            }
            (info, None, Some(n.to_string()), None)
        }
        [r, n, s] => {
            let info = lookup(r)?;
            if info.namespaced {
                return Err(ApiError::path_not_found());
            }
            (info, None, Some(n.to_string()), Some(s.to_string()))
        }
        _ => return Err(ApiError::path_not_found()),
    };
    if let Some(s) = &sub
        && !(s == "status" && resource.status_subresource
            || s == "finalize" && resource.gr.resource == "namespaces")
    {
        return Err(ApiError::path_not_found());
    }
    let req = ResReq { info: resource, version: version.to_string(), namespace, name, sub, watch_path };
    dispatch(ctx, &req)
}

fn version_info() -> Value {
    json!({
        "major": KUBE_VERSION.0,
        "minor": KUBE_VERSION.1,
        "gitVersion": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1),
        "gitCommit": "wasmctrl-devcluster",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_list(store: &Store) -> Value {
    let groups: Vec<Value> = store
        .registry()
        .groups()
        .into_iter()
        .map(|(name, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            let preferred = vs.first().cloned().unwrap_or_default();
            json!({"name": name, "versions": vs, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Group/versions served, as `(group, version)` with core first.
fn group_versions(store: &Store) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), "v1".to_string())];
    for (g, vs) in store.registry().groups() {
        for v in vs {
            out.push((g.clone(), v));
        }
    }
    out
}

/// A hash of what a group/version serves, so OpenAPI clients refetch when CRDs change it.
fn gv_hash(store: &Store, group: &str, version: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    resource_list(store, group, version).to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `/openapi/v3`: one entry per group/version.
fn openapi_index(store: &Store) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in group_versions(store) {
        let key = if g.is_empty() { format!("api/{v}") } else { format!("apis/{g}/{v}") };
        let hash = gv_hash(store, &g, &v);
        paths.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
    }
    json!({"paths": paths})
}

/// `/openapi/v3/{gv}`: a document with each resource's operations and the query
/// parameters they accept (kubectl reads `fieldValidation` support from it and then leaves
/// validation to the server). Schemas are not published: storage is schemaless.
fn openapi_doc(store: &Store, group: &str, version: &str) -> Result<Response, ApiError> {
    let registry = store.registry();
    let infos: Vec<_> = registry
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .cloned()
        .collect();
    if infos.is_empty() {
        return Err(ApiError::path_not_found());
    }
    let prefix =
        if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
    let param =
        |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": true});
    let write_params = json!([param("dryRun"), param("fieldManager"), param("fieldValidation")]);
    let mut paths = serde_json::Map::new();
    for info in infos {
        let gvk = json!({"group": group, "version": version, "kind": info.kind});
        let op = |action: &str| {
            json!({
                "parameters": write_params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            })
        };
        let base = if info.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", info.gr.resource)
        } else {
            format!("{prefix}/{}", info.gr.resource)
        };
        paths.insert(base.clone(), json!({"post": op("post"), "get": op("list")}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"patch": op("patch"), "put": op("put"), "get": op("get"), "delete": op("delete")}),
        );
        if info.status_subresource {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({"patch": op("patch"), "put": op("put"), "get": op("get")}),
            );
        }
    }
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBE_VERSION.0, KUBE_VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    });
    Ok(value_response(StatusCode::OK, &doc))
}

fn resource_list(store: &Store, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = store
        .registry()
        .all()
        .filter(|i| i.gr.group == group && i.versions.iter().any(|v| v == version))
        .flat_map(|i| i.discovery_entries())
        .collect();
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

fn dispatch(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let ns = req.namespace.as_deref().unwrap_or("");
    let gr = &req.info.gr;
    let watch = req.watch_path || ctx.flag("watch");
    match (ctx.method.clone(), &req.name) {
        (Method::GET, None) if watch => watch_handler(ctx, req),
        (Method::GET, None) => list_handler(ctx, req),
        (Method::GET, Some(name)) if watch => {
            // Legacy /watch/.../name: a watch of one object.
            let mut q = ctx.query.clone();
            q.insert("fieldSelector".into(), format!("metadata.name={name}"));
            let sub_ctx = Ctx { query: &q, body: ctx.body.clone(), ..*ctx };
            watch_handler(&sub_ctx, &ResReq { name: None, ..req.clone_shallow() })
        }
        (Method::GET, Some(name)) => {
            let obj = ctx.st.store.get(gr, ns, name)?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::POST, None) => {
            let body = ctx.body_json()?;
            let opts = WriteOpts { dry_run: ctx.dry_run(), manager: Some(ctx.manager()) };
            let obj = ctx.st.store.create(gr, ns, to_storage(body, &req.info), &opts)?;
            render_one(ctx, req, StatusCode::CREATED, obj)
        }
        (Method::PUT, Some(name)) => {
            let body = ctx.body_json()?;
            let sub = if req.sub.is_some() { Subresource::Status } else { Subresource::Main };
            let opts = WriteOpts { dry_run: ctx.dry_run(), manager: Some(ctx.manager()) };
            let new = to_storage(body, &req.info);
            let (obj, _) = ctx.st.store.modify(gr, ns, name, sub, &opts, false, |_, _| Ok(new))?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::PATCH, Some(name)) => patch_handler(ctx, req, name),
        (Method::DELETE, Some(name)) => {
            let opts = delete_opts(ctx)?;
            let obj = ctx.st.store.delete(gr, ns, name, &opts)?;
            render_one(ctx, req, StatusCode::OK, obj)
        }
        (Method::DELETE, None) => {
            let opts = delete_opts(ctx)?;
            let list = list_opts(ctx, req)?;
            let items = ctx.st.store.delete_collection(gr, &list, &opts)?;
            let rv = ctx.st.store.current_rv();
            Ok(json_response(StatusCode::OK, render_list(ctx, req, Format::Full, &items, rv, None, 0)?))
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

impl ResReq {
    fn clone_shallow(&self) -> ResReq {
        ResReq {
            info: self.info.clone(),
            version: self.version.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            sub: self.sub.clone(),
            watch_path: self.watch_path,
        }
    }
}

/// Rewrites a body's apiVersion to the storage version (all versions share storage).
fn to_storage(mut body: Value, info: &ResourceInfo) -> Value {
    if info.versions.len() > 1
        && let Some(o) = body.as_object_mut()
        && o.contains_key("apiVersion")
    {
        o.insert("apiVersion".into(), Value::String(info.api_version(info.storage_version())));
    }
    body
}

fn delete_opts(ctx: &Ctx<'_>) -> Result<DeleteOpts, ApiError> {
    let body: Value = if ctx.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
    };
    let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
    let mut propagation = s("/propagationPolicy").or_else(|| ctx.q("propagationPolicy").map(str::to_string));
    let orphan = body
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| ctx.q("orphanDependents").map(|v| v == "true"));
    if propagation.is_none() && orphan == Some(true) {
        propagation = Some("Orphan".into());
    }
    let dry_run = ctx.dry_run()
        || body.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok(DeleteOpts {
        propagation,
        uid: s("/preconditions/uid"),
        resource_version: s("/preconditions/resourceVersion"),
        dry_run,
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    ns: String,
    name: String,
}

fn list_opts(ctx: &Ctx<'_>, req: &ResReq) -> Result<ListOpts, ApiError> {
    let mut opts = ListOpts {
        namespace: req.namespace.clone(),
        labels: LabelSelector::parse(ctx.q("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(ctx.q("fieldSelector").unwrap_or(""))?,
        limit: match ctx.q("limit") {
            Some(l) => l.parse().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            None => 0,
        },
        ..Default::default()
    };
    if let Some(token) = ctx.q("continue") {
        if ctx.q("resourceVersion").is_some_and(|rv| rv != "0") {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| ApiError::bad_request("continue key is not valid: illegal base64 data"))?;
        let t: ContinueToken =
            serde_json::from_slice(&raw).map_err(|_| ApiError::bad_request("continue key is not valid"))?;
        opts.after = Some((t.ns, t.name));
        opts.continue_rv = Some(t.rv);
    } else if let Some(rv) = ctx.q("resourceVersion").filter(|rv| *rv != "0") {
        let n: u64 =
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
        match ctx.q("resourceVersionMatch") {
            Some("Exact") => opts.exact_rv = Some(n),
            None | Some("NotOlderThan") => {
                let current = ctx.st.store.current_rv();
                if n > current {
                    let mut e = ApiError::injected(504, Some(1));
                    e.reason = "Timeout";
                    e.message = format!("Too large resource version: {n}, current: {current}");
                    e.details = Some(
                        json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                    );
                    return Err(e);
                }
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!("invalid resourceVersionMatch: {other:?}")));
            }
        }
    }
    Ok(opts)
}

fn list_handler(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let opts = list_opts(ctx, req)?;
    let result = ctx.st.store.list(&req.info.gr, &opts)?;
    let next = result.next.map(|(ns, name)| {
        let t = ContinueToken { v: "meta.k8s.io/v1".into(), rv: result.rv, ns, name };
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap_or_default())
    });
    let body = render_list(ctx, req, ctx.format(), &result.items, result.rv, next, result.remaining)?;
    Ok(json_response(StatusCode::OK, body))
}

/// Rewrites one object for the requested version / format.
fn convert(req: &ResReq, format: Format, obj: &Bytes) -> Result<Bytes, ApiError> {
    if format == Format::Full && req.version == req.info.storage_version() {
        return Ok(obj.clone());
    }
    let mut v: Value = serde_json::from_slice(obj).map_err(|e| ApiError::internal(e.to_string()))?;
    v["apiVersion"] = Value::String(req.info.api_version(&req.version));
    let v = match format {
        Format::Full => v,
        Format::Metadata => partial_metadata(&v),
        Format::Table => table(req, std::slice::from_ref(&v), true, None),
    };
    Ok(Bytes::from(serde_json::to_vec(&v).unwrap_or_default()))
}

fn partial_metadata(v: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": v.get("metadata").cloned().unwrap_or_default()})
}

fn render_one(ctx: &Ctx<'_>, req: &ResReq, code: StatusCode, obj: Bytes) -> Result<Response, ApiError> {
    Ok(json_response(code, convert(req, ctx.format(), &obj)?))
}

/// Evaluates a simple JSONPath (`.a.b`, `.a[0].b`) of a printer column.
fn json_path(v: &Value, path: &str) -> Value {
    let mut cur = v;
    for seg in path.trim_start_matches('.').split('.') {
        if seg.is_empty() {
            continue;
        }
        let (field, idx) = match seg.split_once('[') {
            Some((f, rest)) => (f, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        cur = match cur.get(field) {
            Some(x) => x,
            None => return Value::Null,
        };
        if let Some(i) = idx {
            cur = match cur.get(i) {
                Some(x) => x,
                None => return Value::Null,
            };
        }
    }
    cur.clone()
}

fn table(req: &ResReq, items: &[Value], headers: bool, list_meta: Option<Value>) -> Value {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for (name, ty, _) in &req.info.printer_columns {
        cols.push(json!({"name": name, "type": ty, "format": "", "description": "", "priority": 0}));
    }
    cols.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    let rows: Vec<Value> = items
        .iter()
        .map(|v| {
            let mut cells = vec![json!(meta_str(v, "name"))];
            for (_, _, path) in &req.info.printer_columns {
                cells.push(json_path(v, path));
            }
            cells.push(json!(crate::util::age(meta_str(v, "creationTimestamp"))));
            json!({"cells": cells, "object": partial_metadata(v)})
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "rows": rows,
    });
    if headers {
        t["columnDefinitions"] = Value::Array(cols);
    } else {
        t["columnDefinitions"] = json!([]);
    }
    t
}

fn render_list(
    ctx: &Ctx<'_>,
    req: &ResReq,
    format: Format,
    items: &[Bytes],
    rv: u64,
    next: Option<String>,
    remaining: usize,
) -> Result<Bytes, ApiError> {
    let _ = ctx;
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = next {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    match format {
        Format::Table => {
            let parsed: Vec<Value> = items
                .iter()
                .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(e.to_string())))
                .collect::<Result<_, _>>()?;
            Ok(Bytes::from(serde_json::to_vec(&table(req, &parsed, true, Some(meta))).unwrap_or_default()))
        }
        Format::Full | Format::Metadata => {
            let (kind, api_version) = if format == Format::Full {
                (req.info.list_kind(), req.info.api_version(&req.version))
            } else {
                ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1".to_string())
            };
            let head = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
            let mut buf = BytesMut::with_capacity(items.iter().map(|i| i.len() + 1).sum::<usize>() + 256);
            let head = serde_json::to_vec(&head).unwrap_or_default();
            // `{...}` minus the closing brace, then the items array.
            buf.put_slice(&head[..head.len() - 1]);
            buf.put_slice(b",\"items\":[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    buf.put_u8(b',');
                }
                let item = convert(req, format, item)?;
                buf.put_slice(&item);
            }
            buf.put_slice(b"]}");
            Ok(buf.freeze())
        }
    }
}

fn patch_handler(ctx: &Ctx<'_>, req: &ResReq, name: &str) -> Result<Response, ApiError> {
    let ct = ctx.headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
    let pt = PatchType::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
    let patch_body: Value = match pt {
        PatchType::Apply => serde_norway::from_slice(&ctx.body)
            .or_else(|_| serde_json::from_slice(&ctx.body))
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        _ => serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
    };
    let ns = req.namespace.as_deref().unwrap_or("");
    let sub = if req.sub.is_some() { Subresource::Status } else { Subresource::Main };
    let dry_run = ctx.dry_run();
    let info = req.info.clone();
    let (obj, created) = if pt == PatchType::Apply {
        let manager = ctx.q("fieldManager").ok_or_else(|| {
            ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                "fieldManager: Required value: is required for apply patch",
            )
        })?;
        let force = ctx.flag("force");
        let applied = to_storage(patch_body, &info);
        let api_version = info.api_version(&req.version);
        let opts = WriteOpts { dry_run, manager: None };
        ctx.st.store.modify(&info.gr, ns, name, sub, &opts, true, |live, info| {
            if live.is_none() && sub == Subresource::Status {
                return Err(ApiError::not_found(&info.gr.group, &info.gr.resource, name));
            }
            let ignore_status = sub == Subresource::Main && info.status_subresource;
            let mut out = managed::apply(live, &applied, manager, force, &api_version, ignore_status).map_err(|mut e| {
                if e.code == 409 {
                    e.details = Some(json!({"name": name, "group": info.gr.group, "kind": info.gr.resource, "causes": e.details.as_ref().and_then(|d| d.get("causes")).cloned().unwrap_or_default()}));
                }
                e
            })?;
            if sub == Subresource::Status
                && let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut)
            {
                m.remove("resourceVersion");
            }
            Ok(out)
        })?
    } else {
        let opts = WriteOpts { dry_run, manager: Some(ctx.manager()) };
        ctx.st.store.modify(&info.gr, ns, name, sub, &opts, false, |live, _| {
            let mut v = live.unwrap_or_default();
            match pt {
                PatchType::Merge => patch::merge_patch(&mut v, &patch_body),
                PatchType::Json => patch::json_patch(&mut v, &patch_body)?,
                PatchType::Strategic => patch::strategic_merge(&mut v, &patch_body)?,
                PatchType::Apply => {}
            }
            Ok(to_storage(v, &info))
        })?
    };
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    render_one(ctx, req, code, obj)
}

fn watch_handler(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let filter = WatchFilter {
        namespace: req.namespace.clone(),
        labels: LabelSelector::parse(ctx.q("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(ctx.q("fieldSelector").unwrap_or(""))?,
    };
    let send_initial = ctx.flag("sendInitialEvents");
    let bookmarks = ctx.flag("allowWatchBookmarks");
    if send_initial && (!bookmarks || ctx.q("resourceVersionMatch") != Some("NotOlderThan")) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is NotOlderThan and allowWatchBookmarks is true",
        ));
    }
    let rv = ctx.q("resourceVersion");
    let start = match rv {
        _ if send_initial => WatchStart::Current,
        None | Some("0") => WatchStart::Current,
        Some(rv) => WatchStart::After(
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        ),
    };
    let timeout = ctx
        .q("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let format = ctx.format();
    let watch = WatchCtx { req: req.clone_shallow(), format, filter: filter.clone(), headers_sent: false };
    let mut resp = Response::new(Body::empty());
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let stream = match ctx.st.store.watch(&req.info.gr, filter, start) {
        Ok(s) => s,
        Err(e) if e.code == 410 => {
            // Like the API server: 200 and an ERROR event carrying the 410 Status.
            let mut line = b"{\"type\":\"ERROR\",\"object\":".to_vec();
            line.extend_from_slice(&e.status_bytes());
            line.extend_from_slice(b"}\n");
            *resp.body_mut() = Body::from(line);
            return Ok(resp);
        }
        Err(e) => return Err(e),
    };
    let initial_end_rv = send_initial.then_some(stream.start_rv);
    let state = WatchLoop {
        ctx: watch,
        initial: stream.initial.into_iter(),
        initial_end_rv,
        rx: stream.rx,
        deadline: tokio::time::Instant::now() + timeout,
        bookmarks,
        last_rv: stream.start_rv,
        store: ctx.st.store.clone(),
        #[cfg(feature = "faults")]
        faults: ctx.st.faults.clone(),
        done: false,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        let chunk = s.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), s))
    });
    *resp.body_mut() = Body::from_stream(body);
    Ok(resp)
}

struct WatchCtx {
    req: ResReq,
    format: Format,
    filter: WatchFilter,
    headers_sent: bool,
}

impl WatchCtx {
    fn encode_event(&mut self, buf: &mut BytesMut, ty: &str, object: &Bytes) {
        buf.put_slice(b"{\"type\":\"");
        buf.put_slice(ty.as_bytes());
        buf.put_slice(b"\",\"object\":");
        if self.format == Format::Full && self.req.version == self.req.info.storage_version() {
            buf.put_slice(object);
        } else if self.format == Format::Table {
            let v: Value = serde_json::from_slice(object).unwrap_or_default();
            let t = table(&self.req, std::slice::from_ref(&v), !self.headers_sent, None);
            self.headers_sent = true;
            buf.put_slice(&serde_json::to_vec(&t).unwrap_or_default());
        } else {
            match convert(&self.req, self.format, object) {
                Ok(b) => buf.put_slice(&b),
                Err(_) => buf.put_slice(object),
            }
        }
        buf.put_slice(b"}\n");
    }

    fn encode_bookmark(&self, buf: &mut BytesMut, rv: u64, initial_end: bool) {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.req.info.kind, "apiVersion": self.req.info.api_version(&self.req.version), "metadata": meta});
        let ev = json!({"type": "BOOKMARK", "object": obj});
        buf.put_slice(&serde_json::to_vec(&ev).unwrap_or_default());
        buf.put_u8(b'\n');
    }

    fn encode(&mut self, buf: &mut BytesMut, ev: &Event) -> bool {
        match self.filter.view(ev) {
            Some(ty) => {
                self.encode_event(buf, ty.as_str(), &ev.object);
                true
            }
            None => false,
        }
    }
}

struct WatchLoop {
    ctx: WatchCtx,
    initial: std::vec::IntoIter<Arc<Event>>,
    initial_end_rv: Option<u64>,
    rx: tokio::sync::mpsc::Receiver<WatchItem>,
    deadline: tokio::time::Instant,
    bookmarks: bool,
    last_rv: u64,
    store: Arc<Store>,
    #[cfg(feature = "faults")]
    faults: Faults,
    done: bool,
}

impl WatchLoop {
    /// The next chunk of newline-delimited watch events; None ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut buf = BytesMut::new();
        // Initial state / replay first, in batches.
        for ev in self.initial.by_ref() {
            self.ctx.encode(&mut buf, &ev);
            self.last_rv = self.last_rv.max(ev.rv);
            if buf.len() >= WATCH_BATCH_BYTES {
                return Some(buf.freeze());
            }
        }
        if let Some(rv) = self.initial_end_rv.take() {
            self.ctx.encode_bookmark(&mut buf, rv, true);
        }
        if !buf.is_empty() {
            return Some(buf.freeze());
        }
        loop {
            #[cfg(feature = "faults")]
            self.faults.wait_unpaused().await;
            let bookmark_at = tokio::time::Instant::now() + BOOKMARK_INTERVAL;
            let item = tokio::select! {
                item = self.rx.recv() => item,
                _ = tokio::time::sleep_until(self.deadline) => { self.done = true; return None; }
                _ = tokio::time::sleep_until(bookmark_at), if self.bookmarks => {
                    // Everything up to `dispatched` is already in the channel: drain it first.
                    let dispatched = self.store.current_rv();
                    while let Ok(WatchItem::Event(ev)) = self.rx.try_recv() {
                        self.ctx.encode(&mut buf, &ev);
                        self.last_rv = self.last_rv.max(ev.rv);
                    }
                    self.last_rv = self.last_rv.max(dispatched);
                    let rv = self.last_rv;
                    self.ctx.encode_bookmark(&mut buf, rv, false);
                    return Some(buf.freeze());
                }
            };
            let Some(WatchItem::Event(ev)) = item else {
                self.done = true;
                return if buf.is_empty() { None } else { Some(buf.freeze()) };
            };
            self.ctx.encode(&mut buf, &ev);
            self.last_rv = self.last_rv.max(ev.rv);
            while buf.len() < WATCH_BATCH_BYTES {
                match self.rx.try_recv() {
                    Ok(WatchItem::Event(ev)) => {
                        self.ctx.encode(&mut buf, &ev);
                        self.last_rv = self.last_rv.max(ev.rv);
                    }
                    Err(_) => break,
                }
            }
            if !buf.is_empty() {
                return Some(buf.freeze());
            }
        }
    }
}
