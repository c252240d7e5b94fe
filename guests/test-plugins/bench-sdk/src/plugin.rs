// The plugin the SDK bench crates export (included, so the builds run the same code and
// differ only in their allocator).

use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl_guest::prelude::*;

/// Reads the requested ConfigMap from the cache (the SDK does that before `reconcile`) and
/// checks it has data; a missing one (`noop`) is the bare cost of a call with a cache miss.
pub struct Bench;

impl Plugin for Bench {
    type For = ConfigMap;

    fn init(_settings: Settings) -> Result<Self, InitError> {
        Ok(Bench)
    }

    fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
        match target {
            Target::Present(cm) if cm.data.as_ref().is_none_or(|d| d.is_empty()) => {
                Err(ReconcileError::Terminal("empty".into()))
            }
            _ => Ok(Action::Done),
        }
    }
}
