//! Where objects come from: discovery (apiVersion + kind → REST resource), the reflector
//! (paginated list + watch over raw HTTP, keeping each object's JSON bytes) driven by its
//! state machine, the requests it sends, and the backoff it uses between failures.

mod backoff;
mod discovery;
mod error;
mod list_body;
mod machine;
mod metrics;
mod reflector;
mod requests;

pub use backoff::{Backoff, BackoffConfig};
pub use discovery::{ApiResource, Discovery, DiscoveryError, split_api_version};
pub use error::ReflectorError;
pub use metrics::ReflectorMetrics;
pub use reflector::{Reflector, ReflectorConfig};
