//! A plugin's TOML (`plugins/<name>.toml`, next to `<name>.wasm`): the file form
//! ([`PluginToml`], in [`schema`], round-trips through serde), the resolver that checks it
//! ([`resolver`]) and the checked, defaulted form the host runs ([`PluginConfig`], here).
//!
//! Invariants of a [`PluginConfig`]: the name is a DNS label; every kind is well formed
//! (`apiVersion` + CamelCase `Kind`); selectors parse; each index has exactly one source;
//! every limit is non-zero; `settings` is a JSON object; Secrets are watched only when
//! `permissions.read` lists them (watching hands the objects to the plugin); every namespace
//! a source names is one of the plugin's namespaces ([`PluginConfig::namespaces`]); the field
//! manager is 1–128 printable ASCII characters. Whether the cluster serves the kinds (and,
//! for a plugin limited to namespaces, that no source of a namespaced kind watches every
//! namespace and no cluster-scoped kind is writable) and whether the component exports
//! `map`/`filter` are checked later, against discovery ([`PluginConfig::check_kinds`]) and
//! the compiled component ([`PluginConfig::check_hooks`]), with errors that still point into
//! the file.

mod admission;
mod resolver;
mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use admission::{AdmissionToml, FailurePolicyToml, OperationToml, ReinvocationToml, SideEffectsToml};
pub use schema::{
    IndexToml, OwnerIndex, PermissionsToml, PluginToml, PredicatesToml, SourceToml, TransformToml,
};

use super::decode::decode;
use super::error::{ConfigError, ConfigErrors, did_you_mean};
use super::kinds::{BuiltinKinds, KindLookupError, KindResolver};
use super::source::{SourceMap, parse_path};
use crate::admission::{AdmissionRule, WebhookType};
use crate::cache::IndexSpec;
use crate::object::Transform;
use crate::plugin::AdmissionExports;
use crate::plugin::spec::{Gvk, Permissions, PluginSpec, SandboxLimits};

/// Values a plugin TOML falls back to (the host TOML's `[defaults]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginDefaults {
    pub concurrency: usize,
    pub deadline: Duration,
    pub memory: u64,
    pub max_output: u64,
    /// Guest log lines a second the plugin may put into the host's log (with a burst of
    /// ten seconds' worth).
    pub log_lines_per_second: u32,
    /// `None`: no periodic resync.
    pub resync: Option<Duration>,
    /// The most instances one plugin may hold (the host TOML's `max-instances-per-plugin`):
    /// a plugin's `concurrency` may be at most one less (one instance serves its hooks).
    pub max_instances: usize,
}

impl Default for PluginDefaults {
    fn default() -> Self {
        PluginDefaults {
            concurrency: 1,
            deadline: Duration::from_secs(5),
            memory: 64 << 20,
            max_output: 4 << 20,
            log_lines_per_second: crate::plugin::DEFAULT_LOG_LINES_PER_SECOND,
            resync: None,
            max_instances: crate::plugin::DEFAULT_INSTANCES_PER_PLUGIN as usize,
        }
    }
}

/// How one kind is watched, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSource {
    pub kind: Gvk,
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub indexes: BTreeMap<String, IndexSpec>,
    pub predicates: Predicates,
    /// The plugin's `[transform]`: part of the informer's identity.
    pub transform: Transform,
}

/// Event predicates of one source; all set ones must pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Predicates {
    pub generation_changed: bool,
    pub resource_version_changed: bool,
    pub labels_changed: bool,
    pub annotations_changed: bool,
    pub label_selector: Option<String>,
    pub annotation_present: Option<String>,
    /// Ask the plugin's `filter` export.
    pub filter: bool,
}

