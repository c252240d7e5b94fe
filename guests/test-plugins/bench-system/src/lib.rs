//! Benchmark plugin: `test-plugin-bench-sdk`'s code with Rust's system allocator (wasi-libc's
//! dlmalloc) instead of the SDK's default per-call arena (`export_plugin!(…, allocator = system)`).

include!("../../bench-sdk/src/plugin.rs");

wasmctrl_guest::export_plugin!(Bench, allocator = system);
