//! The subcommands' implementations, at the binary's edge (anyhow errors with context).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};
use wasmctrl::config::{BuiltinKinds, ClusterConfig, HostConfig, PluginConfig, ServerAuth};
use wasmctrl::controller::leader::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use wasmctrl::informer::{FactoryOptions, InformerFactory};
use wasmctrl::metrics::Metrics;
use wasmctrl::oci::{OciOptions, OciSource, RegistryOptions, VerifyKey};
use wasmctrl::plugin::{CompileLimits, EngineConfig, KubeServices, PluginEngine, PoolingLimits};
use wasmctrl::reload::scan::plugin_tomls;
use wasmctrl::reload::{
    CheckOptions, EngineValidator, FactoryLeases, ManagerDeps, ManagerOptions, PluginManager, RbacOptions,
    StatusBoard, check_paths, rbac_for, webhook_configurations_for,
};
use wasmctrl::server::{Access, KubernetesAuth, Readiness, ServerTls, StatusSource};
use wasmctrl::shard::Sharding;
use wasmctrl::telemetry::Telemetry;
#[cfg(feature = "embedded")]
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

/// What `wasmctrl` says when asked for the embedded dev cluster it was built without.
#[cfg(not(feature = "embedded"))]
pub const NOT_EMBEDDED: &str = "the embedded dev cluster is not compiled into this wasmctrl (built without the \
     `embedded` feature); set `[cluster] kubeconfig` in the host TOML, or rebuild with `--features embedded`";

/// Without the `embedded` feature no dev cluster can be running: the type has no values.
#[cfg(not(feature = "embedded"))]
enum DevCluster {}

#[cfg(not(feature = "embedded"))]
impl DevCluster {
    async fn shutdown(self) {
        match self {}
    }
}

/// `wasmctrl run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The host TOML (see docs/configuration.md).
    #[arg(long, short, default_value = "wasmctrl.toml")]
    pub config: PathBuf,
    /// Use the embedded dev cluster, whatever the host TOML's `[cluster]` says.
    #[arg(long)]
    pub embedded: bool,
    /// With the embedded dev cluster: also write a kubeconfig for it here, so kubectl can
    /// watch what the plugins do.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Override the `[server] address` for /metrics, /healthz and /readyz.
    #[arg(long)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// With `[sharding]`: this replica's shard name, unique in the ring (default: the pod
    /// name from $POD_NAME, else the host name).
    #[arg(long, env = "WASMCTRL_SHARD_NAME")]
    pub shard_name: Option<String>,
}

/// `wasmctrl rbac`.
#[derive(Args, Debug)]
pub struct RbacArgs {
    /// The host TOML whose plugins directory (and leader election, sharding) is read.
    #[arg(long, short, default_value = "wasmctrl.toml")]
    pub config: PathBuf,
    /// The host's ServiceAccount.
    #[arg(long, default_value = "wasmctrl")]
    pub service_account: String,
    /// The ServiceAccount's namespace.
    #[arg(long, default_value = "wasmctrl-system")]
    pub namespace: String,
    /// Name of the (Cluster)Role and its binding.
    #[arg(long, default_value = "wasmctrl")]
    pub name: String,
    /// Always emit one ClusterRole (default: a Role per namespace when every plugin is
    /// limited to namespaces).
    #[arg(long)]
    pub cluster_scope: bool,
}

/// `wasmctrl webhook-config`.
#[derive(Args, Debug)]
pub struct WebhookConfigArgs {
    /// The host TOML whose `[admission]` table and plugins directory are read.
    #[arg(long, short, default_value = "wasmctrl.toml")]
    pub config: PathBuf,
}

/// `wasmctrl dev-cluster`.
#[derive(Args, Debug)]
pub struct DevClusterArgs {
    /// Where to write the kubeconfig for the dev cluster (use it with `kubectl --kubeconfig`).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Port on 127.0.0.1 (default: a free one).
    #[arg(long)]
    pub port: Option<u16>,
    /// Serve plain HTTP instead of HTTPS with a self-signed certificate.
    #[arg(long)]
    pub insecure_http: bool,
    /// Multi-document YAML files to create at start (e.g. examples/seed/*.yaml).
    #[arg(long)]
    pub seed: Vec<PathBuf>,
    /// Keep state across runs in this file (loaded at start, written on exit).
    #[arg(long)]
    pub state_file: Option<PathBuf>,
}

