//! The `ValidatingWebhookConfiguration` and `MutatingWebhookConfiguration` of each admitting
//! plugin: built from its `[[admission]]` rules ([`configurations`]), applied and deleted by
//! the host when it may ([`WebhookConfigs`]), printed by `wasmctrl webhook-config` when not.
//!
//! Invariants:
//! - One configuration of each type per plugin, named `<prefix>-<plugin>`, one webhook per
//!   rule (named `<rule>.<plugin>.wasmctrl.dev`), pointing at the rule's path on the host;
//!   a plugin with no rule of a type has no configuration of that type (the host deletes one
//!   left from an earlier version).
//! - Every webhook asks for `admission.k8s.io/v1` reviews only, matches the rule's kinds by
//!   group, version and plural resource (main resource only, `matchPolicy: Equivalent`),
//!   and carries the CA bundle the host's certificate is trusted by, when there is one.
//! - The host writes them with server-side apply under its own field manager, so a rerun
//!   converges on the same objects and another manager's fields (cert-manager's injected
//!   `caBundle`) are left to it when the host writes none.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::review::REVIEW_API_VERSION;
use super::rules::{AdmissionRule, AdmittedKind, WebhookType, to_label_selector};
use crate::plugin::Gvk;
use crate::source::Discovery;

/// Field manager of the host's writes of webhook configurations.
pub const FIELD_MANAGER: &str = "wasmctrl-admission";

/// The label naming the plugin a configuration belongs to.
pub const PLUGIN_LABEL: &str = "wasmctrl.dev/plugin";

/// How the API server reaches the host's admission server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A base URL (`https://127.0.0.1:9443`); each webhook's path is appended.
    Url(String),
    /// A Service in front of the host (in-cluster).
    Service { namespace: String, name: String, port: u16 },
}

impl Endpoint {
    fn client_config(&self, path: String, ca: Option<&[u8]>) -> WebhookClientConfig {
        let ca_bundle = ca.map(|c| ByteString(c.to_vec()));
        match self {
            Endpoint::Url(base) => WebhookClientConfig {
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
                ca_bundle,
                service: None,
            },
            Endpoint::Service { namespace, name, port } => WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    port: Some(i32::from(*port)),
                    path: Some(path),
                }),
                ca_bundle,
                url: None,
            },
        }
    }
}

/// A plugin's configurations, one of each type it needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WebhookConfigurations {
    pub validating: Option<ValidatingWebhookConfiguration>,
    pub mutating: Option<MutatingWebhookConfiguration>,
}

impl WebhookConfigurations {
    /// Multi-document YAML, as `kubectl apply -f -` takes it.
    pub fn to_yaml(&self) -> Result<String, serde_norway::Error> {
        let mut out = String::new();
        if let Some(m) = &self.mutating {
            out.push_str("---\n");
            out.push_str(&serde_norway::to_string(&with_type(m, "MutatingWebhookConfiguration"))?);
        }
        if let Some(v) = &self.validating {
            out.push_str("---\n");
            out.push_str(&serde_norway::to_string(&with_type(v, "ValidatingWebhookConfiguration"))?);
        }
        Ok(out)
    }
}

/// An object's JSON with its `apiVersion` and `kind` (k8s-openapi's serialisation has them;
/// kept explicit so printed manifests always do).
fn with_type(object: &impl serde::Serialize, kind: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(object).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), "admissionregistration.k8s.io/v1".into());
        o.insert("kind".into(), kind.into());
    }
    v
}

/// The name of `plugin`'s configurations.
pub fn configuration_name(prefix: &str, plugin: &str) -> String {
    format!("{prefix}-{plugin}")
}

/// Why a rule's webhook could not be written down.
#[derive(Debug, thiserror::Error)]
#[error("webhook {rule} of plugin {plugin}: {reason}")]
pub struct BuildError {
    pub plugin: String,
    pub rule: String,
    pub reason: String,
}

