//! Kubernetes label and field selectors, parsed and matched as the API server does
//! (`k8s.io/apimachinery/pkg/labels` and `pkg/fields`).
//!
//! One implementation for every place that reads a selector or checks a name: the host's
//! configuration check and cache, `wasmctrl new`, the dev cluster's list and watch handlers
//! and the guest SDK's test host, so a selector or a name is accepted or refused the same way
//! (with the same message) everywhere. No dependency beyond `thiserror`, so it builds for
//! `wasm32-wasip2` too.
//!
//! Invariants: parsing never panics; a parsed selector displays in a canonical form that
//! parses back to an equal selector; matching is a pure function of the selector and the
//! labels (or fields) it is given.
//!
//! ```
//! use std::collections::BTreeMap;
//! use wasmctrl_selectors::LabelSelector;
//!
//! let sel = LabelSelector::parse("app=web, tier>3").unwrap();
//! let labels = BTreeMap::from([("app".to_string(), "web".to_string()), ("tier".into(), "5".into())]);
//! assert!(sel.matches(&labels));
//! assert!(LabelSelector::parse("tier>high").is_err());
//! ```

mod field;
#[doc(hidden)]
pub mod fuzzing;
mod label;
mod labels;
mod names;

pub use field::{FieldRequirement, FieldSelector, FieldSelectorError};
pub use label::{LabelSelector, Operator, Requirement, SelectorError};
pub use labels::Labels;
pub use names::{is_dns_label, is_dns_subdomain, is_dns1035_label, validate_key, validate_value};
