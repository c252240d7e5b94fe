//! `cargo xtask fuzz [--seconds N] [TARGET...]`: builds the fuzz targets of `fuzz/` once
//! (cargo-fuzz on the nightly toolchain, release with debug assertions, no sanitizer: the
//! code fuzzed is safe Rust, and overflow checks and assertions are what find its bugs), then
//! runs each for a fixed time from its committed seeds (`fuzz/seeds/<target>`) and the corpus
//! it grew before (kept in the build directory), with its dictionary (`fuzz/dicts`) when it
//! has one, and prints what each did: executions, executions per second, new inputs, and
//! the input of any crash (written under the build directory's `fuzz/artifacts/<target>/`).
//!
//! The check each target runs on an input is a library function (`wasmctrl::fuzzing`,
//! `wasmctrl_selectors::fuzzing`, `wasmctrl_devcluster::fuzzing`) that the stable tests run
//! on the seeds and on generated inputs, so CI covers every check without nightly. Where a
//! nightly toolchain is installed, `cargo xtask ci` also fuzzes each target briefly
//! ([`CI_SECONDS`]); without one it says that it skips this. cargo-fuzz is installed when
//! missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Every target, with the longest input it is given.
const TARGETS: &[(&str, usize)] = &[
    ("config_host", 4096),
    ("config_plugin", 8192),
    ("label_selector", 1024),
    ("field_selector", 1024),
    ("object_meta", 16384),
    ("watch_stream", 16384),
    ("list_body", 16384),
    ("devcluster_http", 8192),
    ("wit_imports", 4096),
];

/// Seconds per target by default.
pub const DEFAULT_SECONDS: u64 = 60;

/// Seconds per target in CI.
pub const CI_SECONDS: u64 = 10;

/// What one run of a target did.
struct Outcome {
    target: &'static str,
    executions: u64,
    per_second: u64,
    new_inputs: u64,
    corpus: usize,
    crash: Option<String>,
}

/// `cargo xtask fuzz` with its arguments.
pub fn fuzz(root: &Path, args: &[String]) -> Result<()> {
    let mut seconds = DEFAULT_SECONDS;
    let mut chosen = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                let n = args.next().context("--seconds needs a number")?;
                seconds = n.parse().with_context(|| format!("--seconds {n}: not a number"))?;
            }
            other if other.starts_with("--seconds=") => {
                let n = &other["--seconds=".len()..];
                seconds = n.parse().with_context(|| format!("--seconds {n}: not a number"))?;
            }
            other if other.starts_with('-') => bail!("fuzz: unknown option `{other}`"),
            target => match TARGETS.iter().find(|(t, _)| *t == target) {
                Some(t) => chosen.push(*t),
                None => bail!(
                    "fuzz: no target `{target}`; the targets are {}",
                    TARGETS.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
                ),
            },
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.to_vec();
    }
    if !nightly_available() {
        bail!("fuzzing needs a nightly toolchain (`rustup toolchain install nightly`)");
    }
    run_targets(root, &chosen, seconds)
}

/// CI's brief run of every target, when a nightly toolchain is installed.
pub fn ci(root: &Path) -> Result<()> {
    if !nightly_available() {
        eprintln!(
            "xtask: no nightly toolchain; the fuzz targets are not run (their checks ran in the tests)"
        );
        return Ok(());
    }
    run_targets(root, TARGETS, CI_SECONDS)
}

/// `cargo` of the nightly toolchain (through rustup: the `cargo` that runs this task is the
/// stable one, and the toolchain rustup chose for it is not to be inherited).
fn nightly_cargo() -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC");
    super::without_cargo_run_env(cmd)
}

fn nightly_available() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Where the fuzz build, the grown corpora, the logs and the crash inputs go.
fn fuzz_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("fuzz"),
        None => root.join("fuzz/target"),
    }
}

fn run_targets(root: &Path, targets: &[(&'static str, usize)], seconds: u64) -> Result<()> {
    let dir = fuzz_dir(root);
    ensure_cargo_fuzz()?;
    let started = Instant::now();
    let mut build = nightly_cargo();
    build.current_dir(root).args(["fuzz", "build", "-O", "-a", "-s", "none", "--codegen-units", "16"]);
    build.arg("--target-dir").arg(&dir);
    super::run(&mut build)?;
    eprintln!("xtask: fuzz targets built in {:.1}s", started.elapsed().as_secs_f64());
    let host = host_triple()?;
    let mut outcomes = Vec::new();
    for (target, max_len) in targets {
        outcomes.push(run_one(root, &dir, &host, target, *max_len, seconds)?);
    }
    eprintln!("\nxtask: fuzzing, {seconds}s per target");
    eprintln!("{:<16} {:>12} {:>10} {:>9} {:>8}  result", "target", "executions", "execs/s", "new", "corpus");
    for o in &outcomes {
        eprintln!(
            "{:<16} {:>12} {:>10} {:>9} {:>8}  {}",
            o.target,
            o.executions,
            o.per_second,
            o.new_inputs,
            o.corpus,
            o.crash.as_deref().map_or("no crash".to_owned(), |c| format!("CRASH: {c}"))
        );
    }
    let crashed: Vec<&str> = outcomes.iter().filter(|o| o.crash.is_some()).map(|o| o.target).collect();
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {} (inputs under {})",
            crashed.join(", "),
            dir.join("artifacts").display()
        );
    }
    Ok(())
}

/// Installs cargo-fuzz when `cargo +nightly fuzz` is not there.
fn ensure_cargo_fuzz() -> Result<()> {
    let present = nightly_cargo().args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if !present {
        eprintln!("xtask: installing cargo-fuzz");
        super::run(nightly_cargo().args(["install", "--locked", "cargo-fuzz"]))?;
    }
    Ok(())
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustup")
        .args(["run", "nightly", "rustc", "-vV"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

/// Runs one built target for `seconds` and reads libFuzzer's final statistics.
fn run_one(
    root: &Path,
    dir: &Path,
    host: &str,
    target: &'static str,
    max_len: usize,
    seconds: u64,
) -> Result<Outcome> {
    let binary = dir.join(host).join("release").join(target);
    let corpus = dir.join("corpus").join(target);
    let artifacts = dir.join("artifacts").join(target);
    let logs = dir.join("logs");
    for d in [&corpus, &artifacts, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let seeds = root.join("fuzz/seeds").join(target);
    let dict = root.join("fuzz/dicts").join(format!("{target}.dict"));
    let log = logs.join(format!("{target}.log"));
    let log_file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&binary);
    // New inputs go to the first directory (the grown corpus); the seeds are read too.
    cmd.arg(&corpus);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.arg(format!("-max_total_time={seconds}"))
        .arg(format!("-max_len={max_len}"))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    eprintln!("xtask: fuzzing {target} for {seconds}s (log {})", log.display());
    let status = cmd
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let stat = |name: &str| -> u64 {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .filter_map(|v| v.trim().parse().ok())
            .next_back()
            .unwrap_or(0)
    };
    let crash = (!status.success()).then(|| {
        text.lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim().to_owned()))
            .unwrap_or_else(|| format!("exit {status}; see {}", log.display()))
    });
    let corpus_size = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
    Ok(Outcome {
        target,
        executions: stat("number_of_executed_units"),
        per_second: stat("average_exec_per_sec"),
        new_inputs: stat("new_units_added"),
        corpus: corpus_size,
        crash,
    })
}
