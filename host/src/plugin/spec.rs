//! What the runtime needs to know about one plugin, independent of where it came from.
//!
//! The config module maps a plugin TOML onto [`PluginSpec`]; tests build one by hand.
//! Invariants: every limit is non-zero once [`SandboxLimits::normalized`] ran;
//! `v1/Secret` is readable only when listed in the plugin's explicit `read` permissions; a
//! plugin limited to namespaces ([`Permissions::with_namespaces`]) is in scope only there;
//! a field manager is the plugin's own only when it is its manager or `<manager>/<suffix>`
//! ([`owns_field_manager`]).

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;

/// A kind as a manifest writes it: `apiVersion` + `kind` (`apps/v1` + `Deployment`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    /// `v1`, `apps/v1`, `example.com/v1alpha1`.
    pub api_version: String,
    /// `ConfigMap`, `Deployment`.
    pub kind: String,
}

impl Gvk {
    /// Builds a kind from `apiVersion` and `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Gvk { api_version: api_version.into(), kind: kind.into() }
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    /// The version (`v1`).
    pub fn version(&self) -> &str {
        self.api_version.rsplit_once('/').map_or(&self.api_version, |(_, version)| version)
    }

    /// Whether this is the core `v1/Secret` kind, which is never readable undeclared.
    pub fn is_secret(&self) -> bool {
        self.api_version == "v1" && self.kind == "Secret"
    }

    /// Parses the TOML form `"<apiVersion>/<Kind>"` (`"v1/Secret"`, `"apps/v1/Deployment"`).
    pub fn parse(text: &str) -> Option<Self> {
        let (api_version, kind) = text.rsplit_once('/')?;
        if api_version.is_empty() || kind.is_empty() {
            return None;
        }
        Some(Gvk::new(api_version, kind))
    }
}

impl fmt::Display for Gvk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// Which kinds a plugin may read (cache and live `client.get`), write and admit, and in
/// which namespaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permissions {
    readable: BTreeSet<Gvk>,
    writable: BTreeSet<Gvk>,
    /// `None`: every namespace.
    namespaces: Option<BTreeSet<String>>,
    /// Kinds whose admission requests the plugin may receive (its `[[admission]]` kinds).
    admitted: BTreeSet<Gvk>,
}

impl Permissions {
    /// Permissions from a plugin's declarations: `watched` are the kinds of `for`, `owns`
    /// and `watches`; `read` and `write` are its `[permissions]`. A Secret is readable only
    /// when it is in `read` (watching Secrets does not grant reading them).
    pub fn new(
        watched: impl IntoIterator<Item = Gvk>,
        read: impl IntoIterator<Item = Gvk>,
        write: impl IntoIterator<Item = Gvk>,
    ) -> Self {
        let mut readable: BTreeSet<Gvk> = watched.into_iter().filter(|g| !g.is_secret()).collect();
        readable.extend(read);
        Permissions {
            readable,
            writable: write.into_iter().collect(),
            namespaces: None,
            admitted: BTreeSet::new(),
        }
    }

    /// These permissions limited to `namespaces`: objects of namespaced kinds elsewhere are
    /// neither read nor written, and no cluster-scoped object is written.
    pub fn with_namespaces(mut self, namespaces: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.namespaces = Some(namespaces.into_iter().map(Into::into).collect());
        self
    }

    /// The namespaces the plugin is limited to; `None` for every namespace.
    pub fn namespaces(&self) -> Option<&BTreeSet<String>> {
        self.namespaces.as_ref()
    }

    /// Whether an object in `namespace` (`None`: a cluster-scoped object) is in the
    /// plugin's scope. Cluster-scoped objects are in every plugin's scope for reading.
    pub fn in_scope(&self, namespace: Option<&str>) -> bool {
        match (namespace, &self.namespaces) {
            (_, None) | (None, _) => true,
            (Some(ns), Some(scope)) => scope.contains(ns),
        }
    }

    /// These permissions, also admitting `kinds` (the kinds of its `[[admission]]` sections).
    pub fn admitting(mut self, kinds: impl IntoIterator<Item = Gvk>) -> Self {
        self.admitted.extend(kinds);
        self
    }

