//! Discovery: `(apiVersion, kind)` → the REST resource serving it (plural, scope), read from
//! the API server's `/api/v1` and `/apis/<group>/<version>` resource lists. The host's one
//! discovery path: informers, config checks and the plugins' client all resolve kinds here.
//!
//! Invariants: subresources (`pods/status`) are never returned; a miss re-reads the server's
//! list once (a CRD may just have been installed) before failing with an error naming the kind
//! and the kinds that do exist in that group/version.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use parking_lot::RwLock;

/// A resolved REST resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApiResource {
    /// API group (`""` for the core group).
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// `group/version`, or `version` for the core group.
    pub api_version: String,
    /// Kind (`ConfigMap`).
    pub kind: String,
    /// Resource plural (`configmaps`).
    pub plural: String,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
}

impl ApiResource {
    /// Builds a resource description without asking the server.
    ///
    /// ```
    /// use wasmctrl_runtime::source::ApiResource;
    /// let cm = ApiResource::new("v1", "ConfigMap", "configmaps", true);
    /// assert_eq!(cm.collection_path(Some("default")), "/api/v1/namespaces/default/configmaps");
    /// let d = ApiResource::new("apps/v1", "Deployment", "deployments", true);
    /// assert_eq!(d.collection_path(None), "/apis/apps/v1/deployments");
    /// ```
    pub fn new(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        let (group, version) = split_api_version(api_version);
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            namespaced,
        }
    }

    /// The collection URL path, in `namespace` when given and the resource is namespaced.
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced && !ns.is_empty() => {
                format!("{base}/namespaces/{ns}/{}", self.plural)
            }
            _ => format!("{base}/{}", self.plural),
        }
    }
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (`""`, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// Why a kind could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("unknown kind {kind:?} in {api_version:?} (the API server serves: {})", if known.is_empty() { "nothing".to_string() } else { known.join(", ") })]
    UnknownKind { api_version: String, kind: String, known: Vec<String> },
    #[error("unknown apiVersion {api_version:?} (kind {kind:?}): the API server does not serve it")]
    UnknownApiVersion { api_version: String, kind: String },
    #[error("invalid apiVersion {0:?}")]
    InvalidApiVersion(String),
    #[error("discovery of {api_version:?} failed: {source}")]
    Request {
        api_version: String,
        #[source]
        source: kube::Error,
    },
}

/// A caching resolver of kinds to resources.
#[derive(Clone)]
pub struct Discovery {
    client: kube::Client,
    cache: Arc<RwLock<HashMap<String, Arc<Vec<ApiResource>>>>>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").field("group_versions", &self.cache.read().len()).finish()
    }
}

impl Discovery {
    /// A resolver using `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client, cache: Arc::default() }
    }

    /// `(apiVersion, kind)` when an earlier lookup already read it, without a request.
    pub fn cached(&self, api_version: &str, kind: &str) -> Option<ApiResource> {
        self.cache.read().get(api_version)?.iter().find(|r| r.kind == kind).cloned()
    }

    /// Resolves `(apiVersion, kind)`.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<ApiResource, DiscoveryError> {
        let (group, version) = split_api_version(api_version);
        if version.is_empty()
            || api_version.matches('/').count() > 1
            || (api_version.contains('/') && group.is_empty())
        {
            return Err(DiscoveryError::InvalidApiVersion(api_version.to_owned()));
        }
        if let Some(r) = self.cached(api_version, kind) {
            return Ok(r);
        }
        let list = self.fetch(api_version, kind).await?;
        let found = list.iter().find(|r| r.kind == kind).cloned();
        let known = list.iter().map(|r| r.kind.clone()).collect::<Vec<_>>();
        self.cache.write().insert(api_version.to_owned(), list);
        found.ok_or_else(|| DiscoveryError::UnknownKind {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            known,
        })
    }

    async fn fetch(&self, api_version: &str, kind: &str) -> Result<Arc<Vec<ApiResource>>, DiscoveryError> {
        let (group, version) = split_api_version(api_version);
        let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{api_version}") };
        let request = http::Request::get(path).body(Vec::new()).map_err(|e| DiscoveryError::Request {
            api_version: api_version.to_owned(),
            source: kube::Error::HttpError(e),
        })?;
        let list: APIResourceList = match self.client.request(request).await {
            Ok(l) => l,
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(DiscoveryError::UnknownApiVersion {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                });
            }
            Err(source) => {
                return Err(DiscoveryError::Request { api_version: api_version.to_owned(), source });
            }
        };
        let mut resources: Vec<ApiResource> = list
            .resources
            .into_iter()
            .filter(|r| !r.name.contains('/'))
            .map(|r| ApiResource::new(api_version, &r.kind, &r.name, r.namespaced))
            .collect();
        resources.sort_by(|a, b| a.kind.cmp(&b.kind));
        Ok(Arc::new(resources))
    }
}
