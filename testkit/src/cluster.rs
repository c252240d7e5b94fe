//! [`TestCluster`]: one test's view of a Kubernetes API server of either backend.
//!
//! - `dev` (default): a fresh in-process [`DevCluster`] per test, with fault injection.
//! - `real`: one real API server shared by every test of the run, given by
//!   [`KUBECONFIG_ENV`](crate::KUBECONFIG_ENV) (the xtask starts it once) or started on demand
//!   once per test process.
//!
//! Invariants: tests are isolated by name, not by server: every namespace a test gets from
//! [`TestCluster::namespace`] / [`TestCluster::namespace_named`] and every name from
//! [`TestCluster::unique`] carries a suffix unique to the `TestCluster`, on both backends, so
//! a test behaves the same on either. The namespaces a test created are deleted when its
//! `TestCluster` drops (on the real server; the dev cluster is dropped whole).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use rand::Rng;
use serde_json::Value;
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

use crate::realserver::{self, BACKEND_ENV, KUBECONFIG_ENV, RealServer, RealServerError};

/// The field manager of [`TestCluster::apply_yaml`] on the real server.
pub const FIELD_MANAGER: &str = "wasmctrl-testkit";
/// Objects applied at once by [`TestCluster::apply_yaml`] on the real server.
const APPLY_CONCURRENCY: usize = 16;
/// How long [`TestCluster::wait_crd_established`] and the wait for a namespace's default
/// ServiceAccount take at most.
const CRD_PATIENCE: Duration = Duration::from_secs(60);

/// Which kind of API server a [`TestCluster`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The in-process dev cluster (`wasmctrl-devcluster`).
    Dev,
    /// A real kube-apiserver with etcd and kube-controller-manager's GC and namespace controllers.
    Real,
}

impl Backend {
    /// The backend chosen by [`BACKEND_ENV`] (`dev` when unset).
    pub fn from_env() -> Result<Backend, TestClusterError> {
        match std::env::var(BACKEND_ENV).as_deref() {
            Err(_) | Ok("") | Ok("dev") => Ok(Backend::Dev),
            Ok("real") => Ok(Backend::Real),
            Ok(other) => Err(TestClusterError::Backend(other.to_owned())),
        }
    }
}

/// Why a [`TestCluster`] could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum TestClusterError {
    /// [`BACKEND_ENV`] names no backend.
    #[error("{BACKEND_ENV}={0}: expected `dev` or `real`")]
    Backend(String),
    /// The dev cluster failed to start.
    #[error("starting the dev cluster: {0}")]
    Dev(#[from] wasmctrl_devcluster::Error),
    /// The real server could not be built or started.
    #[error("starting the real API server: {0}")]
    Real(String),
    /// The kubeconfig could not be read or written.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A request to the API server failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// YAML given to [`TestCluster::apply_yaml`] is not a list of Kubernetes objects.
    #[error("invalid YAML object: {0}")]
    Yaml(String),
    /// A namespace got no `default` ServiceAccount in time.
    #[error("namespace {0} got no default ServiceAccount within {1:?}")]
    NamespaceNotReady(String, Duration),
    /// A user granted access by [`TestCluster::grant`] was not authorized in time.
    #[error("user {0} was not authorized within {1:?} after its RoleBinding was made")]
    NotAuthorized(String, Duration),
    /// A CRD did not become established in time.
    #[error("CustomResourceDefinition {0} not established within {1:?}")]
    NotEstablished(String, Duration),
    /// Writing a temporary file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TestClusterError {
    let what = what.into();
    move |source| TestClusterError::Api { what, source }
}

/// The real server of this process when none was given by [`KUBECONFIG_ENV`]: built and
/// started by the first test that needs it, stopped when the process exits (its stdin closes).
fn on_demand_server() -> Result<PathBuf, TestClusterError> {
    static SERVER: OnceLock<Result<(RealServer, tempfile::TempDir), String>> = OnceLock::new();
    static STARTING: Mutex<()> = Mutex::new(());
    let _guard = STARTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = SERVER.get_or_init(|| {
        let start = || -> Result<(RealServer, tempfile::TempDir), RealServerError> {
            let binary = realserver::build()?;
            let dir =
                tempfile::Builder::new().prefix("wasmctrl-realcluster-").tempdir().map_err(|source| {
                    RealServerError::Io { what: "creating the real server's directory".into(), source }
                })?;
            let server = RealServer::start(&binary, dir.path(), &dir.path().join("kubeconfig"))?;
            eprintln!(
                "testkit: real API server at {} (ready in {:.1}s, log {})",
                server.url(),
                server.startup().as_secs_f64(),
                server.log().display()
            );
            Ok((server, dir))
        };
        start().map_err(|e| e.to_string())
    });
    match started {
        Ok((server, _)) => Ok(server.kubeconfig().to_owned()),
        Err(message) => Err(TestClusterError::Real(message.clone())),
    }
}