/// A layer of the process's subscriber.
pub type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Logs to stderr (filtered by `RUST_LOG`, default `info`), plus `traces` (the
/// OpenTelemetry layer, with its own filter) when given.
pub fn init_tracing(json: bool, traces: Option<BoxedLayer>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs: BoxedLayer =
        if json { fmt.json().with_filter(filter).boxed() } else { fmt.with_filter(filter).boxed() };
    let mut layers = vec![logs];
    layers.extend(traces);
    tracing_subscriber::registry().with(layers).init();
}

pub fn run(args: RunArgs, json_logs: bool) -> Result<ExitCode> {
    let mut host = match HostConfig::load(&args.config) {
        Ok(host) => host,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.embedded && !matches!(host.cluster, ClusterConfig::Embedded { .. }) {
        host.cluster = ClusterConfig::Embedded { seed: Vec::new(), state_file: None };
    }
    if let Some(address) = args.metrics_address {
        host.server_address = address;
    }
    let runtime = runtime()?;
    // The exporter's gRPC channel lives on the runtime: it is built inside it.
    let telemetry = match &host.telemetry {
        Some(config) => {
            let _inside = runtime.enter();
            let (telemetry, layer) = Telemetry::install::<Registry>(config).context("setting up traces")?;
            init_tracing(json_logs, Some(layer.boxed()));
            tracing::info!(endpoint = %config.endpoint, sampling_ratio = config.sampling_ratio, "exporting traces");
            Some(telemetry)
        }
        None => {
            init_tracing(json_logs, None);
            None
        }
    };
    let outcome = runtime.block_on(run_host(host, args.kubeconfig_out, args.shard_name));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    // Dropping the runtime waits for its blocking tasks: a hang after this line is one of them.
    tracing::debug!("host stopped; shutting the runtime down");
    drop(runtime);
    outcome
}

/// The host's life: cluster access, metrics endpoint, plugins (under leader election when
/// configured), until a signal; then drain and stop.
async fn run_host(
    host: HostConfig,
    kubeconfig_out: Option<PathBuf>,
    shard_name: Option<String>,
) -> Result<ExitCode> {
    let shutdown = CancellationToken::new();
    let (client, client_config, dev_cluster) = connect(&host.cluster, kubeconfig_out.as_deref()).await?;
    let metrics = Metrics::new();

    // The endpoint comes up first (liveness), reporting not-ready until plugins run.
    let status = Arc::new(LateStatus::default());
    let access = endpoint_access(&host, &client)?;
    let scheme = if matches!(access, Access::Open) { "http" } else { "https" };
    let (address, server) = wasmctrl::server::serve_with(
        host.server_address,
        access,
        metrics.clone(),
        status.clone(),
        shutdown.clone(),
    )
    .await
    .with_context(|| format!("binding the metrics endpoint on {}", host.server_address))?;
    tracing::info!(%address, %scheme, "serving /metrics, /healthz, /readyz and /plugins");

    let engine = PluginEngine::new(
        EngineConfig {
            cache_dir: Some(host.cache_dir.clone()),
            cache_max_bytes: host.cache_max_bytes,
            idle_instance_timeout: Some(host.idle_instance_timeout),
            idle_code_timeout: Some(host.idle_code_timeout),
            tier_up: host.tier_up,
            // Compiles run in a child process of this binary (see `EngineConfig`): the
            // compiler's code and memory stay out of the host.
            compile_process: std::env::current_exe().ok(),
            compile_limits: CompileLimits { timeout: host.compile_timeout, ..CompileLimits::default() },
            pooling: Some(PoolingLimits {
                instances: host.instance_slots,
                per_plugin: host.max_instances_per_plugin,
                ..PoolingLimits::default()
            }),
            ..EngineConfig::default()
        },
        Some(&metrics),
    )
    .context("configuring the WebAssembly engine")?;
    let factory = InformerFactory::with_metrics(
        client.clone(),
        FactoryOptions {
            max_object_size: usize::try_from(host.max_object_size).unwrap_or(usize::MAX),
            ..FactoryOptions::default()
        },
        metrics.clone(),
    );
    let identity = identity();
    let kube = KubeServices::with_discovery(
        client.clone(),
        tokio::runtime::Handle::current(),
        identity.clone(),
        factory.discovery().clone(),
    );
    let sharding = match &host.sharding {
        None => None,
        Some(config) => {
            let shard = shard_name.unwrap_or_else(default_shard_name);
            // Unique to this process: a restarted replica takes its Lease over only once the
            // previous holder's has run out (or was released).
            let holder = format!("{shard}_{}_{:08x}", std::process::id(), rand::random::<u32>());
            let revoke = kube.clone();
            // The ring's Leases go through connections of their own: a burst of the plugins'
            // (or the labeller's) requests must not hold up a renewal.
            let lease_client = kube::Client::try_from(client_config.clone())
                .context("creating the Kubernetes client for Leases")?;
            let sharding = Sharding::start(
                client.clone(),
                lease_client,
                factory.discovery().clone(),
                config.clone(),
                &shard,
                &holder,
                &metrics,
                move || revoke.revoke(),
            )
            .context("starting sharding")?;
            Some(sharding)
        }
    };
    let leader_metrics = metrics.clone();
    // Admission reviews are served from start-up; the plugins' versions join as they load.
    let admission = match &host.admission {
        Some(settings) => Some(
            wasmctrl::admission::start(settings, Some(client.clone()), Some(&metrics), shutdown.clone())
                .await
                .context("starting the admission server")?,
        ),
        None => None,
    };
    let deps = ManagerDeps {
        engine,
        informers: Arc::new(FactoryLeases(factory)),
        kube: Some(kube.clone()),
        metrics,
    };
    let mut options = ManagerOptions::new(&host.plugins_dir);
    options.defaults = host.plugin_defaults.clone();
    options.cache_sync_timeout = host.cache_sync_timeout;
    options.sharding = sharding.clone();
    options.rescan_interval = host.rescan_interval;
    options.parked_keys_ttl = host.parked_keys_ttl;
    options.admission = admission.as_ref().map(|a| a.router.clone());
    options.registry = Some(oci_source(&host)?);

    let signal = {
        let shutdown = shutdown.clone();
        // A replica of a ring first reconciles its deletes, calls running normally; it
        // cuts blocked calls itself when its plugins stop (see `run_sharded`).
        let engine = sharding.is_none().then(|| deps.engine.clone());
        tokio::spawn(async move {
            shutdown_signal().await;
            // Calls blocked in a host call (a guest's sleep) end now; the drain waits for
            // the rest, each bounded by its deadline.
            if let Some(engine) = engine {
                engine.shut_down_calls();
            }
            shutdown.cancel();
        })
    };

    let outcome = match (&host.leader_election, sharding) {
        (_, Some(sharding)) => run_sharded(options, deps, status, shutdown.clone(), sharding).await,
        (None, None) => run_plugins(options, deps, status, shutdown.clone()).await,
        (Some(le), None) => {
            let config = LeaderElectionConfig {
                lease_duration: le.lease_duration,
                renew_deadline: le.renew_deadline,
                retry_period: le.retry_period,
                ..LeaderElectionConfig::new(&le.namespace, &le.name, &identity)
            };
            // Losing the lease revokes the plugins' cluster access before anything else:
            // no write of theirs reaches the cluster after that, running calls are cut.
            let elector = LeaderElector::new(client, config)
                .context("configuring leader election")?
                .metrics(&leader_metrics)
                .on_lost(move || kube.revoke());
            tracing::info!(lease = %format!("{}/{}", le.namespace, le.name), %identity, "campaigning for leadership");
            let mut result = Ok(());
            let elected = elector
                .run(shutdown.clone(), |leading| async {
                    tracing::info!("elected leader; starting plugins");
                    result = run_plugins(options, deps, status, leading).await;
                })
                .await;
            match elected {
                Err(error @ LeaderElectionError::LeadershipLost { .. }) => {
                    // Like controller-runtime: a replica that lost its lease exits at once,
                    // without draining (a new leader may already act), and is restarted as
                    // a fresh candidate, so it never acts on a stale view.
                    tracing::error!(%error, "exiting without draining");
                    eprintln!("error: {error}");
                    std::process::exit(1);
                }
                other => result.and(other.context("leader election")),
            }
        }
    };
    tracing::debug!("plugins stopped; stopping the endpoints");
    shutdown.cancel();
    signal.abort();
    if let Some(admission) = admission {
        admission.server.stopped().await;
    }
    if let Ok(Err(error)) = server.await {
        tracing::warn!(%error, "metrics endpoint");
    }
    if let Some(cluster) = dev_cluster {
        cluster.shutdown().await;
    }
    outcome.map(|()| ExitCode::SUCCESS)
}

/// Where plugins whose TOML names `wasm = "oci://..."` come from, as `[oci]` configures it;
/// pulled plugins are kept under `cache-dir/oci`.
fn oci_source(host: &HostConfig) -> Result<OciSource> {
    let o = &host.oci;
    let mut verify_keys = Vec::new();
    if let Some(path) = &o.verify_key {
        verify_keys.push(VerifyKey::load(path).context("`[oci] verify-key`")?);
    }
    let options = OciOptions {
        registry: RegistryOptions {
            insecure_registries: o.insecure_registries.clone(),
            ca_certificates: o.ca_certificates.clone(),
            credentials: o.credentials.clone(),
        },
        store_dir: host.cache_dir.join("oci"),
        store_max_bytes: o.cache_max_bytes,
        max_wasm_bytes: o.max_wasm_bytes,
        poll_interval: o.poll_interval,
        verify_keys,
    };
    OciSource::new(options).context("setting up the registry client (`[oci]`)")
}

/// Who may read the endpoint, from `[server] auth`: with "kubernetes", the API server behind
/// `client` reviews each request, over HTTPS with the configured or a self-signed certificate.
fn endpoint_access(host: &HostConfig, client: &kube::Client) -> Result<Access> {
    let ServerAuth::Kubernetes { tls } = &host.server_auth else { return Ok(Access::Open) };
    let tls = match tls {
        Some(files) => ServerTls::from_files(&files.cert, &files.key).context("[server] TLS certificate")?,
        None => {
            let mut names: Vec<String> = std::env::var("HOSTNAME").into_iter().collect();
            if !host.server_address.ip().is_unspecified() {
                names.push(host.server_address.ip().to_string());
            }
            ServerTls::self_signed(&names).context("[server] self-signed TLS certificate")?
        }
    };
    Ok(Access::Kubernetes { auth: Arc::new(KubernetesAuth::new(client.clone())), tls })
}

/// Runs the plugins directory until `stop` is cancelled, then drains every plugin.
async fn run_plugins(
    options: ManagerOptions,
    deps: ManagerDeps,
    status: Arc<LateStatus>,
    stop: CancellationToken,
) -> Result<()> {
    let dir = options.plugins_dir.clone();
    let manager = PluginManager::start(options, deps, stop.clone())
        .await
        .with_context(|| format!("loading plugins from {}", dir.display()))?;
    status.set(manager.status());
    stop.cancelled().await;
    tracing::info!("draining plugins");
    manager.stopped().await;
    Ok(())
}

/// Runs the plugins directory as one shard of a ring until `stop` is cancelled: the
/// replica joins the ring once its plugins are loaded; on shutdown it first reconciles every
/// delete it was told of (the key's next owner may have started after the delete), then
/// drains every plugin, and only then leaves the ring (releasing its Lease). A replica whose
/// shard Lease is lost has already stopped every reconcile and revoked its plugins' cluster
/// access; it exits at once, without draining (another replica may already own its keys),
/// to be restarted as a new member.
async fn run_sharded(
    options: ManagerOptions,
    deps: ManagerDeps,
    status: Arc<LateStatus>,
    stop: CancellationToken,
    sharding: Sharding,
) -> Result<()> {
    let lost = || async {
        sharding.lost().await;
        tracing::error!(shard = %sharding.shard(), "shard lease lost: exiting without draining");
        eprintln!("error: the shard lease of {} was lost", sharding.shard());
        std::process::exit(1);
    };
    let dir = options.plugins_dir.clone();
    let engine = deps.engine.clone();
    // The plugins stop only after the deletes were reconciled: they run for that.
    let plugins_stop = CancellationToken::new();
    let manager = tokio::select! {
        manager = PluginManager::start(options, deps, plugins_stop.clone()) => manager
            .with_context(|| format!("loading plugins from {}", dir.display()))?,
        () = lost() => unreachable!("lost() exits"),
    };
    status.set(manager.status());
    if !stop.is_cancelled() {
        sharding.join();
        tracing::info!(shard = %sharding.shard(), "plugins loaded; joining the ring");
    }
    tokio::select! {
        _ = stop.cancelled() => {}
        () = lost() => {}
    }
    tracing::info!(shard = %sharding.shard(), "leaving the ring: reconciling the deletes this replica was told of");
    tokio::select! {
        () = sharding.finish_deletes() => {}
        () = lost() => {}
    }
    tracing::info!("draining plugins");
    // Calls blocked in a host call (a guest's sleep) end now; the drain waits for the rest,
    // each bounded by its deadline.
    engine.shut_down_calls();
    plugins_stop.cancel();
    tokio::select! {
        () = manager.stopped() => {}
        () = lost() => {}
    }
    tracing::info!(shard = %sharding.shard(), "plugins drained; releasing the shard lease");
    sharding.leave().await;
    tracing::info!(shard = %sharding.shard(), "left the ring");
    Ok(())
}

/// The shard name when none is given: the pod name, else the host name.
fn default_shard_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| "wasmctrl".to_owned())
        .to_lowercase()
}

