//! A real OCI registry for tests: the CNCF Distribution registry
//! (`github.com/distribution/distribution/v3`) of one pinned release, built from the Go
//! module in `testkit/registry/` and run as a child process, as [`crate::realserver`] runs
//! the real API server.
//!
//! The module's `main.go` serves the registry's own HTTP application
//! (`registry/handlers.NewApp`, what `cmd/registry` serves) with in-memory storage on
//! 127.0.0.1 and a free port, optionally behind HTTP basic authentication (the registry's
//! htpasswd access controller) and TLS (a certificate for 127.0.0.1 from a fresh CA).
//!
//! Invariants: the binary is rebuilt only when a source file is newer than it; a started
//! registry serves (its "registry: ready" line was read) before [`TestRegistry::start`]
//! returns; it listens on loopback only; its standard input is a pipe it watches, so it stops
//! when the [`TestRegistry`] is dropped or this process ends in any way; every registry has
//! empty storage of its own.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::gotool::{self, GoToolError, io};

const READY_PREFIX: &str = "registry: ready";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The Go module of the test registry (`testkit/registry/`).
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("registry")
}

/// Builds the registry unless it is up to date (once per process); returns the binary.
pub fn build() -> Result<PathBuf, GoToolError> {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = &*built {
        return Ok(b.clone());
    }
    let binary = gotool::out_dir("testregistry").join("registry");
    gotool::build_module(&source_dir(), &binary)?;
    *built = Some(binary.clone());
    Ok(binary)
}

/// How to run a registry.
#[derive(Clone, Debug, Default)]
pub struct RegistryConfig {
    /// Require this user and password (HTTP basic authentication).
    pub htpasswd: Option<(String, String)>,
    /// Serve HTTPS with a certificate from a fresh CA ([`TestRegistry::ca_pem`]).
    pub tls: bool,
}

/// A running registry. Dropping it stops it.
#[derive(Debug)]
pub struct TestRegistry {
    child: Child,
    stdin: Option<ChildStdin>,
    address: String,
    dir: PathBuf,
    tls: bool,
}

impl TestRegistry {
    /// Builds (if needed) and starts a registry.
    pub fn start(config: RegistryConfig) -> Result<TestRegistry, GoToolError> {
        let binary = build()?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wasmctrl-test-registry-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let log = dir.join("registry.log");
        let log_file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let mut command = Command::new(&binary);
        command.arg("--exit-on-stdin-close");
        if let Some((user, password)) = &config.htpasswd {
            command.arg("--htpasswd").arg(format!("{user}:{password}"));
        }
        if config.tls {
            command.arg("--tls-dir").arg(&dir);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err(GoToolError::Run("the registry has no stdout".into()));
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with(READY_PREFIX) {
                    let _ = ready_tx.send(line);
                }
            }
        });
        let started = Instant::now();
        let line = match ready_rx.recv_timeout(READY_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log_text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(GoToolError::Run(format!(
                    "the registry was not ready after {:?}; its log:\n{log_text}",
                    started.elapsed()
                )));
            }
        };
        let address =
            line.split_whitespace().find_map(|f| f.strip_prefix("address=")).unwrap_or_default().to_owned();
        Ok(TestRegistry { child, stdin, address, dir, tls: config.tls })
    }

    /// Starts a registry, or prints why the calling test is skipped and returns `None` when
    /// Go is not installed. Any other failure panics.
    pub fn start_or_skip(test: &str, config: RegistryConfig) -> Option<TestRegistry> {
        match TestRegistry::start(config) {
            Ok(r) => Some(r),
            Err(GoToolError::GoMissing) => {
                eprintln!(
                    "{test}: skipped: the test registry is built from Go modules and `go` was not found on PATH"
                );
                None
            }
            Err(e) => panic!("{test}: test registry: {e}"),
        }
    }

    /// `127.0.0.1:PORT`: the registry part of a reference.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The CA that signed the registry's certificate, with `tls`.
    pub fn ca_pem(&self) -> Option<PathBuf> {
        self.tls.then(|| self.dir.join("ca.pem"))
    }

    /// The registry's log (stderr).
    pub fn log(&self) -> PathBuf {
        self.dir.join("registry.log")
    }

    /// Stops the registry now (as dropping it does).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
