//! An in-memory, kubectl-compatible Kubernetes API server for development and tests.
//!
//! [`DevCluster::start`] serves the Kubernetes REST protocol on `127.0.0.1` (random port by
//! default) with bearer-token auth over HTTPS (a self-signed CA generated at start) or,
//! for tests, plain HTTP. It serves discovery, the built-in kinds Namespace, ConfigMap,
//! Secret, Service, Pod, Event (core and events.k8s.io), Deployment, Lease and
//! CustomResourceDefinition, and every kind a CRD defines, all through one schemaless store
//! (see [`store`]). `kubectl` and `kube::Client` talk to it as to a real cluster.
//!
//! Invariants: the server only ever binds loopback; every request but `/healthz`,
//! `/livez`, `/readyz` needs the token; stopping (by [`DevCluster::shutdown`] or drop) ends
//! all connections and, when a state file is configured, writes a snapshot to it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wasmctrl_devcluster::Error> {
//! use wasmctrl_devcluster::{DevCluster, DevClusterConfig};
//! let cluster = DevCluster::start(DevClusterConfig::default()).await?;
//! cluster.write_kubeconfig("/tmp/dev.kubeconfig")?;
//! println!("serving at {}", cluster.url());
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

pub mod error;
#[cfg(feature = "faults")]
pub mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod kubeconfig;
mod managed;
pub mod patch;
mod proto;
pub mod resources;
pub mod selector;
mod server;
pub mod store;
mod tls;
mod util;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use error::{ApiError, Error};
#[cfg(feature = "faults")]
pub use faults::{FaultAction, FaultRule, Faults};
use store::{Store, Subresource, WriteOpts};

/// The field manager recorded for objects created by seeding.
pub const SEED_FIELD_MANAGER: &str = "wasmctrl-seed";

/// How to start a [`DevCluster`].
#[derive(Debug, Clone)]
pub struct DevClusterConfig {
    /// Port on 127.0.0.1; `None` picks a free one.
    pub port: Option<u16>,
    /// Serve HTTPS with a self-signed CA (default). `false` serves plain HTTP (tests).
    pub tls: bool,
    /// Bearer token clients must send; `None` generates a random one.
    pub token: Option<String>,
    /// YAML documents (each may hold several `---`-separated objects) applied at start.
    pub seed: Vec<String>,
    /// Snapshot file: loaded at start if it exists, written on shutdown.
    pub state_file: Option<PathBuf>,
    /// Watch events kept per resource for resuming watches (older RVs get 410).
    pub history_size: usize,
}

impl Default for DevClusterConfig {
    fn default() -> Self {
        Self { port: None, tls: true, token: None, seed: Vec::new(), state_file: None, history_size: 10_000 }
    }
}

impl DevClusterConfig {
    /// Plain-HTTP configuration for tests (random port, random token).
    pub fn plain_http() -> Self {
        Self { tls: false, ..Self::default() }
    }
}

/// A running dev cluster. Dropping it stops the server (and saves the state file).
pub struct DevCluster {
    addr: SocketAddr,
    token: String,
    ca_pem: Option<String>,
    ca_der: Option<Vec<u8>>,
    store: Arc<Store>,
    #[cfg(feature = "faults")]
    faults: Faults,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    state_file: Option<PathBuf>,
}

