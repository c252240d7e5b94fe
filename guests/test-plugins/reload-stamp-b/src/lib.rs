//! Hot-reload test plugin, build "b": the same logic as `reload-stamp-a`, another stamp.

const STAMP: &str = "b";
const FAIL_INIT: bool = false;

include!("../../reload-stamp-a/src/plugin.rs");
