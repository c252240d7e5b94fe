//! Project tasks, so that a fresh machine with only Rust installed needs one command each:
//!
//! - `cargo xtask demo`  — build the example plugins, then run the host with them against
//!   the embedded dev cluster seeded with `examples/seed`.
//! - `cargo xtask test`  — build the guest plugins, then run every test of both workspaces on
//!   the dev cluster; then, when Go is installed, build and start one real API server
//!   (`realcluster/`) and run the backend-aware suites again against it.
//! - `cargo xtask test-real` — only that second half.
//! - `cargo xtask real-cluster [--kubeconfig PATH]` — build and run the real API server
//!   (etcd, kube-apiserver, GC and namespace controllers) until Ctrl-C.
//! - `cargo xtask build-guests` — build `guests/` for wasm32-wasip2 and copy the example
//!   plugins next to their TOMLs in `examples/plugins/`; then the TypeScript and Python
//!   guests (`guests/ts`, `guests/python`) when Node and Python are installed.
//! - `cargo xtask ci`    — what `.ci/run` checks: formatting, clippy, then `test`.
//! - `cargo xtask fuzz [--seconds N] [TARGET...]` — build the fuzz targets of `fuzz/` and run
//!   each (or the ones named) for N seconds (default 60); see `fuzz.rs`.
//! - `cargo xtask bench [--quick] [anchors]` — every benchmark, writing `docs/benchmarks.md`,
//!   or only the tables next to kube-rs, client-go and controller-runtime; `--quick` is a
//!   reduced-size smoke run (see `bench.rs`).
//! - `cargo xtask gen-proto-json` — regenerate the dev cluster's protobuf-to-JSON conversion
//!   (`devcluster/src/proto/messages.rs`) from k8s-pb and k8s-openapi; see `proto_json.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use wasmctrl_testkit::realserver::{self, BACKEND_ENV, KUBECONFIG_ENV, RealServer};

mod bench;
mod bench_report;
mod bench_summary;
mod fuzz;

mod doc_paths;
mod guest_langs;
mod proto_json;

const WASM_TARGET: &str = "wasm32-wasip2";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    let root = project_root();
    match task.as_str() {
        "build-guests" => build_guests(&root),
        "bench" => bench::bench(&root, &rest),
        "demo" => {
            build_guests(&root)?;
            demo(&root, &rest)
        }
        "test" => {
            build_guests(&root)?;
            test(&root, &rest)?;
            test_real(&root, &rest)
        }
        "check-docs" => doc_paths::check(&root),
        "ci" => {
            doc_paths::check(&root)?;
            lint(&root)?;
            build_guests(&root)?;
            test(&root, &[])?;
            test_real(&root, &[])?;
            fuzz::ci(&root)
        }
        "fuzz" => fuzz::fuzz(&root, &rest),
        "gen-proto-json" => proto_json::generate(&root),
        "real-cluster" => real_cluster(&root, &rest),
        "test-real" => {
            build_guests(&root)?;
            test_real(&root, &rest)
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <demo|test|test-real|real-cluster|build-guests|check-docs|ci|bench|fuzz|gen-proto-json> [args]"
            );
            eprintln!(
                "  demo          build the example plugins and run the host on the embedded dev cluster"
            );
            eprintln!(
                "  test          build the guest plugins and run all tests (extra args go to the test runner)"
            );
            eprintln!("  test-real     only the second half of `test`: the suites against a real API server");
            eprintln!(
                "  real-cluster  build and run a real kube-apiserver with etcd (--kubeconfig PATH; Ctrl-C stops it)"
            );
            eprintln!(
                "  build-guests  build guests/ for {WASM_TARGET} and copy the example plugins into examples/plugins/"
            );
            eprintln!("  check-docs    check that every repository path the documentation names exists");
            eprintln!(
                "  gen-proto-json  regenerate devcluster/src/proto/messages.rs from k8s-pb and k8s-openapi"
            );
            eprintln!(
                "  ci            check-docs, cargo fmt --check, cargo clippy -D warnings, test, then each fuzz target briefly (with nightly)"
            );
            eprintln!(
                "  fuzz          build the fuzz targets (nightly) and run each for --seconds N (default 60); or name targets"
            );
            eprintln!(
                "  bench         run every benchmark (release) and write docs/benchmarks.md; `bench anchors`: only the tables vs kube-rs, client-go, controller-runtime; `--quick`: a reduced-size smoke run"
            );
            if task.is_empty() || task == "help" || task == "--help" {
                Ok(())
            } else {
                bail!("unknown task `{task}`")
            }
        }
    }
}

fn project_root() -> PathBuf {
    // `cargo run` sets CARGO_MANIFEST_DIR for the process; prefer it to the path baked in at
    // compile time, which names whichever clone first built a shared CARGO_TARGET_DIR's binary.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// A `cargo` command without the variables `cargo run` gave this process: build scripts
/// that watch them (`ring`'s watches `CARGO_MANIFEST_DIR` and `CARGO_PKG_*`) would otherwise
/// see them change between `cargo xtask ...` and plain `cargo ...`, and rebuild everything
/// that depends on them each time one follows the other.
fn cargo() -> Command {
    without_cargo_run_env(Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())))
}

