//! wasmctrl-runtime: client-go's informer machinery for Rust — reflectors, DeltaFIFOs,
//! indexers, shared informers, rate-limited workqueues and controllers — without
//! WebAssembly. The `wasmctrl` host builds its plugin controllers on it; a Rust program can
//! use it on its own, as it would use kube-runtime, with a native reconciler
//! (`examples/configmap_controller.rs`).
//!
//! The modules follow the data, one way:
//!
//! 1. [`object`]: one Kubernetes object as the API server sent it (its JSON bytes kept),
//!    with the metadata the machinery reads parsed once.
//! 2. [`source`]: where objects come from — discovery (apiVersion + kind → REST resource)
//!    and the reflector (paginated list + watch, relist on `410 Gone`, backoff), which
//!    feeds a FIFO.
//! 3. [`fifo`]: the `DeltaFIFO` — each key's pending changes, in order, deduplicated,
//!    popped by one consumer.
//! 4. [`cache`]: the store and its indexes: one [`cache::Writer`] (the informer's), any
//!    number of read-only [`cache::Indexer`]s, label selectors.
//! 5. [`informer`]: the shared informer — reflector + FIFO + cache, fanning each change out
//!    to its registered handlers, each with its own buffer — and the factory that shares
//!    one informer per kind and selector between controllers.
//! 6. [`queue`]: the rate-limited workqueue between handlers and workers: a key is never
//!    handed to two workers at once.
//! 7. [`controller`]: workers that take keys from the queue and call a [`controller::Reconciler`],
//!    with controller-runtime's result handling, event sources, predicates, leader election
//!    and sharding by key ownership.
//!
//! Beside the data path: [`metrics`] (client-go's workqueue and controller-runtime's
//! controller metric families, in one prometheus-client registry), [`telemetry`] (a
//! reconcile's OpenTelemetry trace, off until a tracer is installed) and [`heap`]
//! (handing jemalloc's free pages back after a large list, with the `jemalloc` feature).

pub mod heap;

pub mod object;

pub mod source;

pub mod fifo;

pub mod cache;

pub mod informer;

pub mod queue;

pub mod controller;

pub mod metrics;

pub mod telemetry;

// The README's example compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
