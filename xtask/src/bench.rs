//! `cargo xtask bench [anchors]`: the project's benchmarks, release builds, one after another.
//!
//! - `cargo xtask bench` builds the guests (the plugin benchmarks load them), runs every
//!   harness-free benchmark of the host and the dev cluster, each printing its own table, and
//!   runs `anchors` last, so its table (wasmctrl next to kube-rs, client-go and
//!   controller-runtime, with ratios) closes the output.
//! - `cargo xtask bench anchors` builds the Rust guests (its no-op plugin is one) and runs
//!   only that table.
//!
//! A benchmark is a file `<package>/benches/<name>.rs` declared as `[[bench]] name = "<name>"`
//! in its package; new ones are picked up without changing this task. The Go programs the
//! anchors table runs are built by the benchmark itself (see `host/benches/anchors.rs`).

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{build_guests, build_rust_guests, cargo, run};

/// The benchmark that prints the comparison table.
const ANCHORS: &str = "anchors";

/// Packages with benchmarks: (directory, package name).
const PACKAGES: [(&str, &str); 2] = [("host", "wasmctrl"), ("devcluster", "wasmctrl-devcluster")];

pub fn bench(root: &Path, rest: &[String]) -> Result<()> {
    match rest.first().map(String::as_str) {
        None => {
            build_guests(root)?;
            for (dir, package) in PACKAGES {
                let names: Vec<String> = bench_names(&root.join(dir).join("benches"))?
                    .into_iter()
                    .filter(|n| n != ANCHORS)
                    .collect();
                if names.is_empty() {
                    continue;
                }
                let mut cmd = cargo();
                cmd.current_dir(root).args(["bench", "--package", package]);
                for name in &names {
                    cmd.args(["--bench", name]);
                }
                run(&mut cmd)?;
            }
            anchors(root)
        }
        Some(ANCHORS) => {
            build_rust_guests(root)?;
            anchors(root)
        }
        Some(other) => {
            bail!("unknown benchmark set `{other}`: use `cargo xtask bench` or `cargo xtask bench {ANCHORS}`")
        }
    }
}

fn anchors(root: &Path) -> Result<()> {
    run(cargo().current_dir(root).args(["bench", "--package", "wasmctrl", "--bench", ANCHORS]))
}

/// The stems of the `.rs` files directly in `dir`, sorted (none if there is no such dir).
fn bench_names(dir: &Path) -> Result<Vec<String>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry.with_context(|| format!("reading {}", dir.display()))?.path();
        if path.extension().is_some_and(|e| e == "rs")
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    Ok(names)
}
