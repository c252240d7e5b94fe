//! wasmctrl: a Kubernetes controller host whose controllers are WebAssembly plugins.
//!
//! The informer machinery, from [`object`] to [`controller`], with the [`metrics`] it counts
//! into, is the `wasmctrl-runtime` crate (no wasmtime), re-exported here at the same paths;
//! this crate adds the plugins and everything that runs them.
//!
//! The modules follow the data: objects come from the API server through a
//! [`source`] (discovery + reflector), queue up as deltas in the [`fifo`], land in the
//! [`cache`] (store + indexes) and are fanned out by the [`informer`] to listeners, whose
//! keys wait in a [`queue`] until a [`controller`] worker hands them to a [`plugin`];
//! [`admission`] serves the plugins' validating and mutating webhooks.
//! [`config`] and [`reload`] turn a plugins directory into running controllers, whose
//! code comes from files or, through [`oci`], from OCI registries;
//! `fixture` runs one plugin against fixture files on the embedded dev cluster (`wasmctrl
//! test`; with the default-on `embedded` feature);
//! [`metrics`], [`telemetry`] (OpenTelemetry traces, off by default) and [`server`] make
//! the whole visible. `heap` hands the allocator's free
//! pages back after the one-off bursts (a large list applied, a plugin loaded), gives the
//! plugins' compiles an arena of their own, and holds the jemalloc options a program on
//! jemalloc exports ([`heap::MallocConf`]).

// The informer machinery (object → controller) and what it reports through live in
// `wasmctrl-runtime`, which does not depend on wasmtime; they keep their paths here.
pub use wasmctrl_runtime::{cache, controller, fifo, informer, metrics, object, queue, source};

pub mod heap;

pub mod plugin;

pub mod admission;
pub mod oci;

pub mod config;

pub mod shard;

pub mod reload;

#[cfg(feature = "embedded")]
pub mod fixture;

pub mod telemetry;

pub mod server;

#[doc(hidden)]
pub mod fuzzing;
