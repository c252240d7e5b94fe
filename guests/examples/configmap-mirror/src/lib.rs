//! `configmap-mirror`: copies every ConfigMap labelled `mirror=true` into the namespaces
//! listed in the plugin's `[settings] namespaces`, keeps the copies in sync, and deletes
//! them when the source goes away or loses the label.
//!
//! Kubernetes garbage collection cannot own the copies: an owner reference to an object
//! in another namespace is ignored. So each copy names its source in the annotation
//! [`SOURCE_ANNOTATION`] (`<namespace>/<name>`, indexed as `by-source` in the TOML), and
//! the source carries the finalizer [`FINALIZER`] until its copies are deleted.
//!
//! Invariants kept by `reconcile`:
//! - a copy exists in every listed namespace (other than the source's own) that exists,
//!   with exactly the source's `data`, `binaryData` and `immutable`;
//! - a ConfigMap this plugin did not create is never overwritten (Warning `NameConflict`);
//! - a copy whose source is gone, unlabelled, or whose namespace is no longer listed is
//!   deleted; a live labelled source carries the finalizer, nothing else does.

use std::collections::BTreeSet;

use serde::Deserialize;
use wasmctrl_guest::k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wasmctrl_guest::prelude::*;

/// The label that marks a source.
pub const MIRROR_LABEL: &str = "mirror";
/// Annotation on each copy: `<namespace>/<name>` of its source.
pub const SOURCE_ANNOTATION: &str = "mirror.example.com/source";
/// Label on each copy, so `kubectl get cm -l app.kubernetes.io/managed-by=configmap-mirror` finds them.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "configmap-mirror";
/// Finalizer on each source while it has copies to clean up.
pub const FINALIZER: &str = "mirror.example.com/cleanup";
/// The index (declared in the TOML) from source key to its copies.
pub const BY_SOURCE_INDEX: &str = "by-source";

/// `[settings]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct MirrorSettings {
    /// Namespaces every source is copied into.
    pub namespaces: Vec<String>,
}

/// The plugin.
pub struct Mirror {
    settings: MirrorSettings,
}

/// Whether `cm` is a mirror source (labelled `mirror=true`, and not itself a copy).
pub fn is_source(cm: &ConfigMap) -> bool {
    cm.label(MIRROR_LABEL) == Some("true") && cm.annotation(SOURCE_ANNOTATION).is_none()
}

impl MirrorSettings {
    /// The namespaces `source` is copied into: the listed ones except its own, sorted, deduplicated.
    pub fn targets_for(&self, source_namespace: &str) -> BTreeSet<&str> {
        self.namespaces.iter().map(String::as_str).filter(|ns| *ns != source_namespace).collect()
    }
}

/// The copy of `source` that belongs in `namespace`.
pub fn desired_copy(source: &ConfigMap, namespace: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: source.metadata.name.clone(),
            namespace: Some(namespace.to_owned()),
            labels: Some([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())].into()),
            annotations: Some([(SOURCE_ANNOTATION.to_owned(), source.key())].into()),
            ..Default::default()
        },
        data: source.data.clone(),
        binary_data: source.binary_data.clone(),
        immutable: source.immutable,
    }
}

/// `existing` brought in line with `source`, or `None` when it already is. Keeps whatever
/// else is on the copy (other labels and annotations, resourceVersion for the CAS).
pub fn updated_copy(existing: &ConfigMap, source: &ConfigMap) -> Option<ConfigMap> {
    let mut copy = existing.clone();
    copy.data = source.data.clone();
    copy.binary_data = source.binary_data.clone();
    copy.immutable = source.immutable;
    copy.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    copy.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SOURCE_ANNOTATION.to_owned(), source.key());
    (copy != *existing).then_some(copy)
}

/// What one sync of a source did.
#[derive(Debug, Default, PartialEq, Eq)]
struct SyncReport {
    created: Vec<String>,
    updated: Vec<String>,
    unchanged: Vec<String>,
    deleted: Vec<String>,
    conflicts: Vec<String>,
    missing_namespaces: Vec<String>,
}