/// A client for the configured cluster, and its configuration (for a second client with
/// connections of its own); with the embedded one, the running dev cluster too.
async fn connect(
    cluster: &ClusterConfig,
    kubeconfig_out: Option<&std::path::Path>,
) -> Result<(kube::Client, kube::Config, Option<DevCluster>)> {
    let config = match cluster {
        #[cfg(not(feature = "embedded"))]
        ClusterConfig::Embedded { .. } => {
            let _ = kubeconfig_out;
            anyhow::bail!(NOT_EMBEDDED);
        }
        #[cfg(feature = "embedded")]
        ClusterConfig::Embedded { seed, state_file } => {
            let config = DevClusterConfig {
                seed: read_seeds(seed)?,
                state_file: state_file.clone(),
                ..DevClusterConfig::default()
            };
            let dev = DevCluster::start(config).await.context("starting the embedded dev cluster")?;
            tracing::info!(url = %dev.url(), objects = dev.object_count(), "embedded dev cluster running");
            if let Some(path) = kubeconfig_out {
                dev.write_kubeconfig(path)
                    .with_context(|| format!("writing kubeconfig {}", path.display()))?;
                tracing::info!(kubeconfig = %path.display(), "kubectl --kubeconfig {} get all -A", path.display());
            }
            let client = dev.client().context("connecting to the embedded dev cluster")?;
            return Ok((client, dev.kube_config(), Some(dev)));
        }
        ClusterConfig::Kubeconfig { path, context } => {
            let options = KubeConfigOptions { context: context.clone(), ..KubeConfigOptions::default() };
            match path {
                Some(path) => {
                    let file = Kubeconfig::read_from(path)
                        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                    kube::Config::from_custom_kubeconfig(file, &options).await
                }
                None => kube::Config::from_kubeconfig(&options).await,
            }
            .context("loading the kubeconfig")?
        }
        ClusterConfig::InCluster => {
            kube::Config::incluster().context("loading the in-cluster configuration")?
        }
    };
    let client = kube::Client::try_from(config.clone()).context("creating the Kubernetes client")?;
    Ok((client, config, None))
}

