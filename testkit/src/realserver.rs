//! The real API server: `realcluster/` (a Go program running etcd, kube-apiserver and the
//! garbage-collector, namespace and ServiceAccount controllers of one pinned Kubernetes release)
//! built with the Go toolchain and run as a child process.
//!
//! Invariants: the binary is built only from `realcluster/` and Go modules, into a directory
//! outside the source tree ([`cache_dir`]), and rebuilt only when a source file is newer than
//! it; a started server is ready (its "realcluster: ready" line was read) before
//! [`RealServer::start`] returns; the child's standard input is a pipe it watches, so the
//! server stops when the [`RealServer`] is dropped or when this process ends in any way.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// Selects the backend of [`crate::TestCluster`]: `dev` (default) or `real`.
pub const BACKEND_ENV: &str = "WASMCTRL_TEST_BACKEND";
/// Kubeconfig of an already running real server to use instead of starting one.
pub const KUBECONFIG_ENV: &str = "WASMCTRL_TEST_KUBECONFIG";
/// The line the server prints on stdout once it serves.
const READY_PREFIX: &str = "realcluster: ready";
/// Start-up includes etcd, the API server's post-start hooks and the controllers' first sync.
const READY_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a stopping server may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the real server could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum RealServerError {
    /// No `go` on PATH.
    #[error("the real API server needs Go (`go` was not found on PATH)")]
    GoMissing,
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `go build` failed (its output went to this process's stderr).
    #[error("`go build` of {dir} failed with {status}")]
    Build {
        /// The Go module built.
        dir: PathBuf,
        /// Its exit status.
        status: ExitStatus,
    },
    /// The server exited or closed stdout before it was ready.
    #[error("the real API server stopped before it was ready; its log ({log}) ends with:\n{tail}")]
    Exited {
        /// The server's log file.
        log: PathBuf,
        /// The last lines of the log.
        tail: String,
    },
    /// The server printed no ready line in time.
    #[error("the real API server was not ready within {}s; its log is {log}", READY_TIMEOUT.as_secs())]
    Timeout {
        /// The server's log file.
        log: PathBuf,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RealServerError {
    let what = what.into();
    move |source| RealServerError::Io { what, source }
}

/// The Go module of the real server (`realcluster/` at the repository root).
///
/// Cargo sets `CARGO_MANIFEST_DIR` for the processes it runs (tests, `cargo run`), always a
/// package one level below the root here; it is preferred to the path baked in when this
/// crate was compiled, which is another clone's when clones share a target directory.
pub fn source_dir() -> PathBuf {
    let at_runtime = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|d| Path::new(&d).join("..").join("realcluster"))
        .filter(|d| d.join("go.mod").is_file());
    at_runtime.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("realcluster"))
}

/// Where the binary is built: `$CARGO_TARGET_DIR/realcluster`, else
/// `$HOME/.cache/wasmctrl/realcluster`, else a directory under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("realcluster");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache/wasmctrl/realcluster");
    }
    std::env::temp_dir().join("wasmctrl-realcluster")
}

pub use crate::gotool::go_available;

/// The `-ldflags` stamping the Kubernetes release of `go.mod` into the binary, as the
/// Kubernetes build does (otherwise `/version` reports v0.0.0-master, which kubectl rejects).
fn version_ldflags(src: &Path) -> Result<String, RealServerError> {
    let go_mod = src.join("go.mod");
    let text = std::fs::read_to_string(&go_mod).map_err(io(format!("reading {}", go_mod.display())))?;
    let version = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("k8s.io/kubernetes "))
        .map(str::trim)
        .find(|v| v.starts_with('v'))
        .ok_or_else(|| RealServerError::Io {
            what: format!("{} requires no k8s.io/kubernetes version", go_mod.display()),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        })?;
    let mut parts = version.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().unwrap_or("1"), parts.next().unwrap_or("0"));
    Ok(["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"]
        .iter()
        .map(|pkg| {
            format!(
                "-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
            )
        })
        .collect::<Vec<_>>()
        .join(" "))
}

/// Builds the server unless the binary is newer than every source file; returns its path.
/// Go's build cache makes a rebuild after a source change fast; the first build compiles
/// Kubernetes and takes minutes.
pub fn build() -> Result<PathBuf, RealServerError> {
    let src = source_dir();
    let out_dir = cache_dir();
    let binary = out_dir.join("realcluster");
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    if built.is_some_and(|t| t >= crate::gotool::newest_source(&src).unwrap_or(SystemTime::now())) {
        return Ok(binary);
    }
    if !go_available() {
        return Err(RealServerError::GoMissing);
    }
    std::fs::create_dir_all(&out_dir).map_err(io(format!("creating {}", out_dir.display())))?;
    // Build next to the destination, then rename: concurrent builders never run a partial file.
    let tmp = out_dir.join(format!(".realcluster.{}.tmp", std::process::id()));
    eprintln!("testkit: building the real API server ({} → {})", src.display(), binary.display());
    let status = Command::new("go")
        .current_dir(&src)
        .args(["build", "-trimpath", "-buildvcs=false", "-ldflags"])
        .arg(version_ldflags(&src)?)
        .arg("-o")
        .arg(&tmp)
        .arg(".")
        .stdin(Stdio::null())
        .status()
        .map_err(io("running `go build`"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(RealServerError::Build { dir: src, status });
    }
    std::fs::rename(&tmp, &binary).map_err(io(format!("installing {}", binary.display())))?;
    Ok(binary)
}

/// A running real server (a child process). Dropping it stops the server.
#[derive(Debug)]
pub struct RealServer {
    child: Child,
    stdin: Option<ChildStdin>,
    kubeconfig: PathBuf,
    log: PathBuf,
    url: String,
    startup: Duration,
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl RealServer {
    /// Starts `binary`, which writes its admin kubeconfig to `kubeconfig` and logs to
    /// `dir/realcluster.log`, and waits until it is ready.
    pub fn start(binary: &Path, dir: &Path, kubeconfig: &Path) -> Result<RealServer, RealServerError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let kubeconfig = kubeconfig.to_owned();
        let log = dir.join("realcluster.log");
        let log_file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let started = Instant::now();
        let mut child = Command::new(binary)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--exit-on-stdin-close")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err(RealServerError::Exited { log: log.clone(), tail: "no stdout".into() });
        };
        // A thread reads stdout so the wait below can time out; it keeps draining after.
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with(READY_PREFIX) {
                    let _ = ready_tx.send(line);
                }
            }
        });
        let line = match ready_rx.recv_timeout(READY_TIMEOUT) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.wait();
                return Err(RealServerError::Exited { tail: tail(&log, 30), log });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RealServerError::Timeout { log });
            }
        };
        let url = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("server="))
            .unwrap_or_default()
            .to_owned();
        Ok(RealServer { child, stdin, kubeconfig, log, url, startup: started.elapsed() })
    }

    /// The admin kubeconfig the server wrote.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The server's log (stderr of etcd, kube-apiserver and the controllers).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The API server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Time from spawning the process to its ready line.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// Waits until the server exits by itself (it stops on SIGTERM or SIGINT, e.g. Ctrl-C).
    pub fn wait(mut self) -> Result<ExitStatus, RealServerError> {
        self.child.wait().map_err(io("waiting for the real API server"))
    }

    /// Stops the server: closes its standard input, then kills it if it has not exited in time.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