impl Mirror {
    /// Brings the copies of `source` in `only` (every target namespace when `None`) in line.
    ///
    /// The source's own reconcile syncs every target and deletes stale copies; a copy's
    /// reconcile (`Some(its namespace)`) touches that copy alone. Two reconciles of different
    /// keys run side by side (`concurrency = 2`), so if a copy's reconcile synced every target
    /// it would race the source's reconcile over the other copies (both creating the same
    /// copy, each reporting half of the work).
    fn sync(&self, source: &ConfigMap, only: Option<&str>) -> Result<Action, ReconcileError> {
        let source_ns = source.namespace().unwrap_or_default();
        let name = source.name();
        let all_targets = self.settings.targets_for(source_ns);
        let targets: Vec<&str> = match only {
            Some(ns) => all_targets.iter().copied().filter(|t| *t == ns).collect(),
            None => all_targets.iter().copied().collect(),
        };
        let mut report = SyncReport::default();

        for &ns in &targets {
            match cache::get::<ConfigMap>(Some(ns), name)? {
                Some(existing) if existing.annotation(SOURCE_ANNOTATION) != Some(source.key().as_str()) => {
                    report.conflicts.push(ns.to_owned());
                }
                // An immutable copy cannot change: replace it by deleting it, the next pass re-creates it.
                Some(existing)
                    if existing.immutable == Some(true) && updated_copy(&existing, source).is_some() =>
                {
                    client::delete_with::<ConfigMap>(
                        Some(ns),
                        name,
                        &client::DeleteOptions::preconditions_of(&existing),
                    )
                    .ignore_not_found()
                    .context(format_args!("deleting immutable copy {ns}/{name}"))?;
                    report.deleted.push(ns.to_owned());
                }
                Some(existing) => match updated_copy(&existing, source) {
                    Some(update) => {
                        client::replace(&update).context(format_args!("updating copy {ns}/{name}"))?;
                        report.updated.push(ns.to_owned());
                    }
                    None => report.unchanged.push(ns.to_owned()),
                },
                None if cache::get::<Namespace>(None, ns)?.is_none() => {
                    report.missing_namespaces.push(ns.to_owned())
                }
                None => match client::create(&desired_copy(source, ns)) {
                    Ok(_) => report.created.push(ns.to_owned()),
                    // The cache was behind; the next pass (from the copy's add event) checks it.
                    Err(e) if e.is_already_exists() => report.unchanged.push(ns.to_owned()),
                    Err(e) => return Err(ReconcileError::from(e)),
                },
            }
        }

        // Copies in namespaces no longer listed (settings changed): the source's own pass.
        let stale = if only.is_none() {
            cache::by_index::<ConfigMap>(BY_SOURCE_INDEX, &source.key())?
        } else {
            Vec::new()
        };
        for copy in stale {
            let ns = copy.namespace().unwrap_or_default();
            if !all_targets.contains(ns) && is_copy_of(&copy, source) {
                client::delete::<ConfigMap>(Some(ns), name)
                    .ignore_not_found()
                    .context(format_args!("deleting stale copy {ns}/{name}"))?;
                report.deleted.push(ns.to_owned());
            }
        }

        self.record(source, &report)?;
        if !report.missing_namespaces.is_empty() {
            // The Namespace watch re-enqueues us when one appears; this is a safety net.
            return Ok(Action::RequeueAfter(std::time::Duration::from_secs(300)));
        }
        Ok(Action::Done)
    }

    fn record(&self, source: &ConfigMap, r: &SyncReport) -> Result<(), Error> {
        let key = source.key();
        if !r.created.is_empty() || !r.updated.is_empty() || !r.deleted.is_empty() {
            let note = format!(
                "copies created in [{}], updated in [{}], deleted from [{}]",
                r.created.join(", "),
                r.updated.join(", "),
                r.deleted.join(", ")
            );
            events::normal(source, "Mirrored", "Sync", &note)?;
        }
        for ns in &r.conflicts {
            events::warning(
                source,
                "NameConflict",
                "Sync",
                &format!("{ns}/{} exists and is not a copy of {key}; left untouched", source.name()),
            )?;
        }
        for ns in &r.missing_namespaces {
            events::warning(
                source,
                "NamespaceMissing",
                "Sync",
                &format!("target namespace {ns} does not exist"),
            )?;
        }
        log::info!("mirrored {}", key;
            created = r.created.join(","),
            updated = r.updated.join(","),
            unchanged = r.unchanged.join(","),
            deleted = r.deleted.join(","),
            conflicts = r.conflicts.join(","),
            missing_namespaces = r.missing_namespaces.join(","));
        Ok(())
    }

