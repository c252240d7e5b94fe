//! Which admission exports (`validator`, `mutator`, added by `wasmctrl:controller@0.2.1`)
//! a compiled component has, looked up once per compiled code, and their functions in one
//! instance. The calls themselves are `plugin::admit`'s.
//!
//! Invariants: a component exporting neither (every 0.2.0 component) is a plain plugin, and
//! instantiating it looks up nothing more; a component that exports `validator` or
//! `mutator` with other functions than the WIT's is refused at load.

use wasmtime::component::{Instance as ComponentInstance, InstancePre};

use super::store_data::HostState;
use crate::plugin::bindings::admission::{Mutator, MutatorIndices, Validator, ValidatorIndices};

/// The export names a plugin's admission is looked up by (the host's package version; a
/// component of any `0.2.x` matches them).
const VALIDATOR: &str = "wasmctrl:controller/validator@0.2.1";
const MUTATOR: &str = "wasmctrl:controller/mutator@0.2.1";

/// Which admission exports a component has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionExports {
    /// It exports `validator` (can serve validating webhooks).
    pub validate: bool,
    /// It exports `mutator` (can serve mutating webhooks).
    pub mutate: bool,
}

impl AdmissionExports {
    /// Whether the component exports either.
    pub fn any(self) -> bool {
        self.validate || self.mutate
    }
}

/// The admission exports of one compiled component, looked up before instantiation.
pub(crate) struct AdmissionIndices {
    validator: Option<ValidatorIndices>,
    mutator: Option<MutatorIndices>,
}

/// The admission exports of one instance.
pub(crate) struct AdmissionFuncs {
    pub(super) validator: Option<Validator>,
    pub(super) mutator: Option<Mutator>,
}

impl AdmissionIndices {
    /// Looks the exports up: absent ones are `None`; one that is there but lacks a function
    /// of the WIT is an error.
    pub fn new(pre: &InstancePre<HostState>) -> wasmtime::Result<Self> {
        let exported = |name: &str| pre.component().get_export_index(None, name).is_some();
        let validator = if exported(VALIDATOR) { Some(ValidatorIndices::new(pre)?) } else { None };
        let mutator = if exported(MUTATOR) { Some(MutatorIndices::new(pre)?) } else { None };
        Ok(AdmissionIndices { validator, mutator })
    }

    pub fn exports(&self) -> AdmissionExports {
        AdmissionExports { validate: self.validator.is_some(), mutate: self.mutator.is_some() }
    }

    /// The exports of `instance` (type-checked here).
    pub fn load(
        &self,
        store: &mut wasmtime::Store<HostState>,
        instance: &ComponentInstance,
    ) -> wasmtime::Result<AdmissionFuncs> {
        let validator = self.validator.as_ref().map(|v| v.load(&mut *store, instance)).transpose()?;
        let mutator = self.mutator.as_ref().map(|m| m.load(&mut *store, instance)).transpose()?;
        Ok(AdmissionFuncs { validator, mutator })
    }
}