    /// Whether admission requests for objects of `kind` may reach the plugin: a kind its
    /// `[[admission]]` sections name, and a Secret only when it may also read Secrets.
    pub fn can_admit(&self, kind: &Gvk) -> bool {
        self.admitted.contains(kind) && (!kind.is_secret() || self.can_read(kind))
    }

    /// Whether `kind` is among the `[[admission]]` kinds (whatever else it needs).
    pub fn lists_admitted(&self, kind: &Gvk) -> bool {
        self.admitted.contains(kind)
    }

    /// Whether the plugin may read objects of `kind`.
    pub fn can_read(&self, kind: &Gvk) -> bool {
        self.readable.contains(kind)
    }

    /// Whether the plugin may create, update, patch or delete objects of `kind`.
    pub fn can_write(&self, kind: &Gvk) -> bool {
        self.writable.contains(kind)
    }

    /// The readable kinds (each needs a cache).
    pub fn readable(&self) -> impl Iterator<Item = &Gvk> {
        self.readable.iter()
    }

    /// The writable kinds.
    pub fn writable(&self) -> impl Iterator<Item = &Gvk> {
        self.writable.iter()
    }
}

/// Whether `requested` is a field manager a plugin whose own manager is `own` may use:
/// `own` itself, or `own` followed by `/` and a suffix (`wasmctrl-mirror/status`). Plugin
/// names are DNS labels, so no other plugin's default manager has this form.
pub fn owns_field_manager(own: &str, requested: &str) -> bool {
    requested == own
        || requested.strip_prefix(own).and_then(|r| r.strip_prefix('/')).is_some_and(|s| !s.is_empty())
}

/// Whether two plugins' field managers overlap: one could write as the other.
pub fn field_managers_overlap(a: &str, b: &str) -> bool {
    a == b || owns_field_manager(a, b) || owns_field_manager(b, a)
}

/// Per-plugin sandbox limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall-clock budget of one call into the plugin (epoch interruption).
    pub deadline: Duration,
    /// Maximum linear memory of one instance, in bytes.
    pub memory: usize,
    /// Maximum bytes a guest may hand back per call (returned lists and strings) or pass
    /// to one host call (object bodies, log messages).
    pub max_output: usize,
    /// Guest log lines a second (log import, stdout and stderr together) the plugin may put
    /// into the host's log, with a burst of ten seconds' worth.
    pub log_lines_per_second: u32,
    /// Maximum elements of any one table.
    pub table_elements: usize,
    /// Maximum core + component instances one plugin instance may create.
    pub instances: usize,
    /// Maximum tables one plugin instance may create.
    pub tables: usize,
    /// Maximum linear memories one plugin instance may create.
    pub memories: usize,
    /// Maximum resource handles (WASI streams, pollables, ...) one plugin instance may hold
    /// at once, in its own handle tables and in the host's resource table.
    pub handles: usize,
}

/// Guest log lines a second a plugin may log, sustained, unless its TOML (or the host's
/// `[defaults]`) says `log-lines-per-second`.
pub const DEFAULT_LOG_LINES_PER_SECOND: u32 = 1_000;

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            deadline: Duration::from_secs(5),
            memory: 64 << 20,
            max_output: 4 << 20,
            log_lines_per_second: DEFAULT_LOG_LINES_PER_SECOND,
            table_elements: 100_000,
            instances: 64,
            tables: 16,
            memories: 4,
            handles: 4096,
        }
    }
}

impl SandboxLimits {
    /// The limits with zero values replaced by the defaults (a zero limit would make
    /// every call fail).
    pub fn normalized(mut self) -> Self {
        let d = SandboxLimits::default();
        if self.deadline.is_zero() {
            self.deadline = d.deadline;
        }
        if self.log_lines_per_second == 0 {
            self.log_lines_per_second = d.log_lines_per_second;
        }
        for (value, default) in [
            (&mut self.memory, d.memory),
            (&mut self.max_output, d.max_output),
            (&mut self.table_elements, d.table_elements),
            (&mut self.instances, d.instances),
            (&mut self.tables, d.tables),
            (&mut self.memories, d.memories),
            (&mut self.handles, d.handles),
        ] {
            if *value == 0 {
                *value = default;
            }
        }
        self
    }
}