/// A checked plugin TOML with defaults applied and paths resolved.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    pub name: String,
    /// The TOML this came from.
    pub toml_path: PathBuf,
    /// The component's file; empty when the component comes from a registry
    /// ([`Self::wasm_registry`]).
    pub wasm_path: PathBuf,
    /// Where the component comes from when `wasm` names a registry (`oci://...`).
    pub wasm_registry: Option<RegistryWasm>,
    pub concurrency: usize,
    pub resync: Option<Duration>,
    pub deadline: Duration,
    pub memory: u64,
    pub max_output: u64,
    pub log_lines_per_second: u32,
    pub field_manager: String,
    pub for_source: WatchSource,
    pub owns: Vec<WatchSource>,
    pub watches: Vec<WatchSource>,
    /// Extra kinds to cache for reads.
    pub read: Vec<Gvk>,
    /// Kinds the plugin may write.
    pub write: Vec<Gvk>,
    /// The namespaces the plugin reads and writes in (sorted); `None`: every namespace.
    /// `permissions.namespaces` when given (`["*"]` is `None`), else, when `[for]` names a
    /// namespace, that one and those `[[owns]]` and `[[watches]]` name.
    pub namespaces: Option<Vec<String>>,
    /// `[transform]`, resolved: what every cache this plugin reads strips.
    pub transform: Transform,
    /// `[[admission]]`, checked: the webhooks the plugin answers.
    pub admission: Vec<AdmissionRule>,
    /// `[settings]` as a JSON object.
    pub settings: serde_json::Value,
    /// The file as written.
    pub file: PluginToml,
    source: Arc<str>,
}

/// A component in an OCI registry, as a plugin TOML names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryWasm {
    pub reference: crate::oci::OciReference,
    /// The plugin's own cosign public key (`verify-key`), resolved against the TOML's directory.
    pub verify_key: Option<PathBuf>,
}

/// The defaulted limits of a [`PluginConfig`], compared by its `PartialEq`.
#[derive(PartialEq)]
struct ResolvedLimits<'a> {
    concurrency: usize,
    resync: Option<Duration>,
    deadline: Duration,
    memory: u64,
    max_output: u64,
    log_lines_per_second: u32,
    field_manager: &'a str,
}

impl PartialEq for PluginConfig {
    fn eq(&self, other: &Self) -> bool {
        // Same file contents resolved the same way; the source text may differ in comments.
        self.name == other.name
            && self.toml_path == other.toml_path
            && self.wasm_path == other.wasm_path
            && self.file == other.file
            && self.resolved_limits() == other.resolved_limits()
    }
}

