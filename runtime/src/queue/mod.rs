//! Work queues between event handlers and controller workers (client-go `util/workqueue`).
//!
//! - [`WorkQueue`]: FIFO with dirty + processing sets (a key is never handed to two workers at
//!   once, and a key added while processing is handed out again after `done`), low priority
//!   for start-up backlog, shut down with or without drain, and the `workqueue_*` metrics
//!   (`workqueue.rs`); delayed adds (`add_after`, earliest ready time wins; `delaying.rs`); the
//!   hand-over of its keys to a successor queue (`handover.rs`).
//! - [`RateLimitingQueue`]: a work queue plus a [`RateLimiter`] for `add_rate_limited` /
//!   `forget` / `num_requeues`.
//! - Rate limiters: [`ItemExponential`], [`ItemFastSlow`], [`TokenBucket`], [`MaxOf`],
//!   [`default_controller_rate_limiter`], [`RateLimiterConfig`].

mod delaying;
mod handover;
mod metrics;
mod rate_limiter;
mod rate_limiting;
mod workqueue;

pub use rate_limiter::{
    ItemExponential, ItemFastSlow, MaxOf, RateLimiter, RateLimiterConfig, TokenBucket,
    default_controller_rate_limiter,
};
pub use rate_limiting::RateLimitingQueue;
pub use workqueue::{Admission, Origin, Priority, QueueKey, WorkQueue};
