//! A plugin's TOML (`plugins/<name>.toml`, next to `<name>.wasm`): the file form
//! ([`PluginToml`], round-trips through serde) and the checked, defaulted form the host
//! runs ([`PluginConfig`]).
//!
//! Invariants of a [`PluginConfig`]: the name is a DNS label; every kind is well formed
//! (`apiVersion` + CamelCase `Kind`); selectors parse; each index has exactly one source;
//! every limit is non-zero; `settings` is a JSON object. Whether the cluster serves the
//! kinds and whether the component exports `map`/`filter` are checked later, against
//! discovery ([`PluginConfig::check_kinds`]) and the compiled component
//! ([`PluginConfig::check_hooks`]), with errors that still point into the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, ConfigErrors, PathSeg, SourceMap, did_you_mean, from_toml_error};
use super::kinds::{BuiltinKinds, KindLookupError, KindResolver, check_api_version, check_kind_name};
use super::names::{check_field_selector, check_label_key, is_dns_label};
use super::units::{ByteSize, DurationValue};
use crate::cache::{IndexFunc, IndexSpec, LabelSelector, OwnerIndex as CacheOwnerIndex};
use crate::object::Transform;
use crate::plugin::spec::{Gvk, Permissions, PluginSpec, SandboxLimits};

/// The plugin TOML as written. Every key is optional except `[for]`; unknown keys are errors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PluginToml {
    /// Defaults to the TOML's file stem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The component, relative to the TOML's directory. Defaults to `<stem>.wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasm: Option<String>,
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
    fn is_empty(&self) -> bool {
        *self == PredicatesToml::default()
    }
}

/// `[permissions]`: kinds as `"<apiVersion>/<Kind>"`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PermissionsToml {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
}

impl PermissionsToml {
    fn is_empty(&self) -> bool {
        self.read.is_empty() && self.write.is_empty()
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
    fn is_empty(&self) -> bool {
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

/// Values a plugin TOML falls back to (the host TOML's `[defaults]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginDefaults {
    pub concurrency: usize,
    pub deadline: Duration,
    pub memory: u64,
    pub max_output: u64,
    /// `None`: no periodic resync.
    pub resync: Option<Duration>,
}

impl Default for PluginDefaults {
    fn default() -> Self {
        PluginDefaults {
            concurrency: 1,
            deadline: Duration::from_secs(5),
            memory: 64 << 20,
            max_output: 4 << 20,
            resync: None,
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
    /// The component to run.
    pub wasm_path: PathBuf,
    pub concurrency: usize,
    pub resync: Option<Duration>,
    pub deadline: Duration,
    pub memory: u64,
    pub max_output: u64,
    pub field_manager: String,
    pub for_source: WatchSource,
    pub owns: Vec<WatchSource>,
    pub watches: Vec<WatchSource>,
    /// Extra kinds to cache for reads.
    pub read: Vec<Gvk>,
    /// Kinds the plugin may write.
    pub write: Vec<Gvk>,
    /// `[transform]`, resolved: what every cache this plugin reads strips.
    pub transform: Transform,
    /// `[settings]` as a JSON object.
    pub settings: serde_json::Value,
    /// The file as written.
    pub file: PluginToml,
    source: Arc<str>,
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
        let file: PluginToml = toml::from_str(text).map_err(|e| from_toml_error(&map, &e))?;
        Resolver { map: &map, errors: ConfigErrors::default() }.resolve(file, defaults)
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
        out
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

    /// Checks that the cluster (or the built-in catalog) serves every kind named.
    pub fn check_kinds(&self, resolver: &dyn KindResolver) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::default();
        for (field, kind) in self.kinds() {
            let (message, hint) = match resolver.resolve(kind) {
                Ok(_) | Err(KindLookupError::Unknown) => continue,
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

    fn resolved_limits(&self) -> (usize, Option<Duration>, Duration, u64, u64, &str) {
        (self.concurrency, self.resync, self.deadline, self.memory, self.max_output, &self.field_manager)
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
                ..SandboxLimits::default()
            },
            permissions: Permissions::new(watched, self.read.iter().cloned(), self.write.iter().cloned()),
            settings: serde_json::to_vec(&self.settings).unwrap_or_else(|_| b"{}".to_vec()).into(),
            field_manager: self.field_manager.clone(),
        }
    }
}

/// `owns[1].kind` → `[Key(owns), Index(1), Key(kind)]`.
pub(crate) fn parse_path(field: &str) -> Vec<PathSeg> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, rest) = part.split_once('[').unwrap_or((part, ""));
        if !key.is_empty() {
            out.push(PathSeg::Key(key.to_owned()));
        }
        for idx in rest.split('[') {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(PathSeg::Index(i));
            }
        }
    }
    out
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_owned())
}

