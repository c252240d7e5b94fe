//! The README's "Your first plugin" walkthrough, end to end: `wasmctrl new` scaffolds a
//! crate outside the repo, its native tests pass, it builds for wasm32-wasip2, `wasmctrl
//! test` passes its fixture, and copied into a running host's plugins directory it
//! reconciles.
//!
//! Builds share the guests' target directory (`$CARGO_TARGET_DIR/guests`, as
//! `cargo xtask build-guests` uses), so the SDK's dependencies are compiled once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

const WASMCTRL: &str = env!("CARGO_BIN_EXE_wasmctrl");

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn guests_target() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("guests"),
        None => repo_root().join("guests/target"),
    }
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Kills the host when the test ends, however it ends.
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaffold_build_test_and_deploy_a_new_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let crate_dir = tmp.path().join("hello");

    // 1. Scaffold outside the repo.
    let out = run(
        Command::new(WASMCTRL).args(["new", "hello", "--kind", "v1/ConfigMap", "--path"]).arg(&crate_dir),
        "wasmctrl new",
    );
    assert!(out.contains("created plugin crate"), "{out}");
    for f in ["Cargo.toml", ".cargo/config.toml", "src/lib.rs", "hello.toml", "tests/fixtures/basic.yaml"] {
        assert!(crate_dir.join(f).is_file(), "{f} missing");
    }
    // Refuses to overwrite.
    let again = Command::new(WASMCTRL)
        .args(["new", "hello", "--kind", "v1/ConfigMap", "--path"])
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    // The dependency versions the guests workspace already built (no new downloads).
    std::fs::copy(repo_root().join("guests/Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let target = guests_target();

    // 2. Native tests, then the component.
    run(
        Command::new(env!("CARGO")).current_dir(&crate_dir).args(["test", "--target-dir"]).arg(&target),
        "cargo test (scaffold)",
    );
    run(
        Command::new(env!("CARGO"))
            .current_dir(&crate_dir)
            .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
            .arg(&target),
        "cargo build --target wasm32-wasip2 (scaffold)",
    );
    let wasm = target.join("wasm32-wasip2/release/hello.wasm");
    assert!(wasm.is_file(), "{} missing", wasm.display());

    // 3. The fixture against the real component.
    let out = run(
        Command::new(WASMCTRL).current_dir(&crate_dir).args(["test", "tests/fixtures", "--wasm"]).arg(&wasm),
        "wasmctrl test",
    );
    assert!(out.contains("1 fixture(s) passed, 0 failed"), "{out}");

    // 4. A running host picks it up from its plugins directory and reconciles.
    let host_dir = tmp.path().join("host");
    let plugins = host_dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::write(
        host_dir.join("seed.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: example, namespace: default}\ndata: {k: v}\n",
    )
    .unwrap();
    std::fs::write(
        host_dir.join("wasmctrl.toml"),
        "plugins-dir = \"plugins\"\ncache-dir = \"cache\"\n\n[cluster]\nmode = \"embedded\"\nseed = [\"seed.yaml\"]\n\n\
         [server]\naddress = \"127.0.0.1:0\"\n\n[leader-election]\nenabled = false\n",
    )
    .unwrap();
    let kubeconfig = host_dir.join("kubeconfig");
    let _host = Host(
        Command::new(WASMCTRL)
            .arg("run")
            .arg("--config")
            .arg(host_dir.join("wasmctrl.toml"))
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubeconfig.is_file() {
        assert!(Instant::now() < deadline, "the host did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::copy(&wasm, plugins.join(".hello.tmp")).unwrap();
    std::fs::rename(plugins.join(".hello.tmp"), plugins.join("hello.wasm")).unwrap();
    std::fs::copy(crate_dir.join("hello.toml"), plugins.join("hello.toml")).unwrap();

    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    loop {
        let seen = api.get("example").await.ok().and_then(|cm| {
            cm.metadata.annotations.and_then(|a| a.get("wasmctrl.example.com/seen-by").cloned())
        });
        if seen.as_deref() == Some("hello") {
            break;
        }
        assert!(Instant::now() < deadline, "the plugin did not reconcile the ConfigMap");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `wasmctrl new --admission`: the scaffold's webhooks compile, its native tests pass, and
/// `wasmctrl test` passes its fixture's admission steps against the real component.
#[test]
fn scaffold_with_admission_builds_and_passes_its_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    let crate_dir = tmp.path().join("gate");
    let out = run(
        Command::new(WASMCTRL)
            .args(["new", "gate", "--kind", "apps/v1/Deployment", "--admission", "--path"])
            .arg(&crate_dir),
        "wasmctrl new --admission",
    );
    assert!(out.contains("validates and mutates"), "{out}");
    std::fs::copy(repo_root().join("guests/Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let target = guests_target();
    let tests = run(
        Command::new(env!("CARGO")).current_dir(&crate_dir).args(["test", "--target-dir"]).arg(&target),
        "cargo test (admission scaffold)",
    );
    assert!(tests.contains("admits_labels_and_refuses_on_the_annotation ... ok"), "{tests}");
    run(
        Command::new(env!("CARGO"))
            .current_dir(&crate_dir)
            .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
            .arg(&target),
        "cargo build --target wasm32-wasip2 (admission scaffold)",
    );
    let wasm = target.join("wasm32-wasip2/release/gate.wasm");
    let out = run(
        Command::new(WASMCTRL).current_dir(&crate_dir).args(["test", "tests/fixtures", "--wasm"]).arg(&wasm),
        "wasmctrl test (admission scaffold)",
    );
    assert!(out.contains("1 fixture(s) passed, 0 failed") && out.contains("admit validate"), "{out}");
    // `wasmctrl check` sees the exports the TOML's sections need.
    std::fs::copy(&wasm, crate_dir.join("gate.wasm")).unwrap();
    let out = run(Command::new(WASMCTRL).arg("check").arg(crate_dir.join("gate.toml")), "wasmctrl check");
    assert!(out.contains("world wasmctrl:controller/admitting-plugin@0.2.1"), "{out}");
}