impl std::fmt::Debug for DevCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCluster")
            .field("url", &self.url())
            .field("tls", &self.ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl DevCluster {
    /// Starts the server on 127.0.0.1 (must be called inside a tokio runtime): loads the
    /// state file if present, applies the seed documents, then serves until stopped.
    pub async fn start(config: DevClusterConfig) -> Result<DevCluster, Error> {
        let store = Arc::new(Store::new(config.history_size));
        if let Some(path) = &config.state_file
            && path.exists()
        {
            let data = std::fs::read(path).map_err(|source| Error::Io {
                what: format!("reading state file {}", path.display()),
                source,
            })?;
            let snap: store::Snapshot = serde_json::from_slice(&data)
                .map_err(|e| Error::Seed(format!("state file {}: {e}", path.display())))?;
            store.restore(snap).map_err(|e| Error::Seed(format!("state file {}: {e}", path.display())))?;
        }
        for doc in &config.seed {
            apply_yaml_to(&store, doc)?;
        }
        let listener = TcpListener::bind(("127.0.0.1", config.port.unwrap_or(0)))
            .await
            .map_err(|source| Error::Io { what: "binding 127.0.0.1".into(), source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Io { what: "reading the bound address".into(), source })?;
        let token = config.token.clone().unwrap_or_else(|| {
            let b: [u8; 24] = rand::random();
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
        });
        #[cfg(feature = "faults")]
        let faults = Faults::new(store.clone());
        let state = Arc::new(server::AppState {
            store: store.clone(),
            token: token.clone(),
            #[cfg(feature = "faults")]
            faults: faults.clone(),
            address: addr.to_string(),
        });
        let tls = if config.tls { Some(tls::generate()?) } else { None };
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let acceptor = tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.server_config.clone()));
        let router = server::router(state);
        let task = tokio::spawn(serve(listener, acceptor, router, stop_rx));
        tracing::info!(url = %format!("{}://{addr}", if config.tls { "https" } else { "http" }), "dev cluster serving");
        Ok(DevCluster {
            addr,
            token,
            ca_pem: tls.as_ref().map(|t| t.ca_pem.clone()),
            ca_der: tls.as_ref().map(|t| t.ca_der.clone()),
            store,
            #[cfg(feature = "faults")]
            faults,
            stop,
            task: Some(task),
            state_file: config.state_file,
        })
    }

    /// The server URL, e.g. `https://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The self-signed CA certificate (PEM), when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig (context `wasmctrl-dev`, namespace `default`) for this server.
    pub fn kubeconfig(&self) -> kube_client::config::Kubeconfig {
        kubeconfig::build(&self.url(), &self.token, self.ca_pem.as_deref())
    }

    /// [`Self::kubeconfig`] as YAML.
    pub fn kubeconfig_yaml(&self) -> Result<String, Error> {
        kubeconfig::to_yaml(&self.kubeconfig()).map_err(Error::Kubeconfig)
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`, readable by its owner only (see
    /// [`write_private`]).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        write_private(path, self.kubeconfig_yaml()?.as_bytes())
            .map_err(|source| Error::Io { what: format!("writing kubeconfig {}", path.display()), source })
    }

    /// Test-only fault injection handle (drop watches, compact history, pause, latency,
    /// 5xx / 429 on a path), compiled in only with the `faults` feature.
    #[cfg(feature = "faults")]
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// Applies multi-document YAML (create, or replace if the object exists) directly to the
    /// store. Returns how many objects were applied.
    pub fn apply_yaml(&self, yaml: &str) -> Result<usize, Error> {
        apply_yaml_to(&self.store, yaml)
    }

    /// The object store behind the server, for in-process benchmarks and tests that need to
    /// write faster than HTTP allows. Not part of the stable API.
    #[doc(hidden)]
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Number of objects stored (all kinds, including the initial namespaces).
    pub fn object_count(&self) -> usize {
        self.store.object_count()
    }

    /// The current resourceVersion of the store.
    pub fn resource_version(&self) -> u64 {
        self.store.current_rv()
    }

    /// Serves until `signal` completes, then shuts down (writing the state file).
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> Result<(), Error> {
        signal.await;
        self.shutdown_inner().await
    }

    /// Stops serving, closes all connections and writes the state file if configured.
    pub async fn shutdown(self) {
        if let Err(error) = self.shutdown_inner().await {
            tracing::error!(%error, "dev cluster shutdown");
        }
    }

    async fn shutdown_inner(mut self) -> Result<(), Error> {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            // The serve loop ends promptly once signalled; a join error only means it panicked.
            let _ = task.await;
        }
        self.save_state()
    }

    /// Writes the state file now (also done on shutdown), readable by its owner only (it
    /// holds every object, Secrets included; see [`write_private`]).
    pub fn save_state(&self) -> Result<(), Error> {
        let Some(path) = &self.state_file else { return Ok(()) };
        let snap = self.store.snapshot().map_err(|e| Error::Seed(format!("snapshot: {e}")))?;
        let data = serde_json::to_vec(&snap).map_err(|e| Error::Seed(format!("encoding snapshot: {e}")))?;
        write_private(path, &data)
            .map_err(|source| Error::Io { what: format!("writing state file {}", path.display()), source })
    }

    /// A `kube::Config` for this server (trusting its CA, with the token).
    #[cfg(feature = "kube")]
    pub fn kube_config(&self) -> kube::Config {
        let url: http::Uri =
            self.url().parse().unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1"));
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".into();
        config.root_cert = self.ca_der.clone().map(|der| vec![der]);
        config.auth_info.token = Some(self.token.clone().into());
        config
    }

    /// A `kube::Client` for this server.
    #[cfg(feature = "kube")]
    pub fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.kube_config()).map_err(|e| Error::Client(e.to_string()))
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.stop.send_replace(true);
            task.abort();
            if let Err(error) = self.save_state() {
                tracing::error!(%error, "dev cluster: saving state on drop");
            }
        }
    }
}

/// Writes `data` to `path` as a file only its owner may read or write (0600 on Unix), whole or
/// not at all: the bytes go to a new temporary file in the same directory (an unpredictable
/// name, created 0600 and exclusively, so nothing planted there beforehand is written
/// through), which then replaces `path`. A symlink at `path` is replaced, not followed; the
/// directory is created when missing.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir
        }
        None => Path::new("."),
    };
    let stem = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // tempfile creates the file with O_EXCL and mode 0600.
    let mut file = tempfile::Builder::new().prefix(&format!(".{stem}.")).suffix(".tmp").tempfile_in(dir)?;
    file.write_all(data)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Accept loop: serves each connection (TLS or plain) until `stop` flips, then drops all
/// connections.
async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(error) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(%error, "dev cluster accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let tls = tls.clone();
        conns.spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let result = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await,
                    Err(error) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                },
                None => builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).await,
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Parses multi-document YAML into objects (`kind: List` is flattened; empty docs skipped).
pub fn parse_yaml_documents(yaml: &str) -> Result<Vec<Value>, Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc).map_err(|e| Error::Seed(format!("YAML: {e}")))?;
        match v {
            Value::Null => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                if let Some(items) = m.get("items").and_then(Value::as_array) {
                    out.extend(items.iter().cloned());
                }
            }
            Value::Object(_) => out.push(v),
            other => return Err(Error::Seed(format!("YAML document is not an object: {other}"))),
        }
    }
    Ok(out)
}

fn apply_yaml_to(store: &Store, yaml: &str) -> Result<usize, Error> {
    let objects = parse_yaml_documents(yaml)?;
    let n = objects.len();
    for obj in objects {
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = util::meta_str(&obj, "name").to_string();
        let what = format!("{api_version}/{kind} {name}");
        let Some((info, _)) = store.resource_for_kind(api_version, kind) else {
            return Err(Error::Rejected {
                object: what,
                error: ApiError::bad_request(format!("no resource serves {api_version}/{kind}")),
            });
        };
        let ns = if info.namespaced {
            match util::meta_str(&obj, "namespace") {
                "" => "default".to_string(),
                ns => ns.to_string(),
            }
        } else {
            String::new()
        };
        let opts = WriteOpts { dry_run: false, manager: Some(SEED_FIELD_MANAGER.into()) };
        let mut body = obj.clone();
        if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let result = match store.create(&info.gr, &ns, body.clone(), &opts) {
            Err(e) if e.code == 409 && e.reason == "AlreadyExists" => store
                .modify(&info.gr, &ns, &name, Subresource::Main, &opts, false, |_, _| Ok(body))
                .map(|_| ()),
            other => other.map(|_| ()),
        };
        result.map_err(|error| Error::Rejected { object: what, error })?;
    }
    Ok(n)
}
