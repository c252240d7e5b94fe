//! Typed writes (and live reads) through the host's Kubernetes client.
//!
//! Every call is checked against the plugin's declared write permissions
//! (`[permissions] write`, plus the `for` / `owns` kinds as the host allows) and carries
//! the plugin's field manager. Writes return the object as stored by the API server — its
//! `apiVersion`, `kind` and `metadata` only when the plugin may not read the kind (a type
//! whose other fields are required then fails to parse: write such kinds with a type
//! whose fields are optional, as every `k8s-openapi` type's are).

use serde::Serialize;

use crate::host::{gvk_of, into_error};
use crate::kind::{from_json, to_json};
use crate::sys::client as wit;
use crate::{Error, Kind, KindExt};

/// What happens to dependents of a deleted object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// Delete the object now, garbage-collect dependents afterwards (the default).
    Background,
    /// Delete dependents first; the object stays (with a deletionTimestamp) until they are gone.
    Foreground,
    /// Leave dependents, removing their owner references.
    Orphan,
}

/// Preconditions and propagation for [`delete_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Fail with [`Error::Conflict`] unless the object still has this UID.
    pub uid: Option<String>,
    /// Fail with [`Error::Conflict`] unless the object still has this resourceVersion.
    pub resource_version: Option<String>,
    /// Dependents policy; `None` is the kind's default (background for most).
    pub propagation: Option<Propagation>,
}

impl DeleteOptions {
    /// Preconditions that make the delete hit exactly this incarnation of `object`.
    pub fn preconditions_of<K: Kind>(object: &K) -> Self {
        DeleteOptions {
            uid: object.uid().map(str::to_owned),
            resource_version: object.resource_version().map(str::to_owned),
            propagation: None,
        }
    }
}

/// Reads the object from the API server, bypassing the cache.
pub fn get<K: Kind>(namespace: Option<&str>, name: &str) -> Result<K, Error> {
    from_json(&wit::get(&gvk_of::<K>(), namespace, name).map_err(into_error)?)
}

/// Creates `object` (its `metadata.namespace` says where). Fails with
/// [`Error::AlreadyExists`] when it exists.
pub fn create<K: Kind>(object: &K) -> Result<K, Error> {
    from_json(&wit::create(&to_json(object)?).map_err(into_error)?)
}

/// Replaces the object. When `metadata.resourceVersion` is set this is a
/// compare-and-swap that fails with [`Error::Conflict`] if the object changed.
pub fn replace<K: Kind>(object: &K) -> Result<K, Error> {
    from_json(&wit::replace(&to_json(object)?).map_err(into_error)?)
}

/// How [`apply`] is made: `ApplyParams::default()` applies with the plugin's field manager,
/// fails with [`Error::Conflict`] on fields another manager owns, and persists the result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyParams {
    /// Take over fields owned by other managers instead of failing with [`Error::Conflict`].
    pub force: bool,
    /// Validate and return the result without persisting it (`dryRun=All`).
    pub dry_run: bool,
    /// Apply as this field manager instead of the plugin's own (`wasmctrl-<name>` by
    /// default): the host allows only the plugin's own manager followed by `/` and a suffix
    /// (`wasmctrl-mirror/status`), and refuses any other as [`Error::Forbidden`].
    pub field_manager: Option<String>,
}

impl ApplyParams {
    /// Forced apply with the plugin's field manager: the usual choice of a controller,
    /// which owns the fields it applies.
    pub fn force() -> Self {
        ApplyParams { force: true, ..ApplyParams::default() }
    }

    /// The same parameters, as a dry run.
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// The same parameters, applied as `manager`.
    pub fn field_manager(mut self, manager: impl Into<String>) -> Self {
        self.field_manager = Some(manager.into());
        self
    }

    fn to_wit(&self) -> wit::ApplyOptions {
        wit::ApplyOptions {
            force: self.force,
            dry_run: self.dry_run,
            field_manager: self.field_manager.clone(),
        }
    }
}

/// Server-side apply of `object` (usually partial: only the fields this plugin manages).
pub fn apply<K: Kind>(object: &K, params: &ApplyParams) -> Result<K, Error> {
    from_json(&wit::apply(&to_json(object)?, &params.to_wit()).map_err(into_error)?)
}

/// Applies an RFC 7386 JSON merge patch to the object's main resource.
pub fn patch_merge<K: Kind>(namespace: Option<&str>, name: &str, patch: &impl Serialize) -> Result<K, Error> {
    patch_with::<K>(namespace, name, wit::PatchBody::Merge(encode_patch(patch)?))
}

/// Applies an RFC 6902 JSON patch (an array of operations).
pub fn patch_json<K: Kind>(namespace: Option<&str>, name: &str, patch: &impl Serialize) -> Result<K, Error> {
    patch_with::<K>(namespace, name, wit::PatchBody::Json(encode_patch(patch)?))
}

/// Applies a Kubernetes strategic merge patch (built-in kinds only).
pub fn patch_strategic<K: Kind>(
    namespace: Option<&str>,
    name: &str,
    patch: &impl Serialize,
) -> Result<K, Error> {
    patch_with::<K>(namespace, name, wit::PatchBody::Strategic(encode_patch(patch)?))
}

/// Replaces the object's `status` subresource with `object.status`. When
/// `metadata.resourceVersion` is set this is a compare-and-swap.
pub fn update_status<K: Kind>(object: &K) -> Result<K, Error> {
    from_json(&wit::update_status(&to_json(object)?).map_err(into_error)?)
}

/// Applies a JSON merge patch to the object's `status` subresource
/// (e.g. `json!({"status": {"phase": "Ready"}})`).
pub fn patch_status_merge<K: Kind>(
    namespace: Option<&str>,
    name: &str,
    patch: &impl Serialize,
) -> Result<K, Error> {
    let patch = wit::PatchBody::Merge(encode_patch(patch)?);
    from_json(&wit::patch_status(&gvk_of::<K>(), namespace, name, &patch).map_err(into_error)?)
}

/// Deletes the object (background propagation). Deleting an object that is already gone
/// is [`Error::NotFound`]; use [`ResultExt::ignore_not_found`](crate::ResultExt::ignore_not_found)
/// where that is fine.
pub fn delete<K: Kind>(namespace: Option<&str>, name: &str) -> Result<(), Error> {
    delete_with::<K>(namespace, name, &DeleteOptions::default())
}

/// Deletes the object with preconditions and a propagation policy.
pub fn delete_with<K: Kind>(
    namespace: Option<&str>,
    name: &str,
    options: &DeleteOptions,
) -> Result<(), Error> {
    let options = wit::DeleteOptions {
        uid: options.uid.clone(),
        resource_version: options.resource_version.clone(),
        propagation: options.propagation.map(|p| match p {
            Propagation::Background => wit::Propagation::Background,
            Propagation::Foreground => wit::Propagation::Foreground,
            Propagation::Orphan => wit::Propagation::Orphan,
        }),
    };
    wit::delete(&gvk_of::<K>(), namespace, name, &options).map_err(into_error)
}

fn patch_with<K: Kind>(namespace: Option<&str>, name: &str, patch: wit::PatchBody) -> Result<K, Error> {
    from_json(&wit::patch(&gvk_of::<K>(), namespace, name, &patch).map_err(into_error)?)
}

fn encode_patch(patch: &impl Serialize) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(patch).map_err(|e| Error::json("encoding patch", e))
}