/// One test's API server connection, namespaces and helpers. See the module docs.
pub struct TestCluster {
    backend: Backend,
    dev: Option<DevCluster>,
    config: kube::Config,
    client: kube::Client,
    kubeconfig_path: PathBuf,
    suffix: String,
    namespaces: Mutex<Vec<String>>,
    resources: Mutex<HashMap<GroupVersionKind, (ApiResource, ApiCapabilities)>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("backend", &self.backend)
            .field("url", &self.config.cluster_url)
            .field("suffix", &self.suffix)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// A cluster of the backend chosen by [`BACKEND_ENV`]; for `dev` a plain-HTTP dev cluster.
    pub async fn start() -> Result<TestCluster, TestClusterError> {
        Self::start_with(DevClusterConfig::plain_http()).await
    }

    /// Like [`Self::start`], with this configuration for the dev backend (ignored on the real one).
    pub async fn start_with(dev_config: DevClusterConfig) -> Result<TestCluster, TestClusterError> {
        Self::start_backend(Backend::from_env()?, dev_config).await
    }

    /// A cluster of the given backend, whatever [`BACKEND_ENV`] says (tests comparing the two).
    pub async fn start_backend(
        backend: Backend,
        dev_config: DevClusterConfig,
    ) -> Result<TestCluster, TestClusterError> {
        let dir = tempfile::Builder::new().prefix("wasmctrl-test-").tempdir().map_err(|source| {
            TestClusterError::Io { what: "creating a temporary directory".into(), source }
        })?;
        let suffix = format!("{:06x}", rand::rng().random::<u32>() & 0xff_ffff);
        match backend {
            Backend::Dev => {
                let dev = DevCluster::start(dev_config).await?;
                let kubeconfig_path = dir.path().join("kubeconfig");
                dev.write_kubeconfig(&kubeconfig_path)?;
                let config = dev.kube_config();
                let client = dev.client()?;
                Ok(Self::new(Backend::Dev, Some(dev), config, client, kubeconfig_path, suffix, dir))
            }
            Backend::Real => {
                let kubeconfig_path = match std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) {
                    Some(path) => PathBuf::from(path),
                    None => tokio::task::spawn_blocking(on_demand_server)
                        .await
                        .map_err(|e| TestClusterError::Real(e.to_string()))??,
                };
                let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig_path).map_err(|e| {
                    TestClusterError::Kubeconfig { path: kubeconfig_path.clone(), message: e.to_string() }
                })?;
                let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|e| TestClusterError::Kubeconfig {
                        path: kubeconfig_path.clone(),
                        message: e.to_string(),
                    })?;
                let client = kube::Client::try_from(config.clone()).map_err(api_err("building a client"))?;
                Ok(Self::new(Backend::Real, None, config, client, kubeconfig_path, suffix, dir))
            }
        }
    }

    fn new(
        backend: Backend,
        dev: Option<DevCluster>,
        config: kube::Config,
        client: kube::Client,
        kubeconfig_path: PathBuf,
        suffix: String,
        dir: tempfile::TempDir,
    ) -> TestCluster {
        TestCluster {
            backend,
            dev,
            config,
            client,
            kubeconfig_path,
            suffix,
            namespaces: Mutex::new(Vec::new()),
            resources: Mutex::new(HashMap::new()),
            _dir: dir,
        }
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The dev cluster, for dev-only fault injection; `None` on the real server.
    pub fn dev(&self) -> Option<&DevCluster> {
        self.dev.as_ref()
    }

    /// The dev cluster, or `None` after printing that the test is skipped on the real server
    /// and why (`needs` says what the test needs of the dev cluster).
    pub fn dev_or_skip(&self, needs: &str) -> Option<&DevCluster> {
        if self.dev.is_none() {
            eprintln!("testkit: skipped on the real API server: this test needs {needs}");
        }
        self.dev.as_ref()
    }

    /// A client for the server.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The client configuration (URL, CA, token).
    pub fn kube_config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A kubeconfig file for the server.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `base` with this cluster's unique suffix, for objects of cluster-scoped kinds.
    pub fn unique(&self, base: &str) -> String {
        format!("{base}-{}", self.suffix)
    }

    /// Creates a fresh namespace (`test-<suffix>`, then `test-<suffix>-<n>`) and returns its name.
    pub async fn namespace(&self) -> Result<String, TestClusterError> {
        let n = self.namespaces.lock().unwrap_or_else(|p| p.into_inner()).len();
        let base = if n == 0 { "test".to_owned() } else { format!("test{n}") };
        self.namespace_named(&base).await
    }

    /// Creates the namespace `<base>-<suffix>` (if it does not exist) and returns its name.
    pub async fn namespace_named(&self, base: &str) -> Result<String, TestClusterError> {
        let name = self.unique(base);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .map_err(|e| TestClusterError::Yaml(e.to_string()))?;
        match Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(TestClusterError::Api { what: format!("creating namespace {name}"), source });
            }
        }
        self.track_namespace(&name);
        self.wait_namespace_usable(&name).await?;
        Ok(name)
    }

    /// Creates the namespace `name` exactly, without the unique suffix, for a test that runs
    /// once per server (and so owns the name). A namespace of that name still terminating
    /// (a previous run on the same server) is waited out first; one that exists and is
    /// active is reused. It is deleted when this `TestCluster` drops, like the others.
    pub async fn namespace_exact(&self, name: &str) -> Result<String, TestClusterError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let gone = async {
            loop {
                let existing =
                    api.get_opt(name).await.map_err(api_err(format!("reading namespace {name}")))?;
                let terminating = existing
                    .and_then(|ns| ns.status)
                    .and_then(|status| status.phase)
                    .is_some_and(|phase| phase == "Terminating");
                if !terminating {
                    return Ok::<(), TestClusterError>(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::time::timeout(CRD_PATIENCE, gone)
            .await
            .map_err(|_| TestClusterError::NamespaceNotReady(name.to_owned(), CRD_PATIENCE))??;
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .map_err(|e| TestClusterError::Yaml(e.to_string()))?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(TestClusterError::Api { what: format!("creating namespace {name}"), source });
            }
        }
        self.track_namespace(name);
        self.wait_namespace_usable(name).await?;
        Ok(name.to_owned())
    }

    /// A client that acts as the user `user` (the admin credentials impersonate it), so a
    /// test can give and take permissions with [`Self::grant`] and [`Self::revoke`]: on the
    /// real server the user may do only what a Role bound to it allows. The dev cluster does
    /// not authorize requests: there this client may do everything, like [`Self::client`].
    pub fn client_as(&self, user: &str) -> Result<kube::Client, TestClusterError> {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        kube::Client::try_from(config).map_err(api_err(format!("building a client acting as {user}")))
    }

    /// Creates (or updates) the Role `name` in `ns` with `rules` (RBAC policy rules, as
    /// JSON) and the RoleBinding `name` binding it to the user `user`, then waits until the
    /// authorizer lets `user` do the first verb of the first rule on its first resource.
    /// The dev cluster does not authorize requests: there it does nothing.
    pub async fn grant(
        &self,
        ns: &str,
        user: &str,
        name: &str,
        rules: Value,
    ) -> Result<(), TestClusterError> {
        if self.backend != Backend::Real {
            return Ok(());
        }
        let role = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": ns}, "rules": rules,
        });
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        });
        self.apply_yaml(&format!("{role}\n---\n{binding}\n")).await?;
        let first = |field: &str| rules[0][field][0].as_str().unwrap_or_default().to_owned();
        let (group, resource, verb) = (first("apiGroups"), first("resources"), first("verbs"));
        let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {},
            "spec": {"user": user, "resourceAttributes": {
                "namespace": ns, "group": group, "resource": resource, "verb": verb,
            }},
        }))
        .map_err(|e| TestClusterError::Yaml(e.to_string()))?;
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let allowed = async {
            loop {
                let answer = api
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(api_err(format!("reviewing {user}'s access in {ns}")))?;
                if answer.status.is_some_and(|status| status.allowed) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(CRD_PATIENCE, allowed)
            .await
            .map_err(|_| TestClusterError::NotAuthorized(user.to_owned(), CRD_PATIENCE))?
    }

    /// Deletes the RoleBinding `name` in `ns` made by [`Self::grant`]: from now on (once the
    /// authorizer has seen the deletion) its user may no longer do what the Role allowed.
    /// Nothing on the dev cluster (see [`Self::grant`]).
    pub async fn revoke(&self, ns: &str, name: &str) -> Result<(), TestClusterError> {
        if self.backend != Backend::Real {
            return Ok(());
        }
        let api: Api<RoleBinding> = Api::namespaced(self.client.clone(), ns);
        api.delete(name, &DeleteParams::default())
            .await
            .map_err(api_err(format!("deleting RoleBinding {ns}/{name}")))?;
        Ok(())
    }

    fn track_namespace(&self, name: &str) {
        let mut namespaces = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
        if !namespaces.iter().any(|n| n == name) {
            namespaces.push(name.to_owned());
        }
    }

    /// On the real server, waits until the ServiceAccount controller has created the
    /// namespace's `default` ServiceAccount: until then the API server refuses Pods there.
    async fn wait_namespace_usable(&self, ns: &str) -> Result<(), TestClusterError> {
        if self.backend != Backend::Real {
            return Ok(());
        }
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let found = async {
            loop {
                if api.get_opt("default").await.map_err(api_err(format!("reading {ns}/default")))?.is_some() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(CRD_PATIENCE, found)
            .await
            .map_err(|_| TestClusterError::NamespaceNotReady(ns.to_owned(), CRD_PATIENCE))?
    }

    /// Applies multi-document YAML and returns how many objects were applied. On the dev
    /// cluster it is written straight to the store; on the real server it is applied
    /// server-side (force, field manager [`FIELD_MANAGER`]): Namespaces and CRDs first (each
    /// CRD then waited for until established), then everything else concurrently.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<usize, TestClusterError> {
        if let Some(dev) = &self.dev {
            return Ok(dev.apply_yaml(yaml)?);
        }
        let docs = wasmctrl_devcluster::parse_yaml_documents(yaml)?;
        let (first, rest): (Vec<Value>, Vec<Value>) = docs
            .into_iter()
            .partition(|d| matches!(d["kind"].as_str(), Some("Namespace" | "CustomResourceDefinition")));
        for doc in &first {
            self.apply_one(doc).await?;
            let Some(name) = doc["metadata"]["name"].as_str() else { continue };
            if doc["kind"] == "CustomResourceDefinition" {
                self.wait_crd_established(name).await?;
            } else {
                self.track_namespace(name);
                self.wait_namespace_usable(name).await?;
            }
        }
        futures::stream::iter(rest.iter().map(|doc| self.apply_one(doc)))
            .buffer_unordered(APPLY_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(first.len() + rest.len())
    }

    /// Server-side applies one object.
    pub async fn apply_one(&self, doc: &Value) -> Result<(), TestClusterError> {
        let (api, name) = self.dynamic_api(doc).await?;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(doc))
            .await
            .map_err(api_err(format!("applying {} {name}", doc["kind"].as_str().unwrap_or("?"))))?;
        Ok(())
    }

    /// The dynamic API for an object's kind (and namespace), resolved by discovery once per kind.
    pub async fn dynamic_api(&self, doc: &Value) -> Result<(Api<DynamicObject>, String), TestClusterError> {
        let field = |path: &[&str]| {
            path.iter().try_fold(doc, |v, key| v.get(key)).and_then(Value::as_str).map(str::to_owned)
        };
        let api_version =
            field(&["apiVersion"]).ok_or_else(|| TestClusterError::Yaml("no apiVersion".into()))?;
        let kind = field(&["kind"]).ok_or_else(|| TestClusterError::Yaml("no kind".into()))?;
        let name = field(&["metadata", "name"])
            .ok_or_else(|| TestClusterError::Yaml(format!("{kind} without a name")))?;
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
        let gvk = GroupVersionKind::gvk(group, version, &kind);
        let cached = self.resources.lock().unwrap_or_else(|p| p.into_inner()).get(&gvk).cloned();
        let (resource, caps) = match cached {
            Some(found) => found,
            None => {
                let found = kube::discovery::pinned_kind(&self.client, &gvk)
                    .await
                    .map_err(api_err(format!("discovering {api_version} {kind}")))?;
                self.resources.lock().unwrap_or_else(|p| p.into_inner()).insert(gvk, found.clone());
                found
            }
        };
        let api = match (caps.scope, field(&["metadata", "namespace"])) {
            (Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), &ns, &resource),
            (Scope::Namespaced, None) => Api::default_namespaced_with(self.client.clone(), &resource),
        };
        Ok((api, name))
    }

    /// Waits until the CRD `name` has the condition Established=True.
    pub async fn wait_crd_established(&self, name: &str) -> Result<(), TestClusterError> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let established = async {
            loop {
                let crd = api.get(name).await.map_err(api_err(format!("reading CRD {name}")))?;
                let ok = crd.status.and_then(|s| s.conditions).is_some_and(|conditions| {
                    conditions.iter().any(|c| c.type_ == "Established" && c.status == "True")
                });
                if ok {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(CRD_PATIENCE, established)
            .await
            .map_err(|_| TestClusterError::NotEstablished(name.to_owned(), CRD_PATIENCE))?
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.backend != Backend::Real {
            return;
        }
        let namespaces = std::mem::take(&mut *self.namespaces.lock().unwrap_or_else(|p| p.into_inner()));
        if namespaces.is_empty() {
            return;
        }
        // The test's runtime may be shutting down: delete from a thread with its own runtime.
        // The namespace controller removes the contents afterwards.
        let config = self.config.clone();
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async move {
                let Ok(client) = kube::Client::try_from(config) else { return };
                let api: Api<Namespace> = Api::all(client);
                let params = DeleteParams::background();
                for ns in namespaces {
                    let delete = api.delete(&ns, &params);
                    if let Ok(Err(error)) = tokio::time::timeout(Duration::from_secs(10), delete).await {
                        eprintln!("testkit: deleting namespace {ns}: {error}");
                    }
                }
            });
        });
        let _ = cleanup.join();
    }
}