    /// Deletes every copy of `source_key` (by the `by-source` index). Returns their namespaces.
    fn delete_copies(&self, source_key: &str) -> Result<Vec<String>, ReconcileError> {
        let mut deleted = Vec::new();
        for copy in cache::by_index::<ConfigMap>(BY_SOURCE_INDEX, source_key)? {
            let ns = copy.namespace().unwrap_or_default().to_owned();
            client::delete_with::<ConfigMap>(
                Some(&ns),
                copy.name(),
                &client::DeleteOptions { uid: copy.uid().map(Into::into), ..Default::default() },
            )
            .ignore_not_found()
            .context(format_args!("deleting copy {ns}/{}", copy.name()))?;
            deleted.push(ns);
        }
        Ok(deleted)
    }

    /// The source is being deleted or lost its label: delete its copies, then let it go.
    fn cleanup(&self, source: &ConfigMap) -> Result<Action, ReconcileError> {
        let deleted = self.delete_copies(&source.key())?;
        if finalizer::has(source, FINALIZER) {
            if !deleted.is_empty() {
                events::normal(
                    source,
                    "CopiesDeleted",
                    "Cleanup",
                    &format!("deleted copies in [{}]", deleted.join(", ")),
                )?;
            }
            finalizer::ensure_removed(source, FINALIZER).context("removing finalizer")?;
        }
        if !deleted.is_empty() || finalizer::has(source, FINALIZER) {
            log::info!("cleaned up copies of {}", source.key(); deleted = deleted.join(","), deleting = source.is_being_deleted());
        }
        Ok(Action::Done)
    }

    /// A copy changed (or was re-listed): bring it in line with its source, or delete it if
    /// the source no longer wants it.
    fn reconcile_copy(&self, copy: &ConfigMap, source_key: &str) -> Result<Action, ReconcileError> {
        let (source_ns, source_name) = source_key.split_once('/').unwrap_or(("", source_key));
        match cache::get::<ConfigMap>(Some(source_ns), source_name)? {
            Some(source)
                if is_source(&source)
                    && !source.is_being_deleted()
                    && source.name() == copy.name()
                    && self
                        .settings
                        .targets_for(source_ns)
                        .contains(copy.namespace().unwrap_or_default()) =>
            {
                self.sync(&source, copy.namespace())
            }
            _ => {
                let ns = copy.namespace().unwrap_or_default();
                client::delete_with::<ConfigMap>(
                    Some(ns),
                    copy.name(),
                    &client::DeleteOptions { uid: copy.uid().map(Into::into), ..Default::default() },
                )
                .ignore_not_found()
                .context(format_args!("deleting orphaned copy {}", copy.key()))?;
                log::info!("deleted orphaned copy {}", copy.key(); source = source_key);
                Ok(Action::Done)
            }
        }
    }

    /// Nothing in the cache under this key: a deleted source (whose copies may linger if
    /// its finalizer was removed by someone else) or a deleted copy (to re-create).
    fn reconcile_missing(&self, request: &Request) -> Result<Action, ReconcileError> {
        let key = request.key();
        let deleted = self.delete_copies(&key)?;
        if !deleted.is_empty() {
            log::info!("deleted copies of vanished source {}", key; deleted = deleted.join(","));
        }
        let Some(ns) = request.namespace.as_deref() else { return Ok(Action::Done) };
        let mut action = Action::Done;
        for source in cache::list::<ConfigMap>(None, Some("mirror=true"))? {
            if source.name() == request.name
                && is_source(&source)
                && !source.is_being_deleted()
                && self.settings.targets_for(source.namespace().unwrap_or_default()).contains(ns)
            {
                log::info!("re-creating deleted copy {}", key; source = source.key());
                action = self.sync(&source, Some(ns))?;
            }
        }
        Ok(action)
    }
}

fn is_copy_of(copy: &ConfigMap, source: &ConfigMap) -> bool {
    copy.annotation(SOURCE_ANNOTATION) == Some(source.key().as_str())
}

impl Plugin for Mirror {
    type For = ConfigMap;

    fn init(settings: Settings) -> Result<Self, InitError> {
        let settings: MirrorSettings = settings.parse()?;
        if settings.namespaces.is_empty() {
            return Err("[settings] namespaces must list at least one namespace".into());
        }
        Ok(Mirror { settings })
    }

    fn reconcile(&self, target: Target<ConfigMap>) -> Result<Action, ReconcileError> {
        let cm = match target {
            Target::Present(cm) => cm,
            Target::Gone(request) => return self.reconcile_missing(&request),
        };
        if let Some(source_key) = cm.annotation(SOURCE_ANNOTATION) {
            return if cm.label(MANAGED_BY_LABEL) == Some(MANAGED_BY) {
                self.reconcile_copy(&cm, source_key)
            } else {
                Ok(Action::Done)
            };
        }
        if !is_source(&cm) || cm.is_being_deleted() {
            // Not (or no longer) a source: only work if it left copies or our finalizer behind.
            return self.cleanup(&cm);
        }
        let source = finalizer::ensure_added(&cm, FINALIZER).context("adding finalizer")?;
        self.sync(&source, None)
    }
}

