//! Typed reads from the host's informer caches: fast (no network), possibly slightly stale.
//!
//! Only kinds the plugin's TOML declares (`for`, `owns`, `watches`, `permissions.read`)
//! are cached; anything else fails with [`Error::Forbidden`].

use crate::host::{gvk_of, into_error};
use crate::kind::from_json;
use crate::sys::cache as wit;
use crate::{Error, Gvk, Kind, RawObject};

/// The cached object, or `None` when the cache has no such object.
///
/// `namespace` is `None` for cluster-scoped kinds.
pub fn get<K: Kind>(namespace: Option<&str>, name: &str) -> Result<Option<K>, Error> {
    match wit::get(&gvk_of::<K>(), namespace, name).map_err(into_error)? {
        Some(json) => from_json(&json).map(Some),
        None => Ok(None),
    }
}

/// Every cached object of kind `K`, optionally only in `namespace`, optionally only those
/// matching a label selector (`app=web,tier in (a,b),!legacy`).
pub fn list<K: Kind>(namespace: Option<&str>, label_selector: Option<&str>) -> Result<Vec<K>, Error> {
    wit::list(&gvk_of::<K>(), namespace, label_selector)
        .map_err(into_error)?
        .iter()
        .map(|json| from_json(json))
        .collect()
}

/// Objects of kind `K` whose index `index` contains `value`. `index` is one declared under
/// `[for.indexes]` (or an `owns` kind's `indexes`) in the plugin's TOML, or the built-in
/// `namespace` index.
pub fn by_index<K: Kind>(index: &str, value: &str) -> Result<Vec<K>, Error> {
    wit::by_index(&gvk_of::<K>(), index, value)
        .map_err(into_error)?
        .iter()
        .map(|json| from_json(json))
        .collect()
}

/// [`get`] for a kind known only at run time.
pub fn get_raw(kind: &Gvk, namespace: Option<&str>, name: &str) -> Result<Option<RawObject>, Error> {
    Ok(wit::get(&crate::host::gvk_to_wit(kind), namespace, name)
        .map_err(into_error)?
        .map(RawObject::from_json))
}

/// [`list`] for a kind known only at run time.
pub fn list_raw(
    kind: &Gvk,
    namespace: Option<&str>,
    label_selector: Option<&str>,
) -> Result<Vec<RawObject>, Error> {
    Ok(wit::list(&crate::host::gvk_to_wit(kind), namespace, label_selector)
        .map_err(into_error)?
        .into_iter()
        .map(RawObject::from_json)
        .collect())
}

/// [`by_index`] for a kind known only at run time.
pub fn by_index_raw(kind: &Gvk, index: &str, value: &str) -> Result<Vec<RawObject>, Error> {
    Ok(wit::by_index(&crate::host::gvk_to_wit(kind), index, value)
        .map_err(into_error)?
        .into_iter()
        .map(RawObject::from_json)
        .collect())
}
