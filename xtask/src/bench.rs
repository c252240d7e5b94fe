//! `cargo xtask bench [--quick] [anchors]`: the project's benchmarks, release builds, one after
//! another.
//!
//! - `cargo xtask bench` builds the guests (the plugin benchmarks load them), runs every
//!   harness-free benchmark of the host and the dev cluster, each printing its own tables
//!   (this task passes them through and keeps a copy), then `anchors` (wasmctrl next to
//!   kube-rs, client-go and controller-runtime), prints one table of every benchmark's key
//!   figures, each next to what it was compared with in the same run (ratios) and its target
//!   (`bench_summary.rs`), and writes `docs/benchmarks.md` with every table, plot and
//!   output of the run (`bench_report.rs`). A benchmark that fails does not stop the others;
//!   the task fails at the end, after the report.
//! - `--quick` (or `BENCH_QUICK=1` in the environment) is a smoke run, to check that every
//!   benchmark and the report work, not how fast anything is: every benchmark gets
//!   `BENCH_QUICK=1` (the ones that read it shrink their own defaults) and the sizes in
//!   [`QUICK_SIZES`] unless the environment sets them (or the arguments in [`QUICK_ARGS`]),
//!   and builds with the dev profile (dependencies optimised, the workspace not; the tests'
//!   build is mostly reused, where a release build of everything takes long on a shared
//!   machine); the report says it is a smoke run.
//! - `cargo xtask bench anchors` builds the Rust guests (its no-op plugin is one) and runs
//!   only that table; it prints, and writes no report.
//!
//! A benchmark is a file `<package>/benches/<name>.rs` declared as `[[bench]] name = "<name>"`
//! in its package; new ones are picked up without changing this task. The Go programs the
//! anchors table runs are built by the benchmark itself (see `host/benches/anchors.rs`).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use super::bench_report::{self, BenchOutput, RunInfo};
use super::{bench_summary, build_guests, build_rust_guests, cargo, run};

/// The benchmark that prints the comparison table.
const ANCHORS: &str = "anchors";

/// The variable naming the file benchmarks append their records to
/// (`wasmctrl_bench_support::summary::SUMMARY_ENV`; xtask does not depend on that crate).
const SUMMARY_ENV: &str = "WASMCTRL_BENCH_SUMMARY";

/// The variable that asks every benchmark for a reduced-size smoke run.
const QUICK_ENV: &str = "BENCH_QUICK";

/// Packages with benchmarks: (directory, package name).
const PACKAGES: [(&str, &str); 2] = [("host", "wasmctrl"), ("devcluster", "wasmctrl-devcluster")];

/// Sizes of a smoke run for benchmarks that take them from variables of their own (a
/// variable already in the environment wins): (benchmark, variable, value).
const QUICK_SIZES: &[(&str, &str, &str)] = &[
    ("informer", "BENCH_OBJECTS", "2000"),
    ("informer", "BENCH_UPDATES", "20000"),
    ("informer", "BENCH_CACHE_OBJECTS", "10000"),
    ("queue", "BENCH_QUEUE_ITEMS", "20000"),
    ("queue", "BENCH_SECONDS", "1"),
    ("plugin", "BENCH_ITERS", "2000"),
    ("plugin", "BENCH_ROUNDS", "3"),
    ("languages", "BENCH_COMPILES", "1"),
    ("languages", "BENCH_ITERS", "200"),
    ("languages", "BENCH_ROUNDS", "3"),
    ("many_plugins", "PLUGINS", "10"),
    ("scale", "SCALE_OBJECTS", "5000"),
    ("scale", "SCALE_SECS", "6"),
    ("scale", "SCALE_RATE", "2000"),
    ("scale", "SCALE_SYNC_OBJECTS", "20000"),
    ("scale", "SCALE_RELIST_OBJECTS", "5000"),
    ("scale", "SCALE_RELIST_AFTER", "2"),
    ("scale", "SCALE_ALLOCATORS", "jemalloc"),
    ("devcluster", "BENCH_OBJECTS", "2000"),
];

