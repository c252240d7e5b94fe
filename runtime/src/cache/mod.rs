//! The informer cache: a thread-safe store of shared immutable objects with secondary
//! indexes, and Kubernetes label-selector evaluation for listing.
//!
//! [`Indexer`] is the cheap-to-clone, read-only handle every controller and plugin import
//! uses; [`Writer`] is the store's single write handle, held by the informer that feeds it.

mod index;
mod selector;
mod store;
mod writer;

pub use index::{IndexError, IndexFunc, IndexSpec, NAMESPACE_INDEX, OwnerIndex};
pub use selector::{LabelSelector, Labels, Operator, Requirement, SelectorError, selector_from_match};
pub use store::Indexer;
pub use writer::Writer;
