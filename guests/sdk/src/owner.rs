//! Owner references: who owns an object, for garbage collection and for `owns` watches.
//!
//! Mirrors controller-runtime's `controllerutil.SetControllerReference` /
//! `SetOwnerReference`: references are keyed by the owner's group, kind and name (so a
//! re-created owner replaces its stale reference), an object has at most one controller,
//! and an owner must be cluster-scoped or in the dependent's namespace (Kubernetes
//! garbage collection ignores any other reference).
//!
//! Pure functions: nothing here calls the host.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::{Error, Gvk, Kind, KindExt};

/// A reference to `owner` with `controller` and `blockOwnerDeletion` unset.
pub fn owner_ref<P: Kind>(owner: &P) -> Result<OwnerReference, Error> {
    let Some(uid) = owner.uid() else {
        return Err(Error::Invalid(format!(
            "owner {} {} has no metadata.uid (was it read from the cluster?)",
            P::KIND,
            owner.key()
        )));
    };
    if owner.name().is_empty() {
        return Err(Error::Invalid(format!("owner {} has no metadata.name", P::KIND)));
    }
    Ok(OwnerReference {
        api_version: P::API_VERSION.to_owned(),
        kind: P::KIND.to_owned(),
        name: owner.name().to_owned(),
        uid: uid.to_owned(),
        controller: None,
        block_owner_deletion: None,
    })
}

/// A controller reference to `owner` (`controller: true`, `blockOwnerDeletion: true`),
/// as `owns` watches and foreground deletion expect.
pub fn controller_owner_ref<P: Kind>(owner: &P) -> Result<OwnerReference, Error> {
    let mut reference = owner_ref(owner)?;
    reference.controller = Some(true);
    reference.block_owner_deletion = Some(true);
    Ok(reference)
}

/// The reference of the object's controller, if it has one.
pub fn controller_of<K: Kind>(object: &K) -> Option<&OwnerReference> {
    object.meta().owner_references.as_ref()?.iter().find(|r| r.controller == Some(true))
}

/// Whether `object`'s controller is `owner` (compared by UID).
pub fn is_controlled_by<K: Kind, P: Kind>(object: &K, owner: &P) -> bool {
    match (controller_of(object), owner.uid()) {
        (Some(reference), Some(uid)) => reference.uid == uid,
        _ => false,
    }
}

/// Makes `owner` the controller of `object`. Fails with [`Error::Conflict`] when another
/// object already controls it, and with [`Error::Invalid`] when the reference could not
/// work (owner without UID, namespaced owner of an object in another namespace or of a
/// cluster-scoped object).
pub fn set_controller_ref<K: Kind, P: Kind>(object: &mut K, owner: &P) -> Result<(), Error> {
    let reference = controller_owner_ref(owner)?;
    check_scope(object, owner)?;
    if let Some(existing) = controller_of(object)
        && !same_owner(existing, &reference)
    {
        return Err(Error::Conflict(format!(
            "{} {} is already controlled by {} {}",
            K::KIND,
            object.key(),
            existing.kind,
            existing.name
        )));
    }
    upsert(object, reference);
    Ok(())
}

/// Adds (or refreshes) a non-controller reference to `owner` on `object`.
pub fn set_owner_ref<K: Kind, P: Kind>(object: &mut K, owner: &P) -> Result<(), Error> {
    let mut reference = owner_ref(owner)?;
    check_scope(object, owner)?;
    // Keep the controller bit if this owner already is the controller.
    if let Some(existing) = object
        .meta()
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| same_owner(r, &reference)))
    {
        reference.controller = existing.controller;
        reference.block_owner_deletion = existing.block_owner_deletion;
    }
    upsert(object, reference);
    Ok(())
}

/// Removes every reference to `owner` (by group, kind and name). Returns whether one was removed.
pub fn remove_owner_ref<K: Kind, P: Kind>(object: &mut K, owner: &P) -> bool {
    let gvk = Gvk::of::<P>();
    let Some(refs) = object.meta_mut().owner_references.as_mut() else { return false };
    let before = refs.len();
    refs.retain(|r| {
        !(Gvk::new(&*r.api_version, &*r.kind).group() == gvk.group()
            && r.kind == gvk.kind
            && r.name == owner.name())
    });
    refs.len() != before
}

fn check_scope<K: Kind, P: Kind>(object: &K, owner: &P) -> Result<(), Error> {
    match (owner.namespace(), object.namespace()) {
        (None, _) => Ok(()),
        (Some(owner_ns), Some(object_ns)) if owner_ns == object_ns => Ok(()),
        (Some(owner_ns), Some(object_ns)) => Err(Error::Invalid(format!(
            "cross-namespace owner references are not allowed: {} {} (namespace {owner_ns}) cannot own {} {} (namespace {object_ns})",
            P::KIND,
            owner.name(),
            K::KIND,
            object.name()
        ))),
        (Some(owner_ns), None) => Err(Error::Invalid(format!(
            "cluster-scoped {} {} cannot have the namespaced owner {} {owner_ns}/{}",
            K::KIND,
            object.name(),
            P::KIND,
            owner.name()
        ))),
    }
}

