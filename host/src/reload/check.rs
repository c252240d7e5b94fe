//! `wasmctrl check PATH...`: the loader's validation, offline. A path may be a plugins
//! directory, a plugin TOML, a `.wasm` component, or a host TOML (whose plugins directory is
//! then checked too). On success it describes what would run.
//!
//! Invariants: the checks are the ones the [`super::PluginManager`] applies before starting
//! a plugin (same parsing, same kind checks, same component validation through
//! [`ComponentValidator`], names and field managers unique within a directory); a report
//! with any error has `ok() == false`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{
    BuiltinKinds, ConfigError, ConfigErrors, HostConfig, KindResolver, PluginConfig, PluginDefaults,
    WatchSource,
};

use super::scan::{plugin_tomls, read_settled, wasm_files};
use crate::plugin::spec::field_managers_overlap;

/// What validating a component found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentInfo {
    /// Short content hash (the plugin's version).
    pub version: String,
    /// The world the component targets, as the runtime names it.
    pub world: String,
    /// The optional hooks `init` declared, when `init` was run.
    pub hooks: Option<Hooks>,
    /// The admission exports the component has (`validator`, `mutator`).
    pub admission: crate::plugin::AdmissionExports,
}

/// The optional hooks a plugin declares that its TOML depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hooks {
    pub map: bool,
    pub filter: bool,
}

/// Compiles a component and checks it fits the plugin world (and, where the implementation
/// can, that `init` accepts the plugin's settings). Implemented over the plugin runtime.
pub trait ComponentValidator: Send + Sync {
    /// `plugin` is the component's TOML when there is one (for `init`'s settings).
    fn validate(&self, wasm: &[u8], plugin: Option<&PluginConfig>) -> Result<ComponentInfo, String>;
}

/// How to check.
#[derive(Default)]
pub struct CheckOptions<'a> {
    /// Where kinds are looked up; [`BuiltinKinds`] when `None` (offline).
    pub kinds: Option<&'a dyn KindResolver>,
    /// Validates components; when `None`, components are only read and hashed.
    pub components: Option<&'a dyn ComponentValidator>,
    /// Defaults for plugin TOMLs checked without a host TOML.
    pub defaults: PluginDefaults,
    /// Told what is being checked, for a progress display.
    pub progress: Option<&'a dyn CheckProgress>,
}

/// What `check` is doing, for a progress display: plugins are announced before they are
/// checked (a directory's all at once), then each one starts and ends.
pub trait CheckProgress {
    /// `count` more plugins will be checked.
    fn planned(&self, count: usize);
    /// The plugin of `toml` is being checked (its component compiled and instantiated).
    fn started(&self, toml: &Path);
    /// The plugin of `toml` is checked (passed or not).
    fn finished(&self, toml: &Path);
}

/// One plugin that passed.
#[derive(Clone, Debug)]
pub struct CheckedPlugin {
    pub config: PluginConfig,
    /// `None` when no validator was given (only hashed) or the component was not checked.
    pub component: Option<ComponentInfo>,
    /// Short content hash of the `.wasm`.
    pub version: String,
}

/// The outcome of `wasmctrl check`.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub hosts: Vec<HostConfig>,
    pub plugins: Vec<CheckedPlugin>,
    /// Components checked on their own (a `.wasm` path without a TOML next to it).
    pub components: Vec<(PathBuf, ComponentInfo)>,
    pub errors: ConfigErrors,
    /// Not errors, but probably not what was meant (a `.wasm` no TOML uses, ...).
    pub warnings: Vec<String>,
    /// Plugin TOMLs already checked (canonical paths).
    checked: std::collections::HashSet<PathBuf>,
}

impl CheckReport {
    /// True when nothing failed.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }

    /// Human-readable: errors first, then warnings, then what would run.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if !self.errors.is_empty() {
            let _ = writeln!(out, "{}", self.errors);
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        for h in &self.hosts {
            let path = h.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
            let cluster = match &h.cluster {
                crate::config::ClusterConfig::Embedded { .. } => "embedded dev cluster".to_owned(),
                crate::config::ClusterConfig::Kubeconfig { path, context } => format!(
                    "kubeconfig {}{}",
                    path.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "(default)".into()),
                    context.as_deref().map(|c| format!(" context {c}")).unwrap_or_default()
                ),
                crate::config::ClusterConfig::InCluster => "in-cluster service account".to_owned(),
            };
            let _ = writeln!(
                out,
                "host {path}: {cluster}; plugins in {}; serving on {}{}",
                h.plugins_dir.display(),
                h.server_address,
                if h.leader_election.is_some() { "; leader election on" } else { "" }
            );
        }
        for p in &self.plugins {
            out.push_str(&describe_plugin(p));
        }
        for (path, c) in &self.components {
            let _ = writeln!(out, "component {}: version {}, world {}", path.display(), c.version, c.world);
        }
        if self.ok() {
            let _ = writeln!(
                out,
                "ok: {} plugin{} would run",
                self.plugins.len(),
                if self.plugins.len() == 1 { "" } else { "s" }
            );
        }
        out
    }
}

fn describe_source(s: &WatchSource) -> String {
    let mut d = s.kind.to_string();
    d.push_str(&format!(
        " in {}",
        s.namespace.as_deref().map_or("all namespaces".to_owned(), |n| format!("namespace {n}"))
    ));
    if let Some(l) = &s.label_selector {
        d.push_str(&format!(", labels {l}"));
    }
    if let Some(f) = &s.field_selector {
        d.push_str(&format!(", fields {f}"));
    }
    if !s.indexes.is_empty() {
        d.push_str(&format!(", indexes {}", s.indexes.keys().cloned().collect::<Vec<_>>().join(" ")));
    }
    d
}

fn describe_plugin(p: &CheckedPlugin) -> String {
    let c = &p.config;
    let mut out = String::new();
    let _ = writeln!(out, "plugin {} ({})", c.name, c.toml_path.display());
    let component = match &p.component {
        Some(info) => {
            format!(", world {}{}", info.world, if info.hooks.is_some() { ", init ok" } else { "" })
        }
        None => ", component not validated".to_owned(),
    };
    match &c.wasm_registry {
        Some(r) => {
            let signed =
                r.verify_key.as_ref().map_or(String::new(), |k| format!(", signed with {}", k.display()));
            let _ = writeln!(out, "  wasm     {} (pulled when the host loads it{signed})", r.reference);
        }
        None => {
            let _ = writeln!(out, "  wasm     {} version {}{component}", c.wasm_path.display(), p.version);
        }
    }
    let _ = writeln!(out, "  for      {}", describe_source(&c.for_source));
    for s in &c.owns {
        let _ = writeln!(out, "  owns     {}", describe_source(s));
    }
    for s in &c.watches {
        let _ = writeln!(out, "  watches  {}", describe_source(s));
    }
    let list =
        |v: &[crate::plugin::spec::Gvk]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    if !c.read.is_empty() {
        let _ = writeln!(out, "  read     {}", list(&c.read));
    }
    if !c.write.is_empty() {
        let _ = writeln!(out, "  write    {}", list(&c.write));
    }
    if let Some(namespaces) = &c.namespaces {
        let _ = writeln!(out, "  only in  {}", namespaces.join(", "));
    }
    for rule in &c.admission {
        let _ = writeln!(out, "  admits   {}", describe_rule(&c.name, rule));
    }
    let _ = writeln!(
        out,
        "  limits   concurrency {}, deadline {}, memory {}, max-output {}, resync {}",
        c.concurrency,
        crate::config::DurationValue(c.deadline),
        crate::config::ByteSize(c.memory),
        crate::config::ByteSize(c.max_output),
        c.resync.map_or("off".to_owned(), |r| crate::config::DurationValue(r).to_string()),
    );
    out
}

fn describe_rule(plugin: &str, r: &crate::admission::AdmissionRule) -> String {
    let mut d = format!(
        "{} {} ({}) {} on {}",
        r.webhook_type.verb(),
        r.kinds.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        r.operations.iter().map(|o| o.as_str()).collect::<Vec<_>>().join(" "),
        r.path(plugin),
        format_args!("failure policy {}, timeout {}s", r.failure_policy.as_str(), r.timeout_seconds()),
    );
    if let Some(n) = &r.namespace_selector {
        d.push_str(&format!(", namespaces {n}"));
    }
    if let Some(o) = &r.object_selector {
        d.push_str(&format!(", objects {o}"));
    }
    d
}

