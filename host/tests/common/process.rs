//! The real binary as a host for the integration tests: `wasmctrl run` started as a child
//! process, as a user starts it, from a host TOML the test wrote.
//!
//! It keeps these promises to the tests that use it:
//! - the child is killed and reaped when its [`HostProcess`] is dropped, however the test
//!   ends (a failed assertion included), so no host outlives its test or holds its ports;
//! - [`HostProcess::run_embedded`] returns once the host's embedded API server wrote the
//!   kubeconfig it was asked for, with a client of that server; the wait is bounded by the
//!   test's patience and fails saying what it waited for.
//!
//! Included with `#[path = "common/process.rs"] mod process;`; not every suite uses every part.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `wasmctrl` binary of this build.
pub const WASMCTRL: &str = env!("CARGO_BIN_EXE_wasmctrl");

/// How often [`HostProcess::run_embedded`] looks for the kubeconfig again.
const POLL_FILE: Duration = Duration::from_millis(50);

/// A running `wasmctrl` child process; killed and reaped on drop.
pub struct HostProcess(pub Child);

impl HostProcess {
    /// Spawns `command` (a `wasmctrl` command line); fails naming `what`.
    pub fn spawn(command: &mut Command, what: &str) -> HostProcess {
        HostProcess(command.spawn().unwrap_or_else(|e| panic!("{what}: cannot start: {e}")))
    }

    /// Runs `wasmctrl run --config <config>` (a host TOML whose `[cluster]` is `embedded`),
    /// its output discarded, and waits at most `patience` for the kubeconfig of its API
    /// server (written next to `config`); returns the host and a client of that server.
    pub async fn run_embedded(config: &Path, patience: Duration) -> (HostProcess, kube::Client) {
        let kubeconfig = config.with_file_name("kubeconfig");
        let host = HostProcess::spawn(
            Command::new(WASMCTRL)
                .arg("run")
                .arg("--config")
                .arg(config)
                .arg("--kubeconfig-out")
                .arg(&kubeconfig)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "wasmctrl run",
        );
        tokio::time::timeout(patience, async {
            while !kubeconfig.is_file() {
                tokio::time::sleep(POLL_FILE).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("wasmctrl run wrote no {} in {patience:?}", kubeconfig.display()));
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("the host's kubeconfig"),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("a client configuration from the host's kubeconfig");
        (host, kube::Client::try_from(config).expect("a client of the host's API server"))
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