/// `cmd` without the variables `cargo run` gave this process (see [`cargo`]).
fn without_cargo_run_env(mut cmd: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let from_cargo_run = key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "OUT_DIR"
            );
        if from_cargo_run {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Installs the wasm target when rustup is there and the target is not.
fn ensure_wasm_target() -> Result<()> {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    match installed {
        Ok(out) if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == WASM_TARGET) => Ok(()),
        Ok(_) => run(Command::new("rustup").args(["target", "add", WASM_TARGET])),
        // No rustup: the toolchain was installed some other way; let cargo report a missing target.
        Err(_) => Ok(()),
    }
}

/// Builds every guest: the Rust ones ([`build_rust_guests`]), then the TypeScript and Python
/// ones.
fn build_guests(root: &Path) -> Result<()> {
    build_rust_guests(root)?;
    guest_langs::build(root, run)
}

/// Where the guests are built. Host tests read the `.wasm` files from
/// `guests/target/wasm32-wasip2/release/`; when the build goes elsewhere (a shared
/// `CARGO_TARGET_DIR`), the results are copied there.
fn build_rust_guests(root: &Path) -> Result<()> {
    ensure_wasm_target()?;
    let local = root.join("guests/target");
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("guests"),
        None => local.clone(),
    };
    run(cargo()
        .current_dir(root.join("guests"))
        .args(["build", "--release", "--target", WASM_TARGET, "--target-dir"])
        .arg(&target_dir))?;
    let built = target_dir.join(WASM_TARGET).join("release");
    let expected = local.join(WASM_TARGET).join("release");
    std::fs::create_dir_all(&expected).with_context(|| format!("creating {}", expected.display()))?;
    let plugins = root.join("examples/plugins");
    for entry in std::fs::read_dir(&built).with_context(|| format!("reading {}", built.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "wasm") {
            let file = path.file_name().context("wasm file without a name")?;
            if built != expected {
                std::fs::copy(&path, expected.join(file))
                    .with_context(|| format!("copying {}", path.display()))?;
            }
            // An example plugin `foo_bar.wasm` goes next to `examples/plugins/foo-bar.toml`.
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().replace('_', "-");
            if plugins.join(format!("{stem}.toml")).exists() {
                let dest = plugins.join(format!("{stem}.wasm"));
                // Write then rename, so a running host never sees a half-written plugin.
                let tmp = plugins.join(format!(".{stem}.wasm.tmp"));
                std::fs::copy(&path, &tmp).with_context(|| format!("copying {}", path.display()))?;
                std::fs::rename(&tmp, &dest).with_context(|| format!("installing {}", dest.display()))?;
            }
        }
    }
    Ok(())
}

fn demo(root: &Path, rest: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(root).args([
        "run",
        "--package",
        "wasmctrl",
        "--bin",
        "wasmctrl",
        "--",
        "run",
        "--config",
    ]);
    cmd.arg(root.join("examples/wasmctrl.toml"));
    // So a second terminal can watch the plugins' work with kubectl.
    let kubeconfig = root.join("examples/dev-cluster.kubeconfig");
    eprintln!(
        "xtask: kubectl --kubeconfig {} get configmaps -A   # in another terminal",
        kubeconfig.display()
    );
    cmd.arg("--kubeconfig-out").arg(kubeconfig);
    cmd.args(rest);
    run(&mut cmd)
}

fn test(root: &Path, rest: &[String]) -> Result<()> {
    let nextest = cargo().args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success());
    let mut cmd = cargo();
    cmd.current_dir(root);
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(rest);
    run(&mut cmd)?;
    // The guest SDK and the example plugins keep their logic testable natively.
    let mut guests = cargo();
    guests.current_dir(root.join("guests")).args(["test", "--package", "wasmctrl-guest"]);
    let examples = root.join("guests/examples");
    for entry in std::fs::read_dir(&examples).with_context(|| format!("reading {}", examples.display()))? {
        let dir = entry?.path();
        if dir.join("Cargo.toml").exists()
            && let Some(name) = dir.file_name().and_then(|n| n.to_str())
        {
            guests.args(["--package", name]);
        }
    }
    run(&mut guests)?;
    fixtures(root)?;
    // Doc examples (nextest does not run them).
    if nextest {
        run(cargo().current_dir(root).args(["test", "--workspace", "--doc"]))?;
    }
    Ok(())
}

/// `wasmctrl test` on every example's `tests/fixtures`, with the components just built.
fn fixtures(root: &Path) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(root).args(["run", "--quiet", "--package", "wasmctrl", "--", "test"]);
    let examples = root.join("guests/examples");
    for entry in std::fs::read_dir(&examples).with_context(|| format!("reading {}", examples.display()))? {
        let dir = entry?.path().join("tests/fixtures");
        if dir.is_dir() {
            cmd.arg(dir);
        }
    }
    run(&mut cmd)
}

