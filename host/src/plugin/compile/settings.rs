//! The engine settings: how the host's wasmtime engines are configured ([`EngineConfig`],
//! [`EngineTuning`], [`PoolingLimits`]), what one compile in the compile child may take
//! ([`CompileLimits`]), their defaults, and the wasmtime [`Config`] they make
//! ([`wasm_config`]).
//!
//! Layering: the leaf of the plugin runtime. This module imports nothing of `plugin`, so
//! the compile pipeline (the compile child builds its engine with [`wasm_config`]) and the
//! runtime's engine both build on it without importing each other.
//!
//! Invariants: the host's engines and the compile child's engine are configured by the one
//! function [`wasm_config`], so an artifact compiled in the child is compiled with the
//! settings of the engine that loads it.

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::{Config, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

/// Default byte budget of the compile cache (the host TOML's `cache-max-size`).
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

/// How the shared engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Where compiled components are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Byte budget of the compile cache: past it, the least recently used artifacts are
    /// removed (the host TOML's `cache-max-size`).
    pub cache_max_bytes: u64,
    /// Granularity of call deadlines (one epoch tick).
    pub epoch_tick: Duration,
    /// Use wasmtime's pooling allocator (faster instantiation, bounded slots).
    pub pooling: Option<PoolingLimits>,
    /// Maximum native stack a guest may use before it traps with a stack overflow.
    pub max_wasm_stack: usize,
    /// Release plugin instances idle this long (the next call instantiates anew); `None`
    /// or zero keeps them until their plugin is dropped.
    pub idle_instance_timeout: Option<Duration>,
    /// A plugin with no call for this long drops its compiled code (its idle instances
    /// go too); the next call loads it again from the compile cache. Only plugins
    /// loaded from a file (`Plugin::load_file`) running optimised code whose
    /// artifact is in the compile cache drop it. `None` or zero keeps the code: the default
    /// here; the host TOML's `idle-code-timeout` turns it on by default.
    pub idle_code_timeout: Option<Duration>,
    /// Code generation and memory layout knobs; the default is what the host runs with.
    pub tuning: EngineTuning,
    /// Tier-up: a component missing from the compile cache is compiled with Winch first
    /// (several times faster to compile, slower to run) and serves at once, while Cranelift
    /// compiles it in the background; plugins switch to the optimised code when it is
    /// ready. Off here (every plugin runs Cranelift code from its first call, which is
    /// what benchmarks and tests of guest speed expect); the host TOML's `tier-up` turns it
    /// on by default.
    pub tier_up: bool,
    /// A program that compiles components in a process of its own (run as `PROGRAM
    /// compile-component SETTINGS`, the component on stdin, the artifact on stdout: the
    /// `wasmctrl` binary passes itself). The host then never runs the optimising compiler:
    /// its code and memory stay out of the host's RSS. A compile the program fails is done
    /// in this process instead, with a warning. `None` (the default here) compiles in this
    /// process. See `compile::child`.
    pub compile_process: Option<PathBuf>,
    /// What one compile in the compile program may take: time (the host TOML's
    /// `compile-timeout`), address space and output. See `compile::child`.
    pub compile_limits: CompileLimits,
}

/// Engine knobs that trade speed for address space or for guarantees. The defaults are the
/// fast and safe ones; the others exist so benchmarks can measure what the defaults buy.
#[derive(Clone, Debug)]
pub struct EngineTuning {
    /// Address space reserved per linear memory (`None`: wasmtime's default, 4 GiB on
    /// 64-bit hosts). With the default guard region, 4 GiB lets Cranelift drop the explicit
    /// bounds check of every load and store of a 32-bit memory; a smaller reservation
    /// brings the checks back. The memory cap (`memory` limit) holds either way.
    pub memory_reservation: Option<u64>,
    /// Guard region after each linear memory (`None`: wasmtime's default, 32 MiB on
    /// 64-bit hosts), which lets accesses with a constant offset skip their check.
    pub memory_guard_size: Option<u64>,
    /// Epoch interruption: how call deadlines and cancellation stop running guest code.
    /// Off only to measure its cost: a looping guest then runs forever.
    pub epoch_interruption: bool,
    /// Cranelift inlines small functions of a module into their callers (wasmtime's
    /// `Inlining::Yes`; its default is `No`). Winch ignores it.
    pub inlining: bool,
}

impl Default for EngineTuning {
    fn default() -> Self {
        EngineTuning {
            memory_reservation: None,
            memory_guard_size: None,
            epoch_interruption: true,
            inlining: false,
        }
    }
}