/// Short content hash used as a plugin's version.
pub fn version_of(wasm: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(wasm)[..6])
}

/// Checks every path; see the module docs.
pub fn check_paths(paths: &[PathBuf], options: &CheckOptions<'_>) -> CheckReport {
    let mut report = CheckReport::default();
    for path in paths {
        check_one(path, options, &mut report);
    }
    report
}

fn check_one(path: &Path, options: &CheckOptions<'_>, report: &mut CheckReport) {
    if path.is_dir() {
        check_plugins_dir(path, &options.defaults, options, report);
        return;
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("wasm") => {
            let toml = path.with_extension("toml");
            if toml.is_file() {
                if let Some(p) = options.progress {
                    p.planned(1);
                }
                check_plugin(&toml, &options.defaults, options, report);
            } else {
                match read_settled(path) {
                    Ok((bytes, _)) => match options.components {
                        Some(v) => match v.validate(&bytes, None) {
                            Ok(info) => report.components.push((path.to_path_buf(), info)),
                            Err(e) => report
                                .errors
                                .push(ConfigError::file_level(path, format!("invalid component: {e}"))),
                        },
                        None => report.warnings.push(format!(
                            "{}: read {} bytes (version {}); no runtime to validate it",
                            path.display(),
                            bytes.len(),
                            version_of(&bytes)
                        )),
                    },
                    Err(e) => report.errors.push(ConfigError::file_level(path, format!("cannot read: {e}"))),
                }
            }
        }
        Some("toml") => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    report.errors.push(ConfigError::file_level(path, format!("cannot read: {e}")));
                    return;
                }
            };
            if is_plugin_toml(&text) {
                if let Some(p) = options.progress {
                    p.planned(1);
                }
                check_plugin(path, &options.defaults, options, report);
            } else {
                match HostConfig::parse(path, &text) {
                    Ok(host) => {
                        check_oci_files(path, &host, report);
                        let dir = host.plugins_dir.clone();
                        let defaults = host.plugin_defaults.clone();
                        report.hosts.push(host);
                        if dir.is_dir() {
                            check_plugins_dir(&dir, &defaults, options, report);
                        } else {
                            report.errors.push(
                                ConfigError::file_level(
                                    path,
                                    format!("plugins directory {} does not exist", dir.display()),
                                )
                                .with_field("plugins-dir"),
                            );
                        }
                    }
                    Err(errs) => report.errors.0.extend(errs.0),
                }
            }
        }
        _ => report.errors.push(ConfigError::file_level(
            path,
            if path.exists() {
                "not a directory, `.toml` or `.wasm` file".to_owned()
            } else {
                "no such file or directory".to_owned()
            },
        )),
    }
}

/// The files `[oci]` names: the key parses, the credentials are a Docker config.json, the
/// CAs can be read (what `wasmctrl run` would otherwise fail on at start or at a pull).
fn check_oci_files(path: &Path, host: &HostConfig, report: &mut CheckReport) {
    let o = &host.oci;
    if let Some(key) = &o.verify_key
        && let Err(e) = crate::oci::VerifyKey::load(key)
    {
        report.errors.push(ConfigError::file_level(path, e.to_string()).with_field("oci.verify-key"));
    }
    if let Some(creds) = &o.credentials {
        let parsed = std::fs::read(creds)
            .map_err(|e| format!("registry credentials {}: {e}", creds.display()))
            .and_then(|text| {
                crate::oci::credentials::RegistryCredentials::parse(creds, &text).map_err(|e| e.to_string())
            });
        if let Err(e) = parsed {
            report.errors.push(ConfigError::file_level(path, e).with_field("oci.credentials"));
        }
    }
    for ca in &o.ca_certificates {
        if let Err(e) = std::fs::read(ca) {
            report.errors.push(
                ConfigError::file_level(path, format!("CA certificates {}: {e}", ca.display()))
                    .with_field("oci.ca-certificates"),
            );
        }
    }
}

/// A plugin TOML has a `[for]` table; a host TOML never does.
fn is_plugin_toml(text: &str) -> bool {
    match text.parse::<toml::Table>() {
        Ok(t) => t.contains_key("for"),
        // Unparsable: guess from the text so the right parser reports the error.
        Err(_) => text
            .lines()
            .any(|l| l.trim_start().starts_with("[for]") || l.trim_start().starts_with("api-version")),
    }
}

