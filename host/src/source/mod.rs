//! Where objects come from: discovery (apiVersion + kind → REST resource), the reflector
//! (paginated list + watch over raw HTTP, keeping each object's JSON bytes), and the backoff
//! it uses between failures.

mod backoff;
mod discovery;
mod reflector;

pub use backoff::{Backoff, BackoffConfig};
pub use discovery::{ApiResource, Discovery, DiscoveryError, split_api_version};
pub use reflector::{Reflector, ReflectorConfig, ReflectorError};
