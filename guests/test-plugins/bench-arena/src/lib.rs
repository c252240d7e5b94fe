//! Benchmark plugin: `test-plugin-bench-sdk`'s code with the SDK's per-call arena as the
//! global allocator (`export_plugin!(…, allocator = arena)`).

include!("../../bench-sdk/src/plugin.rs");

wasmctrl_guest::export_plugin!(Bench, allocator = arena);