/// Same owner: same API group (the version may differ), kind and name.
fn same_owner(a: &OwnerReference, b: &OwnerReference) -> bool {
    Gvk::new(&*a.api_version, &*a.kind).group() == Gvk::new(&*b.api_version, &*b.kind).group()
        && a.kind == b.kind
        && a.name == b.name
}

fn upsert<K: Kind>(object: &mut K, reference: OwnerReference) {
    let refs = object.meta_mut().owner_references.get_or_insert_with(Vec::new);
    match refs.iter_mut().find(|r| same_owner(r, &reference)) {
        Some(existing) => *existing = reference,
        None => refs.push(reference),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn meta(ns: Option<&str>, name: &str, uid: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            namespace: ns.map(Into::into),
            name: Some(name.into()),
            uid: uid.map(Into::into),
            ..Default::default()
        }
    }
    fn deploy(ns: &str, name: &str, uid: &str) -> Deployment {
        Deployment { metadata: meta(Some(ns), name, Some(uid)), ..Default::default() }
    }
    fn cm(ns: &str, name: &str) -> ConfigMap {
        ConfigMap { metadata: meta(Some(ns), name, None), ..Default::default() }
    }

    #[test]
    fn controller_ref_has_controller_and_block_owner_deletion() {
        let r = controller_owner_ref(&deploy("a", "web", "u1")).unwrap();
        assert_eq!(r.api_version, "apps/v1");
        assert_eq!(r.kind, "Deployment");
        assert_eq!(r.name, "web");
        assert_eq!(r.uid, "u1");
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));
    }

    #[test]
    fn owner_without_uid_is_invalid() {
        let owner = Deployment { metadata: meta(Some("a"), "web", None), ..Default::default() };
        assert!(controller_owner_ref(&owner).unwrap_err().is_invalid());
    }

    #[test]
    fn set_controller_ref_is_idempotent_and_refreshes_uid() {
        let mut child = cm("a", "c");
        set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        assert_eq!(child.metadata.owner_references.as_ref().unwrap().len(), 1);
        // The owner was re-created with a new UID: the stale reference is replaced.
        set_controller_ref(&mut child, &deploy("a", "web", "u2")).unwrap();
        let refs = child.metadata.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, "u2");
        assert!(is_controlled_by(&child, &deploy("a", "web", "u2")));
        assert!(!is_controlled_by(&child, &deploy("a", "web", "u1")));
    }

    #[test]
    fn second_controller_is_a_conflict() {
        let mut child = cm("a", "c");
        set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        let err = set_controller_ref(&mut child, &deploy("a", "other", "u3")).unwrap_err();
        assert!(err.is_conflict(), "{err}");
        // A plain owner reference can be added next to the controller.
        set_owner_ref(&mut child, &deploy("a", "other", "u3")).unwrap();
        assert_eq!(child.metadata.owner_references.as_ref().unwrap().len(), 2);
        assert!(is_controlled_by(&child, &deploy("a", "web", "u1")));
    }

    #[test]
    fn set_owner_ref_keeps_existing_controller_bit() {
        let mut child = cm("a", "c");
        set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        set_owner_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        assert!(is_controlled_by(&child, &deploy("a", "web", "u1")));
    }

    #[test]
    fn cross_namespace_owner_is_rejected() {
        let mut child = cm("b", "c");
        assert!(set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap_err().is_invalid());
        assert!(set_owner_ref(&mut child, &deploy("a", "web", "u1")).unwrap_err().is_invalid());
        assert!(child.metadata.owner_references.is_none());
    }

    #[test]
    fn cluster_scoped_owner_may_own_anything_but_not_the_reverse() {
        let ns = Namespace { metadata: meta(None, "team-a", Some("n1")), ..Default::default() };
        let mut child = cm("team-a", "c");
        set_owner_ref(&mut child, &ns).unwrap();
        let mut cluster_child = Namespace { metadata: meta(None, "x", None), ..Default::default() };
        assert!(set_owner_ref(&mut cluster_child, &deploy("a", "web", "u1")).unwrap_err().is_invalid());
    }

    #[test]
    fn remove_owner_ref_by_identity() {
        let mut child = cm("a", "c");
        set_controller_ref(&mut child, &deploy("a", "web", "u1")).unwrap();
        assert!(!remove_owner_ref(&mut child, &deploy("a", "other", "u9")));
        assert!(remove_owner_ref(&mut child, &deploy("a", "web", "u1")));
        assert!(controller_of(&child).is_none());
    }
}
