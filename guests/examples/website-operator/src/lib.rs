//! `website-operator`: turns each `Website` (`example.com/v1`, a CRD) into a Deployment
//! running a web server, a Service in front of it and a ConfigMap holding its page, and
//! reports progress in the Website's `status`.
//!
//! - Children are named after the Website (`<name>` Deployment and Service,
//!   `<name>-content` ConfigMap), carry a controller owner reference to it (so the
//!   `[[owns]]` watches enqueue it when they change, and garbage collection would remove
//!   them) and are written with server-side apply only when they differ from what the
//!   Website asks for ([`diff::needs_update`]), so a steady state causes no writes.
//! - A child of that name that this Website does not control is left alone, and the
//!   Website reports `Ready=False` (`ChildConflict`).
//! - The finalizer [`FINALIZER`] makes deletion explicit: the operator deletes the
//!   children itself (and records an Event) before the Website disappears, instead of
//!   relying on background garbage collection.
//! - `status.conditions`: `Ready` (children in place and up to date) and `Available`
//!   (the Deployment reports at least `spec.replicas` available replicas);
//!   `lastTransitionTime` moves only when a condition's status flips.
//!
//! It also admits Websites (the `[[admission]]` sections of its TOML): a mutating webhook
//! fills in what the user left out ([`Mutate`]: the spec's defaults, a page naming the
//! site), and a validating one refuses what the operator could not run ([`Validate`]:
//! replicas from 0 to [`MAX_REPLICAS`], a port, an image; a `spec.host` another Website of
//! the namespace already serves, read from the operator's own cache), with warnings for the
//! doubtful (a `:latest` image, scaling to zero).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use wasmctrl_guest::k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use wasmctrl_guest::k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, PodSpec, PodTemplateSpec, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount,
};
use wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, ObjectMeta, Time,
};
use wasmctrl_guest::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use wasmctrl_guest::prelude::*;
use wasmctrl_guest::time;

/// Finalizer the operator keeps on every live Website.
pub const FINALIZER: &str = "website.example.com/cleanup";
/// Pod-template annotation holding a hash of the page, so a content change rolls the Deployment.
pub const CONTENT_HASH_ANNOTATION: &str = "website.example.com/content-hash";
/// `app.kubernetes.io/managed-by` value on every child.
pub const MANAGED_BY: &str = "website-operator";
/// The most replicas a Website may ask for.
pub const MAX_REPLICAS: i32 = 10;

/// A website: `kubectl get websites`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Website {
    /// Standard metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the user asks for.
    #[serde(default)]
    pub spec: WebsiteSpec,
    /// What the operator observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WebsiteStatus>,
}

wasmctrl_guest::impl_kind!(Website, "example.com/v1", "Website");

/// `Website.spec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WebsiteSpec {
    /// Web server image.
    pub image: String,
    /// Number of web server Pods.
    pub replicas: i32,
    /// The page served at `/` (`index.html`).
    pub content: String,
    /// Service and container port.
    pub port: i32,
    /// The host name the site is served under, unique among the namespace's Websites.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl Default for WebsiteSpec {
    fn default() -> Self {
        WebsiteSpec {
            image: "nginx:1.27-alpine".into(),
            replicas: 1,
            content: String::new(),
            port: 80,
            host: None,
        }
    }
}

/// `Website.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WebsiteStatus {
    /// `Ready` and `Available`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// In-cluster URL of the Service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Available replicas the Deployment reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
}

/// Labels on every child; the selector uses `app.kubernetes.io/instance`.
pub fn labels(site: &Website) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name".to_owned(), "website".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), site.name().to_owned()),
        ("app.kubernetes.io/managed-by".to_owned(), MANAGED_BY.to_owned()),
    ]
    .into()
}

fn child_meta(site: &Website, name: String) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: site.namespace().map(str::to_owned),
        labels: Some(labels(site)),
        owner_references: Some(vec![owner::controller_owner_ref(site)?]),
        ..Default::default()
    })
}

/// Name of the content ConfigMap.
pub fn content_name(site: &Website) -> String {
    format!("{}-content", site.name())
}

