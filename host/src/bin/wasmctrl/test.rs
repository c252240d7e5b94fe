//! `wasmctrl test PATH...`: runs plugins against fixture files (see `wasmctrl::fixture`).

use std::path::PathBuf;
use std::process::ExitCode;

#[cfg(feature = "embedded")]
use anyhow::Context;
use anyhow::Result;
use clap::Args;
#[cfg(feature = "embedded")]
use wasmctrl::fixture::{fixture_files, run_fixture};
#[cfg(feature = "embedded")]
use wasmctrl::plugin::{EngineConfig, PluginEngine};

/// `wasmctrl test`.
#[derive(Args, Debug)]
pub struct TestArgs {
    /// Fixture files, or directories whose `*.yaml` files are fixtures.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The plugin TOML to use instead of each fixture's `plugin:`.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// The component to run instead of the one the TOML names (e.g. a fresh build in
    /// `target/wasm32-wasip2/release/`).
    #[arg(long)]
    pub wasm: Option<PathBuf>,
}

/// Fixtures run on a fresh embedded API server, so they need the `embedded` feature.
#[cfg(not(feature = "embedded"))]
pub fn test(_args: TestArgs) -> Result<ExitCode> {
    anyhow::bail!(
        "`wasmctrl test` runs fixtures on the embedded dev cluster, but {}",
        crate::cli::NOT_EMBEDDED
    )
}

#[cfg(feature = "embedded")]
pub fn test(args: TestArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let engine = PluginEngine::new(EngineConfig { pooling: None, ..EngineConfig::default() }, None)
            .context("configuring the WebAssembly engine")?;
        let mut files = Vec::new();
        for p in &args.paths {
            files.extend(fixture_files(p).with_context(|| format!("finding fixtures in {}", p.display()))?);
        }
        if files.is_empty() {
            anyhow::bail!("no fixture files (*.yaml) in {:?}", args.paths);
        }
        let (mut passed, mut failed) = (0usize, 0usize);
        for file in &files {
            let run = run_fixture(file, args.plugin.as_deref(), args.wasm.as_deref(), &engine)
                .await
                .with_context(|| format!("running fixture {}", file.display()))?;
            print!("{}", run.render());
            if run.passed() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
        println!("{passed} fixture(s) passed, {failed} failed");
        Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}
