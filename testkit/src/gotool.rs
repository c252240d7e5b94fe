//! Building Go programs for tests: the Go toolchain on PATH, Go's own module and build
//! caches (outside the repository), and binaries kept next to the Cargo target directory.
//!
//! Invariants: a binary is installed by renaming a finished build into place, so test
//! processes building at once never run half a file; a build that fails says what was built
//! (its output went to this process's stderr).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::SystemTime;

/// Why a Go tool could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum GoToolError {
    /// No `go` on PATH.
    #[error("this needs Go (`go` was not found on PATH)")]
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
    /// `go build` / `go install` failed.
    #[error("building {what} with Go failed with {status}")]
    Build {
        /// What was built.
        what: String,
        /// The exit status.
        status: ExitStatus,
    },
    /// The program stopped or said something unexpected.
    #[error("{0}")]
    Run(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> GoToolError {
    let what = what.into();
    move |source| GoToolError::Io { what, source }
}

/// Whether the Go toolchain is installed.
pub fn go_available() -> bool {
    std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success())
}

/// Where test tools are built: `$CARGO_TARGET_DIR/<name>`, else `$HOME/.cache/wasmctrl/<name>`,
/// else a directory under the system temp dir.
pub fn out_dir(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join(name);
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache/wasmctrl").join(name);
    }
    std::env::temp_dir().join(format!("wasmctrl-{name}"))
}

/// The newest modification time of the Go sources (`*.go`, `go.mod`, `go.sum`) of `dir`.
pub(crate) fn newest_source(dir: &Path) -> Result<SystemTime, GoToolError> {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))? {
        let path = entry.map_err(io(format!("reading {}", dir.display())))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.ends_with(".go") || name == "go.mod" || name == "go.sum" {
            let modified = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .map_err(io(format!("reading {}", path.display())))?;
            newest = newest.max(modified);
        }
    }
    Ok(newest)
}

/// Builds the main package of the Go module `src` into `binary`, unless `binary` is newer
/// than every source file.
pub(crate) fn build_module(src: &Path, binary: &Path) -> Result<(), GoToolError> {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok();
    if built.is_some_and(|t| t >= newest_source(src).unwrap_or(SystemTime::now())) {
        return Ok(());
    }
    if !go_available() {
        return Err(GoToolError::GoMissing);
    }
    let dir = binary.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let tmp = dir.join(format!(".build.{}.tmp", std::process::id()));
    eprintln!("testkit: building {} → {}", src.display(), binary.display());
    let status = Command::new("go")
        .current_dir(src)
        .args(["build", "-trimpath", "-buildvcs=false", "-o"])
        .arg(&tmp)
        .arg(".")
        .stdin(Stdio::null())
        .status()
        .map_err(io("running `go build`"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(GoToolError::Build { what: src.display().to_string(), status });
    }
    std::fs::rename(&tmp, binary).map_err(io(format!("installing {}", binary.display())))
}

/// Installs `package@version` (a main package of a published module, built with that
/// module's own `go.mod`) as `binary`, unless `binary` exists.
pub(crate) fn install_package(package_at_version: &str, binary: &Path) -> Result<(), GoToolError> {
    if binary.is_file() {
        return Ok(());
    }
    if !go_available() {
        return Err(GoToolError::GoMissing);
    }
    let dir = binary.parent().unwrap_or(Path::new("."));
    let gobin = dir.join(format!(".install.{}", std::process::id()));
    std::fs::create_dir_all(&gobin).map_err(io(format!("creating {}", gobin.display())))?;
    eprintln!(
        "testkit: building {package_at_version} → {} (once; Go's build cache keeps it)",
        binary.display()
    );
    let status = Command::new("go")
        .args(["install", "-trimpath", package_at_version])
        .env("GOBIN", &gobin)
        .env("GOFLAGS", "-buildvcs=false")
        .stdin(Stdio::null())
        .status()
        .map_err(io("running `go install`"))?;
    let result = if status.success() {
        let name =
            package_at_version.split('@').next().unwrap_or_default().rsplit('/').next().unwrap_or_default();
        std::fs::rename(gobin.join(name), binary).map_err(io(format!("installing {}", binary.display())))
    } else {
        Err(GoToolError::Build { what: package_at_version.to_owned(), status })
    };
    let _ = std::fs::remove_dir_all(&gobin);
    result
}

/// Installs `package@version` as `<out_dir("oci-tools")>/<name>-<version>`, once per process.
pub(crate) fn install_once(name: &str, package_at_version: &str) -> Result<PathBuf, GoToolError> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _one_at_a_time = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let version = package_at_version.rsplit('@').next().unwrap_or("latest");
    let binary = out_dir("oci-tools").join(format!("{name}-{version}"));
    install_package(package_at_version, &binary)?;
    Ok(binary)
}
