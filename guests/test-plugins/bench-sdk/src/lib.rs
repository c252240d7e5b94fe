//! Benchmark plugin: the `bench` plugin's reconcile (cache get + typed parse of a ConfigMap)
//! written with the SDK, with the system allocator (wasi-libc's dlmalloc). Its twin
//! `test-plugin-bench-arena` is the same code with the per-call arena.

include!("plugin.rs");

wasmctrl_guest::export_plugin!(Bench);