/// Turns a [`PluginToml`] into a [`PluginConfig`], collecting every error.
struct Resolver<'m, 'a> {
    map: &'m SourceMap<'a>,
    errors: ConfigErrors,
}

impl Resolver<'_, '_> {
    fn err(&mut self, path: &[PathSeg], message: impl Into<String>, hint: Option<String>) {
        let mut e = self.map.error_for(path, false, message);
        e.hint = hint;
        self.errors.push(e);
    }

    fn resolve(mut self, file: PluginToml, defaults: &PluginDefaults) -> Result<PluginConfig, ConfigErrors> {
        let toml_path = self.map.file;
        let stem = toml_path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        let name = file.name.clone().unwrap_or_else(|| stem.clone());
        if !is_dns_label(&name) {
            let why = "a plugin name must be lowercase letters, digits and `-` (at most 63), as it names metrics and the field manager";
            if file.name.is_some() {
                self.err(&[key("name")], format!("`{name}` is not a valid plugin name: {why}"), None);
            } else {
                self.errors.push(
                    ConfigError::file_level(
                        toml_path,
                        format!("the file name `{stem}` is not a valid plugin name: {why}"),
                    )
                    .with_field("name")
                    .with_hint("rename the file or set `name = \"...\"`"),
                );
            }
        }
        let dir = toml_path.parent().unwrap_or(Path::new(""));
        let wasm_rel = file.wasm.clone().unwrap_or_else(|| format!("{stem}.wasm"));
        if file.wasm.is_some() && !wasm_rel.ends_with(".wasm") {
            self.err(&[key("wasm")], format!("`{wasm_rel}` does not end in `.wasm`"), None);
        }
        let wasm_path = dir.join(&wasm_rel);

        let concurrency = match file.concurrency {
            Some(0) => {
                self.err(&[key("concurrency")], "concurrency must be at least 1", None);
                1
            }
            Some(n) if n > 1024 => {
                self.err(
                    &[key("concurrency")],
                    format!("concurrency {n} is more than the maximum, 1024"),
                    None,
                );
                1024
            }
            Some(n) => n as usize,
            None => defaults.concurrency,
        };
        let deadline = match file.deadline {
            Some(d) if d.0.is_zero() => {
                self.err(&[key("deadline")], "the deadline must be more than 0", None);
                defaults.deadline
            }
            Some(d) => d.0,
            None => defaults.deadline,
        };
        let resync = match file.resync {
            Some(d) if d.0.is_zero() => None,
            Some(d) if d.0 < Duration::from_secs(1) => {
                self.err(
                    &[key("resync")],
                    format!("resync `{d}` is below the minimum, 1s"),
                    Some("use \"0s\" to turn resync off".into()),
                );
                None
            }
            Some(d) => Some(d.0),
            None => defaults.resync,
        };
        let memory = match file.memory {
            Some(m) if m.0 < (1 << 20) => {
                self.err(&[key("memory")], format!("memory `{m}` is below the minimum, 1MiB"), None);
                defaults.memory
            }
            Some(m) => m.0,
            None => defaults.memory,
        };
        let max_output = match file.max_output {
            Some(m) if m.0 < 1024 => {
                self.err(&[key("max-output")], format!("max-output `{m}` is below the minimum, 1KiB"), None);
                defaults.max_output
            }
            Some(m) => m.0,
            None => defaults.max_output,
        };
        let field_manager = file.field_manager.clone().unwrap_or_else(|| format!("wasmctrl-{name}"));
        if field_manager.is_empty() || field_manager.len() > 128 {
            self.err(&[key("field-manager")], "a field manager must be 1 to 128 characters", None);
        }

        let transform = file.transform.resolve();
        let for_source = self.source(&file.for_kind, vec![key("for")], transform);
        let owns = self.sources(&file.owns, "owns", &for_source);
        let watches = self.sources(&file.watches, "watches", &for_source);
        let read = self.permission_kinds(&file.permissions.read, "read");
        let write = self.permission_kinds(&file.permissions.write, "write");
        let settings = match toml_to_json(&toml::Value::Table(file.settings.clone())) {
            Ok(v) => v,
            Err((path, message)) => {
                let mut p = vec![key("settings")];
                p.extend(path);
                self.err(&p, message, None);
                serde_json::Value::Object(Default::default())
            }
        };

        let config = PluginConfig {
            name,
            toml_path: toml_path.to_path_buf(),
            wasm_path,
            concurrency,
            resync,
            deadline,
            memory,
            max_output,
            field_manager,
            for_source,
            owns,
            watches,
            read,
            write,
            transform,
            settings,
            file,
            source: self.map.text.into(),
        };
        self.errors.into_result(config)
    }

