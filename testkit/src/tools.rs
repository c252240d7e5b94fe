//! The real `cosign` (sigstore's signing tool, `github.com/sigstore/cosign/v2/cmd/cosign`
//! of one pinned release) and `oras` (the ORAS project's OCI artifact tool,
//! `oras.land/oras/cmd/oras`), built once with Go for the tests that check what wasmctrl
//! writes against them.
//!
//! Invariants: built with `go install package@version`, so with each release's own
//! `go.mod`; kept under the Cargo target directory by version, so a version change builds
//! anew and nothing else does.

use std::path::PathBuf;

use crate::gotool::{self, GoToolError};

/// The cosign release the tests use.
pub const COSIGN_VERSION: &str = "v2.6.5";

/// Builds cosign unless it is there (once per process); returns the binary.
pub fn build_cosign() -> Result<PathBuf, GoToolError> {
    gotool::install_once("cosign", &format!("github.com/sigstore/cosign/v2/cmd/cosign@{COSIGN_VERSION}"))
}

/// The oras release the tests use.
pub const ORAS_VERSION: &str = "v1.3.6";

/// Builds oras unless it is there (once per process); returns the binary.
pub fn build_oras() -> Result<PathBuf, GoToolError> {
    gotool::install_once("oras", &format!("oras.land/oras/cmd/oras@{ORAS_VERSION}"))
}

/// Builds `tool` with `build`, or prints why the calling test is skipped and returns `None`
/// when Go is not installed. Any other failure panics.
pub fn or_skip(test: &str, tool: &str, build: fn() -> Result<PathBuf, GoToolError>) -> Option<PathBuf> {
    match build() {
        Ok(b) => Some(b),
        Err(GoToolError::GoMissing) => {
            eprintln!("{test}: skipped: {tool} is built from its Go module and `go` was not found on PATH");
            None
        }
        Err(e) => panic!("{test}: {tool}: {e}"),
    }
}
