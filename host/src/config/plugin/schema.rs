//! The plugin TOML as written (`plugins/<name>.toml`): the serde types, and nothing else.
//!
//! Invariants: every table refuses unknown keys (`deny_unknown_fields`) and every key is
//! kebab-case; only `[for]` is required; a value left out stays `None` / empty here (the
//! defaults are applied by the resolver, not by serde); serialising skips what was left out,
//! so a file round-trips to the same TOML keys it was read from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::units::{ByteSize, DurationValue};
use crate::object::Transform;

/// The plugin TOML as written. Every key is optional except `[for]`; unknown keys are errors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PluginToml {
    /// Defaults to the TOML's file stem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The component, relative to the TOML's directory, or a registry reference
    /// (`oci://registry/repository:tag` or `...@sha256:...`). Defaults to `<stem>.wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasm: Option<String>,
    /// With a registry `wasm`: a cosign public key (PEM) the artifact must be signed with,
    /// relative to the TOML's directory (in addition to the host's `[oci] verify-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_key: Option<String>,
    /// Maximum concurrent reconciles (and instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Periodic resync of this plugin's handlers; `"0s"` turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<DurationValue>,
    /// Budget of one call into the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DurationValue>,
    /// Linear memory cap of one instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// Cap on the data a guest may return per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<ByteSize>,
    /// Guest log lines a second the plugin may put into the host's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lines_per_second: Option<u32>,
    /// Field manager of the plugin's writes; defaults to `wasmctrl-<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_manager: Option<String>,
    /// The kind whose keys are reconciled.
    #[serde(rename = "for")]
    pub for_kind: SourceToml,
    /// Kinds whose changes enqueue their controller owner of the `for` kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owns: Vec<SourceToml>,
    /// Kinds whose changes the plugin's `map` export turns into requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watches: Vec<SourceToml>,
    #[serde(default, skip_serializing_if = "PermissionsToml::is_empty")]
    pub permissions: PermissionsToml,
    /// What the caches this plugin reads strip from objects.
    #[serde(default, skip_serializing_if = "TransformToml::is_empty")]
    pub transform: TransformToml,
    /// Validating and mutating webhooks the plugin answers (see `admission`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admission: Vec<super::admission::AdmissionToml>,
    /// Free-form, handed to `init` as JSON.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub settings: toml::Table,
}

/// `[for]`, `[[owns]]`, `[[watches]]`: a kind and how to watch it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SourceToml {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub indexes: BTreeMap<String, IndexToml>,
    #[serde(default, skip_serializing_if = "PredicatesToml::is_empty")]
    pub predicates: PredicatesToml,
}

/// One index: exactly one of `field`, `label`, `annotation`, `owner`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct IndexToml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerIndex>,
}

/// Which owner references an `owner` index reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OwnerIndex {
    /// The UID of every owner.
    Uid,
    /// The UID of the controller owner only.
    Controller,
}

/// `[*.predicates]`: every predicate given must pass for an event to enqueue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PredicatesToml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_changed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version_changed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels_changed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations_changed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_present: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<bool>,
}

impl PredicatesToml {
    pub(super) fn is_empty(&self) -> bool {
        *self == PredicatesToml::default()
    }
}

/// `[permissions]`: kinds as `"<apiVersion>/<Kind>"`, and the namespaces the plugin works in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PermissionsToml {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
    /// The only namespaces the plugin reads and writes in (`["*"]`: every namespace). Left
    /// out: `[for]`'s namespace and those `[[owns]]`/`[[watches]]` name, when `[for]` names
    /// one; else every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
}

impl PermissionsToml {
    pub(super) fn is_empty(&self) -> bool {
        self.read.is_empty() && self.write.is_empty() && self.namespaces.is_none()
    }
}

/// `[transform]`: what is dropped from objects before they are cached (client-go's
/// informer transform). Informers with different settings are separate caches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TransformToml {
    /// Drop the `kubectl.kubernetes.io/last-applied-configuration` annotation (default
    /// `false`: kept, so a plugin that writes back what it read keeps `kubectl apply` working).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_last_applied: Option<bool>,
    /// Drop `metadata.managedFields` (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_managed_fields: Option<bool>,
}

impl TransformToml {
    pub(super) fn is_empty(&self) -> bool {
        *self == TransformToml::default()
    }

    /// The transform these settings describe.
    pub fn resolve(&self) -> Transform {
        let default = Transform::default();
        Transform {
            strip_managed_fields: self.strip_managed_fields.unwrap_or(default.strip_managed_fields),
            strip_last_applied: self.strip_last_applied.unwrap_or(default.strip_last_applied),
        }
    }
}
