//! Hot-reload test plugin, a broken build: a valid component whose `init` always fails, so
//! the host must reject it and keep the running version.

const STAMP: &str = "bad";
const FAIL_INIT: bool = true;

include!("../../reload-stamp-a/src/plugin.rs");
