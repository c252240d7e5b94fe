//! `wasmctrl webhook-config`: the webhook configurations of a plugins directory, printed for
//! a host that does not write them itself (`[admission] manage-configurations = false`).
//!
//! Invariants: the objects are exactly the ones the running host would apply (the same
//! builder, [`crate::admission::configurations`]); kinds resolve through the given resolver
//! (the built-in catalog offline; a kind it does not know gets the plural Kubernetes would
//! guess); output is deterministic (plugins by name).

use crate::admission::{AdmissionSettings, Endpoint, configurations, rules::AdmittedKind};
use crate::config::{KindResolver, PluginConfig, resolve_or_guess};
use crate::plugin::Gvk;

/// Why the configurations cannot be printed.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigPrintError {
    #[error(
        "[admission] listens on port 0 and sets no `url` or `service`: the API server's address for it is known only once it runs; set `url` (or `service`)"
    )]
    NoEndpoint,
    #[error(transparent)]
    Build(#[from] crate::admission::webhooks::BuildError),
    #[error("encoding the configurations as YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// The multi-document YAML of every admitting plugin's configurations. `ca`: the CA bundle
/// (PEM) to write into them, if any.
pub fn webhook_configurations_for(
    plugins: &[PluginConfig],
    settings: &AdmissionSettings,
    ca: Option<&[u8]>,
    resolver: &dyn KindResolver,
) -> Result<String, WebhookConfigPrintError> {
    let endpoint = match &settings.endpoint {
        Some(e) => e.clone(),
        None if settings.address.port() == 0 => return Err(WebhookConfigPrintError::NoEndpoint),
        None => Endpoint::Url(format!("https://{}", settings.address)),
    };
    let kind_of = |k: &Gvk| {
        let r = resolve_or_guess(resolver, k);
        AdmittedKind { kind: k.clone(), plural: r.plural, namespaced: r.namespaced }
    };
    let mut sorted: Vec<&PluginConfig> = plugins.iter().filter(|p| !p.admission.is_empty()).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for p in sorted {
        let built =
            configurations(&p.name, &p.admission, &kind_of, &endpoint, ca, &settings.configuration_prefix)?;
        out.push_str(&built.to_yaml()?);
    }
    Ok(out)
}
