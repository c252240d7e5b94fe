//! Where objects come from: discovery (apiVersion + kind → REST resource), the reflector
//! (paginated list + watch over raw HTTP, keeping each object's JSON bytes) driven by its
//! state machine, the requests it sends, the splitters its list and watch bodies go through
//! (each with a cap on what it holds), and the backoff it uses between failures.

mod backoff;
mod discovery;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod list_body;
mod machine;
mod metrics;
mod reflector;
mod requests;
mod watch_lines;

pub use backoff::{Backoff, BackoffConfig};
pub use discovery::{ApiResource, Discovery, DiscoveryError, split_api_version};
pub use error::ReflectorError;
pub use metrics::ReflectorMetrics;
pub use reflector::{DEFAULT_MAX_OBJECT_SIZE, MAX_STATUS_BODY, Reflector, ReflectorConfig};