    fn sources(&mut self, list: &[SourceToml], name: &str, for_source: &WatchSource) -> Vec<WatchSource> {
        let mut out: Vec<WatchSource> = Vec::new();
        for (i, s) in list.iter().enumerate() {
            let path = vec![key(name), PathSeg::Index(i)];
            let source = self.source(s, path.clone(), for_source.transform);
            if let Some(j) = out.iter().position(|o| o.kind == source.kind && o.namespace == source.namespace)
            {
                let mut p = path.clone();
                p.push(key("kind"));
                self.err(
                    &p,
                    format!("`{}` is already listed as `{name}[{j}]`", source.kind),
                    Some("merge the two entries (one informer per kind and namespace)".into()),
                );
            }
            if name == "owns"
                && source.namespace.is_some()
                && for_source.namespace.is_some()
                && source.namespace != for_source.namespace
            {
                let mut p = path.clone();
                p.push(key("namespace"));
                self.err(
                    &p,
                    "owned objects live in their owner's namespace, which `[for]` limits to another one",
                    None,
                );
            }
            out.push(source);
        }
        out
    }

    fn source(&mut self, s: &SourceToml, path: Vec<PathSeg>, transform: Transform) -> WatchSource {
        let at = |k: &str| {
            let mut p = path.clone();
            p.push(key(k));
            p
        };
        let kind = self.kind(&s.api_version, &s.kind, &at("api-version"), &at("kind"));
        if let Some(ns) = &s.namespace
            && !is_dns_label(ns)
        {
            self.err(&at("namespace"), format!("`{ns}` is not a valid namespace name"), None);
        }
        if let Some(sel) = &s.label_selector
            && let Err(e) = LabelSelector::parse(sel)
        {
            self.err(&at("label-selector"), e.to_string(), None);
        }
        if let Some(sel) = &s.field_selector
            && let Err(e) = check_field_selector(sel)
        {
            self.err(&at("field-selector"), e, None);
        }
        let mut indexes = BTreeMap::new();
        for (name, ix) in &s.indexes {
            let mut p = at("indexes");
            p.push(key(name));
            if let Some(spec) = self.index(name, ix, &p) {
                indexes.insert(name.clone(), spec);
            }
        }
        let pr = &s.predicates;
        let mut pp = at("predicates");
        if let Some(sel) = &pr.label_selector
            && let Err(e) = LabelSelector::parse(sel)
        {
            pp.push(key("label-selector"));
            self.err(&pp, e.to_string(), None);
            pp.pop();
        }
        if let Some(k) = &pr.annotation_present
            && let Err(e) = check_label_key(k)
        {
            pp.push(key("annotation-present"));
            self.err(&pp, e, None);
        }
        WatchSource {
            kind,
            namespace: s.namespace.clone(),
            label_selector: s.label_selector.clone().filter(|s| !s.trim().is_empty()),
            field_selector: s.field_selector.clone().filter(|s| !s.trim().is_empty()),
            indexes,
            predicates: Predicates {
                generation_changed: pr.generation_changed.unwrap_or(false),
                resource_version_changed: pr.resource_version_changed.unwrap_or(false),
                labels_changed: pr.labels_changed.unwrap_or(false),
                annotations_changed: pr.annotations_changed.unwrap_or(false),
                label_selector: pr.label_selector.clone(),
                annotation_present: pr.annotation_present.clone(),
                filter: pr.filter.unwrap_or(false),
            },
            transform,
        }
    }

    fn kind(&mut self, api_version: &str, kind: &str, av_path: &[PathSeg], kind_path: &[PathSeg]) -> Gvk {
        if let Err(e) = check_api_version(api_version) {
            let hint = BuiltinKinds::api_version_of(kind).map(|av| format!("`{kind}` is in `{av}`"));
            self.err(av_path, e, hint);
        }
        if let Err((e, hint)) = check_kind_name(kind) {
            self.err(kind_path, e, hint);
        }
        Gvk::new(api_version, kind)
    }

