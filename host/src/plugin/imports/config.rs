//! Host side of the `config` import: the plugin's name and `[settings]` JSON.
//!
//! Layering: [`ConfigCtx`] is this interface's whole host context, reached through
//! [`ConfigCtxView`]; this module knows nothing of the store's state or the other imports.
//! Invariant: what the guest reads here is exactly its spec's name and settings, the same
//! for every instance and every call.

use bytes::Bytes;
use wasmtime::component::HasData;

use crate::plugin::bindings::wasmctrl::controller::config::Host;

/// The `config` import's host context.
pub(crate) struct ConfigCtx {
    pub plugin: String,
    pub settings: Bytes,
}

/// What a `config` call sees.
pub(crate) struct ConfigCtxView<'a> {
    pub ctx: &'a ConfigCtx,
}

/// Links `config` with [`ConfigCtxView`] as its host.
pub(crate) struct HasConfig;

impl HasData for HasConfig {
    type Data<'a> = ConfigCtxView<'a>;
}

impl Host for ConfigCtxView<'_> {
    fn plugin_name(&mut self) -> wasmtime::Result<String> {
        Ok(self.ctx.plugin.clone())
    }

    fn settings(&mut self) -> wasmtime::Result<Vec<u8>> {
        Ok(self.ctx.settings.to_vec())
    }
}
