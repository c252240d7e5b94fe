//! The kubeconfig that points `kubectl` (or any client) at a running dev cluster.
//!
//! Invariants: the file is built from kube's own serde types ([`Kubeconfig`]) and written
//! by a YAML serializer, never by string formatting, so URLs and tokens are quoted as YAML
//! needs; it has exactly one cluster, one user and one context, all named [`NAME`], the
//! context is current and its namespace is `default`; the CA is embedded
//! (`certificate-authority-data`) when, and only when, the server speaks HTTPS.

use base64::Engine;
use kube_client::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext, Preferences,
};

/// The name of the cluster, user and context.
pub const NAME: &str = "wasmctrl-dev";

/// A kubeconfig for the server at `url`, authenticating with the bearer `token` and trusting
/// `ca_pem` (the self-signed CA, when serving HTTPS).
pub fn build(url: &str, token: &str, ca_pem: Option<&str>) -> Kubeconfig {
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        preferences: Some(Preferences::default()),
        clusters: vec![NamedCluster {
            name: NAME.into(),
            cluster: Some(Cluster {
                server: Some(url.into()),
                certificate_authority_data: ca_pem
                    .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem)),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.into(),
            auth_info: Some(AuthInfo { token: Some(token.to_owned().into()), ..AuthInfo::default() }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: NAME.into(),
            context: Some(Context {
                cluster: NAME.into(),
                user: Some(NAME.into()),
                namespace: Some("default".into()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(NAME.into()),
        ..Kubeconfig::default()
    }
}

/// [`build`] as YAML.
pub fn to_yaml(config: &Kubeconfig) -> Result<String, serde_norway::Error> {
    serde_norway::to_string(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_kubes_reader() {
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let yaml = to_yaml(&build("https://127.0.0.1:6443", "t0k: en#1", Some(ca))).unwrap();
        let back = Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(back.current_context.as_deref(), Some(NAME));
        let cluster = back.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let data = cluster.certificate_authority_data.as_deref().unwrap();
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(data).unwrap(), ca.as_bytes());
        // Serialising is the way to read the secret back without the `secrecy` crate.
        let user = serde_json::to_value(&back.auth_infos[0].auth_info).unwrap();
        assert_eq!(user["token"], "t0k: en#1", "a token YAML would misread is quoted");
        let context = back.contexts[0].context.as_ref().unwrap();
        assert_eq!((context.cluster.as_str(), context.user.as_deref()), (NAME, Some(NAME)));
        assert_eq!(context.namespace.as_deref(), Some("default"));
    }

    #[test]
    fn plain_http_has_no_ca() {
        let yaml = to_yaml(&build("http://127.0.0.1:1", "t", None)).unwrap();
        assert!(!yaml.contains("certificate-authority"), "{yaml}");
        assert!(yaml.contains("kind: Config"), "{yaml}");
    }
}