    fn index(&mut self, name: &str, ix: &IndexToml, path: &[PathSeg]) -> Option<IndexSpec> {
        if name == "namespace" {
            self.err(
                path,
                "`namespace` is the built-in namespace index and cannot be redefined",
                Some("pick another name".into()),
            );
            return None;
        }
        let ok_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' || c == '/');
        if !ok_name {
            self.err(
                path,
                format!("`{name}` is not a valid index name (lowercase letters, digits, `-`, `.`, `/`)"),
                None,
            );
        }
        let given = [ix.field.is_some(), ix.label.is_some(), ix.annotation.is_some(), ix.owner.is_some()];
        let count = given.iter().filter(|g| **g).count();
        if count != 1 {
            self.err(
                path,
                format!("index `{name}` must have exactly one of `field`, `label`, `annotation`, `owner`; it has {count}"),
                Some("e.g. `by-node = { field = \"spec.nodeName\" }`".into()),
            );
            return None;
        }
        let mut sub = path.to_vec();
        if let Some(f) = &ix.field {
            let spec = IndexSpec::Field(f.clone());
            if let Err(e) = IndexFunc::from_spec(spec.clone()) {
                sub.push(key("field"));
                self.err(&sub, e.to_string(), Some("write a dotted path like `spec.nodeName`; bracket segments holding dots: `metadata.labels['app.kubernetes.io/name']`".into()));
                return None;
            }
            return Some(spec);
        }
        if let Some(l) = &ix.label {
            if let Err(e) = check_label_key(l) {
                sub.push(key("label"));
                self.err(&sub, e, None);
                return None;
            }
            return Some(IndexSpec::Label(l.clone()));
        }
        if let Some(a) = &ix.annotation {
            if let Err(e) = check_label_key(a) {
                sub.push(key("annotation"));
                self.err(&sub, e, None);
                return None;
            }
            return Some(IndexSpec::Annotation(a.clone()));
        }
        match ix.owner {
            Some(OwnerIndex::Uid) => Some(IndexSpec::Owner(CacheOwnerIndex::Uid)),
            Some(OwnerIndex::Controller) => Some(IndexSpec::Owner(CacheOwnerIndex::Controller)),
            None => None,
        }
    }

    fn permission_kinds(&mut self, list: &[String], which: &str) -> Vec<Gvk> {
        let mut out = Vec::new();
        for (i, text) in list.iter().enumerate() {
            let path = [key("permissions"), key(which), PathSeg::Index(i)];
            let Some(g) = Gvk::parse(text) else {
                let hint = BuiltinKinds::api_version_of(text)
                    .map(|av| format!("write `{av}/{}`", BuiltinKinds::canonical_kind(text).unwrap_or(text)))
                    .unwrap_or_else(|| {
                        "write `<apiVersion>/<Kind>`, e.g. `v1/ConfigMap` or `apps/v1/Deployment`".into()
                    });
                self.err(
                    &path,
                    format!("`{text}` is not a kind: expected `<apiVersion>/<Kind>`"),
                    Some(hint),
                );
                continue;
            };
            let mut bad = false;
            if let Err(e) = check_api_version(&g.api_version) {
                self.err(&path, e, None);
                bad = true;
            }
            if !bad && let Err((e, hint)) = check_kind_name(&g.kind) {
                // `v1/secrets` is a resource, not a kind: point at the kind instead.
                let singular = g.kind.strip_suffix('s').unwrap_or(&g.kind);
                let hint = BuiltinKinds::canonical_kind(singular)
                    .filter(|_| singular != g.kind)
                    .map(|k| format!("use the kind, `{}/{k}`, not the resource name", g.api_version))
                    .or(hint);
                self.err(&path, e, hint);
                bad = true;
            }
            if !bad {
                if out.contains(&g) {
                    self.err(&path, format!("`{g}` is listed twice"), None);
                }
                out.push(g);
            }
        }
        out
    }
}

/// `[settings]` as JSON. Datetimes become strings (RFC 3339, as written); NaN and infinite
/// floats, which JSON cannot hold, are errors.
fn toml_to_json(v: &toml::Value) -> Result<serde_json::Value, (Vec<PathSeg>, String)> {
    use serde_json::Value as J;
    Ok(match v {
        toml::Value::String(s) => J::String(s.clone()),
        toml::Value::Integer(i) => J::from(*i),
        toml::Value::Float(f) => match serde_json::Number::from_f64(*f) {
            Some(n) => J::Number(n),
            None => return Err((Vec::new(), format!("`{f}` cannot be represented in JSON"))),
        },
        toml::Value::Boolean(b) => J::Bool(*b),
        toml::Value::Datetime(d) => J::String(d.to_string()),
        toml::Value::Array(a) => J::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| {
                    toml_to_json(x).map_err(|(mut p, m)| {
                        p.insert(0, PathSeg::Index(i));
                        (p, m)
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(t) => J::Object(
            t.iter()
                .map(|(k, x)| {
                    toml_to_json(x).map(|j| (k.clone(), j)).map_err(|(mut p, m)| {
                        p.insert(0, PathSeg::Key(k.clone()));
                        (p, m)
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}