fn lint(root: &Path) -> Result<()> {
    run(cargo().current_dir(root).args(["fmt", "--all", "--check"]))?;
    run(cargo().current_dir(root.join("guests")).args(["fmt", "--all", "--check"]))?;
    run(cargo().current_dir(root).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    ensure_wasm_target()?;
    let guests_target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("guests"),
        None => root.join("guests/target"),
    };
    run(cargo()
        .current_dir(root.join("guests"))
        .args(["clippy", "--target", WASM_TARGET, "--target-dir"])
        .arg(&guests_target)
        .args(["--", "-D", "warnings"]))
}

/// The integration suites that run on either backend (see `wasmctrl-testkit`).
/// `differential` compares the dev cluster with the real server, request by request;
/// `chaos` reloads a plugin under churn and checks that nothing is lost (at its reduced size);
/// `sandbox_runtime` ends a sleeping plugin call on the loss of a real Lease; `sandbox` runs
/// the adversarial plugins; `oci` runs a plugin pulled from a registry, hot-reloaded as its
/// tag moves; `sharding` runs `wasmctrl` replicas through kills, joins, restarts and a
/// partition; `hostile_input` and `endpoint` are the reflector's caps and the endpoint's
/// authorization; `operations` runs `wasmctrl run` for the monitoring files, `wasmctrl
/// status` and traces.
const BACKEND_AWARE_SUITES: &[&str] = &[
    "informer",
    "controller",
    "plugin",
    "examples",
    "differential",
    "reload",
    "semantics",
    "chaos",
    "sandbox_runtime",
    "sandbox",
    "admission",
    "oci",
    "sharding",
    "hostile_input",
    "endpoint",
    "operations",
];

/// Builds the real API server, timing the build.
fn build_real_server() -> Result<PathBuf> {
    let started = Instant::now();
    let binary = realserver::build().context("building the real API server (realcluster/)")?;
    eprintln!("xtask: real API server binary {} ({:.1}s)", binary.display(), started.elapsed().as_secs_f64());
    Ok(binary)
}

/// The second half of `test`: the backend-aware suites against one real API server shared by
/// every test (each test isolates itself by namespace). Skipped, saying so, without Go.
fn test_real(root: &Path, rest: &[String]) -> Result<()> {
    if !realserver::go_available() {
        eprintln!("xtask: Go is not installed: the real-API-server half of the tests is skipped");
        return Ok(());
    }
    let started = Instant::now();
    let binary = build_real_server()?;
    let dir = realserver::cache_dir().join(format!("run-{}", std::process::id()));
    let kubeconfig = dir.join("kubeconfig");
    let server = RealServer::start(&binary, &dir, &kubeconfig).context("starting the real API server")?;
    eprintln!(
        "xtask: real API server at {} ready in {:.1}s (log {})",
        server.url(),
        server.startup().as_secs_f64(),
        server.log().display()
    );
    let mut cmd = cargo();
    cmd.current_dir(root).env(BACKEND_ENV, "real").env(KUBECONFIG_ENV, &kubeconfig);
    // `--workspace` keeps the features (and so the build) of the first half.
    cmd.args(["test", "--workspace", "--no-fail-fast"]);
    for suite in BACKEND_AWARE_SUITES {
        cmd.args(["--test", suite]);
    }
    cmd.args(rest);
    let result = run(&mut cmd);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("xtask: real-API-server half finished in {:.1}s", started.elapsed().as_secs_f64());
    result
}

/// `cargo xtask real-cluster [--kubeconfig PATH]`: runs the real API server until Ctrl-C.
fn real_cluster(root: &Path, rest: &[String]) -> Result<()> {
    let mut kubeconfig = root.join("examples/real-cluster.kubeconfig");
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kubeconfig" => kubeconfig = PathBuf::from(args.next().context("--kubeconfig needs a path")?),
            other => match other.strip_prefix("--kubeconfig=") {
                Some(path) => kubeconfig = PathBuf::from(path),
                None => bail!("real-cluster: unknown argument `{other}` (expected --kubeconfig PATH)"),
            },
        }
    }
    if !realserver::go_available() {
        bail!("real-cluster needs Go (`go` was not found on PATH)");
    }
    let binary = build_real_server()?;
    let dir = realserver::cache_dir().join(format!("run-{}", std::process::id()));
    let server = RealServer::start(&binary, &dir, &kubeconfig).context("starting the real API server")?;
    eprintln!(
        "xtask: real API server at {} ready in {:.1}s; log {}",
        server.url(),
        server.startup().as_secs_f64(),
        server.log().display()
    );
    eprintln!(
        "xtask: kubectl --kubeconfig {} get namespaces   # Ctrl-C stops the server",
        kubeconfig.display()
    );
    let status = server.wait()?;
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("xtask: real API server exited ({status})");
    Ok(())
}