/// Arguments of a smoke run for benchmarks that take their sizes as arguments:
/// (benchmark, arguments after `--`).
const QUICK_ARGS: &[(&str, &[&str])] = &[("reload", &["--samples", "3"])];

pub fn bench(root: &Path, rest: &[String]) -> Result<()> {
    let quick = rest.iter().any(|a| a == "--quick")
        || std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let set: Vec<&String> = rest.iter().filter(|a| *a != "--quick").collect();
    match set.first().map(|s| s.as_str()) {
        None => all(root, quick),
        Some(ANCHORS) => {
            build_rust_guests(root)?;
            let mut cmd = bench_command(root, "wasmctrl", ANCHORS, quick);
            run(&mut cmd)
        }
        Some(other) => {
            bail!(
                "unknown benchmark set `{other}`: use `cargo xtask bench [--quick]` or `cargo xtask bench [--quick] {ANCHORS}`"
            )
        }
    }
}

fn all(root: &Path, quick: bool) -> Result<()> {
    let started = Instant::now();
    let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let tree = bench_report::tree_state(root);
    build_guests(root)?;
    let summary = std::env::temp_dir().join(format!("wasmctrl-bench-summary-{}.jsonl", std::process::id()));
    // A stale file from an earlier run with the same pid must not add rows.
    let _ = std::fs::remove_file(&summary);
    let mut outputs = Vec::new();
    let mut benches = Vec::new();
    for (dir, package) in PACKAGES {
        for name in bench_names(&root.join(dir).join("benches"))?.into_iter().filter(|n| n != ANCHORS) {
            benches.push((package, name));
        }
    }
    benches.push(("wasmctrl", ANCHORS.to_owned()));
    let total = benches.len();
    let bar = progress_bar(total);
    for (i, (package, name)) in benches.into_iter().enumerate() {
        match &bar {
            Some(bar) => {
                bar.set_position(i as u64);
                bar.set_message(format!("{package}/{name}"));
            }
            None => eprintln!("xtask: benchmark {}/{total}: {package}/{name}", i + 1),
        }
        let mut cmd = bench_command(root, package, &name, quick);
        cmd.env(SUMMARY_ENV, &summary);
        let (stdout, failure) = match run_teeing(&mut cmd, bar.as_ref()) {
            Ok((stdout, true)) => (stdout, None),
            Ok((stdout, false)) => {
                (stdout, Some(format!("`cargo bench -p {package} --bench {name}` failed")))
            }
            Err(e) => (String::new(), Some(format!("{e:#}"))),
        };
        if let Some(why) = &failure {
            eprintln!("xtask: {why}");
        }
        outputs.push(BenchOutput { name, package: package.to_owned(), stdout, failure });
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let records = std::fs::read_to_string(&summary).unwrap_or_default();
    let _ = std::fs::remove_file(&summary);
    let figures: String =
        records.lines().filter(|l| !is_table_or_plot(l)).map(|l| format!("{l}\n")).collect();
    println!();
    println!(
        "Key figures of every benchmark (release build), with what each was compared with in the same run:"
    );
    println!();
    print!("{}", bench_summary::render(&figures));
    let run_info = RunInfo { quick, started: started_unix, seconds: started.elapsed().as_secs_f64(), tree };
    bench_report::write(root, &records, &outputs, &run_info)?;
    let failures: Vec<&str> =
        outputs.iter().filter(|o| o.failure.is_some()).map(|o| o.name.as_str()).collect();
    if !failures.is_empty() {
        bail!("benchmarks failed: {}", failures.join(", "));
    }
    Ok(())
}

/// Whether a record line is a table or a plot (the summary table shows figures only).
fn is_table_or_plot(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| matches!(v["record"].as_str(), Some("table") | Some("plot")))
}

