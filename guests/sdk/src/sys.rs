//! Where the SDK's host calls go: the WIT imports inside a Wasm instance, the
//! [`testing`](crate::testing) fake host in native builds.
//!
//! Each submodule has the functions (and types) of one WIT import interface with the
//! signatures wit-bindgen generates, so the typed modules (`cache`, `client`, ...) are the
//! same code on both targets. Invariant: on `wasm32` nothing here adds behaviour; natively
//! every call is answered by the fake host installed on the calling thread.

#[cfg(target_arch = "wasm32")]
pub(crate) use crate::bindings::wasmctrl::controller::{cache, client, config, events, log};

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod cache {
    use crate::bindings::wasmctrl::controller::types::{Error, Gvk};
    use crate::testing::{no_host, with_host};

    pub fn get(kind: &Gvk, namespace: Option<&str>, name: &str) -> Result<Option<Vec<u8>>, Error> {
        with_host(|h| h.cache_get(kind, namespace, name)).unwrap_or_else(no_host)
    }

    pub fn list(
        kind: &Gvk,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Vec<u8>>, Error> {
        with_host(|h| h.cache_list(kind, namespace, label_selector)).unwrap_or_else(no_host)
    }

    pub fn by_index(kind: &Gvk, index: &str, value: &str) -> Result<Vec<Vec<u8>>, Error> {
        with_host(|h| h.cache_by_index(kind, index, value)).unwrap_or_else(no_host)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod client {
    pub use crate::bindings::wasmctrl::controller::client::{
        ApplyOptions, DeleteOptions, PatchBody, Propagation,
    };
    use crate::bindings::wasmctrl::controller::types::{Error, Gvk};
    use crate::testing::{no_host, with_host};

    pub fn get(kind: &Gvk, namespace: Option<&str>, name: &str) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_get(kind, namespace, name)).unwrap_or_else(no_host)
    }

    pub fn create(object: &[u8]) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_create(object)).unwrap_or_else(no_host)
    }

    pub fn replace(object: &[u8]) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_replace(object)).unwrap_or_else(no_host)
    }

    pub fn patch(
        kind: &Gvk,
        namespace: Option<&str>,
        name: &str,
        patch: &PatchBody,
    ) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_patch(kind, namespace, name, patch, false)).unwrap_or_else(no_host)
    }

    pub fn apply(object: &[u8], options: &ApplyOptions) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_apply(object, options)).unwrap_or_else(no_host)
    }

    pub fn update_status(object: &[u8]) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_update_status(object)).unwrap_or_else(no_host)
    }

    pub fn patch_status(
        kind: &Gvk,
        namespace: Option<&str>,
        name: &str,
        patch: &PatchBody,
    ) -> Result<Vec<u8>, Error> {
        with_host(|h| h.client_patch(kind, namespace, name, patch, true)).unwrap_or_else(no_host)
    }

    pub fn delete(
        kind: &Gvk,
        namespace: Option<&str>,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<(), Error> {
        with_host(|h| h.client_delete(kind, namespace, name, options)).unwrap_or_else(no_host)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod events {
    pub use crate::bindings::wasmctrl::controller::events::{Event, EventType};
    use crate::bindings::wasmctrl::controller::types::Error;
    use crate::testing::{no_host, with_host};

    pub fn publish(event: &Event) -> Result<(), Error> {
        with_host(|h| h.publish_event(event)).unwrap_or_else(no_host)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod log {
    pub use crate::bindings::wasmctrl::controller::log::Level;
    use crate::testing::with_host;

    pub fn enabled(level: Level) -> bool {
        with_host(|h| h.log_enabled(level)).unwrap_or(false)
    }

    pub fn log(level: Level, message: &str, fields: &[(String, String)]) {
        with_host(|h| h.log(level, message, fields)).unwrap_or(())
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod config {
    use crate::testing::with_host;

    pub fn plugin_name() -> String {
        with_host(|h| h.plugin_name()).unwrap_or_default()
    }

    pub fn settings() -> Vec<u8> {
        with_host(|h| h.settings_json()).unwrap_or_default()
    }
}
