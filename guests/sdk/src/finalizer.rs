//! Finalizers: keep an object around (with a `deletionTimestamp`) until the plugin has
//! cleaned up what the object stood for.
//!
//! [`has`], [`add`] and [`remove`] edit an object in memory. [`ensure_added`] /
//! [`ensure_removed`] write the change with a JSON merge patch that carries the object's
//! `resourceVersion`, so a concurrent change makes the patch fail with a conflict instead
//! of losing someone else's finalizer (controller-runtime's `MergeFromWithOptimisticLock`).
//! [`handle`] is the whole flow, like kube-rs's `finalizer()`.

use serde_json::json;

use crate::{Action, Error, Kind, KindExt, ReconcileError, client};

/// Whether `object` lists `finalizer`.
pub fn has<K: Kind>(object: &K, finalizer: &str) -> bool {
    object.meta().finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Adds `finalizer` to `object` (in memory). Returns whether it was missing.
pub fn add<K: Kind>(object: &mut K, finalizer: &str) -> bool {
    if has(object, finalizer) {
        return false;
    }
    object.meta_mut().finalizers.get_or_insert_with(Vec::new).push(finalizer.to_owned());
    true
}

/// Removes `finalizer` from `object` (in memory). Returns whether it was there.
pub fn remove<K: Kind>(object: &mut K, finalizer: &str) -> bool {
    let Some(list) = object.meta_mut().finalizers.as_mut() else { return false };
    let before = list.len();
    list.retain(|f| f != finalizer);
    list.len() != before
}

/// The merge patch that sets `object`'s finalizers to those of `object` as edited, guarded
/// by its resourceVersion.
fn finalizers_patch<K: Kind>(object: &K) -> serde_json::Value {
    let finalizers = object.meta().finalizers.clone().unwrap_or_default();
    match object.resource_version() {
        Some(rv) => json!({"metadata": {"finalizers": finalizers, "resourceVersion": rv}}),
        None => json!({"metadata": {"finalizers": finalizers}}),
    }
}

/// Adds `finalizer` in the cluster unless `object` already has it. Returns the object as
/// stored (unchanged when nothing was written).
pub fn ensure_added<K: Kind + Clone>(object: &K, finalizer: &str) -> Result<K, Error> {
    let mut edited = object.clone();
    if !add(&mut edited, finalizer) {
        return Ok(edited);
    }
    client::patch_merge::<K>(object.namespace(), object.name(), &finalizers_patch(&edited))
}

/// Removes `finalizer` in the cluster if `object` has it. Returns the object as stored,
/// or `None` when removing the last finalizer let a pending deletion complete.
pub fn ensure_removed<K: Kind + Clone>(object: &K, finalizer: &str) -> Result<Option<K>, Error> {
    let mut edited = object.clone();
    if !remove(&mut edited, finalizer) {
        return Ok(Some(edited));
    }
    match client::patch_merge::<K>(object.namespace(), object.name(), &finalizers_patch(&edited)) {
        Ok(stored) => Ok(Some(stored)),
        // Deleted as soon as the last finalizer went: that is what we asked for.
        Err(err) if err.is_not_found() => Ok(None),
        Err(err) => Err(err),
    }
}

/// What [`handle`] asks the plugin to do.
#[derive(Debug)]
pub enum Event<K> {
    /// The object is live (and carries the finalizer): make the world match it.
    Apply(K),
    /// The object is being deleted and still carries the finalizer: clean up. When this
    /// returns `Ok`, the finalizer is removed and Kubernetes finishes the deletion.
    Cleanup(K),
}

/// The step [`handle`] takes for an object in a given state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Live without the finalizer: add it, then apply.
    AddThenApply,
    /// Live with the finalizer: apply.
    Apply,
    /// Being deleted with the finalizer: clean up, then remove it.
    Cleanup,
    /// Being deleted without the finalizer: nothing left for this plugin to do.
    Nothing,
}

/// Decides what [`handle`] does with `object` (pure; exposed for tests and custom flows).
pub fn step<K: Kind>(object: &K, finalizer: &str) -> Step {
    match (object.is_being_deleted(), has(object, finalizer)) {
        (false, false) => Step::AddThenApply,
        (false, true) => Step::Apply,
        (true, true) => Step::Cleanup,
        (true, false) => Step::Nothing,
    }
}

