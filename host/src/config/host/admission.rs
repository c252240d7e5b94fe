//! The host TOML's `[admission]` table: where the admission server listens, how the API
//! server reaches it, its certificate and whether the host writes the webhook
//! configurations. Present means on: without the table no admission server runs.
//!
//! Invariants: `url` and `service` exclude each other; without either, the address must be
//! one the API server can dial (not `0.0.0.0`/`::`); `cert-file` and `key-file` come
//! together, `ca-file` only with them; paths are resolved against the TOML's directory.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use wasmctrl_selectors::is_dns_label;

use crate::admission::{
    AdmissionSettings, CertFiles, DEFAULT_ADDRESS, DEFAULT_CONFIGURATION_PREFIX, Endpoint,
};
use crate::config::error::ConfigErrors;
use crate::config::source::{PathSeg, SourceMap};

/// `[admission]` as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AdmissionServerToml {
    /// `host:port` the HTTPS server listens on. Default `127.0.0.1:9443`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Base URL the API server posts to (`https://...`); webhook paths are appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Or the Service in front of the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceToml>,
    /// PEM certificate chain (cert-manager's `tls.crt`); reloaded when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// PEM private key (`tls.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// PEM CA bundle written into the webhook configurations (`ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Write the Validating/MutatingWebhookConfigurations. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manage_configurations: Option<bool>,
    /// Configurations are named `<prefix>-<plugin>`. Default `wasmctrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_prefix: Option<String>,
}

/// `[admission.service]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServiceToml {
    pub namespace: String,
    pub name: String,
    /// Default 443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_owned())
}

/// Checks `[admission]` (paths against `base`).
pub(super) fn resolve(
    map: &SourceMap<'_>,
    errors: &mut ConfigErrors,
    table: &AdmissionServerToml,
    base: &Path,
) -> AdmissionSettings {
    let mut err = |k: &[&str], message: String, hint: Option<&str>| {
        let mut path = vec![key("admission")];
        path.extend(k.iter().map(|k| key(k)));
        let mut e = map.error_for(&path, false, message);
        e.hint = hint.map(str::to_owned);
        errors.push(e);
    };
    let address = match table.address.as_deref().map(str::parse::<SocketAddr>) {
        None => DEFAULT_ADDRESS,
        Some(Ok(a)) => a,
        Some(Err(_)) => {
            err(
                &["address"],
                format!("`{}` is not an address", table.address.as_deref().unwrap_or_default()),
                Some("write `host:port` with an IP address, e.g. \"127.0.0.1:9443\""),
            );
            DEFAULT_ADDRESS
        }
    };
    let endpoint = match (&table.url, &table.service) {
        (Some(_), Some(_)) => {
            err(
                &["service"],
                "`url` and `service` exclude each other".into(),
                Some("keep the one the API server uses"),
            );
            None
        }
        (Some(url), None) => {
            let valid = url.strip_prefix("https://").is_some_and(|rest| !rest.is_empty())
                && url.parse::<http::Uri>().is_ok_and(|u| u.host().is_some() && u.query().is_none());
            if !valid {
                err(
                    &["url"],
                    format!("`{url}` is not an https:// URL"),
                    Some("the API server calls webhooks over HTTPS only: e.g. \"https://127.0.0.1:9443\""),
                );
            }
            Some(Endpoint::Url(url.clone()))
        }
        (None, Some(s)) => {
            for (k, v) in [("namespace", &s.namespace), ("name", &s.name)] {
                if !is_dns_label(v) {
                    err(&["service", k], format!("`{v}` is not a valid {k}"), None);
                }
            }
            if s.port == Some(0) {
                err(&["service", "port"], "port 0 cannot be dialled".into(), None);
            }
            Some(Endpoint::Service {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                port: s.port.unwrap_or(443),
            })
        }
        (None, None) => {
            if address.ip().is_unspecified() {
                err(
                    &["address"],
                    format!(
                        "the API server cannot dial {}, and neither `url` nor `service` says how to reach the host",
                        address.ip()
                    ),
                    Some(
                        "set `url = \"https://<host>:<port>\"`, or `service = { namespace = ..., name = ... }`",
                    ),
                );
            }
            None
        }
    };
    let certificate = match (&table.cert_file, &table.key_file) {
        (Some(cert), Some(key)) => Some(CertFiles {
            cert: base.join(cert),
            key: base.join(key),
            ca: table.ca_file.as_ref().map(|c| base.join(c)),
        }),
        (None, None) => {
            if table.ca_file.is_some() {
                err(
                    &["ca-file"],
                    "`ca-file` goes with `cert-file` and `key-file`; a generated certificate brings its own CA".into(),
                    None,
                );
            }
            None
        }
        (Some(_), None) => {
            err(&["cert-file"], "`cert-file` needs `key-file`".into(), None);
            None
        }
        (None, Some(_)) => {
            err(&["key-file"], "`key-file` needs `cert-file`".into(), None);
            None
        }
    };
    let prefix =
        table.configuration_prefix.clone().unwrap_or_else(|| DEFAULT_CONFIGURATION_PREFIX.to_owned());
    if !is_dns_label(&prefix) || prefix.len() > 40 {
        err(
            &["configuration-prefix"],
            format!("`{prefix}` is not a valid prefix: lowercase letters, digits and `-`, at most 40"),
            None,
        );
    }
    AdmissionSettings {
        address,
        endpoint,
        certificate,
        manage_configurations: table.manage_configurations.unwrap_or(true),
        configuration_prefix: prefix,
    }
}