impl PluginConfig {
    /// Reads and checks `toml_path`.
    pub fn load(toml_path: &Path, defaults: &PluginDefaults) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(toml_path)
            .map_err(|e| ConfigError::file_level(toml_path, format!("cannot read: {e}")))?;
        Self::parse(toml_path, &text, defaults)
    }

    /// Checks `text` as the contents of `toml_path` (which need not exist).
    pub fn parse(toml_path: &Path, text: &str, defaults: &PluginDefaults) -> Result<Self, ConfigErrors> {
        let map = SourceMap::new(toml_path, text);
        let file: PluginToml = decode(&map)?;
        resolver::resolve(&map, file, defaults)
    }

    /// An error about `field` (a dotted path like `for.kind` or `owns[1].kind`), placed at
    /// that field in the file.
    pub fn field_error(&self, field: &str, message: impl Into<String>) -> ConfigError {
        let map = SourceMap::new(&self.toml_path, &self.source);
        map.error_for(&parse_path(field), false, message)
    }

    /// Every kind the plugin names, with the field that names it.
    pub fn kinds(&self) -> Vec<(String, &Gvk)> {
        let mut out = vec![("for.kind".to_owned(), &self.for_source.kind)];
        for (list, name) in [(&self.owns, "owns"), (&self.watches, "watches")] {
            out.extend(list.iter().enumerate().map(|(i, s)| (format!("{name}[{i}].kind"), &s.kind)));
        }
        for (list, name) in [(&self.read, "read"), (&self.write, "write")] {
            out.extend(list.iter().enumerate().map(|(i, g)| (format!("permissions.{name}[{i}]"), g)));
        }
        for (i, rule) in self.admission.iter().enumerate() {
            let named = !self.file.admission.get(i).is_some_and(|s| s.kinds.is_empty());
            out.extend(rule.kinds.iter().enumerate().map(|(j, g)| {
                (if named { format!("admission[{i}].kinds[{j}]") } else { format!("admission[{i}]") }, g)
            }));
        }
        out
    }

    /// The kinds the plugin's `[[admission]]` sections admit.
    pub fn admitted_kinds(&self) -> Vec<&Gvk> {
        let mut kinds: Vec<&Gvk> = self.admission.iter().flat_map(|r| &r.kinds).collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// The kinds the plugin watches or may read: each needs an informer.
    pub fn cached_kinds(&self) -> Vec<&Gvk> {
        let mut kinds: Vec<&Gvk> = std::iter::once(&self.for_source)
            .chain(&self.owns)
            .chain(&self.watches)
            .map(|s| &s.kind)
            .chain(&self.read)
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    }

    /// Checks that the cluster (or the built-in catalog) serves every kind named, and, for
    /// a plugin limited to namespaces, that no source of a namespaced kind watches every
    /// namespace and no cluster-scoped kind is writable.
    pub fn check_kinds(&self, resolver: &dyn KindResolver) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::default();
        for (field, kind) in self.kinds() {
            let (message, hint) = match resolver.resolve(kind) {
                Ok(resolved) => {
                    if let Some(e) = self.scope_error(&field, kind, resolved.namespaced) {
                        errors.push(e);
                    }
                    continue;
                }
                Err(KindLookupError::Unknown) => continue,
                Err(KindLookupError::UnknownKind { known_kinds }) => (
                    format!("the cluster serves no kind `{}` in `{}`", kind.kind, kind.api_version),
                    did_you_mean(&kind.kind, known_kinds.iter().map(String::as_str))
                        .map(|k| format!("did you mean `{k}`?"))
                        .or_else(|| {
                            BuiltinKinds::api_version_of(&kind.kind)
                                .filter(|av| *av != kind.api_version)
                                .map(|av| format!("`{}` is in `{av}`", kind.kind))
                        }),
                ),
                Err(KindLookupError::UnknownApiVersion { known_versions }) => (
                    format!("the cluster does not serve `{}`", kind.api_version),
                    BuiltinKinds::api_version_of(&kind.kind)
                        .map(|av| format!("`{}` is in `{av}`", kind.kind))
                        .or_else(|| {
                            (!known_versions.is_empty()).then(|| {
                                format!("served versions of this group: {}", known_versions.join(", "))
                            })
                        }),
                ),
                Err(KindLookupError::Unavailable(why)) => {
                    (format!("cannot check kind `{kind}`: {why}"), None)
                }
            };
            let mut e = self.field_error(&field, message);
            e.hint = hint;
            errors.push(e);
        }
        errors.into_result(())
    }

    /// What is wrong with the kind at `field` (as [`kinds`](Self::kinds) names it) for a
    /// plugin limited to namespaces, given whether the kind is `namespaced`.
    fn scope_error(&self, field: &str, kind: &Gvk, namespaced: bool) -> Option<ConfigError> {
        let scope = self.namespaces.as_ref()?.join(", ");
        if let Some(source) = field.strip_suffix(".kind") {
            let watched = match source {
                "for" => &self.for_source,
                _ => {
                    let (list, i) = source.split_once('[')?;
                    let i: usize = i.strip_suffix(']')?.parse().ok()?;
                    if list == "owns" { self.owns.get(i)? } else { self.watches.get(i)? }
                }
            };
            if namespaced && watched.namespace.is_none() {
                return Some(
                    self.field_error(
                        field,
                        format!("`{kind}` is watched in every namespace, but the plugin works only in {scope}"),
                    )
                    .with_hint(
                        "set `namespace` on this source, or `namespaces = [\"*\"]` in `[permissions]` to let the plugin work in every namespace",
                    ),
                );
            }
        } else if field.starts_with("permissions.write") && !namespaced {
            return Some(
                self.field_error(
                    field,
                    format!("`{kind}` is cluster-scoped, and a plugin that works only in {scope} writes nothing outside them"),
                )
                .with_hint("remove it, or set `namespaces = [\"*\"]` in `[permissions]`"),
            );
        }
        None
    }

    /// Checks the TOML against the component's optional exports: `[[watches]]` needs
    /// `map`, `predicates.filter = true` needs `filter`.
    pub fn check_hooks(&self, exports_map: bool, exports_filter: bool) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::default();
        if !self.watches.is_empty() && !exports_map {
            errors.push(
                self.field_error(
                    "watches[0]",
                    "`[[watches]]` needs the plugin to export `map`, and it does not",
                )
                .with_hint("implement `map` in the plugin, or remove `[[watches]]`"),
            );
        }
        if !exports_filter {
            let sources = std::iter::once(("for".to_owned(), &self.for_source))
                .chain(self.owns.iter().enumerate().map(|(i, s)| (format!("owns[{i}]"), s)))
                .chain(self.watches.iter().enumerate().map(|(i, s)| (format!("watches[{i}]"), s)));
            for (at, s) in sources {
                if s.predicates.filter {
                    errors.push(
                        self.field_error(
                            &format!("{at}.predicates.filter"),
                            "`filter = true` needs the plugin to export `filter`, and it does not",
                        )
                        .with_hint("implement `filter` in the plugin, or remove this predicate"),
                    );
                }
            }
        }
        errors.into_result(())
    }

    /// Checks the `[[admission]]` sections against the component's exports: a validating
    /// webhook needs `validator`, a mutating one `mutator`.
    pub fn check_admission_exports(&self, exports: AdmissionExports) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::default();
        for (i, rule) in self.admission.iter().enumerate() {
            let (exported, interface, what) = match rule.webhook_type {
                WebhookType::Validating => (exports.validate, "validator", "validates"),
                WebhookType::Mutating => (exports.mutate, "mutator", "mutates"),
            };
            if !exported {
                errors.push(
                    self.field_error(
                        &format!("admission[{i}]"),
                        format!(
                            "webhook `{}` needs the plugin to export `{interface}` (wasmctrl:controller@0.2.1), and it does not",
                            rule.name
                        ),
                    )
                    .with_hint(format!(
                        "build a plugin that {what} (Rust SDK: implement `{}` and list it in `export_plugin!(.., admission = [..])`), or remove this section",
                        if rule.webhook_type == WebhookType::Validating { "Validate" } else { "Mutate" }
                    )),
                );
            }
        }
        errors.into_result(())
    }

    /// Checks that the host serves admission webhooks when the plugin asks for one.
    pub fn check_admission_served(&self, served: bool) -> Result<(), ConfigErrors> {
        if self.admission.is_empty() || served {
            return Ok(());
        }
        Err(self
            .field_error("admission[0]", "the plugin answers admission webhooks, but this host serves none")
            .with_hint("add an `[admission]` table to the host TOML (see docs/admission.md)")
            .into())
    }

    /// The values the host TOML's `[defaults]` may have filled in: two configs read from
    /// the same file differ only here when the defaults changed.
    fn resolved_limits(&self) -> ResolvedLimits<'_> {
        ResolvedLimits {
            concurrency: self.concurrency,
            resync: self.resync,
            deadline: self.deadline,
            memory: self.memory,
            max_output: self.max_output,
            log_lines_per_second: self.log_lines_per_second,
            field_manager: &self.field_manager,
        }
    }

    /// What the Wasm runtime needs to run this plugin.
    pub fn to_plugin_spec(&self) -> PluginSpec {
        let watched =
            std::iter::once(&self.for_source).chain(&self.owns).chain(&self.watches).map(|s| s.kind.clone());
        PluginSpec {
            name: self.name.clone(),
            for_kind: self.for_source.kind.clone(),
            concurrency: self.concurrency,
            limits: SandboxLimits {
                deadline: self.deadline,
                memory: usize::try_from(self.memory).unwrap_or(usize::MAX),
                max_output: usize::try_from(self.max_output).unwrap_or(usize::MAX),
                log_lines_per_second: self.log_lines_per_second,
                ..SandboxLimits::default()
            },
            permissions: {
                let p = Permissions::new(watched, self.read.iter().cloned(), self.write.iter().cloned())
                    .admitting(self.admitted_kinds().into_iter().cloned());
                match &self.namespaces {
                    Some(namespaces) => p.with_namespaces(namespaces.iter().cloned()),
                    None => p,
                }
            },
            settings: serde_json::to_vec(&self.settings).unwrap_or_else(|_| b"{}".to_vec()).into(),
            field_manager: self.field_manager.clone(),
        }
    }
}
