//! The README's "Your first plugin" walkthrough, end to end: `wasmctrl new` scaffolds a
//! crate outside the repo, its native tests pass, it builds for wasm32-wasip2, `wasmctrl
//! test` passes its fixture, and copied into a running host's plugins directory it
//! reconciles.
//!
//! Builds share the guests' target directory (`$CARGO_TARGET_DIR/guests`, as
//! `cargo xtask build-guests` uses), so the SDK's dependencies are compiled once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

#[path = "common/process.rs"]
mod process;

use process::{HostProcess, WASMCTRL};

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
    let (_host, client) =
        HostProcess::run_embedded(&host_dir.join("wasmctrl.toml"), Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::copy(&wasm, plugins.join(".hello.tmp")).unwrap();
    std::fs::rename(plugins.join(".hello.tmp"), plugins.join("hello.wasm")).unwrap();
    std::fs::copy(crate_dir.join("hello.toml"), plugins.join("hello.toml")).unwrap();

    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let deadline = Instant::now() + Duration::from_secs(60);
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

/// Where `cargo xtask build-guests` installed `lang`'s pinned toolchain (`ts`, `python`),
/// as `xtask/src/guest_langs.rs` chooses it.
fn guest_toolchain(lang: &str) -> PathBuf {
    let base = match std::env::var_os("WASMCTRL_GUEST_TOOLS") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .expect("neither XDG_CACHE_HOME nor HOME is set")
            .join("wasmctrl/guest-toolchains"),
    };
    let dir = base.join(lang);
    assert!(
        dir.join(".installed-from").is_file(),
        "no {lang} toolchain at {}: run `cargo xtask build-guests` first",
        dir.display()
    );
    dir
}

/// Copies the file or directory `from` to `to` (skipping `__pycache__`).
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() != "__pycache__" {
                copy_tree(&entry.path(), &to.join(entry.file_name()));
            }
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
    }
}

/// Whether `cmd args` runs; prints why the test skips when not.
fn runs(test: &str, cmd: &str, args: &[&str]) -> bool {
    let ok = Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping {test}: `{cmd}` is missing or too old");
    }
    ok
}

/// `wasmctrl new --lang ts`: outside the repository, the scaffold installs the SDK package
/// from its directory (npm, offline), its native tests pass on the SDK's fake host, it
/// builds into a component, and `wasmctrl check` and `wasmctrl test` (its fixture against
/// the real component) pass.
#[test]
fn typescript_scaffold_installs_the_sdk_package_tests_and_builds() {
    if !runs("typescript_scaffold", "node", &["--version"])
        || !runs("typescript_scaffold", "npm", &["--version"])
    {
        return;
    }
    let tools = guest_toolchain("ts");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hello-ts");
    let out = run(
        Command::new(WASMCTRL)
            .args(["new", "hello-ts", "--lang", "ts", "--kind", "v1/ConfigMap", "--path"])
            .arg(&dir),
        "wasmctrl new --lang ts",
    );
    assert!(out.contains("created TypeScript plugin"), "{out}");
    let package = std::fs::read_to_string(dir.join("package.json")).unwrap();
    let sdk = std::fs::canonicalize(repo_root().join("guests/ts/sdk")).unwrap();
    assert!(package.contains(&format!("\"@wasmctrl/guest\": \"file:{}\"", sdk.display())), "{package}");

    // npm installs the SDK package from its directory, offline. The toolchain the scaffold
    // lists as devDependencies is the one `cargo xtask build-guests` installed (the same
    // pinned versions, passed as --tools below), so it is left out of this install.
    let mut manifest: serde_json::Value = serde_json::from_str(&package).unwrap();
    manifest.as_object_mut().unwrap().remove("devDependencies");
    std::fs::write(dir.join("package.json"), serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
    run(
        Command::new("npm").current_dir(&dir).args([
            "install",
            "--offline",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--no-package-lock",
        ]),
        "npm install (the SDK package)",
    );
    assert!(dir.join("node_modules/@wasmctrl/guest/package.json").is_file());
    let tests = run(
        Command::new("node")
            .current_dir(&dir)
            .arg("node_modules/@wasmctrl/guest/tools/test.mjs")
            .arg("--tools")
            .arg(&tools)
            .arg("tests/plugin.test.ts"),
        "the scaffold's native tests",
    );
    assert!(tests.contains("# pass 2") && tests.contains("# fail 0"), "{tests}");
    run(Command::new("node").current_dir(&dir).arg("build.mjs").arg("--tools").arg(&tools), "node build.mjs");
    assert!(dir.join("hello-ts.wasm").is_file());

    let out = run(Command::new(WASMCTRL).arg("check").arg(dir.join("hello-ts.toml")), "wasmctrl check (ts)");
    assert!(out.contains("world wasmctrl:controller/plugin@0.2.1"), "{out}");
    let out =
        run(Command::new(WASMCTRL).current_dir(&dir).args(["test", "tests/fixtures"]), "wasmctrl test (ts)");
    assert!(out.contains("1 fixture(s) passed, 0 failed"), "{out}");
}

/// `wasmctrl new --lang python`: outside the repository, the SDK package installs with pip
/// from its directory (offline, with the pinned toolchain's setuptools), `build.py` runs the
/// native tests on the SDK's fake host and builds the component, and `wasmctrl check` and
/// `wasmctrl test` (its fixture against the real component) pass.
#[test]
fn python_scaffold_installs_the_sdk_package_tests_and_builds() {
    if !runs("python_scaffold", "python3", &["-c", "import sys, venv; assert sys.version_info >= (3, 10)"]) {
        return;
    }
    let venv = guest_toolchain("python");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hello-py");
    let out = run(
        Command::new(WASMCTRL)
            .args(["new", "hello-py", "--lang", "python", "--kind", "v1/ConfigMap", "--path"])
            .arg(&dir),
        "wasmctrl new --lang python",
    );
    assert!(out.contains("created Python plugin"), "{out}");

    // pip builds the SDK package from its directory (a copy, as pip builds in the source
    // tree) into a private site directory.
    let sdk = tmp.path().join("sdk");
    for file in ["pyproject.toml", "wasmctrl_guest"] {
        copy_tree(&repo_root().join("guests/python/sdk").join(file), &sdk.join(file));
    }
    let site = tmp.path().join("site");
    run(
        Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-build-isolation",
                "--no-index",
                "--target",
            ])
            .arg(&site)
            .arg(&sdk),
        "pip install guests/python/sdk",
    );
    assert!(site.join("wasmctrl_guest/testing.py").is_file());
    let build = Command::new(venv.join("bin/python"))
        .current_dir(&dir)
        .arg("build.py")
        .env("PYTHONPATH", &site)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&build.stderr);
    assert!(build.status.success(), "python build.py failed:\n{stderr}");
    assert!(stderr.contains("Ran 2 tests") && stderr.contains("OK"), "{stderr}");
    assert!(dir.join("hello-py.wasm").is_file());

    let out =
        run(Command::new(WASMCTRL).arg("check").arg(dir.join("hello-py.toml")), "wasmctrl check (python)");
    assert!(out.contains("world wasmctrl:controller/plugin@0.2.1"), "{out}");
    let out = run(
        Command::new(WASMCTRL).current_dir(&dir).args(["test", "tests/fixtures"]),
        "wasmctrl test (python)",
    );
    assert!(out.contains("1 fixture(s) passed, 0 failed"), "{out}");
}