/// This replica's name in leases and Events: the pod name in a cluster, else host + pid.
fn identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| format!("{h}_{}", std::process::id()))
        .unwrap_or_else(|_| format!("wasmctrl_{}", std::process::id()))
}

/// The plugins' status, once the manager runs (not ready before).
#[derive(Default)]
struct LateStatus(std::sync::OnceLock<StatusBoard>);

impl LateStatus {
    fn set(&self, board: StatusBoard) {
        let _ = self.0.set(board);
    }
}

impl StatusSource for LateStatus {
    fn readiness(&self) -> Readiness {
        match self.0.get() {
            Some(board) => board.readiness(),
            None => Readiness {
                ready: false,
                details: vec!["plugins not started (waiting for leadership or still loading)".into()],
            },
        }
    }

    fn plugins(&self) -> serde_json::Value {
        self.0.get().map(|b| b.plugins()).unwrap_or_else(|| serde_json::json!([]))
    }
}

pub fn check(paths: &[PathBuf]) -> Result<ExitCode> {
    // Components are compiled and instantiated for real (no cluster needed); kinds are
    // checked against the built-in list, since `check` runs offline.
    let engine = PluginEngine::new(EngineConfig { pooling: None, ..EngineConfig::default() }, None)
        .context("configuring the WebAssembly engine")?;
    let validator = EngineValidator(engine);
    let progress = crate::progress::CheckDisplay::new();
    let options =
        CheckOptions { components: Some(&validator), progress: Some(&progress), ..CheckOptions::default() };
    let report = check_paths(paths, &options);
    progress.finish();
    print!("{}", report.render());
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub fn rbac(args: RbacArgs) -> Result<ExitCode> {
    let host = match HostConfig::load(&args.config) {
        Ok(host) => host,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::from(2));
        }
    };
    let Some(plugins) = load_plugin_tomls(&host)? else {
        // RBAC for only some plugins would fail at run time in a confusing way.
        return Ok(ExitCode::from(2));
    };
    let options = RbacOptions {
        service_account: args.service_account,
        service_account_namespace: args.namespace,
        name: args.name,
        cluster_scope: args.cluster_scope.then_some(true),
        leader_election: host.leader_election.clone(),
        sharding: host.sharding.clone(),
        endpoint_auth: matches!(host.server_auth, ServerAuth::Kubernetes { .. }),
        webhook_configurations: host.admission.as_ref().is_some_and(|a| a.manage_configurations),
    };
    let manifests = rbac_for(&plugins, &options, &BuiltinKinds);
    print!("{}", manifests.to_yaml().context("encoding the RBAC as YAML")?);
    Ok(ExitCode::SUCCESS)
}

