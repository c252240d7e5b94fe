//! The informer cache: a thread-safe store of shared immutable objects with secondary
//! indexes, and Kubernetes label-selector evaluation for listing.
//!
//! [`Indexer`] is the cheap-to-clone read handle every controller and plugin import uses.

mod index;
mod selector;
mod store;

pub use index::{IndexError, IndexFunc, IndexSpec, NAMESPACE_INDEX, OwnerIndex};
pub use selector::{LabelSelector, Operator, Requirement, SelectorError};
pub use store::{Indexer, KnownObjects};
