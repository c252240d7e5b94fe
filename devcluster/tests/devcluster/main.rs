//! Integration tests of the dev cluster, in one binary: kube-rs as a client for every verb
//! (`kube_client`), kubectl as a real client (`kubectl`), concurrent writers/watchers
//! (`concurrency`) and what it gives a local user (`local_security`).

mod concurrency;
mod kube_client;
mod kubectl;
mod local_security;

use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

/// A TLS dev cluster with default settings.
pub async fn cluster() -> DevCluster {
    DevCluster::start(DevClusterConfig::default()).await.expect("dev cluster starts")
}

/// A dev cluster with a config tweak.
pub async fn cluster_with(f: impl FnOnce(&mut DevClusterConfig)) -> DevCluster {
    let mut config = DevClusterConfig::default();
    f(&mut config);
    DevCluster::start(config).await.expect("dev cluster starts")
}

/// The HTTP code of a kube API error (panics on other errors).
pub fn code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}
