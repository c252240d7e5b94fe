//! Turns a [`PluginToml`] (as written) into a [`PluginConfig`] (checked, defaulted, with
//! paths resolved against the TOML's directory).
//!
//! Invariants: every problem is collected, not only the first, each placed at its field in
//! the file; a value that fails its check is replaced by its default so the rest can still
//! be checked, and the result is then an error; the resolver reads only the file and the
//! defaults it is given (no cluster, no component), so `wasmctrl check` and the host agree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wasmctrl_selectors::{FieldSelector, is_dns_label, validate_key};

use super::schema::{IndexToml, OwnerIndex, PluginToml, SourceToml};
use super::{PluginConfig, PluginDefaults, Predicates, RegistryWasm, WatchSource};
use crate::cache::{IndexFunc, IndexSpec, LabelSelector, OwnerIndex as CacheOwnerIndex};
use crate::config::error::{ConfigError, ConfigErrors};
use crate::config::kinds::{BuiltinKinds, check_api_version, check_kind_name};
use crate::config::source::{PathSeg, SourceMap};
use crate::object::Transform;
use crate::oci::OciReference;
use crate::plugin::spec::Gvk;

/// Checks `file` (parsed from `map`) and applies `defaults`.
pub(super) fn resolve(
    map: &SourceMap<'_>,
    file: PluginToml,
    defaults: &PluginDefaults,
) -> Result<PluginConfig, ConfigErrors> {
    Resolver { map, errors: ConfigErrors::default() }.resolve(file, defaults)
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
        let (wasm_path, wasm_registry) = if OciReference::is_registry_value(&wasm_rel) {
            let reference = match wasm_rel.parse::<OciReference>() {
                Ok(r) => Some(r),
                Err(e) => {
                    self.err(&[key("wasm")], e.to_string(), None);
                    None
                }
            };
            let verify_key = file.verify_key.as_deref().map(|k| dir.join(k));
            (PathBuf::new(), reference.map(|reference| RegistryWasm { reference, verify_key }))
        } else {
            if file.wasm.is_some() && !wasm_rel.ends_with(".wasm") {
                self.err(
                    &[key("wasm")],
                    format!("`{wasm_rel}` does not end in `.wasm`"),
                    Some("name a `.wasm` file, or a registry: `oci://registry/repository:tag`".into()),
                );
            }
            if file.verify_key.is_some() {
                self.err(
                    &[key("verify-key")],
                    "`verify-key` applies to a component from a registry (`wasm = \"oci://...\"`)",
                    None,
                );
            }
            (dir.join(&wasm_rel), None)
        };

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
            Some(n) if n as usize >= defaults.max_instances => {
                self.err(
                    &[key("concurrency")],
                    format!(
                        "concurrency {n} needs {} instances, more than the {} a plugin may hold on this host",
                        n as usize + 1,
                        defaults.max_instances
                    ),
                    Some(format!(
                        "use concurrency {} or less, or raise max-instances-per-plugin (and instance-slots) in the host TOML",
                        defaults.max_instances.saturating_sub(1).max(1)
                    )),
                );
                defaults.max_instances.saturating_sub(1).max(1)
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
        let log_lines_per_second = match file.log_lines_per_second {
            Some(0) => {
                self.err(&[key("log-lines-per-second")], "log-lines-per-second must be at least 1", None);
                defaults.log_lines_per_second
            }
            Some(n) => n,
            None => defaults.log_lines_per_second,
        };
        let field_manager = file.field_manager.clone().unwrap_or_else(|| format!("wasmctrl-{name}"));
        if field_manager.is_empty()
            || field_manager.len() > 128
            || !field_manager.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            self.err(
                &[key("field-manager")],
                "a field manager must be 1 to 128 printable ASCII characters, as the API server requires",
                None,
            );
        }

        let transform = file.transform.resolve();
        let for_source = self.source(&file.for_kind, vec![key("for")], transform);
        let owns = self.sources(&file.owns, "owns", &for_source);
        let watches = self.sources(&file.watches, "watches", &for_source);
        let read = self.permission_kinds(&file.permissions.read, "read");
        let write = self.permission_kinds(&file.permissions.write, "write");
        self.check_watched_secrets(&for_source, &owns, &watches, &read);
        let namespaces =
            self.namespaces(file.permissions.namespaces.as_deref(), &for_source, &owns, &watches);
        let admission = super::admission::resolve(
            self.map,
            &mut self.errors,
            &file.admission,
            &for_source.kind,
            &read,
            namespaces.as_deref(),
        );
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
            wasm_registry,
            concurrency,
            resync,
            deadline,
            memory,
            max_output,
            log_lines_per_second,
            field_manager,
            for_source,
            owns,
            watches,
            read,
            write,
            namespaces,
            transform,
            admission,
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
            && let Err(e) = FieldSelector::parse(sel)
        {
            self.err(&at("field-selector"), e.to_string(), None);
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
            && let Err(e) = validate_key(k)
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
            if let Err(e) = validate_key(l) {
                sub.push(key("label"));
                self.err(&sub, e, None);
                return None;
            }
            return Some(IndexSpec::Label(l.clone()));
        }
        if let Some(a) = &ix.annotation {
            if let Err(e) = validate_key(a) {
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

    /// A Secret watched (`for`, `owns`, `watches`) is handed to the plugin whole, so it must
    /// be readable: listed in `permissions.read`.
    fn check_watched_secrets(
        &mut self,
        for_source: &WatchSource,
        owns: &[WatchSource],
        watches: &[WatchSource],
        read: &[Gvk],
    ) {
        if read.iter().any(Gvk::is_secret) {
            return;
        }
        let sources = std::iter::once((vec![key("for")], for_source, "`[for]`"))
            .chain(
                owns.iter().enumerate().map(|(i, s)| (vec![key("owns"), PathSeg::Index(i)], s, "`[[owns]]`")),
            )
            .chain(
                watches
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (vec![key("watches"), PathSeg::Index(i)], s, "`[[watches]]`")),
            );
        let secrets: Vec<(Vec<PathSeg>, &str)> =
            sources.filter(|(_, s, _)| s.kind.is_secret()).map(|(p, _, what)| (p, what)).collect();
        for (mut path, what) in secrets {
            path.push(key("kind"));
            self.err(
                &path,
                format!(
                    "{what} watches `v1/Secret`, which hands every Secret it sees (its data included) to the plugin, \
                     but `permissions.read` does not list `v1/Secret`"
                ),
                Some("add `read = [\"v1/Secret\"]` to `[permissions]` if the plugin is to read Secrets".into()),
            );
        }
    }

    /// The plugin's namespaces (see [`PluginConfig::namespaces`]), checking
    /// `permissions.namespaces` and that every source's namespace is one of them.
    fn namespaces(
        &mut self,
        listed: Option<&[String]>,
        for_source: &WatchSource,
        owns: &[WatchSource],
        watches: &[WatchSource],
    ) -> Option<Vec<String>> {
        let sources = || {
            std::iter::once((vec![key("for")], for_source))
                .chain(owns.iter().enumerate().map(|(i, s)| (vec![key("owns"), PathSeg::Index(i)], s)))
                .chain(watches.iter().enumerate().map(|(i, s)| (vec![key("watches"), PathSeg::Index(i)], s)))
        };
        let Some(listed) = listed else {
            // Derived from the sources when `[for]` names a namespace.
            for_source.namespace.as_ref()?;
            let mut scope: Vec<String> = sources().filter_map(|(_, s)| s.namespace.clone()).collect();
            scope.sort();
            scope.dedup();
            return Some(scope);
        };
        let at = |i: usize| [key("permissions"), key("namespaces"), PathSeg::Index(i)];
        if listed.is_empty() {
            self.err(
                &[key("permissions"), key("namespaces")],
                "`namespaces` is empty: the plugin could read and write nowhere",
                Some("list the namespaces the plugin works in, `[\"*\"]` for every namespace, or remove the key".into()),
            );
            return Some(Vec::new());
        }
        let mut scope = Vec::new();
        for (i, ns) in listed.iter().enumerate() {
            if ns == "*" {
                if listed.len() > 1 {
                    self.err(
                        &at(i),
                        "`*` (every namespace) is given with other namespaces",
                        Some("keep `*` alone, or remove it".into()),
                    );
                }
                continue;
            }
            if !is_dns_label(ns) {
                self.err(&at(i), format!("`{ns}` is not a valid namespace name"), None);
            } else if scope.contains(ns) {
                self.err(&at(i), format!("`{ns}` is listed twice"), None);
            } else {
                scope.push(ns.clone());
            }
        }
        if listed.iter().any(|ns| ns == "*") {
            return None;
        }
        for (path, s) in sources() {
            if let Some(ns) = &s.namespace
                && !scope.contains(ns)
            {
                let mut p = path;
                p.push(key("namespace"));
                self.err(
                    &p,
                    format!("`{ns}` is not one of `permissions.namespaces` ({})", scope.join(", ")),
                    Some(format!("add `{ns}` to `permissions.namespaces`")),
                );
            }
        }
        scope.sort();
        Some(scope)
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
