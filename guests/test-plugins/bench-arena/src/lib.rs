//! Benchmark plugin: `test-plugin-bench-sdk`'s code with the SDK's per-call arena as the
//! global allocator, named explicitly (`export_plugin!(…, allocator = arena)`; also the
//! default). `host/tests/guest_arena.rs` loads it.

include!("../../bench-sdk/src/plugin.rs");

wasmctrl_guest::export_plugin!(Bench, allocator = arena);
