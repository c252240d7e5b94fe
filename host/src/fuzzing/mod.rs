//! The checks the fuzz targets (`fuzz/fuzz_targets/`) run on each input, and what they drive
//! that the API does not offer (the reflector's body splitters and event decoder, the host
//! side of the plugin imports). The checks live here, not in the targets, so that the stable
//! test suite runs each on its committed seeds (`fuzz/seeds/<target>`) and on generated
//! inputs, while `cargo xtask fuzz` runs them under libFuzzer. Not part of the API (hidden
//! from the docs).
//!
//! Invariant of every check: any input is an error or a result, never a panic; each check
//! adds what its target's input must satisfy besides (see each function).

mod bodies;
mod config;

pub use bodies::{list_body, object_meta, watch_stream};
pub use config::{config_host, config_plugin};

pub use crate::plugin::imports::fuzzing::*;
pub use crate::source::fuzzing::*;

/// The committed seeds of a fuzz target, for the stable tests.
#[cfg(test)]
pub(crate) fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let seeds: Vec<Vec<u8>> = entries
        .map(|e| std::fs::read(e.unwrap_or_else(|e| panic!("{e}")).path()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert!(!seeds.is_empty(), "{} holds no seed", dir.display());
    seeds
}
