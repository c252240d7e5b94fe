//! Admission: plugins that validate and mutate objects as well as reconcile them. The host
//! serves `AdmissionReview` v1 over HTTPS on the plugins' behalf and calls their `validate`
//! / `mutate` exports (`wasmctrl:controller@0.2.1`) in the same sandbox, with the same
//! caches and permissions as their reconciles.
//!
//! The path a review takes, one concept per file:
//! - [`server`]: HTTPS (rustls) and HTTP/1.1 + HTTP/2 (hyper); reviews to a [`ReviewService`].
//! - [`tls`]: the serving certificate, from files (reloaded when they change) or generated,
//!   and the CA bundle the webhook configurations carry.
//! - [`router`]: which running plugin version answers (swapped atomically on hot reload),
//!   and the webhook configurations that follow the plugins ([`webhooks`]).
//! - [`handler`]: one version's answer: the plugin's verdict, or the failure policy's.
//! - [`review`]: kube's `AdmissionReview` types in and out; [`rules`]: a checked
//!   `[[admission]]` section; [`metrics`]: controller-runtime's webhook metrics.
//!
//! Invariants kept across the module: every review the server reads gets an answer (the
//! plugin's, the failure policy's, or an HTTP error for a path that is no webhook); a review
//! is answered by exactly one plugin version; a plugin receives only reviews of kinds it
//! admits, never a Secret without `permissions.read`; the server listens where the host
//! TOML says (loopback by default).
//!
//! Layering: after `plugin` (it calls plugins) and `source` (discovery, for the resources
//! its rules name); `config` resolves TOML into its types and `reload` installs versions
//! into its [`AdmissionRouter`]. It imports neither.

pub mod handler;
pub mod metrics;
pub mod review;
pub mod router;
pub mod rules;
pub mod server;
pub mod tls;
pub mod webhooks;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use handler::PluginAdmission;
pub use metrics::WebhookMetrics;
pub use router::AdmissionRouter;
pub use rules::{AdmissionRule, FailurePolicy, Operation, Reinvocation, SideEffects, WebhookType};
pub use server::{AdmissionServer, ReviewReply, ReviewService};
pub use tls::{CertError, CertSource, ServingCert};
pub use webhooks::{Endpoint, WebhookConfigs, WebhookConfigurations, configurations};

use crate::metrics::Metrics;
use crate::source::Discovery;

/// The default address of the admission server.
pub const DEFAULT_ADDRESS: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9443);

/// The default name prefix of the webhook configurations.
pub const DEFAULT_CONFIGURATION_PREFIX: &str = "wasmctrl";

/// The serving certificate's files (cert-manager's `tls.crt`, `tls.key`, `ca.crt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA bundle for the webhook configurations; `None` writes none.
    pub ca: Option<PathBuf>,
}

/// The host TOML's `[admission]`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// Where the HTTPS server listens.
    pub address: SocketAddr,
    /// How the API server reaches it; `None`: `https://<address>` (the bound port when the
    /// address has port 0), which the config check allows only for a specific address.
    pub endpoint: Option<Endpoint>,
    /// `None`: a CA and certificate generated at start for the endpoint's names.
    pub certificate: Option<CertFiles>,
    /// Whether the host writes the webhook configurations itself.
    pub manage_configurations: bool,
    /// Configurations are named `<prefix>-<plugin>`.
    pub configuration_prefix: String,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            address: DEFAULT_ADDRESS,
            endpoint: None,
            certificate: None,
            manage_configurations: true,
            configuration_prefix: DEFAULT_CONFIGURATION_PREFIX.to_owned(),
        }
    }
}

impl AdmissionSettings {
    /// The endpoint when the server listens on `bound`.
    pub fn endpoint_for(&self, bound: SocketAddr) -> Endpoint {
        self.endpoint.clone().unwrap_or_else(|| Endpoint::Url(format!("https://{bound}")))
    }

