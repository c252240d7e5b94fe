//! What a label selector reads: a label set, looked up by key.
//!
//! Invariant: a lookup is pure (the same key gives the same answer for one label set).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A set of labels a [`LabelSelector`](crate::LabelSelector) can be matched against.
pub trait Labels {
    /// The value of label `key`, if the set has it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl Labels for [(&str, &str)] {
    fn label(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

impl<T: Labels + ?Sized> Labels for &T {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

impl<T: Labels + ?Sized> Labels for Arc<T> {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

impl<T: Labels + ?Sized> Labels for Box<T> {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}
