//! What the benchmarks share: the generated ConfigMap stream ([`Corpus`]), the fake API
//! server that serves it over HTTP on loopback ([`StreamServer`]), the wall clock the
//! stamps use, event → reconcile latency percentiles, a counting allocator for heap
//! figures over a chosen inner allocator (glibc's, jemalloc or mimalloc), and the key
//! figures each benchmark records for `cargo xtask bench`'s table.
//!
//! Every consumer measured against another (wasmctrl, kube-rs, and the Go programs in
//! `bench/anchors`) reads the same bytes from this server and measures latency from the
//! same stamp, so their figures compare.

mod alloc;
mod clock;
mod corpus;
pub mod latency;
mod negotiate;
mod proc_status;
mod progress;
pub mod protobuf;
mod rounds;
mod server;
pub mod summary;

pub use alloc::{ALLOCATOR_ENV, Allocator, CountingAllocator, allocated, in_use, peak_allocated, reset_peak};
pub use clock::unix_nanos;
pub use corpus::{Corpus, SENT_ANNOTATION, SEQ_ANNOTATION};
pub use negotiate::{Encoding, negotiate};
pub use proc_status::ProcStatus;
pub use progress::{StreamProgress, WatchFigures};
pub use rounds::{Rounds, number, quick, rounds_from_env};
pub use server::{BackgroundServer, Pace, StreamConfig, StreamServer};
pub use summary::{Figure, Plot, Table};