/// Every plugin TOML of the host's plugins directory, checked; `None` when any is invalid
/// (its errors printed).
fn load_plugin_tomls(host: &HostConfig) -> Result<Option<Vec<PluginConfig>>> {
    let tomls = plugin_tomls(&host.plugins_dir)
        .with_context(|| format!("reading plugins directory {}", host.plugins_dir.display()))?;
    let mut plugins = Vec::new();
    let mut failed = false;
    for toml in &tomls {
        match PluginConfig::load(toml, &host.plugin_defaults) {
            Ok(p) => plugins.push(p),
            Err(errors) => {
                eprintln!("{errors}");
                failed = true;
            }
        }
    }
    Ok((!failed).then_some(plugins))
}

pub fn webhook_config(args: WebhookConfigArgs) -> Result<ExitCode> {
    let host = match HostConfig::load(&args.config) {
        Ok(host) => host,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::from(2));
        }
    };
    let Some(settings) = &host.admission else {
        anyhow::bail!(
            "{} has no [admission] table: the host serves no admission webhooks (see docs/admission.md)",
            args.config.display()
        );
    };
    let ca = match &settings.certificate {
        Some(files) => match &files.ca {
            Some(ca) => {
                Some(std::fs::read(ca).with_context(|| format!("reading the CA bundle {}", ca.display()))?)
            }
            None => None,
        },
        None => {
            eprintln!(
                "note: the host generates its certificate at start, so its CA is not known here and no caBundle is printed; \
                 give [admission] cert-file, key-file and ca-file, or let the host write the configurations"
            );
            None
        }
    };
    let Some(plugins) = load_plugin_tomls(&host)? else {
        return Ok(ExitCode::from(2));
    };
    print!("{}", webhook_configurations_for(&plugins, settings, ca.as_deref(), &BuiltinKinds)?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "embedded"))]
