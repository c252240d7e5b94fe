//! Benchmark plugin: the `bench` plugin's reconcile (cache get + typed parse of a ConfigMap)
//! written with the SDK and registered as a plugin author does (`export_plugin!(Bench)`: the
//! SDK's default allocator, the workspace's release profile). Its twins run the same code
//! with an explicit allocator: `test-plugin-bench-arena` (per-call arena) and
//! `test-plugin-bench-system` (wasi-libc's dlmalloc).

include!("plugin.rs");

wasmctrl_guest::export_plugin!(Bench);