fn bench_command(root: &Path, package: &str, name: &str, quick: bool) -> Command {
    let mut cmd = cargo();
    cmd.current_dir(root).args(["bench", "--package", package, "--bench", name]);
    if quick {
        cmd.args(["--profile", "dev"]).env(QUICK_ENV, "1");
        for (_, var, value) in QUICK_SIZES.iter().filter(|(bench, ..)| *bench == name) {
            if std::env::var_os(var).is_none() {
                cmd.env(var, value);
            }
        }
        for (_, args) in QUICK_ARGS.iter().filter(|(bench, _)| *bench == name) {
            cmd.arg("--").args(*args);
        }
    }
    cmd
}

/// A bar on stderr saying which benchmark runs and how many are done, when stderr is a
/// terminal (elsewhere each benchmark's start is a plain line).
fn progress_bar(total: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} benchmarks [{pos}/{len}] {elapsed_precise} running {wide_msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    })
}

/// Runs `cmd`, passing its standard output through line by line and keeping a copy; its
/// standard error goes straight through (above the progress bar, when there is one).
/// Returns the copy and whether it succeeded.
fn run_teeing(cmd: &mut Command, bar: Option<&indicatif::ProgressBar>) -> Result<(String, bool)> {
    match bar {
        Some(bar) => bar.println(format!("xtask: running {cmd:?}")),
        None => eprintln!("xtask: running {cmd:?}"),
    }
    if bar.is_some() {
        // Lines are printed above the bar: cargo and the benchmark see a pipe, not the
        // terminal, so keep cargo's colours.
        cmd.stderr(Stdio::piped()).env("CARGO_TERM_COLOR", "always");
    }
    let mut child = cmd.stdout(Stdio::piped()).spawn().with_context(|| format!("could not start {cmd:?}"))?;
    let errors = match (bar, child.stderr.take()) {
        (Some(bar), Some(err)) => {
            let bar = bar.clone();
            Some(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    bar.println(line);
                }
            }))
        }
        _ => None,
    };
    let mut kept = String::new();
    if let Some(out) = child.stdout.take() {
        let mut stdout = std::io::stdout();
        for line in BufReader::new(out).lines() {
            let line = line.context("reading the benchmark's output")?;
            let _ = match bar {
                Some(bar) => bar.suspend(|| writeln!(stdout, "{line}")),
                None => writeln!(stdout, "{line}"),
            };
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    let status = child.wait().with_context(|| format!("waiting for {cmd:?}"))?;
    if let Some(errors) = errors {
        let _ = errors.join();
    }
    Ok((kept, status.success()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benches_are_the_files_directly_in_benches_only() {
        let dir = std::env::temp_dir().join(format!("wasmctrl-bench-names-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("anchors")).expect("dirs");
        for f in ["b.rs", "a.rs", "anchors/decode_floor.rs", "notes.md"] {
            std::fs::write(dir.join(f), "").expect("file");
        }
        let names = bench_names(&dir).expect("names");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn a_quick_run_sizes_each_benchmark_and_the_environment_wins() {
        let cmd = bench_command(Path::new("."), "wasmctrl", "many_plugins", true);
        let envs: Vec<(String, Option<String>)> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into(), v.map(|v| v.to_string_lossy().into())))
            .collect();
        assert!(envs.contains(&("BENCH_QUICK".into(), Some("1".into()))), "{envs:?}");
        assert!(cmd.get_args().any(|a| a == "dev"), "a smoke run builds with the dev profile");
        assert!(envs.contains(&("PLUGINS".into(), Some("10".into()))), "{envs:?}");
        assert!(!envs.iter().any(|(k, _)| k == "SCALE_SECS"), "{envs:?}");
        let reload = bench_command(Path::new("."), "wasmctrl", "reload", true);
        let args: Vec<_> = reload.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.ends_with(&["--".into(), "--samples".into(), "3".into()]), "{args:?}");
        let full = bench_command(Path::new("."), "wasmctrl", "many_plugins", false);
        assert!(!full.get_envs().any(|(k, _)| k == "BENCH_QUICK"));
        assert!(is_table_or_plot(r#"{"record":"plot"}"#) && !is_table_or_plot(r#"{"bench":"x"}"#));
    }
}
