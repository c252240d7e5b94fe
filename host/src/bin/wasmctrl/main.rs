//! The `wasmctrl` command line: run the host, check a setup offline, test a plugin against
//! fixtures, scaffold a plugin, publish one to a registry, print the RBAC or the webhook
//! configurations the plugins need, or run the embedded dev cluster alone.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

mod cli;
mod new;
mod progress;
mod push;
mod status;
mod test;

/// jemalloc rather than glibc's malloc (feature `jemalloc`, on by default). The host keeps a
/// large, long-lived cache of many small allocations and replaces them from several threads;
/// glibc's per-thread arenas fragment under that and keep the freed memory (capping them
/// with `M_ARENA_MAX` trades it for slower hot reloads). `cargo bench -p wasmctrl --bench
/// scale` measures the resident memory of a large cache under a stream of updates; figures
/// in `docs/benchmarks.md`.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (why: [`wasmctrl::heap::MallocConf::HOST`]), read once at start-up.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;

/// A Kubernetes controller host whose controllers are WebAssembly plugins.
#[derive(Parser, Debug)]
#[command(name = "wasmctrl", version, about, long_about = None)]
struct Cli {
    /// Log format. Filter with RUST_LOG (e.g. `RUST_LOG=info,wasmctrl=debug`); default `info`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the host: load the plugins directory, watch it for changes, reconcile until
    /// interrupted (Ctrl-C / SIGTERM drain in-flight reconciles first).
    Run(cli::RunArgs),
    /// Validate a host TOML, a plugins directory, a plugin TOML or a `.wasm` component
    /// without starting anything; print what would run. Exits non-zero on any error.
    Check {
        /// Files or directories to check: `wasmctrl.toml`, `plugins/`, `plugins/x.toml`, `plugins/x.wasm`.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Run plugins' real components against fixture files (a YAML world, steps,
    /// expected writes, Events and results) on a fresh embedded API server. Exits
    /// non-zero when any expectation fails.
    Test(test::TestArgs),
    /// Scaffold a plugin crate (Cargo.toml, src/lib.rs, NAME.toml, a fixture) that builds
    /// with `cargo build --release --target wasm32-wasip2`.
    New(new::NewArgs),
    /// Publish a plugin's component to an OCI registry as a Wasm OCI artifact (config
    /// `application/vnd.wasm.config.v0+json`, layer `application/wasm`), optionally signed
    /// as `cosign sign --key` does. Plugin TOMLs then name it as `wasm = "oci://..."`.
    Push(push::PushArgs),
    /// Print the RBAC (ClusterRole or Role, and its binding) that the host's service
    /// account needs for the configured plugins, as YAML.
    Rbac(cli::RbacArgs),
    /// Show a running host's plugins: versions, states, queue depths, reconcile and error
    /// rates, instances and last errors (read from its /plugins and /metrics).
    Status(status::StatusArgs),
    /// Print the Validating/MutatingWebhookConfigurations the admitting plugins need, as
    /// YAML (for a host whose `[admission]` has `manage-configurations = false`).
    WebhookConfig(cli::WebhookConfigArgs),
    /// Start the embedded Kubernetes API server alone (loopback only), write a kubeconfig
    /// for it and serve until interrupted.
    DevCluster(cli::DevClusterArgs),
    /// Compile a component read from stdin and write the artifact to stdout: what the host
    /// runs in a child process for each compile (`wasmctrl::plugin::serve_compile`).
    #[command(name = "compile-component", hide = true)]
    CompileComponent {
        /// The host's compile settings, as JSON.
        settings: String,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::CompileComponent { settings } = &cli.command {
        // No logging set up: the host reads this process's stdout as the artifact, and
        // its stderr only when it fails.
        return match wasmctrl::plugin::serve_compile(
            settings,
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        ) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                std::process::ExitCode::from(err.exit_code())
            }
        };
    }
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    // `run` sets logging up itself, once it knows whether its host TOML asks for traces.
    if !matches!(cli.command, Command::Run(_)) {
        cli::init_tracing(json_logs, None);
    }
    let result: Result<std::process::ExitCode> = match cli.command {
        Command::Run(args) => cli::run(args, json_logs),
        Command::Check { paths } => cli::check(&paths),
        Command::Test(args) => test::test(args),
        Command::New(args) => new::new(args),
        Command::Push(args) => push::push(args),
        Command::Rbac(args) => cli::rbac(args),
        Command::Status(args) => status::status(args),
        Command::WebhookConfig(args) => cli::webhook_config(args),
        Command::DevCluster(args) => cli::dev_cluster(args),
        Command::CompileComponent { .. } => Ok(std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(all(test, feature = "jemalloc"))]
mod tests {
    /// A jemalloc control's value of type `T` (`unsigned` or `size_t`).
    fn mallctl<T: Default>(name: &str) -> T {
        let name = std::ffi::CString::new(name).unwrap();
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: `value` is a `T` of `len` bytes, what jemalloc writes for the controls read here.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&raw mut value).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0, "mallctl {name:?}");
        value
    }

    #[test]
    fn jemalloc_reads_the_exported_options() {
        assert_eq!(super::MALLOC_CONF.options().to_str().unwrap(), "slab_sizes:1-4096:16");
        // The binary's own test harness runs on its allocator, so jemalloc has read the
        // exported options: the 2 KiB class (a ~2 KB object's JSON) has 64 KiB slabs, not
        // its default one page.
        let bins: u32 = mallctl("arenas.nbins");
        let bin = (0..bins)
            .find(|i| mallctl::<usize>(&format!("arenas.bin.{i}.size")) == 2048)
            .expect("a 2048-byte size class");
        assert_eq!(mallctl::<usize>(&format!("arenas.bin.{bin}.slab_size")), 64 * 1024);
    }
}
