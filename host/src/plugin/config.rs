//! Host side of the `config` import: the plugin's name and `[settings]` JSON.

use super::bindings::wasmctrl::controller::config::Host;
use super::state::HostState;

impl Host for HostState {
    fn plugin_name(&mut self) -> wasmtime::Result<String> {
        Ok(self.ctx.spec.name.clone())
    }

    fn settings(&mut self) -> wasmtime::Result<Vec<u8>> {
        Ok(self.ctx.spec.settings.to_vec())
    }
}

/// `types` declares no functions; its host trait is empty.
impl super::bindings::wasmctrl::controller::types::Host for HostState {}
