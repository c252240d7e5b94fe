//! What a `.wasm` file is and whether it fits the `plugin` world (`wasmctrl check`).
//!
//! The check is the one loading does: refuse a WASI import the host does not grant (see
//! [`crate::plugin::imports::wasi`]), link against the host's imports (the granted WASI plus
//! `wasmctrl:controller`) and type-check the `reconciler` export and the admission exports
//! (`validator`, `mutator`) it has. A report never runs guest code.

use std::fmt;

use super::admission_exports::{AdmissionExports, AdmissionIndices};
use super::engine::PluginEngine;
use crate::plugin::PluginError;
use crate::plugin::bindings::PluginPre;

/// The interface a plugin must export; its package names the world it targets.
const RECONCILER: &str = "wasmctrl:controller/reconciler";
const VALIDATOR: &str = "wasmctrl:controller/validator";
const MUTATOR: &str = "wasmctrl:controller/mutator";

/// What `inspect_component` found.
#[derive(Clone, Debug)]
pub struct ComponentReport {
    /// Size of the file in bytes.
    pub size: usize,
    /// Hex SHA-256 of the file (the version the host reports for it).
    pub hash: String,
    /// The world the component targets, as far as its exports tell
    /// (`wasmctrl:controller/plugin@0.2.0`, `.../admitting-plugin@0.2.1`), if recognised.
    pub world: Option<String>,
    /// The admission exports it has.
    pub admission: AdmissionExports,
    /// Interfaces the component imports.
    pub imports: Vec<String>,
    /// Interfaces and functions the component exports.
    pub exports: Vec<String>,
    /// `Ok` when the host can run it as a plugin, else why not.
    pub fits: Result<(), String>,
}

/// Compiles `wasm` (never runs it) and reports what it targets and whether it fits.
pub fn inspect_component(engine: &PluginEngine, wasm: &[u8]) -> Result<ComponentReport, PluginError> {
    use sha2::Digest;
    let hash = hex::encode(sha2::Sha256::digest(wasm));
    let component = engine.compile(wasm)?;
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(engine.engine()).map(|(name, _)| name.to_owned()).collect();
    let exports: Vec<String> = ty.exports(engine.engine()).map(|(name, _)| name.to_owned()).collect();
    let exported = |interface: &str| exports.iter().any(|e| e.starts_with(interface));
    let admission = AdmissionExports { validate: exported(VALIDATOR), mutate: exported(MUTATOR) };
    let world_name = match (admission.validate, admission.mutate) {
        (false, false) => "plugin",
        (true, false) => "validating-plugin",
        (false, true) => "mutating-plugin",
        (true, true) => "admitting-plugin",
    };
    let world = exports.iter().find_map(|e| {
        e.strip_prefix(RECONCILER).map(|version| format!("wasmctrl:controller/{world_name}{version}"))
    });
    let ungranted = crate::plugin::imports::wasi::ungranted_imports(imports.iter().map(String::as_str));
    let fits =
        if ungranted.is_empty() { Ok(()) } else { Err(crate::plugin::imports::wasi::refusal(&ungranted)) };
    let fits = fits.and_then(|()| {
        engine.linker_for(&component).instantiate_pre(&component).map_err(|e| format!("{e:#}")).and_then(
            |pre| {
                AdmissionIndices::new(&pre).map_err(|e| format!("{e:#}"))?;
                PluginPre::new(pre).map(|_| ()).map_err(|e| format!("{e:#}"))
            },
        )
    });
    Ok(ComponentReport { size: wasm.len(), hash, world, admission, imports, exports, fits })
}

impl fmt::Display for ComponentReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "size:    {} bytes", self.size)?;
        writeln!(f, "sha256:  {}", self.hash)?;
        writeln!(f, "world:   {}", self.world.as_deref().unwrap_or("(not a wasmctrl plugin)"))?;
        writeln!(f, "imports:")?;
        for i in &self.imports {
            writeln!(f, "  {i}")?;
        }
        writeln!(f, "exports:")?;
        for e in &self.exports {
            writeln!(f, "  {e}")?;
        }
        match &self.fits {
            Ok(()) => {
                write!(f, "fits:    yes ({})", self.world.as_deref().unwrap_or("wasmctrl:controller/plugin"))
            }
            Err(why) => write!(f, "fits:    no: {why}"),
        }
    }
}
