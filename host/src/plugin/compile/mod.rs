//! The compile pipeline: from a `.wasm` to code the runtime instantiates.
//!
//! Modules, each importing only those listed before it (and the plugin runtime's floor):
//! `settings` (the engine settings: a leaf importing nothing of `plugin`), `permits` (at
//! most one Cranelift compile per core), `single_flight` (one load per key however many ask),
//! `compile_cache` (the authenticated on-disk artifacts), `child` (a compile in a child
//! process, under limits), `optimizer` (Cranelift through the compile cache, in the child
//! when there is one), `baseline` (Winch, tier-up's first code), `tier` (a component's code
//! across its tier-up) and `tier_up` (the background Cranelift compiles).
//!
//! Invariant of the room: nothing here imports the runtime (`plugin::runtime`) or the host
//! imports (`plugin::imports`); the runtime's engine builds on this room, never the other
//! way round.

pub(crate) mod baseline;
pub(crate) mod child;
pub(crate) mod compile_cache;
pub(crate) mod optimizer;
pub(crate) mod permits;
pub(crate) mod settings;
pub(crate) mod single_flight;
pub(crate) mod tier;
pub(crate) mod tier_up;
