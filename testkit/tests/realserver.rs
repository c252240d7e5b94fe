//! The real API server's admin kubeconfig (its static token is `system:masters`), written
//! where a test run or a developer asks, often a shared directory such as `/tmp`: readable by
//! its owner only, and never written through a file or link another user planted there.
//! Skipped, saying so, without Go.

use std::os::unix::fs::{PermissionsExt, symlink};

use wasmctrl_testkit::realserver::{self, RealServer};

#[test]
fn the_admin_kubeconfig_is_private_and_replaces_a_planted_link() {
    if !realserver::go_available() {
        eprintln!("skipped: Go is not installed, so the real API server cannot be built");
        return;
    }
    let binary = realserver::build().expect("the real API server builds");
    let dir = tempfile::tempdir().expect("a directory");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "untouched").expect("write");
    let kubeconfig = dir.path().join("real.kubeconfig");
    symlink(&victim, &kubeconfig).expect("a planted link");
    let server = RealServer::start(&binary, &dir.path().join("run"), &kubeconfig).expect("the server starts");
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "untouched", "the link was not followed");
    let meta = std::fs::symlink_metadata(&kubeconfig).expect("the kubeconfig");
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(std::fs::read_to_string(&kubeconfig).expect("read").contains("token:"));
    server.stop();
}