pub fn dev_cluster(_args: DevClusterArgs) -> Result<ExitCode> {
    anyhow::bail!(NOT_EMBEDDED)
}

#[cfg(feature = "embedded")]
pub fn dev_cluster(args: DevClusterArgs) -> Result<ExitCode> {
    let seed = read_seeds(&args.seed)?;
    let config = DevClusterConfig {
        port: args.port,
        tls: !args.insecure_http,
        seed,
        state_file: args.state_file,
        ..DevClusterConfig::default()
    };
    runtime()?.block_on(async move {
        let cluster = DevCluster::start(config).await.context("starting the dev cluster")?;
        cluster
            .write_kubeconfig(&args.kubeconfig)
            .with_context(|| format!("writing kubeconfig {}", args.kubeconfig.display()))?;
        println!("dev cluster listening on {}", cluster.url());
        println!("kubeconfig written to {}", args.kubeconfig.display());
        println!("try: kubectl --kubeconfig {} get namespaces", args.kubeconfig.display());
        cluster.run_until(shutdown_signal()).await.context("stopping the dev cluster")?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Reads seed YAML files, naming the file that failed.
#[cfg(feature = "embedded")]
pub fn read_seeds(paths: &[PathBuf]) -> Result<Vec<String>> {
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading seed file {}", p.display())))
        .collect()
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => tracing::info!("interrupted, shutting down"),
        () = term => tracing::info!("terminated, shutting down"),
    }
}