/// FNV-1a, 64 bit: a stable fingerprint of the page (no crypto needed, no extra crate).
pub fn content_hash(content: &str) -> String {
    let hash = content
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

/// The ConfigMap holding the page.
pub fn desired_configmap(site: &Website) -> Result<ConfigMap, Error> {
    Ok(ConfigMap {
        metadata: child_meta(site, content_name(site))?,
        data: Some([("index.html".to_owned(), site.spec.content.clone())].into()),
        ..Default::default()
    })
}

/// The Deployment running the web server with the page mounted.
pub fn desired_deployment(site: &Website) -> Result<Deployment, Error> {
    let selector: BTreeMap<String, String> =
        [("app.kubernetes.io/instance".to_owned(), site.name().to_owned())].into();
    Ok(Deployment {
        metadata: child_meta(site, site.name().to_owned())?,
        spec: DeploymentSpec {
            replicas: Some(site.spec.replicas),
            selector: LabelSelector { match_labels: Some(selector), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(site)),
                    annotations: Some(
                        [(CONTENT_HASH_ANNOTATION.to_owned(), content_hash(&site.spec.content))].into(),
                    ),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "web".into(),
                        image: Some(site.spec.image.clone()),
                        ports: Some(vec![ContainerPort {
                            name: Some("http".into()),
                            container_port: site.spec.port,
                            ..Default::default()
                        }]),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "content".into(),
                            mount_path: "/usr/share/nginx/html".into(),
                            read_only: Some(true),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "content".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: content_name(site),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        ..Default::default()
    })
}

/// The Service in front of the Deployment.
pub fn desired_service(site: &Website) -> Result<Service, Error> {
    Ok(Service {
        metadata: child_meta(site, site.name().to_owned())?,
        spec: Some(ServiceSpec {
            selector: Some([("app.kubernetes.io/instance".to_owned(), site.name().to_owned())].into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: site.spec.port,
                target_port: Some(IntOrString::String("http".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// What applying one child did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildOutcome {
    /// Created or changed.
    Applied,
    /// Already as desired.
    Unchanged,
    /// A same-named object not controlled by this Website exists.
    Conflict,
}

/// Decides what to do about one child given what the cache holds (pure).
pub fn plan_child<K: Kind>(site: &Website, existing: Option<&K>, desired: &K) -> Result<ChildOutcome, Error> {
    match existing {
        None => Ok(ChildOutcome::Applied),
        Some(existing) if !owner::is_controlled_by(existing, site) => Ok(ChildOutcome::Conflict),
        Some(existing) if diff::needs_update(existing, desired)? => Ok(ChildOutcome::Applied),
        Some(_) => Ok(ChildOutcome::Unchanged),
    }
}

/// The status the Website should have, given the outcome of applying its children and
/// the Deployment as last seen (pure; `now` is only used for condition transitions).
pub fn desired_status(
    site: &Website,
    outcomes: &[(&str, ChildOutcome)],
    deployment: Option<&Deployment>,
    now: &Time,
) -> WebsiteStatus {
    let mut status = site.status.clone().unwrap_or_default();
    let generation = site.meta().generation;
    let conflicts: Vec<&str> =
        outcomes.iter().filter(|(_, o)| *o == ChildOutcome::Conflict).map(|(kind, _)| *kind).collect();
    let ready = if conflicts.is_empty() {
        conditions::new(
            "Ready",
            true,
            "Reconciled",
            "Deployment, Service and ConfigMap are up to date",
            generation,
        )
    } else {
        conditions::new(
            "Ready",
            false,
            "ChildConflict",
            format!("{} named after this Website exist and are not controlled by it", conflicts.join(", ")),
            generation,
        )
    };
    conditions::set(&mut status.conditions, ready, now);

    let available_replicas =
        deployment.and_then(|d| d.status.as_ref()).and_then(|s| s.available_replicas).unwrap_or(0);
    let available = if available_replicas >= site.spec.replicas {
        conditions::new(
            "Available",
            true,
            "MinimumReplicasAvailable",
            format!("{available_replicas}/{} replicas available", site.spec.replicas),
            generation,
        )
    } else {
        conditions::new(
            "Available",
            false,
            "ReplicasUnavailable",
            format!("{available_replicas}/{} replicas available", site.spec.replicas),
            generation,
        )
    };
    conditions::set(&mut status.conditions, available, now);

    status.observed_generation = generation;
    status.available_replicas = Some(available_replicas);
    status.url = Some(format!(
        "http://{}.{}.svc.cluster.local:{}",
        site.name(),
        site.namespace().unwrap_or("default"),
        site.spec.port
    ));
    status
}

/// The plugin.
pub struct WebsiteOperator;

fn apply_child<K: Kind + Clone>(site: &Website, desired: K) -> Result<ChildOutcome, ReconcileError> {
    let existing = cache::get::<K>(desired.namespace(), desired.name())?;
    let outcome = plan_child(site, existing.as_ref(), &desired)?;
    if outcome == ChildOutcome::Applied {
        client::apply(&desired, &client::ApplyParams::force()).context(format_args!(
            "applying {} {}",
            K::KIND,
            desired.key()
        ))?;
    }
    Ok(outcome)
}

impl WebsiteOperator {
    fn apply(&self, site: Website) -> Result<Action, ReconcileError> {
        let deployment = desired_deployment(&site)?;
        let outcomes = [
            ("ConfigMap", apply_child(&site, desired_configmap(&site)?)?),
            ("Deployment", apply_child(&site, deployment.clone())?),
            ("Service", apply_child(&site, desired_service(&site)?)?),
        ];
        let live_deployment = cache::get::<Deployment>(site.namespace(), site.name())?;
        let status = desired_status(&site, &outcomes, live_deployment.as_ref(), &time::now());

        let applied: Vec<&str> =
            outcomes.iter().filter(|(_, o)| *o == ChildOutcome::Applied).map(|(k, _)| *k).collect();
        if !applied.is_empty() {
            events::normal(&site, "Applied", "Apply", &format!("applied {}", applied.join(", ")))?;
        }
        for (kind, _) in outcomes.iter().filter(|(_, o)| *o == ChildOutcome::Conflict) {
            events::warning(
                &site,
                "ChildConflict",
                "Apply",
                &format!("{kind} {} exists and is not controlled by this Website", site.key()),
            )?;
        }

        let status_changed = site.status.as_ref() != Some(&status);
        if status_changed {
            let mut updated = site.clone();
            updated.status = Some(status.clone());
            client::update_status(&updated).context("updating status")?;
        }
        log::info!("reconciled website {}", site.key();
            applied = applied.join(","),
            ready = conditions::is_true(&status.conditions, "Ready"),
            available = conditions::is_true(&status.conditions, "Available"),
            status_updated = status_changed);
        Ok(Action::Done)
    }

    fn cleanup(&self, site: Website) -> Result<Action, ReconcileError> {
        let ns = site.namespace();
        let mut deleted = Vec::new();
        if let Some(d) = cache::get::<Deployment>(ns, site.name())?
            && owner::is_controlled_by(&d, &site)
        {
            client::delete::<Deployment>(ns, site.name())
                .ignore_not_found()
                .context("deleting Deployment")?;
            deleted.push("Deployment");
        }
        if let Some(s) = cache::get::<Service>(ns, site.name())?
            && owner::is_controlled_by(&s, &site)
        {
            client::delete::<Service>(ns, site.name()).ignore_not_found().context("deleting Service")?;
            deleted.push("Service");
        }
        if let Some(c) = cache::get::<ConfigMap>(ns, &content_name(&site))?
            && owner::is_controlled_by(&c, &site)
        {
            client::delete::<ConfigMap>(ns, &content_name(&site))
                .ignore_not_found()
                .context("deleting ConfigMap")?;
            deleted.push("ConfigMap");
        }
        events::normal(
            &site,
            "Deleted",
            "Cleanup",
            &format!(
                "deleted {}",
                if deleted.is_empty() { "nothing".to_owned() } else { deleted.join(", ") }
            ),
        )?;
        log::info!("cleaned up website {}", site.key(); deleted = deleted.join(","));
        Ok(Action::Done)
    }
}

impl Plugin for WebsiteOperator {
    type For = Website;

    fn init(_settings: Settings) -> Result<Self, InitError> {
        Ok(WebsiteOperator)
    }

    fn reconcile(&self, target: Target<Website>) -> Result<Action, ReconcileError> {
        let site = match target {
            Target::Present(site) => site,
            Target::Gone(request) => {
                // Its children were deleted by the finalizer (or go by garbage collection).
                log::debug!("website {} is gone", request);
                return Ok(Action::Done);
            }
        };
        finalizer::handle(site, FINALIZER, |event| match event {
            finalizer::Event::Apply(site) => self.apply(site),
            finalizer::Event::Cleanup(site) => self.cleanup(site),
        })
    }
}

/// The checks a Website must pass, on create and on update (pure but for the cache read of
/// the namespace's other Websites).
fn check_spec(request: &AdmissionRequest, site: &Website) -> Result<(), Denied> {
    let spec = &site.spec;
    if !(0..=MAX_REPLICAS).contains(&spec.replicas) {
        return Err(Denied::invalid(format!(
            "spec.replicas: Invalid value: {}: must be between 0 and {MAX_REPLICAS}",
            spec.replicas
        )));
    }
    if !(1..=65535).contains(&spec.port) {
        return Err(Denied::invalid(format!(
            "spec.port: Invalid value: {}: must be a port, 1 to 65535",
            spec.port
        )));
    }
    if spec.image.is_empty() || spec.image.contains(char::is_whitespace) {
        return Err(Denied::invalid(format!(
            "spec.image: Invalid value: {:?}: must be an image reference",
            spec.image
        )));
    }
    if spec.image.ends_with(":latest")
        || !spec.image.rsplit('/').next().unwrap_or_default().contains([':', '@'])
    {
        request
            .warn(format!("spec.image {:?} has no fixed tag: pods may run different versions", spec.image));
    }
    if let Some(host) = &spec.host {
        let others = cache::list::<Website>(site.namespace(), None)?;
        if let Some(other) =
            others.iter().find(|o| o.name() != site.name() && o.spec.host.as_ref() == Some(host))
        {
            return Err(Denied::invalid(format!(
                "spec.host: Duplicate value: {host:?}: website {} already serves it",
                other.name()
            )));
        }
    }
    Ok(())
}

impl Validate for WebsiteOperator {
    fn validate_create(&self, request: &AdmissionRequest, site: &Website) -> Result<(), Denied> {
        check_spec(request, site)
    }

    fn validate_update(
        &self,
        request: &AdmissionRequest,
        old: &Website,
        site: &Website,
    ) -> Result<(), Denied> {
        check_spec(request, site)?;
        if site.spec.replicas == 0 && old.spec.replicas > 0 {
            request.warn(format!("website {} is scaled to zero: it serves nothing", site.name()));
        }
        Ok(())
    }
}

impl Mutate for WebsiteOperator {
    /// Defaults: decoding the Website already fills in the spec fields left out (image,
    /// replicas, port: [`WebsiteSpec::default`]), which the patch adds; a site without a
    /// page gets one naming it.
    fn mutate(&self, _request: &AdmissionRequest, site: &mut Website) -> Result<(), Denied> {
        if site.spec.content.is_empty() {
            site.spec.content = format!("<h1>{}</h1>", site.name());
        }
        Ok(())
    }
}

wasmctrl_guest::export_plugin!(WebsiteOperator, admission = [validate, mutate]);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmctrl_guest::k8s_openapi::api::apps::v1::DeploymentStatus;
    use wasmctrl_guest::k8s_openapi::jiff::Timestamp;

    fn site() -> Website {
        Website {
            metadata: ObjectMeta {
                name: Some("blog".into()),
                namespace: Some("team-a".into()),
                uid: Some("site-uid".into()),
                generation: Some(2),
                ..Default::default()
            },
            spec: WebsiteSpec { content: "<h1>hi</h1>".into(), replicas: 2, ..Default::default() },
            status: None,
        }
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::new(secs, 0).unwrap())
    }

    #[test]
    fn spec_defaults_apply_to_missing_fields() {
        let w: Website = serde_json::from_str(
            r#"{"apiVersion":"example.com/v1","kind":"Website","metadata":{"name":"x"},"spec":{"content":"c"}}"#,
        )
        .unwrap();
        assert_eq!(w.spec.replicas, 1);
        assert_eq!(w.spec.port, 80);
        assert_eq!(w.spec.image, "nginx:1.27-alpine");
    }

    #[test]
    fn children_are_controlled_by_the_website() {
        let s = site();
        let cm = desired_configmap(&s).unwrap();
        let d = desired_deployment(&s).unwrap();
        let svc = desired_service(&s).unwrap();
        assert_eq!(cm.key(), "team-a/blog-content");
        assert_eq!(d.key(), "team-a/blog");
        assert_eq!(svc.key(), "team-a/blog");
        for owner in [&cm.metadata, &d.metadata, &svc.metadata].map(|m| m.owner_references.clone().unwrap()) {
            assert_eq!(owner.len(), 1);
            assert_eq!(owner[0].uid, "site-uid");
            assert_eq!(owner[0].kind, "Website");
            assert_eq!(owner[0].controller, Some(true));
        }
        assert!(owner::is_controlled_by(&d, &s));
        assert_eq!(cm.data.unwrap()["index.html"], "<h1>hi</h1>");
        let spec = d.spec;
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.selector.match_labels.unwrap()["app.kubernetes.io/instance"], "blog");
    }

    #[test]
    fn content_change_changes_template_hash() {
        let a = site();
        let mut b = site();
        b.spec.content = "<h1>bye</h1>".into();
        let hash = |s: &Website| {
            desired_deployment(s).unwrap().spec.template.metadata.unwrap().annotations.unwrap()
                [CONTENT_HASH_ANNOTATION]
                .clone()
        };
        assert_ne!(hash(&a), hash(&b));
        assert_eq!(hash(&a), hash(&site()));
        assert_eq!(content_hash(""), "cbf29ce484222325");
    }

    #[test]
    fn plan_child_detects_conflict_change_and_steady_state() {
        let s = site();
        let desired = desired_service(&s).unwrap();
        assert_eq!(plan_child(&s, None, &desired).unwrap(), ChildOutcome::Applied);

        let mut live = desired.clone();
        live.metadata.resource_version = Some("5".into());
        live.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.7".into());
        assert_eq!(plan_child(&s, Some(&live), &desired).unwrap(), ChildOutcome::Unchanged);

        live.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
        assert_eq!(plan_child(&s, Some(&live), &desired).unwrap(), ChildOutcome::Applied);

        let mut foreign = desired.clone();
        foreign.metadata.owner_references = None;
        assert_eq!(plan_child(&s, Some(&foreign), &desired).unwrap(), ChildOutcome::Conflict);
    }

    #[test]
    fn status_reports_ready_and_availability() {
        let s = site();
        let ok = [("ConfigMap", ChildOutcome::Applied), ("Deployment", ChildOutcome::Unchanged)];
        let status = desired_status(&s, &ok, None, &at(100));
        assert!(conditions::is_true(&status.conditions, "Ready"));
        assert!(conditions::is_false(&status.conditions, "Available"));
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.available_replicas, Some(0));
        assert_eq!(status.url.as_deref(), Some("http://blog.team-a.svc.cluster.local:80"));

        // Deployment becomes available later: Available flips, Ready keeps its transition time.
        let mut s2 = s.clone();
        s2.status = Some(status.clone());
        let dep = Deployment {
            status: Some(DeploymentStatus { available_replicas: Some(2), ..Default::default() }),
            ..Default::default()
        };
        let status2 = desired_status(&s2, &ok, Some(&dep), &at(200));
        let ready = conditions::find(&status2.conditions, "Ready").unwrap();
        let available = conditions::find(&status2.conditions, "Available").unwrap();
        assert_eq!(ready.last_transition_time, at(100));
        assert_eq!(available.status, "True");
        assert_eq!(available.last_transition_time, at(200));

        // Same inputs again: identical status, so no status write.
        let mut s3 = s2.clone();
        s3.status = Some(status2.clone());
        assert_eq!(desired_status(&s3, &ok, Some(&dep), &at(300)), status2);
    }

    #[test]
    fn conflict_makes_ready_false() {
        let status = desired_status(&site(), &[("Service", ChildOutcome::Conflict)], None, &at(1));
        let ready = conditions::find(&status.conditions, "Ready").unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ChildConflict"));
    }

    #[test]
    fn full_reconcile_applies_children_then_settles_and_cleans_up() {
        use wasmctrl_guest::testing::TestHost;
        let host = TestHost::new();
        let mut s = site();
        s.metadata.uid = None;
        host.add(&s).unwrap();
        let plugin = host.init::<WebsiteOperator>().unwrap();
        let request = Request::new(Some("team-a"), "blog");

        assert_eq!(plugin.reconcile(request.clone()), Ok(Action::Done));
        let writes = host.take_writes();
        let verbs: Vec<(&str, String)> = writes.iter().map(|w| (w.verb(), w.key())).collect();
        assert_eq!(
            verbs,
            [
                ("patch", "team-a/blog".into()),
                ("apply", "team-a/blog-content".into()),
                ("apply", "team-a/blog".into()),
                ("apply", "team-a/blog".into()),
                ("update-status", "team-a/blog".into()),
            ]
        );
        let deployment: Deployment = host.server_get(Some("team-a"), "blog").unwrap();
        let stored: Website = host.server_get(Some("team-a"), "blog").unwrap();
        assert!(owner::is_controlled_by(&deployment, &stored));
        assert_eq!(deployment.spec.replicas, Some(2));
        assert!(stored.status.is_some());

        // The cache caught up: nothing left to write.
        host.sync_cache();
        assert_eq!(plugin.reconcile(request.clone()), Ok(Action::Done));
        assert!(host.take_writes().is_empty());

        // Deleted (held by the finalizer): children go, then the finalizer.
        let stored: Website = host.server_get(Some("team-a"), "blog").unwrap();
        client::delete::<Website>(Some("team-a"), "blog").unwrap();
        host.take_writes();
        host.sync_cache();
        assert!(stored.metadata.finalizers.is_some());
        assert_eq!(plugin.reconcile(request), Ok(Action::Done));
        let verbs: Vec<&str> = host.take_writes().iter().map(|w| w.verb()).collect();
        assert_eq!(verbs, ["delete", "delete", "delete", "patch"]);
        assert!(host.server_get::<Website>(Some("team-a"), "blog").is_none());
        assert!(host.server_get::<Deployment>(Some("team-a"), "blog").is_none());
        assert_eq!(host.events().last().map(|e| e.reason.clone()), Some("Deleted".into()));
    }

    #[test]
    fn admission_defaults_then_refuses_what_cannot_run() {
        use wasmctrl_guest::admission::AdmissionRequest;
        let host = wasmctrl_guest::testing::TestHost::new();
        let plugin = host.init::<WebsiteOperator>().unwrap();
        let bare: Website = serde_json::from_str(
            r#"{"apiVersion":"example.com/v1","kind":"Website","metadata":{"name":"blog","namespace":"team-a"},"spec":{}}"#,
        )
        .unwrap();
        // The patch fills in the defaults and a page.
        let (verdict, defaulted) =
            plugin.mutate::<Website>(&AdmissionRequest::create(&bare).unwrap()).unwrap().unwrap();
        assert!(verdict.allowed());
        let defaulted = defaulted.unwrap();
        assert_eq!(defaulted.spec.content, "<h1>blog</h1>");
        assert_eq!((defaulted.spec.replicas, defaulted.spec.port), (1, 80));

        let mut too_big = site();
        too_big.spec.replicas = MAX_REPLICAS + 1;
        let verdict = plugin.validate(&AdmissionRequest::create(&too_big).unwrap()).unwrap();
        let denied = verdict.denied.unwrap();
        assert_eq!(denied.code(), Some(422));
        assert!(denied.message().starts_with("spec.replicas: Invalid value: 11"), "{denied}");

        let mut latest = site();
        latest.spec.image = "nginx:latest".into();
        let verdict = plugin.validate(&AdmissionRequest::create(&latest).unwrap()).unwrap();
        assert!(verdict.allowed());
        assert_eq!(verdict.warnings.len(), 1, "{:?}", verdict.warnings);

        let mut zero = site();
        zero.spec.replicas = 0;
        let verdict = plugin.validate(&AdmissionRequest::update(&site(), &zero).unwrap()).unwrap();
        assert!(verdict.allowed() && verdict.warnings[0].contains("scaled to zero"), "{verdict:?}");
    }

    #[test]
    fn a_host_another_website_serves_is_refused_from_the_cache() {
        use wasmctrl_guest::admission::AdmissionRequest;
        let host = wasmctrl_guest::testing::TestHost::new();
        let mut first = site();
        first.metadata.name = Some("first".into());
        first.spec.host = Some("blog.example.com".into());
        host.add(&first).unwrap();
        let plugin = host.init::<WebsiteOperator>().unwrap();
        let mut second = site();
        second.spec.host = Some("blog.example.com".into());
        let denied = plugin.validate(&AdmissionRequest::create(&second).unwrap()).unwrap().denied.unwrap();
        assert!(denied.message().contains("website first already serves it"), "{denied}");
        // The site itself may keep its host on update.
        let verdict = plugin.validate(&AdmissionRequest::update(&first, &first).unwrap()).unwrap();
        assert!(verdict.allowed(), "{verdict:?}");
    }
}