fn check_plugins_dir(
    dir: &Path,
    defaults: &PluginDefaults,
    options: &CheckOptions<'_>,
    report: &mut CheckReport,
) {
    let tomls = match plugin_tomls(dir) {
        Ok(t) => t,
        Err(e) => {
            report.errors.push(ConfigError::file_level(dir, format!("cannot list plugins directory: {e}")));
            return;
        }
    };
    if tomls.is_empty() {
        report.warnings.push(format!("{}: no plugin TOMLs", dir.display()));
    }
    let first_plugin = report.plugins.len();
    if let Some(p) = options.progress {
        p.planned(tomls.len());
    }
    for toml in &tomls {
        check_plugin(toml, defaults, options, report);
    }
    // Names must be unique within a directory (they name controllers and metrics).
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut duplicates = Vec::new();
    for (i, p) in report.plugins.iter().enumerate().skip(first_plugin) {
        if let Some(first) = seen.get(&p.config.name) {
            duplicates.push((i, first.clone()));
        } else {
            seen.insert(p.config.name.clone(), p.config.toml_path.clone());
        }
    }
    for (i, first) in duplicates.iter().rev() {
        let p = report.plugins.remove(*i);
        report.errors.push(
            p.config
                .field_error(
                    "name",
                    format!("plugin name `{}` is already used by {}", p.config.name, first.display()),
                )
                .with_hint("each plugin in a directory needs its own name"),
        );
    }
    // Field managers too: a plugin writes only as its own manager.
    let mut clashes = Vec::new();
    for (i, p) in report.plugins.iter().enumerate().skip(first_plugin) {
        let earlier = report.plugins[first_plugin..i]
            .iter()
            .find(|q| field_managers_overlap(&q.config.field_manager, &p.config.field_manager));
        if let Some(q) = earlier {
            clashes.push((i, q.config.field_manager.clone(), q.config.toml_path.clone()));
        }
    }
    for (i, theirs, path) in clashes.iter().rev() {
        let p = report.plugins.remove(*i);
        report.errors.push(
            p.config
                .field_error(
                    "field-manager",
                    format!(
                        "field manager `{}` overlaps `{theirs}`, the field manager of {}: a plugin writes only as its own manager",
                        p.config.field_manager,
                        path.display()
                    ),
                )
                .with_hint("give each plugin a field manager of its own (the default, `wasmctrl-<name>`, is)"),
        );
    }
    // A component no TOML refers to does nothing: probably a missing TOML.
    if let Ok(wasms) = wasm_files(dir) {
        for w in wasms {
            let used = report.plugins.iter().any(|p| p.config.wasm_path == w)
                || tomls.iter().any(|t| t.with_extension("wasm") == w);
            if !used {
                report.warnings.push(format!("{}: no plugin TOML uses this component", w.display()));
            }
        }
    }
}

/// Parses, checks kinds, reads and validates the component, checks hooks. Adds the plugin
/// or its errors to `report`.
fn check_plugin(
    toml: &Path,
    defaults: &PluginDefaults,
    options: &CheckOptions<'_>,
    report: &mut CheckReport,
) {
    // A plugin named twice (a host TOML and its plugins directory, say) is checked once.
    let canonical = std::fs::canonicalize(toml).unwrap_or_else(|_| toml.to_path_buf());
    if let Some(p) = options.progress {
        p.started(toml);
    }
    if report.checked.insert(canonical) {
        match validate_plugin(toml, defaults, options.kinds.unwrap_or(&BuiltinKinds), options.components) {
            Ok(p) => report.plugins.push(p),
            Err(errs) => report.errors.0.extend(errs.0),
        }
    }
    if let Some(p) = options.progress {
        p.finished(toml);
    }
}

