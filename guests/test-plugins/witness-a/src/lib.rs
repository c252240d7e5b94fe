//! Hot-reload witness plugin, build "a". The logic is shared with `witness-b` (see
//! `plugin.rs`); only the stamp differs, so the two builds are two versions.

const STAMP: &str = "a";

include!("plugin.rs");
