//! Test harness giving integration tests a Kubernetes API server of either backend: the
//! in-process dev cluster or a real kube-apiserver (with etcd and kube-controller-manager's
//! garbage-collector and namespace controllers) built from `realcluster/`.
//!
//! The backend is chosen by `WASMCTRL_TEST_BACKEND=dev|real` (default `dev`). With `real`, the
//! server named by `WASMCTRL_TEST_KUBECONFIG` is used (`cargo xtask test` starts one for the
//! whole run), or one is built and started on demand, once per test process.
//!
//! For the tests of plugins from OCI registries, [`registry::TestRegistry`] runs a real
//! registry (the CNCF Distribution registry, built from its Go module) and [`tools`] builds
//! the real `cosign` and `oras`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), wasmctrl_testkit::TestClusterError> {
//! let cluster = wasmctrl_testkit::TestCluster::start().await?;
//! let ns = cluster.namespace().await?;
//! cluster.apply_yaml(&format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: a, namespace: {ns}}}\n")).await?;
//! if let Some(dev) = cluster.dev_or_skip("fault injection") {
//!     dev.faults().drop_watches();
//! }
//! # Ok(()) }
//! ```

#[cfg(feature = "cluster")]
mod cluster;
pub mod gotool;
pub mod guests;
pub mod realserver;
pub mod registry;
pub mod tools;

#[cfg(feature = "cluster")]
pub use cluster::{Backend, FIELD_MANAGER, TestCluster, TestClusterError};
pub use realserver::{BACKEND_ENV, KUBECONFIG_ENV, RealServer, RealServerError};
pub use registry::{RegistryConfig, TestRegistry};