    /// Where the certificate comes from, for the server listening on `bound`.
    pub fn cert_source(&self, bound: SocketAddr) -> CertSource {
        match &self.certificate {
            Some(f) => CertSource::Files { cert: f.cert.clone(), key: f.key.clone(), ca: f.ca.clone() },
            None => CertSource::Generated { names: endpoint_names(&self.endpoint_for(bound)) },
        }
    }
}

/// The names a generated certificate must hold for the API server to accept it.
fn endpoint_names(endpoint: &Endpoint) -> Vec<String> {
    match endpoint {
        Endpoint::Url(url) => {
            let host = url
                .parse::<http::Uri>()
                .ok()
                .and_then(|u| u.host().map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned()));
            host.into_iter().collect()
        }
        Endpoint::Service { namespace, name, .. } => vec![
            format!("{name}.{namespace}.svc"),
            format!("{name}.{namespace}.svc.cluster.local"),
            format!("{name}.{namespace}"),
            name.clone(),
        ],
    }
}

/// Why the admission server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("binding the admission server on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("configuring TLS for the admission server: {0}")]
    Tls(#[from] rustls::Error),
}

/// A running admission server and the router it serves.
pub struct Admission {
    pub router: AdmissionRouter,
    pub server: AdmissionServer,
    pub cert: Arc<ServingCert>,
    /// How the API server reaches it (what the webhook configurations say).
    pub endpoint: Endpoint,
}

/// Binds and starts the admission server with an empty router. `client`: the cluster
/// access the router writes webhook configurations with (when the settings let it).
pub async fn start(
    settings: &AdmissionSettings,
    client: Option<kube::Client>,
    metrics: Option<&Metrics>,
    shutdown: CancellationToken,
) -> Result<Admission, AdmissionError> {
    let listener = TcpListener::bind(settings.address)
        .await
        .map_err(|source| AdmissionError::Bind { address: settings.address, source })?;
    let bound =
        listener.local_addr().map_err(|source| AdmissionError::Bind { address: settings.address, source })?;
    let endpoint = settings.endpoint_for(bound);
    let cert = Arc::new(ServingCert::load(&settings.cert_source(bound))?);
    let webhook_metrics = WebhookMetrics::default();
    if let Some(m) = metrics {
        webhook_metrics.register(m, cert.reloads());
    }
    let configs = client.filter(|_| settings.manage_configurations).map(|client| {
        WebhookConfigs::new(
            client.clone(),
            Discovery::new(client),
            endpoint.clone(),
            settings.configuration_prefix.clone(),
        )
    });
    let router = AdmissionRouter::new(configs, cert.ca_bundle_changes(), webhook_metrics);
    {
        let router = router.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { router.follow_ca_bundle(stop).await });
    }
    let server = AdmissionServer::start(listener, cert.server_config()?, Arc::new(router.clone()), shutdown)
        .map_err(|source| AdmissionError::Bind { address: settings.address, source })?;
    tracing::info!(address = %server.address(), ?endpoint, managed = settings.manage_configurations, "serving admission reviews");
    Ok(Admission { router, server, cert, endpoint })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_names_what_the_api_server_dials() {
        let s = AdmissionSettings::default();
        let bound: SocketAddr = "127.0.0.1:34567".parse().unwrap();
        assert_eq!(s.endpoint_for(bound), Endpoint::Url("https://127.0.0.1:34567".into()));
        assert_eq!(s.cert_source(bound), CertSource::Generated { names: vec!["127.0.0.1".into()] });
        let svc = AdmissionSettings {
            endpoint: Some(Endpoint::Service { namespace: "ops".into(), name: "hooks".into(), port: 443 }),
            ..AdmissionSettings::default()
        };
        let CertSource::Generated { names } = svc.cert_source(bound) else { panic!("generated") };
        assert!(names.contains(&"hooks.ops.svc".to_owned()), "{names:?}");
        let v6 = AdmissionSettings {
            endpoint: Some(Endpoint::Url("https://[::1]:9443".into())),
            ..Default::default()
        };
        assert_eq!(v6.cert_source(bound), CertSource::Generated { names: vec!["::1".into()] });
    }
}
