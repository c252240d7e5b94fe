//! Hot-reload witness plugin, build "b": the same logic as `witness-a`, another stamp.

const STAMP: &str = "b";

include!("../../witness-a/src/plugin.rs");
