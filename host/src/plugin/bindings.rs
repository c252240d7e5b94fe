//! Host bindings generated from `wit/wasmctrl.wit` (world `plugin`), synchronous.
//!
//! Synchronous bindings: a call into a guest costs ~0.5 µs against ~1.4 µs through the
//! async machinery. Calls run on blocking threads, so imports may block on the Kubernetes
//! client without stalling tokio workers. Every import is trappable so the host can stop
//! a guest whose deadline passed while it waited on the network.

wasmtime::component::bindgen!({
    world: "plugin",
    path: "../wit",
    imports: { default: trappable },
});
