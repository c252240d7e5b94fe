//! Kubernetes Events about objects, as `kubectl describe` shows them. The host
//! deduplicates and rate-limits them, so recording the same event on every reconcile is
//! cheap, but recording only on a change reads better.

use crate::bindings::wasmctrl::controller::types as wit_types;
use crate::host::{gvk_of, into_error};
use crate::sys::events as wit;
use crate::{Error, Kind, KindExt};

/// Whether an event is routine or a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Routine.
    Normal,
    /// Something the user should look at.
    Warning,
}

/// Records an event about `regarding`.
///
/// `reason` is short CamelCase (`Mirrored`, `MissingTeamLabel`), `action` what the plugin
/// did or failed to do (`Create`, `Check`), `note` a sentence for humans.
pub fn publish<K: Kind>(
    regarding: &K,
    event_type: EventType,
    reason: &str,
    action: &str,
    note: &str,
) -> Result<(), Error> {
    let event = wit::Event {
        regarding: wit_types::ObjectRef {
            kind: gvk_of::<K>(),
            namespace: regarding.namespace().map(str::to_owned),
            name: regarding.name().to_owned(),
        },
        type_: match event_type {
            EventType::Normal => wit::EventType::Normal,
            EventType::Warning => wit::EventType::Warning,
        },
        reason: reason.to_owned(),
        action: action.to_owned(),
        note: note.to_owned(),
    };
    wit::publish(&event).map_err(into_error)
}

/// Records a `Normal` event about `regarding`.
pub fn normal<K: Kind>(regarding: &K, reason: &str, action: &str, note: &str) -> Result<(), Error> {
    publish(regarding, EventType::Normal, reason, action, note)
}

/// Records a `Warning` event about `regarding`.
pub fn warning<K: Kind>(regarding: &K, reason: &str, action: &str, note: &str) -> Result<(), Error> {
    publish(regarding, EventType::Warning, reason, action, note)
}
