//! The crate is the informer machinery without WebAssembly: nothing of wasmtime (its engine,
//! its WASI host, its code generators) may enter its normal dependency graph, with every
//! feature, on every platform. `cargo tree` lists that graph as cargo resolves it.
//!
//! `wit-bindgen` is not looked for on every platform: built for a WASI target, `getrandom`
//! (under `rand`) binds WASI's imports with it, as a guest; no platform brings it as a host.

use std::process::Command;

/// Packages of the Wasm runtime: wasmtime and its crates (`wasmtime-*`), and its code
/// generators.
fn is_wasm_runtime(package: &str) -> bool {
    package == "wasmtime"
        || package.starts_with("wasmtime-")
        || package.starts_with("cranelift")
        || package.starts_with("winch")
}

/// The packages of `package`'s normal dependency graph (itself included), by name.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let output = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "--package", package, "--edges", "normal"])
        .args(["--all-features", "--target", "all", "--prefix", "none", "--format", "{p}"])
        .output()
        .unwrap_or_else(|e| panic!("running {cargo} tree: {e}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo tree -p {package} failed: {stderr}");
    let tree = String::from_utf8(output.stdout).expect("cargo tree prints UTF-8");
    let packages: Vec<String> =
        tree.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_owned).collect();
    // The listing is the real graph: the package and what every crate here is built on.
    for expected in [package, "tokio", "kube", "k8s-openapi"] {
        assert!(
            packages.iter().any(|p| p == expected),
            "{expected} missing from cargo tree -p {package}:\n{tree}"
        );
    }
    packages
}

#[test]
fn the_runtime_never_depends_on_wasmtime() {
    let wasm: Vec<String> =
        normal_dependencies("wasmctrl-runtime").into_iter().filter(|p| is_wasm_runtime(p)).collect();
    assert!(wasm.is_empty(), "wasmctrl-runtime depends on the Wasm runtime through {wasm:?}");
}

#[test]
fn the_check_sees_wasmtime_where_it_is() {
    // The host does run Wasm: the same listing must show wasmtime there, or the check above
    // would pass whatever the runtime depended on.
    let host = normal_dependencies("wasmctrl");
    for expected in ["wasmtime", "wasmtime-wasi"] {
        assert!(host.iter().any(|p| p == expected), "{expected} not seen in the host's graph");
    }
    for package in ["kube", "tokio", "wasmparser", "wit-bindgen", "wasmctrl-runtime"] {
        assert!(!is_wasm_runtime(package), "{package}");
    }
}
