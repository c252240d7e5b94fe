//! Hot-reload test plugin, build "a". The logic is shared with `reload-stamp-b` and
//! `reload-stamp-bad` (see `plugin.rs`); only the stamp differs.

const STAMP: &str = "a";
const FAIL_INIT: bool = false;

include!("plugin.rs");