/// The validation the manager applies before starting a plugin, as one function.
pub fn validate_plugin(
    toml: &Path,
    defaults: &PluginDefaults,
    kinds: &dyn KindResolver,
    components: Option<&dyn ComponentValidator>,
) -> Result<CheckedPlugin, ConfigErrors> {
    let config = PluginConfig::load(toml, defaults)?;
    config.check_kinds(kinds)?;
    if let Some(registry) = &config.wasm_registry {
        // Offline: the component is pulled (and validated) when the host loads the plugin;
        // its key, if any, is checked here.
        if let Some(key) = &registry.verify_key {
            crate::oci::VerifyKey::load(key).map_err(|e| config.field_error("verify-key", e.to_string()))?;
        }
        let version = registry.reference.digest().map_or_else(|| "(tag)".to_owned(), |d| d.short());
        return Ok(CheckedPlugin { config, component: None, version });
    }
    let bytes = match read_settled(&config.wasm_path) {
        Ok((b, _)) => b,
        Err(e) => {
            let field = if config.file.wasm.is_some() { "wasm" } else { "name" };
            let mut err = if config.file.wasm.is_some() {
                config.field_error(field, format!("cannot read {}: {e}", config.wasm_path.display()))
            } else {
                ConfigError::file_level(toml, format!("cannot read {}: {e}", config.wasm_path.display()))
                    .with_field("wasm")
            };
            err.hint = Some("put the component next to the TOML, or set `wasm = \"file.wasm\"`".into());
            return Err(err.into());
        }
    };
    let version = version_of(&bytes);
    let component = match components {
        Some(v) => {
            let info = v.validate(&bytes, Some(&config)).map_err(|e| {
                ConfigErrors::from(ConfigError::file_level(
                    &config.wasm_path,
                    format!("invalid component: {e}"),
                ))
            })?;
            if let Some(h) = info.hooks {
                config.check_hooks(h.map, h.filter)?;
            }
            config.check_admission_exports(info.admission)?;
            Some(info)
        }
        None => None,
    };
    Ok(CheckedPlugin { config, component, version })
}

/// Validates components with the host's plugin engine: compiles (through the compile
/// cache when the engine has one), checks the component fits the `plugin` world, and — when
/// the plugin's TOML is known — instantiates it and runs `init` with its settings (no cluster
/// access: imports answer `unavailable`), which also tells which optional hooks it declares.
pub struct EngineValidator(pub crate::plugin::PluginEngine);

impl ComponentValidator for EngineValidator {
    fn validate(&self, wasm: &[u8], plugin: Option<&PluginConfig>) -> Result<ComponentInfo, String> {
        let report = crate::plugin::inspect_component(&self.0, wasm).map_err(|e| e.to_string())?;
        report.fits.clone()?;
        let hooks = match plugin {
            Some(config) => {
                let loaded = crate::plugin::Plugin::load(
                    &self.0,
                    config.to_plugin_spec(),
                    wasm,
                    crate::plugin::PluginEnv::default(),
                )
                .map_err(|e| e.to_string())?;
                let h = loaded.hooks();
                Some(Hooks { map: h.map, filter: h.filter })
            }
            None => None,
        };
        Ok(ComponentInfo {
            version: version_of(wasm),
            world: report.world.clone().unwrap_or_else(|| "(unknown)".into()),
            hooks,
            admission: report.admission,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[derive(Default)]
    struct Recorded(RefCell<Vec<String>>);

    impl CheckProgress for Recorded {
        fn planned(&self, count: usize) {
            self.0.borrow_mut().push(format!("planned {count}"));
        }
        fn started(&self, toml: &Path) {
            self.0
                .borrow_mut()
                .push(format!("started {}", toml.file_name().unwrap_or_default().to_string_lossy()));
        }
        fn finished(&self, toml: &Path) {
            self.0
                .borrow_mut()
                .push(format!("finished {}", toml.file_name().unwrap_or_default().to_string_lossy()));
        }
    }

    #[test]
    fn progress_hears_of_each_plugin_of_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b"] {
            std::fs::write(
                dir.path().join(format!("{name}.toml")),
                "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n",
            )
            .unwrap();
        }
        let progress = Recorded::default();
        let options = CheckOptions { progress: Some(&progress), ..CheckOptions::default() };
        let report = check_paths(&[dir.path().to_owned()], &options);
        assert!(!report.ok(), "no .wasm next to the TOMLs");
        assert_eq!(
            *progress.0.borrow(),
            ["planned 2", "started a.toml", "finished a.toml", "started b.toml", "finished b.toml"]
        );
    }
}
