//! `cargo xtask bench [anchors]`: the project's benchmarks, release builds, one after another.
//!
//! - `cargo xtask bench` builds the guests (the plugin benchmarks load them), runs every
//!   harness-free benchmark of the host and the dev cluster, each printing its own table,
//!   then `anchors` (wasmctrl next to kube-rs, client-go and controller-runtime), and closes
//!   with one table of every benchmark's key figures, each next to what it was compared with
//!   in the same run (ratios) and its target (`bench_summary.rs`). A benchmark that fails
//!   does not stop the others; the task fails at the end, after the table.
//! - `cargo xtask bench anchors` builds the Rust guests (its no-op plugin is one) and runs
//!   only that table.
//!
//! A benchmark is a file `<package>/benches/<name>.rs` declared as `[[bench]] name = "<name>"`
//! in its package; new ones are picked up without changing this task. The Go programs the
//! anchors table runs are built by the benchmark itself (see `host/benches/anchors.rs`).

use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{bench_summary, build_guests, build_rust_guests, cargo, run};

/// The benchmark that prints the comparison table.
const ANCHORS: &str = "anchors";

/// The variable naming the file benchmarks append their key figures to
/// (`wasmctrl_bench_support::summary::SUMMARY_ENV`; xtask does not depend on that crate).
const SUMMARY_ENV: &str = "WASMCTRL_BENCH_SUMMARY";

/// Packages with benchmarks: (directory, package name).
const PACKAGES: [(&str, &str); 2] = [("host", "wasmctrl"), ("devcluster", "wasmctrl-devcluster")];

pub fn bench(root: &Path, rest: &[String]) -> Result<()> {
    match rest.first().map(String::as_str) {
        None => {
            build_guests(root)?;
            let summary =
                std::env::temp_dir().join(format!("wasmctrl-bench-summary-{}.jsonl", std::process::id()));
            // A stale file from an earlier run with the same pid must not add rows.
            let _ = std::fs::remove_file(&summary);
            let mut failures = Vec::new();
            for (dir, package) in PACKAGES {
                for name in bench_names(&root.join(dir).join("benches"))?.into_iter().filter(|n| n != ANCHORS)
                {
                    let mut cmd = cargo();
                    cmd.current_dir(root).env(SUMMARY_ENV, &summary).args([
                        "bench",
                        "--package",
                        package,
                        "--bench",
                        &name,
                    ]);
                    if let Err(e) = run(&mut cmd) {
                        eprintln!("xtask: {e:#}");
                        failures.push(name);
                    }
                }
            }
            if let Err(e) = run(anchors_command(root).env(SUMMARY_ENV, &summary)) {
                eprintln!("xtask: {e:#}");
                failures.push(ANCHORS.to_owned());
            }
            let figures = std::fs::read_to_string(&summary).unwrap_or_default();
            let _ = std::fs::remove_file(&summary);
            println!();
            println!(
                "Key figures of every benchmark (release build), with what each was compared with in the same run:"
            );
            println!();
            print!("{}", bench_summary::render(&figures));
            if !failures.is_empty() {
                bail!("benchmarks failed: {}", failures.join(", "));
            }
            Ok(())
        }
        Some(ANCHORS) => {
            build_rust_guests(root)?;
            run(&mut anchors_command(root))
        }
        Some(other) => {
            bail!("unknown benchmark set `{other}`: use `cargo xtask bench` or `cargo xtask bench {ANCHORS}`")
        }
    }
}

fn anchors_command(root: &Path) -> std::process::Command {
    let mut cmd = cargo();
    cmd.current_dir(root).args(["bench", "--package", "wasmctrl", "--bench", ANCHORS]);
    cmd
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
