//! A log of the writes and Events a plugin asks for, for fixture runs (`wasmctrl test`).
//!
//! Invariants: a [`CallLog`] is attached to [`crate::plugin::KubeServices`] only when one is asked
//! for (the production host never records); each entry is what the plugin sent (the body
//! as JSON, the target, the options) and how the call ended, in call order.

use parking_lot::Mutex;
use serde_json::Value;

use crate::plugin::spec::Gvk;

/// One write through the `client` import.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedWrite {
    /// `create`, `replace`, `patch`, `apply`, `update-status`, `patch-status`, `delete`.
    pub verb: &'static str,
    pub kind: Gvk,
    pub namespace: Option<String>,
    pub name: String,
    /// The object (create, replace, apply, update-status) or patch (patch, patch-status) sent.
    pub body: Option<Value>,
    /// `merge`, `json` or `strategic` for patches.
    pub patch_type: Option<&'static str>,
    /// Apply or delete options, as set by the plugin (`{}` when none).
    pub options: Value,
    /// `None` when the API server accepted the write, else the error the plugin got.
    pub error: Option<String>,
}

/// One Event published through the `events` import.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    pub kind: Gvk,
    pub namespace: Option<String>,
    pub name: String,
    /// `Normal` or `Warning`.
    pub event_type: &'static str,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// Writes and Events in call order.
#[derive(Debug, Default)]
pub struct CallLog {
    writes: Mutex<Vec<RecordedWrite>>,
    events: Mutex<Vec<RecordedEvent>>,
}

impl CallLog {
    pub(crate) fn push_write(&self, w: RecordedWrite) {
        self.writes.lock().push(w);
    }

    pub(crate) fn push_event(&self, e: RecordedEvent) {
        self.events.lock().push(e);
    }

    /// The writes so far, forgetting them.
    pub fn take_writes(&self) -> Vec<RecordedWrite> {
        std::mem::take(&mut self.writes.lock())
    }

    /// The Events so far, forgetting them.
    pub fn take_events(&self) -> Vec<RecordedEvent> {
        std::mem::take(&mut self.events.lock())
    }
}

/// A JSON body as a value (a body that is not JSON is kept as a string).
pub(crate) fn body_value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}
