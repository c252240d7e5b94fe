//! Host bindings generated from `wit/wasmctrl.wit` (world `plugin`), synchronous.
//!
//! Synchronous bindings: a call into a guest costs less than through the async machinery
//! (`cargo bench -p wasmctrl --bench plugin` measures the call; figures in
//! `docs/benchmarks.md`). Calls run on blocking threads, so imports may block on the Kubernetes
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

/// The admission exports (`validator`, `mutator`), generated from the world that has both,
/// as async calls.
/// Only their per-interface export bindings are used ([`admission::ValidatorIndices`] and
/// [`admission::MutatorIndices`]): a component exports either, both or neither, and the
/// host looks each one up on its own. Their imports are the ones above (`with`), so an
/// instance is linked exactly as a `plugin` one.
pub(crate) mod admission {
    wasmtime::component::bindgen!({
        world: "admitting-plugin",
        path: "../wit",
        imports: { default: trappable },
        // Async: an admission call runs as a future on the server's worker when an instance
        // is idle (`plugin::admit`), and blocks a thread of its own otherwise.
        exports: { default: async },
        with: {
            "wasmctrl:controller/types": super::wasmctrl::controller::types,
            "wasmctrl:controller/cache": super::wasmctrl::controller::cache,
            "wasmctrl:controller/client": super::wasmctrl::controller::client,
            "wasmctrl:controller/events": super::wasmctrl::controller::events,
            "wasmctrl:controller/log": super::wasmctrl::controller::log,
            "wasmctrl:controller/config": super::wasmctrl::controller::config,
        },
    });

    pub(crate) use self::wasmctrl::controller::admission::{AdmissionRequest, Operation, UserInfo, Verdict};
    pub(crate) use exports::wasmctrl::controller::mutator::{
        Guest as Mutator, GuestIndices as MutatorIndices,
    };
    pub(crate) use exports::wasmctrl::controller::validator::{
        Guest as Validator, GuestIndices as ValidatorIndices,
    };
}