/// Everything the runtime needs to run one plugin.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// The plugin's name (metrics, logs, `config.plugin-name`).
    pub name: String,
    /// The kind whose keys `reconcile` receives.
    pub for_kind: Gvk,
    /// Instances kept for concurrent calls (the controller's max concurrent reconciles).
    pub concurrency: usize,
    /// Sandbox limits of every call and instance.
    pub limits: SandboxLimits,
    /// Kinds the plugin may read and write.
    pub permissions: Permissions,
    /// The `[settings]` table as JSON, handed to `init` and `config.settings`.
    pub settings: Bytes,
    /// Field manager of every write (server-side apply included).
    pub field_manager: String,
}

impl PluginSpec {
    /// A spec with default limits, concurrency 1, `{}` settings and field manager
    /// `wasmctrl-<name>`; `for_kind` is readable.
    pub fn new(name: impl Into<String>, for_kind: Gvk) -> Self {
        let name = name.into();
        PluginSpec {
            field_manager: format!("wasmctrl-{name}"),
            permissions: Permissions::new([for_kind.clone()], [], []),
            name,
            for_kind,
            concurrency: 1,
            limits: SandboxLimits::default(),
            settings: Bytes::from_static(b"{}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gvk_parses_toml_form() {
        assert_eq!(Gvk::parse("v1/Secret"), Some(Gvk::new("v1", "Secret")));
        assert_eq!(Gvk::parse("apps/v1/Deployment"), Some(Gvk::new("apps/v1", "Deployment")));
        assert_eq!(Gvk::parse("Secret"), None);
        assert_eq!(Gvk::new("apps/v1", "Deployment").group(), "apps");
        assert_eq!(Gvk::new("v1", "Pod").group(), "");
        assert_eq!(Gvk::new("v1", "Pod").version(), "v1");
    }

    #[test]
    fn watched_secrets_are_not_readable_unless_declared() {
        let secret = Gvk::new("v1", "Secret");
        let cm = Gvk::new("v1", "ConfigMap");
        let p = Permissions::new([secret.clone(), cm.clone()], [], []);
        assert!(!p.can_read(&secret));
        assert!(p.can_read(&cm));
        let p = Permissions::new([secret.clone()], [secret.clone()], []);
        assert!(p.can_read(&secret));
        assert!(!p.can_write(&secret));
    }

    #[test]
    fn namespaces_limit_the_scope_but_not_cluster_scoped_objects() {
        let p = Permissions::new([Gvk::new("v1", "ConfigMap")], [], []);
        assert!(p.in_scope(Some("any")) && p.namespaces().is_none());
        let p = p.with_namespaces(["team-a"]);
        assert!(p.in_scope(Some("team-a")));
        assert!(!p.in_scope(Some("team-b")));
        assert!(p.in_scope(None));
    }

    #[test]
    fn field_managers_are_owned_with_a_slash_suffix_only() {
        assert!(owns_field_manager("wasmctrl-a", "wasmctrl-a"));
        assert!(owns_field_manager("wasmctrl-a", "wasmctrl-a/status"));
        assert!(!owns_field_manager("wasmctrl-a", "wasmctrl-a/"));
        assert!(!owns_field_manager("wasmctrl-a", "wasmctrl-ab"));
        assert!(!owns_field_manager("wasmctrl-a", "wasmctrl-a-b"));
        assert!(!owns_field_manager("wasmctrl-a", "kubectl"));
        assert!(field_managers_overlap("wasmctrl-a/x", "wasmctrl-a"));
        assert!(!field_managers_overlap("wasmctrl-a", "wasmctrl-ab"));
    }

    #[test]
    fn only_admitted_kinds_are_admitted_and_secrets_only_when_readable() {
        let secret = Gvk::new("v1", "Secret");
        let cm = Gvk::new("v1", "ConfigMap");
        let p = Permissions::new([cm.clone()], [], []);
        assert!(!p.can_admit(&cm), "watching a kind does not admit it");
        let p = Permissions::new([], [], []).admitting([cm.clone(), secret.clone()]);
        assert!(p.can_admit(&cm));
        assert!(!p.can_admit(&secret), "a Secret needs permissions.read too");
        let p = Permissions::new([], [secret.clone()], []).admitting([secret.clone()]);
        assert!(p.can_admit(&secret));
    }

    #[test]
    fn zero_limits_normalize_to_defaults() {
        let l = SandboxLimits { memory: 0, deadline: Duration::ZERO, ..Default::default() }.normalized();
        assert_eq!(l, SandboxLimits::default());
    }
}
