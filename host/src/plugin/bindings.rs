//! Host bindings generated from `wit/wasmctrl.wit` (world `plugin`), synchronous.
//!
//! Synchronous bindings: a call into a guest costs ~0.5 µs against ~1.4 µs through the
//! async machinery. Calls run on blocking threads, so imports may block on the Kubernetes
//! client without stalling tokio workers. Every import is trappable so the host can stop
//! a guest whose deadline passed while it waited on the network.
//!
//! Each interface is linked on its own (see the engine) with its own host context; `types`
//! declares no functions, so its host ([`TypesHost`]) holds nothing.

wasmtime::component::bindgen!({
    world: "plugin",
    path: "../wit",
    imports: { default: trappable },
});

/// The host of the function-less `types` interface.
pub(crate) struct TypesHost;

impl wasmtime::component::HasData for TypesHost {
    type Data<'a> = TypesHost;
}

impl wasmctrl::controller::types::Host for TypesHost {}