/// Builds `plugin`'s configurations. `kind_of` gives each kind's resource and scope.
pub fn configurations(
    plugin: &str,
    rules: &[AdmissionRule],
    kind_of: &dyn Fn(&Gvk) -> AdmittedKind,
    endpoint: &Endpoint,
    ca: Option<&[u8]>,
    prefix: &str,
) -> Result<WebhookConfigurations, BuildError> {
    let metadata = ObjectMeta {
        name: Some(configuration_name(prefix, plugin)),
        labels: Some(BTreeMap::from([
            ("app.kubernetes.io/managed-by".to_owned(), "wasmctrl".to_owned()),
            (PLUGIN_LABEL.to_owned(), plugin.to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    let mut validating = Vec::new();
    let mut mutating = Vec::new();
    for rule in rules {
        let error =
            |reason: String| BuildError { plugin: plugin.to_owned(), rule: rule.name.clone(), reason };
        let selector = |s: &Option<String>| {
            s.as_deref().map(to_label_selector).transpose().map_err(|e| error(e.to_string()))
        };
        let namespace_selector = selector(&rule.namespace_selector)?;
        let object_selector = selector(&rule.object_selector)?;
        let operations: Vec<String> = rule.operations.iter().map(|o| o.as_str().to_owned()).collect();
        let resource_rules: Vec<RuleWithOperations> = rule
            .kinds
            .iter()
            .map(|k| {
                let admitted = kind_of(k);
                RuleWithOperations {
                    api_groups: Some(vec![k.group().to_owned()]),
                    api_versions: Some(vec![k.version().to_owned()]),
                    resources: Some(vec![admitted.plural]),
                    operations: Some(operations.clone()),
                    scope: Some(if admitted.namespaced { "Namespaced" } else { "Cluster" }.to_owned()),
                }
            })
            .collect();
        let client_config = endpoint.client_config(rule.path(plugin), ca);
        let review_versions = vec![REVIEW_API_VERSION.trim_start_matches("admission.k8s.io/").to_owned()];
        match rule.webhook_type {
            WebhookType::Validating => validating.push(ValidatingWebhook {
                name: rule.webhook_name(plugin),
                admission_review_versions: review_versions,
                client_config,
                failure_policy: Some(rule.failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector,
                object_selector,
                rules: Some(resource_rules),
                side_effects: rule.side_effects.as_str().to_owned(),
                timeout_seconds: Some(rule.timeout_seconds()),
                match_conditions: None,
            }),
            WebhookType::Mutating => mutating.push(MutatingWebhook {
                name: rule.webhook_name(plugin),
                admission_review_versions: review_versions,
                client_config,
                failure_policy: Some(rule.failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector,
                object_selector,
                reinvocation_policy: Some(rule.reinvocation.as_str().to_owned()),
                rules: Some(resource_rules),
                side_effects: rule.side_effects.as_str().to_owned(),
                timeout_seconds: Some(rule.timeout_seconds()),
                match_conditions: None,
            }),
        }
    }
    Ok(WebhookConfigurations {
        validating: (!validating.is_empty()).then(|| ValidatingWebhookConfiguration {
            metadata: metadata.clone(),
            webhooks: Some(validating),
        }),
        mutating: (!mutating.is_empty())
            .then_some(MutatingWebhookConfiguration { metadata, webhooks: Some(mutating) }),
    })
}

/// Why writing a plugin's configurations failed.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("resolving {kind} for the webhook rules of plugin {plugin}: {reason}")]
    Kind { plugin: String, kind: Gvk, reason: String },
    #[error("{verb} {what} {name}: {source}")]
    Api {
        verb: &'static str,
        what: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Writes and deletes the plugins' webhook configurations in the cluster.
#[derive(Clone)]
pub struct WebhookConfigs {
    client: kube::Client,
    discovery: Discovery,
    endpoint: Endpoint,
    prefix: String,
}

impl std::fmt::Debug for WebhookConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfigs")
            .field("endpoint", &self.endpoint)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl WebhookConfigs {
    pub fn new(
        client: kube::Client,
        discovery: Discovery,
        endpoint: Endpoint,
        prefix: impl Into<String>,
    ) -> Self {
        WebhookConfigs { client, discovery, endpoint, prefix: prefix.into() }
    }

    /// Applies `plugin`'s configurations for `rules`, and deletes the type it no longer
    /// needs (a plugin without rules has none left).
    pub async fn apply(
        &self,
        plugin: &str,
        rules: &[AdmissionRule],
        ca: Option<&[u8]>,
    ) -> Result<(), WebhookConfigError> {
        let mut kinds: BTreeMap<Gvk, AdmittedKind> = BTreeMap::new();
        for kind in rules.iter().flat_map(|r| &r.kinds) {
            if kinds.contains_key(kind) {
                continue;
            }
            let r = self.discovery.resolve(&kind.api_version, &kind.kind).await.map_err(|e| {
                WebhookConfigError::Kind {
                    plugin: plugin.to_owned(),
                    kind: kind.clone(),
                    reason: e.to_string(),
                }
            })?;
            kinds.insert(
                kind.clone(),
                AdmittedKind { kind: kind.clone(), plural: r.plural, namespaced: r.namespaced },
            );
        }
        let kind_of = |k: &Gvk| {
            kinds.get(k).cloned().unwrap_or_else(|| AdmittedKind {
                kind: k.clone(),
                plural: k.kind.to_lowercase(),
                namespaced: true,
            })
        };
        let built = configurations(plugin, rules, &kind_of, &self.endpoint, ca, &self.prefix)?;
        let name = configuration_name(&self.prefix, plugin);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let api_error =
            |verb, what, source| WebhookConfigError::Api { verb, what, name: name.clone(), source };
        match built.validating {
            Some(v) => {
                validating
                    .patch(&name, &params, &Patch::Apply(with_type(&v, "ValidatingWebhookConfiguration")))
                    .await
                    .map_err(|e| api_error("applying", "ValidatingWebhookConfiguration", e))?;
            }
            None => delete_if_present(&validating, &name)
                .await
                .map_err(|e| api_error("deleting", "ValidatingWebhookConfiguration", e))?,
        }
        match built.mutating {
            Some(m) => {
                mutating
                    .patch(&name, &params, &Patch::Apply(with_type(&m, "MutatingWebhookConfiguration")))
                    .await
                    .map_err(|e| api_error("applying", "MutatingWebhookConfiguration", e))?;
            }
            None => delete_if_present(&mutating, &name)
                .await
                .map_err(|e| api_error("deleting", "MutatingWebhookConfiguration", e))?,
        }
        Ok(())
    }

    /// Deletes `plugin`'s configurations (those that exist).
    pub async fn delete(&self, plugin: &str) -> Result<(), WebhookConfigError> {
        self.apply(plugin, &[], None).await
    }
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::admission::rules::{FailurePolicy, Operation, Reinvocation, SideEffects};

    fn rule(name: &str, webhook_type: WebhookType) -> AdmissionRule {
        AdmissionRule {
            name: name.into(),
            webhook_type,
            kinds: vec![Gvk::new("example.com/v1", "Website"), Gvk::new("v1", "Namespace")],
            operations: vec![Operation::Create, Operation::Update],
            namespace_selector: Some("env in (prod)".into()),
            object_selector: None,
            failure_policy: FailurePolicy::Ignore,
            timeout: Duration::from_secs(3),
            side_effects: SideEffects::NoneOnDryRun,
            reinvocation: Reinvocation::IfNeeded,
        }
    }

    fn kind_of(k: &Gvk) -> AdmittedKind {
        AdmittedKind {
            kind: k.clone(),
            plural: format!("{}s", k.kind.to_lowercase()),
            namespaced: k.kind != "Namespace",
        }
    }

    #[test]
    fn each_rule_is_a_webhook_of_its_type_pointing_at_its_path() {
        let rules = [rule("validate", WebhookType::Validating), rule("mutate", WebhookType::Mutating)];
        let endpoint = Endpoint::Url("https://127.0.0.1:9443/".into());
        let built = configurations("web", &rules, &kind_of, &endpoint, Some(b"PEM"), "wasmctrl").unwrap();
        let v = built.validating.unwrap();
        assert_eq!(v.metadata.name.as_deref(), Some("wasmctrl-web"));
        let hook = &v.webhooks.unwrap()[0];
        assert_eq!(hook.name, "validate.web.wasmctrl.dev");
        assert_eq!(hook.client_config.url.as_deref(), Some("https://127.0.0.1:9443/admission/web/validate"));
        assert_eq!(hook.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()), Some(&b"PEM"[..]));
        assert_eq!(hook.admission_review_versions, ["v1"]);
        assert_eq!(
            (hook.failure_policy.as_deref(), hook.side_effects.as_str()),
            (Some("Ignore"), "NoneOnDryRun")
        );
        assert_eq!(hook.timeout_seconds, Some(3));
        let r = hook.rules.as_ref().unwrap();
        assert_eq!(r[0].api_groups.as_deref(), Some(&["example.com".to_owned()][..]));
        assert_eq!(r[0].resources.as_deref(), Some(&["websites".to_owned()][..]));
        assert_eq!(r[0].scope.as_deref(), Some("Namespaced"));
        assert_eq!(r[1].api_groups.as_deref(), Some(&[String::new()][..]));
        assert_eq!(r[1].scope.as_deref(), Some("Cluster"));
        assert_eq!(r[0].operations.as_deref(), Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..]));
        let m = built.mutating.unwrap();
        let hook = &m.webhooks.unwrap()[0];
        assert_eq!(hook.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(hook.client_config.url.as_deref(), Some("https://127.0.0.1:9443/admission/web/mutate"));
    }

    #[test]
    fn a_service_endpoint_names_the_service_and_the_path() {
        let endpoint = Endpoint::Service { namespace: "ops".into(), name: "hooks".into(), port: 443 };
        let built = configurations(
            "web",
            &[rule("validate", WebhookType::Validating)],
            &kind_of,
            &endpoint,
            None,
            "x",
        )
        .unwrap();
        assert!(built.mutating.is_none());
        let hook = &built.validating.unwrap().webhooks.unwrap()[0];
        let service = hook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (service.namespace.as_str(), service.name.as_str(), service.port),
            ("ops", "hooks", Some(443))
        );
        assert_eq!(service.path.as_deref(), Some("/admission/web/validate"));
        assert!(hook.client_config.url.is_none() && hook.client_config.ca_bundle.is_none());
    }

    #[test]
    fn printed_yaml_has_both_kinds_with_their_types() {
        let rules = [rule("validate", WebhookType::Validating), rule("mutate", WebhookType::Mutating)];
        let endpoint = Endpoint::Url("https://127.0.0.1:9443".into());
        let yaml =
            configurations("web", &rules, &kind_of, &endpoint, None, "wasmctrl").unwrap().to_yaml().unwrap();
        assert!(yaml.contains("kind: MutatingWebhookConfiguration"), "{yaml}");
        assert!(yaml.contains("kind: ValidatingWebhookConfiguration"), "{yaml}");
        assert!(yaml.contains("apiVersion: admissionregistration.k8s.io/v1"), "{yaml}");
    }
}
