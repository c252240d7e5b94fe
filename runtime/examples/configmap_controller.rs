//! A ConfigMap controller built on `wasmctrl-runtime` alone, no WebAssembly: a shared
//! informer watches the ConfigMaps of one namespace, a controller's workers reconcile each
//! changed key, and the reconciler (native Rust) reads the object from the informer's cache
//! and records how many data keys it has in an annotation. Level-triggered: the annotation's
//! own update comes back as an event, and its reconcile finds nothing to do.
//!
//! Run it against any cluster your kubeconfig points at (`KUBECONFIG`, `~/.kube/config`),
//! e.g. the embedded dev cluster:
//!
//! ```text
//! cargo run -p wasmctrl -- dev-cluster --kubeconfig /tmp/dev.kubeconfig &
//! KUBECONFIG=/tmp/dev.kubeconfig cargo run -p wasmctrl-runtime --example configmap_controller -- default
//! kubectl --kubeconfig /tmp/dev.kubeconfig create configmap demo --from-literal=a=1
//! ```
//!
//! The argument is the namespace (default: `default`). Ctrl-C stops it: in-flight reconciles
//! finish first. Without a kubeconfig, or with an API server that does not answer, it exits
//! with an error saying so.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use wasmctrl_runtime::controller::{
    Action, Controller, InformerSource, ReconcileError, Request, reconciler_fn,
};
use wasmctrl_runtime::informer::{FactoryOptions, InformerFactory, InformerSpec};

/// The annotation the controller keeps up to date.
const ANNOTATION: &str = "example.wasmctrl.dev/data-keys";

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    let namespace = std::env::args().nth(1).unwrap_or_else(|| "default".to_owned());

    let client = kube::Client::try_default().await.context(
        "no cluster to talk to: point KUBECONFIG at a kubeconfig (runtime/README.md shows the dev cluster)",
    )?;
    let version = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .context("the kubeconfig's API server did not answer within 10 s")?
        .context("the kubeconfig's API server cannot be reached")?;
    println!(
        "connected to Kubernetes {}.{}; watching ConfigMaps in {namespace}",
        version.major, version.minor
    );

    // One informer per (kind, namespace, selectors), shared by every controller of the factory.
    let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
    let configmaps =
        InformerSource::new(&factory, InformerSpec::new("v1", "ConfigMap").namespace(&namespace))
            .await
            .with_context(|| format!("starting the ConfigMap informer of namespace {namespace}"))?;

    let cache = configmaps.lease().informer().indexer();
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let reconciler = reconciler_fn(move |request: Request| {
        let (cache, api) = (cache.clone(), api.clone());
        async move {
            // The cache is what the informer has seen: no request to the API server.
            let Some(object) = cache.get(&request.key()) else {
                println!("{request}: deleted");
                return Ok(Action::Done);
            };
            let configmap: ConfigMap =
                object.parse().map_err(|e| ReconcileError::Terminal(format!("decoding {request}: {e}")))?;
            let keys = configmap.data.map_or(0, |d| d.len()) + configmap.binary_data.map_or(0, |d| d.len());
            let wanted = keys.to_string();
            if object.annotation(ANNOTATION) == Some(wanted.as_str()) {
                return Ok(Action::Done);
            }
            let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: wanted } } });
            api.patch(&request.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| ReconcileError::Retryable(format!("annotating {request}: {e}")))?;
            println!("{request}: annotated, {ANNOTATION}={keys}");
            Ok(Action::Done)
        }
    });

    let controller = Controller::builder("configmap-data-keys", reconciler)
        .for_source(configmaps)
        .max_concurrent_reconciles(2)
        .build()
        .context("building the controller")?;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        }
    });
    controller.run(shutdown).await.context("running the controller")?;
    factory.shutdown();
    Ok(())
}
