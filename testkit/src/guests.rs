//! The compiled guest plugins of `guests/`, for tests that load them.

use std::path::PathBuf;

/// The `.wasm` of guest crate `crate_name` (`guests/target/wasm32-wasip2/release/`); panics
/// with the command that builds it when it is missing.
pub fn wasm(crate_name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run `cargo xtask build-guests` to build the test plugins", path.display())
    })
}