/// Runs `reconcile` under `finalizer`: adds the finalizer to a live object first (in the
/// same call, so apply never runs on an object that could vanish without cleanup), calls
/// `Cleanup` for an object being deleted and removes the finalizer once it succeeds.
pub fn handle<K, F>(object: K, finalizer: &str, reconcile: F) -> Result<Action, ReconcileError>
where
    K: Kind + Clone,
    F: FnOnce(Event<K>) -> Result<Action, ReconcileError>,
{
    match step(&object, finalizer) {
        Step::AddThenApply => {
            let stored = ensure_added(&object, finalizer)
                .map_err(|e| ReconcileError::from(e).with_prefix(&format!("adding finalizer {finalizer}")))?;
            reconcile(Event::Apply(stored))
        }
        Step::Apply => reconcile(Event::Apply(object)),
        Step::Cleanup => {
            let action = reconcile(Event::Cleanup(object.clone()))?;
            ensure_removed(&object, finalizer).map_err(|e| {
                ReconcileError::from(e).with_prefix(&format!("removing finalizer {finalizer}"))
            })?;
            Ok(action)
        }
        Step::Nothing => Ok(Action::Done),
    }
}

impl ReconcileError {
    fn with_prefix(self, prefix: &str) -> Self {
        match self {
            ReconcileError::Retryable(m) => ReconcileError::Retryable(format!("{prefix}: {m}")),
            ReconcileError::Terminal(m) => ReconcileError::Terminal(format!("{prefix}: {m}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    const F: &str = "example.com/cleanup";

    #[test]
    fn add_and_remove_are_idempotent_and_keep_others() {
        let mut cm = ConfigMap::default();
        cm.metadata.finalizers = Some(vec!["other".into()]);
        assert!(add(&mut cm, F));
        assert!(!add(&mut cm, F));
        assert!(has(&cm, F));
        assert_eq!(cm.metadata.finalizers.as_deref().unwrap(), ["other".to_string(), F.to_string()]);
        assert!(remove(&mut cm, F));
        assert!(!remove(&mut cm, F));
        assert_eq!(cm.metadata.finalizers.as_deref().unwrap(), ["other".to_string()]);
        assert!(!remove(&mut ConfigMap::default(), F));
    }

    #[test]
    fn patch_carries_resource_version_for_optimistic_locking() {
        let mut cm = ConfigMap::default();
        cm.metadata.resource_version = Some("42".into());
        add(&mut cm, F);
        assert_eq!(finalizers_patch(&cm), json!({"metadata": {"finalizers": [F], "resourceVersion": "42"}}));
        remove(&mut cm, F);
        // An empty list (not null) so the merge patch clears the field.
        assert_eq!(finalizers_patch(&cm), json!({"metadata": {"finalizers": [], "resourceVersion": "42"}}));
    }

    #[test]
    fn step_covers_the_four_states() {
        let mut cm = ConfigMap::default();
        assert_eq!(step(&cm, F), Step::AddThenApply);
        add(&mut cm, F);
        assert_eq!(step(&cm, F), Step::Apply);
        cm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(step(&cm, F), Step::Cleanup);
        remove(&mut cm, F);
        assert_eq!(step(&cm, F), Step::Nothing);
    }

    #[test]
    fn handle_without_work_does_not_call_reconcile() {
        let mut cm = ConfigMap::default();
        cm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let action = handle(cm, F, |_| panic!("must not be called")).unwrap();
        assert_eq!(action, Action::Done);
    }

    #[test]
    fn handle_apply_passes_object_through() {
        let mut cm = ConfigMap::default();
        add(&mut cm, F);
        cm.metadata.name = Some("x".into());
        let action = handle(cm, F, |ev| match ev {
            Event::Apply(o) if o.metadata.name.as_deref() == Some("x") => Ok(Action::Requeue),
            other => panic!("unexpected {other:?}"),
        });
        assert_eq!(action, Ok(Action::Requeue));
    }

    #[test]
    fn failed_cleanup_keeps_finalizer_and_propagates_error() {
        let mut cm = ConfigMap::default();
        add(&mut cm, F);
        cm.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        // The error returns before any host call that would remove the finalizer.
        let err = handle(cm, F, |_| Err(ReconcileError::retryable("children still there"))).unwrap_err();
        assert_eq!(err, ReconcileError::retryable("children still there"));
    }
}
