//! Building the TypeScript and Python guests (`guests/ts`, `guests/python`), part of
//! `cargo xtask build-guests`.
//!
//! Invariants:
//! - Toolchains come only from the pinned files in the repository: `guests/ts/package.json`
//!   and `package-lock.json` (npm, with integrity hashes) and `guests/python/requirements.txt`
//!   (pip `--require-hashes`). They are installed outside the clone, in
//!   `$WASMCTRL_GUEST_TOOLS` or `~/.cache/wasmctrl/guest-toolchains`, and reinstalled only
//!   when the pinned file changes (a copy of it marks a finished install).
//! - A missing language runtime (no `node`/`npm`, no `python3`) is not an error: that
//!   language is skipped with a message, and the host tests that need its plugins skip
//!   too. A toolchain that is there but fails to install or build is an error.
//! - Components go to `guests/target/ts/` and `guests/target/python/`; each example
//!   plugin is also copied next to its TOML in `examples/plugins/languages/` (written
//!   under a hidden name, then renamed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Builds both languages' guests. `run` runs a command and fails on a non-zero exit.
pub fn build(root: &Path, run: fn(&mut Command) -> Result<()>) -> Result<()> {
    let tools = tools_dir()?;
    let languages_dir = root.join("examples/plugins/languages");
    match Language::Ts.check() {
        Ok(()) => {
            let env = install_ts(root, &tools.join("ts"), run)?;
            let out = root.join("guests/target/ts");
            run(Command::new("node")
                .arg(root.join("guests/ts/build.mjs"))
                .arg("--tools")
                .arg(&env)
                .arg("--out")
                .arg(&out))?;
            install_examples(&out, &languages_dir, "-ts")?;
        }
        Err(why) => eprintln!("xtask: skipping the TypeScript guests: {why}"),
    }
    match Language::Python.check() {
        Ok(()) => {
            let venv = install_python(root, &tools.join("python"), run)?;
            let out = root.join("guests/target/python");
            run(Command::new(python())
                .arg(root.join("guests/python/build.py"))
                .arg("--tools")
                .arg(&venv)
                .arg("--out")
                .arg(&out))?;
            install_examples(&out, &languages_dir, "-py")?;
        }
        Err(why) => eprintln!("xtask: skipping the Python guests: {why}"),
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Language {
    Ts,
    Python,
}

impl Language {
    /// Whether this language's runtime is installed; the reason when it is not.
    fn check(self) -> std::result::Result<(), String> {
        let probes: &[(&str, &[&str])] = match self {
            Language::Ts => &[("node", &["--version"]), ("npm", &["--version"])],
            Language::Python => {
                &[(python(), &["-c", "import sys, venv; assert sys.version_info >= (3, 10)"])]
            }
        };
        for (cmd, args) in probes {
            match Command::new(cmd).args(*args).output() {
                Ok(out) if out.status.success() => {}
                Ok(_) => {
                    return Err(format!("`{cmd}` is too old or unusable (Node 20+, Python 3.10+ with venv)"));
                }
                Err(_) => return Err(format!("`{cmd}` not found (the tests of these guests skip)")),
            }
        }
        Ok(())
    }
}

fn python() -> &'static str {
    if cfg!(windows) { "python" } else { "python3" }
}

/// Where toolchains are installed: `$WASMCTRL_GUEST_TOOLS`, else a cache under `$HOME`.
fn tools_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("WASMCTRL_GUEST_TOOLS") {
        return Ok(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither WASMCTRL_GUEST_TOOLS, XDG_CACHE_HOME nor HOME is set: nowhere to install the guest toolchains")?;
    Ok(base.join("wasmctrl/guest-toolchains"))
}

/// Installs the npm toolchain pinned by `guests/ts/package-lock.json` into `dir`.
fn install_ts(root: &Path, dir: &Path, run: fn(&mut Command) -> Result<()>) -> Result<PathBuf> {
    let manifest = root.join("guests/ts/package.json");
    let lock = root.join("guests/ts/package-lock.json");
    let pinned = [read(&manifest)?, read(&lock)?].concat();
    let marker = dir.join(".installed-from");
    if std::fs::read(&marker).is_ok_and(|m| m == pinned) {
        return Ok(dir.to_owned());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    copy(&manifest, &dir.join("package.json"))?;
    copy(&lock, &dir.join("package-lock.json"))?;
    // `npm install` with the lock file present installs exactly the locked versions and
    // checks their integrity hashes. (`npm ci` would too, but current npm refuses this
    // lock file over platform-specific optional packages the registry does not carry.)
    // No install scripts run: every tool used ships its binary inside its package.
    run(Command::new("npm").current_dir(dir).args([
        "install",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ]))?;
    let changed = lock_changes(&read(&lock)?, &read(&dir.join("package-lock.json"))?)
        .with_context(|| format!("comparing {} with what npm installed", lock.display()))?;
    if !changed.is_empty() {
        bail!(
            "npm changed the lock file while installing the TypeScript toolchain ({}): guests/ts/package-lock.json is out of date with package.json (regenerate it with `npm install` in guests/ts)",
            changed.join(", ")
        );
    }
    std::fs::write(&marker, pinned).with_context(|| format!("writing {}", marker.display()))?;
    Ok(dir.to_owned())
}

/// The packages whose pin npm changed between the committed lock file `before` and the one it
/// wrote after installing, `after`: each package of `before` must keep its version, resolved
/// URL and integrity hash, and none may go. npm may add entries for optional packages (the
/// platform builds of a native tool, listed as the registry publishes them): those are not
/// installed on other platforms and are allowed, so a registry that gained a platform build
/// since the lock was written does not fail the build.
fn lock_changes(before: &[u8], after: &[u8]) -> Result<Vec<String>> {
    let packages = |bytes: &[u8]| -> Result<serde_json::Map<String, serde_json::Value>> {
        let lock: serde_json::Value =
            serde_json::from_slice(bytes).context("a package-lock.json is not JSON")?;
        Ok(lock.get("packages").and_then(|p| p.as_object()).cloned().unwrap_or_default())
    };
    let (before, after) = (packages(before)?, packages(after)?);
    let pin = |p: &serde_json::Value| ["version", "resolved", "integrity"].map(|k| p.get(k).cloned());
    let mut changed = Vec::new();
    for (name, old) in &before {
        match after.get(name) {
            Some(new) if pin(new) == pin(old) => {}
            Some(_) => changed.push(format!("{name} changed")),
            None => changed.push(format!("{name} removed")),
        }
    }
    for (name, new) in &after {
        if !before.contains_key(name) && new.get("optional") != Some(&serde_json::Value::Bool(true)) {
            changed.push(format!("{name} added"));
        }
    }
    Ok(changed)
}

/// Creates a virtualenv in `dir` with the hashes-pinned `guests/python/requirements.txt`.
fn install_python(root: &Path, dir: &Path, run: fn(&mut Command) -> Result<()>) -> Result<PathBuf> {
    let requirements = root.join("guests/python/requirements.txt");
    let pinned = read(&requirements)?;
    let marker = dir.join(".installed-from");
    if std::fs::read(&marker).is_ok_and(|m| m == pinned) {
        return Ok(dir.to_owned());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the old virtualenv {}", dir.display()))?;
    }
    run(Command::new(python()).args(["-m", "venv"]).arg(dir))?;
    let pip = if cfg!(windows) { dir.join("Scripts/pip") } else { dir.join("bin/pip") };
    run(Command::new(pip)
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--require-hashes",
            "--only-binary=:all:",
            "-r",
        ])
        .arg(&requirements))?;
    std::fs::write(&marker, pinned).with_context(|| format!("writing {}", marker.display()))?;
    Ok(dir.to_owned())
}

/// Copies `<out>/<example><suffix>.wasm` next to `<languages>/<example><suffix>.toml`.
fn install_examples(out: &Path, languages: &Path, suffix: &str) -> Result<()> {
    for entry in std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))? {
        let path = entry?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        if path.extension().is_none_or(|e| e != "wasm") || !stem.ends_with(suffix) {
            continue;
        }
        if languages.join(format!("{stem}.toml")).exists() {
            let tmp = languages.join(format!(".{stem}.wasm.tmp"));
            copy(&path, &tmp)?;
            let dest = languages.join(format!("{stem}.wasm"));
            std::fs::rename(&tmp, &dest).with_context(|| format!("installing {}", dest.display()))?;
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::lock_changes;

    fn lock(packages: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "lockfileVersion": 3, "packages": packages })).unwrap()
    }

    #[test]
    fn npm_may_add_optional_platform_packages_but_not_change_a_pin() {
        let pinned = lock(serde_json::json!({
            "": { "devDependencies": { "tool": "1.0.0" } },
            "node_modules/tool": { "version": "1.0.0", "integrity": "sha512-a" },
            "node_modules/tool-linux-x64": { "version": "1.0.0", "integrity": "sha512-b", "optional": true },
        }));
        let mut grown: serde_json::Value = serde_json::from_slice(&pinned).unwrap();
        grown["packages"]["node_modules/tool-win32-x64"] =
            serde_json::json!({ "version": "1.0.0", "integrity": "sha512-c", "optional": true });
        assert_eq!(
            lock_changes(&pinned, &serde_json::to_vec(&grown).unwrap()).unwrap(),
            Vec::<String>::new()
        );

        let mut required = grown.clone();
        required["packages"]["node_modules/extra"] = serde_json::json!({ "version": "2.0.0" });
        assert_eq!(
            lock_changes(&pinned, &serde_json::to_vec(&required).unwrap()).unwrap(),
            ["node_modules/extra added"]
        );

        let mut bumped = grown.clone();
        bumped["packages"]["node_modules/tool"]["version"] = "1.0.1".into();
        bumped["packages"].as_object_mut().unwrap().remove("node_modules/tool-linux-x64");
        assert_eq!(
            lock_changes(&pinned, &serde_json::to_vec(&bumped).unwrap()).unwrap(),
            ["node_modules/tool changed", "node_modules/tool-linux-x64 removed"]
        );
        assert!(lock_changes(b"not json", &pinned).is_err());
    }
}
