//! The subcommands' implementations, at the binary's edge (anyhow errors with context).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

/// `wasmctrl run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The host TOML.
    #[arg(long, short, default_value = "wasmctrl.toml")]
    pub config: PathBuf,
}

/// `wasmctrl rbac`.
#[derive(Args, Debug)]
pub struct RbacArgs {
    /// The host TOML whose plugins directory is read.
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

pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

pub fn run(_args: RunArgs) -> Result<ExitCode> {
    anyhow::bail!("not wired yet")
}

pub fn check(_paths: &[PathBuf]) -> Result<ExitCode> {
    anyhow::bail!("not wired yet")
}

pub fn rbac(_args: RbacArgs) -> Result<ExitCode> {
    anyhow::bail!("not wired yet")
}

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