impl Map for Mirror {
    /// A Namespace appeared or changed: every source that targets it needs a pass.
    fn map(&self, kind: &Gvk, object: RawObject) -> Vec<Request> {
        if !kind.is::<Namespace>() {
            return Vec::new();
        }
        let Ok(meta) = object.meta() else { return Vec::new() };
        let ns = meta.name.unwrap_or_default();
        if !self.settings.namespaces.contains(&ns) {
            return Vec::new();
        }
        match cache::list::<ConfigMap>(None, Some("mirror=true")) {
            Ok(sources) => sources.iter().filter(|s| is_source(s)).map(Request::for_object).collect(),
            Err(e) => {
                log::warn!("listing mirror sources failed"; namespace = ns, error = e);
                Vec::new()
            }
        }
    }
}

wasmctrl_guest::export_plugin!(Mirror);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;
    use wasmctrl_guest::serde_json::json;
    use wasmctrl_guest::testing::{Failure, Op, TestHost, Write};

    fn source(ns: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                uid: Some("uid-1".into()),
                labels: Some(
                    [("mirror".to_string(), "true".to_string()), ("app".into(), "web".into())].into(),
                ),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()),
            ..Default::default()
        }
    }

    #[test]
    fn targets_skip_the_source_namespace_and_dedup() {
        let s = MirrorSettings {
            namespaces: vec!["team-a".into(), "default".into(), "team-b".into(), "team-a".into()],
        };
        assert_eq!(s.targets_for("default").into_iter().collect::<Vec<_>>(), ["team-a", "team-b"]);
    }

    #[test]
    fn copy_carries_data_and_points_at_source_but_not_the_mirror_label() {
        let src = source("default", "app-config", &[("color", "blue")]);
        let copy = desired_copy(&src, "team-a");
        assert_eq!(copy.key(), "team-a/app-config");
        assert_eq!(copy.data, src.data);
        assert_eq!(copy.annotation(SOURCE_ANNOTATION), Some("default/app-config"));
        assert_eq!(copy.label(MANAGED_BY_LABEL), Some(MANAGED_BY));
        // A copy labelled mirror=true would itself be mirrored.
        assert_eq!(copy.label(MIRROR_LABEL), None);
        assert!(!is_source(&copy));
        // No owner reference: they cannot cross namespaces.
        assert!(copy.metadata.owner_references.is_none());
        assert!(is_source(&src));
    }

    #[test]
    fn updated_copy_only_when_data_differs_and_keeps_foreign_metadata() {
        let src = source("default", "app-config", &[("color", "blue")]);
        let mut existing = desired_copy(&src, "team-a");
        existing.metadata.resource_version = Some("7".into());
        existing.metadata.labels.as_mut().unwrap().insert("extra".into(), "kept".into());
        assert_eq!(updated_copy(&existing, &src), None);

        let changed = source("default", "app-config", &[("color", "green")]);
        let update = updated_copy(&existing, &changed).unwrap();
        assert_eq!(update.data.as_ref().unwrap()["color"], "green");
        assert_eq!(update.label("extra"), Some("kept"));
        assert_eq!(update.metadata.resource_version.as_deref(), Some("7"));

        // A key removed from the source is removed from the copy.
        let fewer = source("default", "app-config", &[]);
        assert!(updated_copy(&existing, &fewer).unwrap().data.unwrap().is_empty());
    }

    #[test]
    fn settings_require_namespaces() {
        assert!(Mirror::init(Settings::from_json(br#"{"namespaces":[]}"#.to_vec())).is_err());
        assert!(Mirror::init(Settings::from_json(br#"{"namespaces":["a"],"typo":1}"#.to_vec())).is_err());
        assert!(Mirror::init(Settings::from_json(br#"{"namespaces":["a"]}"#.to_vec())).is_ok());
    }

    /// A host with the plugin's TOML: settings and the `by-source` index.
    fn host() -> TestHost {
        let host = TestHost::new();
        host.set_settings(json!({"namespaces": ["team-a", "team-b"]}));
        host.add_index::<ConfigMap>(BY_SOURCE_INDEX, |cm| {
            cm.annotation(SOURCE_ANNOTATION).map(str::to_owned).into_iter().collect()
        });
        host
    }

    fn namespace(name: &str) -> Namespace {
        Namespace {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn reconcile_adds_the_finalizer_copies_and_then_settles() {
        let host = host();
        host.add(&namespace("team-a")).unwrap();
        host.add(&source("default", "app-config", &[("color", "blue")])).unwrap();
        let plugin = host.init::<Mirror>().unwrap();
        let request = Request::new(Some("default"), "app-config");

        // team-b does not exist yet: one copy, a Warning, and a safety-net requeue.
        assert_eq!(plugin.reconcile(request.clone()), Ok(Action::RequeueAfter(Duration::from_secs(300))));
        let writes = host.take_writes();
        let verbs: Vec<(&str, String)> = writes.iter().map(|w| (w.verb(), w.key())).collect();
        assert_eq!(verbs, [("patch", "default/app-config".into()), ("create", "team-a/app-config".into())]);
        let copy: ConfigMap = writes[1].object().unwrap();
        assert_eq!(copy.annotation(SOURCE_ANNOTATION), Some("default/app-config"));
        let stored: ConfigMap = host.server_get(Some("default"), "app-config").unwrap();
        assert!(finalizer::has(&stored, FINALIZER));
        let reasons: Vec<String> = host.take_events().into_iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["Mirrored", "NamespaceMissing"]);
        let log = host.logs().into_iter().find(|l| l.message == "mirrored default/app-config").unwrap();
        assert_eq!(log.field("created"), Some("team-a"));
        assert_eq!(log.field("missing_namespaces"), Some("team-b"));

        // The namespace appears; once the cache caught up, the next pass creates the
        // second copy and nothing else.
        host.add(&namespace("team-b")).unwrap();
        host.sync_cache();
        assert_eq!(plugin.reconcile(request.clone()), Ok(Action::Done));
        let verbs: Vec<(&str, String)> = host.take_writes().iter().map(|w| (w.verb(), w.key())).collect();
        assert_eq!(verbs, [("create", "team-b/app-config".into())]);
        host.sync_cache();
        assert_eq!(plugin.reconcile(request), Ok(Action::Done));
        assert!(host.writes().is_empty(), "{:?}", host.writes());
    }

    #[test]
    fn a_vanished_source_takes_its_copies_with_it() {
        let host = host();
        host.add(&namespace("team-a")).unwrap();
        let mut copy = desired_copy(&source("default", "app-config", &[]), "team-a");
        copy.metadata.uid = Some("copy-uid".into());
        host.add(&copy).unwrap();
        let plugin = host.init::<Mirror>().unwrap();

        // The source is not in the cache: the plugin gets `Target::Gone`.
        assert_eq!(plugin.reconcile(Request::new(Some("default"), "app-config")), Ok(Action::Done));
        let writes = host.writes();
        assert!(
            matches!(&writes[..], [Write::Delete { name, namespace: Some(ns), options, .. }]
                if name == "app-config" && ns == "team-a" && options.uid.as_deref() == Some("copy-uid")),
            "{writes:?}"
        );
        assert!(host.server_get::<ConfigMap>(Some("team-a"), "app-config").is_none());
    }

    #[test]
    fn host_failures_surface_as_reconcile_errors() {
        let host = host();
        host.add(&namespace("team-a")).unwrap();
        host.add(&namespace("team-b")).unwrap();
        host.add(&source("default", "app-config", &[("color", "blue")])).unwrap();
        let plugin = host.init::<Mirror>().unwrap();
        let request = Request::new(Some("default"), "app-config");

        // The API server is unavailable for creates: retry later, with context.
        host.fail(Failure::new(Op::Create, Error::Unavailable("etcd is down".into())).once());
        let err = plugin.reconcile(request.clone()).unwrap_err();
        assert!(err.is_retryable());
        assert!(err.message().contains("etcd is down"), "{err}");

        // Someone else's ConfigMap of the same name in team-a is never overwritten.
        host.sync_cache();
        host.take_writes();
        let foreign = ConfigMap {
            metadata: ObjectMeta {
                name: Some("app-config".into()),
                namespace: Some("team-a".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        host.remove::<ConfigMap>(Some("team-a"), "app-config");
        host.add(&foreign).unwrap();
        assert_eq!(plugin.reconcile(request), Ok(Action::Done));
        let events = host.events();
        assert!(
            events.iter().any(|e| e.reason == "NameConflict" && e.note.contains("team-a/app-config")),
            "{events:?}"
        );
        assert!(host.writes().iter().all(|w| w.key() != "team-a/app-config"), "{:?}", host.writes());
    }
}
