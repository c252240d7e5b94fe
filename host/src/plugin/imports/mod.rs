//! The host side of a plugin's imports: the `wasmctrl:controller` interfaces and the WASI a
//! plugin gets.
//!
//! Modules, each importing only those listed before it (and the plugin runtime's floor):
//! 1. `call` (the call in progress and what ends a blocked host call), `callsites` (tracing
//!    callsites for guest log fields), `call_log` (the writes and Events of fixture runs),
//!    `event_recorder` (the Event spam filter, rate limits and aggregation), `output_limit`
//!    (a plugin's budget of guest log lines), `stdio` (guest stdout and stderr into the log).
//! 2. What several imports share: `access` (a plugin's permission checks, and what of an
//!    object a guest may be sent) and `cluster` ([`KubeServices`](cluster::KubeServices), the
//!    host's cluster access, so that `client` and `events` both use it without importing
//!    each other).
//! 3. One module per WIT interface — `cache`, `client`, `events`, `log`, `config` — each
//!    with its own narrow host context (`CacheCtx`, ...) implementing that interface's
//!    generated `Host` trait through a view (`CacheCtxView`, ...), as wasmtime's WASI host
//!    code does per interface; and `wasi`, the WASI interfaces a plugin gets. `fuzzing`
//!    drives them all with arbitrary calls (the `wit_imports` fuzz target).
//!
//! Invariant of the room: nothing here imports the runtime (`plugin::runtime`, which holds
//! these contexts in its store's data and links them) or the compile pipeline
//! (`plugin::compile`): an import reaches nothing but its own context and the call in
//! progress.

pub(crate) mod access;
pub(crate) mod cache;
pub(crate) mod call;
pub(crate) mod call_log;
pub(crate) mod callsites;
pub(crate) mod client;
pub(crate) mod cluster;
pub(crate) mod config;
pub(crate) mod event_recorder;
pub(crate) mod events;
pub(crate) mod fuzzing;
pub(crate) mod log;
pub(crate) mod output_limit;
pub(crate) mod stdio;
pub(crate) mod wasi;