/// Default of [`EngineConfig::idle_instance_timeout`] (the host TOML's
/// `idle-instance-timeout`).
pub const DEFAULT_IDLE_INSTANCE_TIMEOUT: Duration = Duration::from_secs(60);

/// The host TOML's default `idle-code-timeout` ([`EngineConfig::idle_code_timeout`]).
pub const DEFAULT_IDLE_CODE_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dir: None,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            epoch_tick: Duration::from_millis(5),
            pooling: Some(PoolingLimits::default()),
            max_wasm_stack: 512 << 10,
            idle_instance_timeout: Some(DEFAULT_IDLE_INSTANCE_TIMEOUT),
            idle_code_timeout: None,
            tuning: EngineTuning::default(),
            tier_up: false,
            compile_process: None,
            compile_limits: CompileLimits::default(),
        }
    }
}

/// Slots of the pooling allocator, shared by every plugin instance of the host.
#[derive(Clone, Debug)]
pub struct PoolingLimits {
    /// Live plugin instances at once (sum of every plugin's pool plus replacements; the
    /// host TOML's `instance-slots`).
    pub instances: u32,
    /// The most instances one plugin may hold (the host TOML's `max-instances-per-plugin`):
    /// a plugin whose concurrency needs more is refused at load. Every plugin also has one
    /// slot reserved for it. See `runtime::instance_slots`.
    pub per_plugin: u32,
    /// Upper bound of any plugin's `memory` limit.
    pub max_memory: usize,
}

/// Default of [`PoolingLimits::instances`].
pub const DEFAULT_INSTANCE_SLOTS: u32 = 128;
/// Default of [`PoolingLimits::per_plugin`].
pub const DEFAULT_INSTANCES_PER_PLUGIN: u32 = 32;

impl Default for PoolingLimits {
    fn default() -> Self {
        PoolingLimits {
            instances: DEFAULT_INSTANCE_SLOTS,
            per_plugin: DEFAULT_INSTANCES_PER_PLUGIN,
            max_memory: 256 << 20,
        }
    }
}

/// Default of [`CompileLimits::timeout`] (the host TOML's `compile-timeout`).
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(300);

/// What one compile in the child may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileLimits {
    /// Wall-clock time; past it the child is killed and the load fails.
    pub timeout: Duration,
    /// Address space of the child (`RLIMIT_AS`), in bytes.
    pub memory: u64,
    /// Bytes of artifact the child may write.
    pub max_output: u64,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits { timeout: DEFAULT_COMPILE_TIMEOUT, memory: 4 << 30, max_output: 512 << 20 }
    }
}

/// The wasmtime configuration of the optimising engine.
pub(crate) fn wasm_config(config: &EngineConfig) -> Config {
    let mut wasm = Config::new();
    wasm.wasm_component_model(true)
        .cranelift_opt_level(OptLevel::Speed)
        .epoch_interruption(config.tuning.epoch_interruption)
        .max_wasm_stack(config.max_wasm_stack)
        .parallel_compilation(true)
        // No `.eh_frame` for guest code. It serves only native unwinders walking through
        // Wasm frames (a debugger, `perf --call-graph=dwarf`); wasmtime's own backtraces
        // and traps do not use it, and a host function's panic is caught before it would
        // unwind into guest frames. Registering it reads every one of its pages at each
        // load (resident for as long as the plugin is loaded), and it takes room in every
        // artifact on disk.
        .native_unwind_info(false);
    if config.tuning.inlining {
        wasm.compiler_inlining(wasmtime::Inlining::Yes);
    }
    if let Some(bytes) = config.tuning.memory_reservation {
        wasm.memory_reservation(bytes);
    }
    if let Some(bytes) = config.tuning.memory_guard_size {
        wasm.memory_guard_size(bytes);
    }
    if let Some(p) = &config.pooling {
        let mut pool = PoolingAllocationConfig::default();
        let n = p.instances.max(1);
        // A wasm32-wasip2 Rust component instantiates a handful of core modules
        // (the program plus wit-component shims), one memory and a few tables.
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(4))
            // A stack for each instance that runs a call as a future (admission calls,
            // `plugin::admit`); reserved address space, committed as a call touches it.
            .total_stacks(n)
            .max_memory_size(p.max_memory)
            .max_core_instances_per_component(16)
            .max_memories_per_component(4)
            .max_tables_per_component(8);
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    wasm
}
