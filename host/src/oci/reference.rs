//! Plugin references: `oci://<registry>/<repository>[:<tag>][@sha256:<digest>]`, the value
//! of a plugin TOML's `wasm` key when the component comes from a registry.
//!
//! Invariants: a parsed [`OciReference`] names its registry explicitly (no implicit Docker
//! Hub: `oci://plugins/mirror:1` is refused, not read as `docker.io/plugins/mirror`); its
//! repository and tag follow the OCI distribution grammar (checked by `oci-spec`'s parser,
//! which `oci-client` uses, so what parses here is what the client requests); a reference
//! with a digest is pinned — the digest wins over the tag, which is then only a label — and
//! one without names a tag (`latest` when none is written) that the host polls.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

use super::digest::Digest;

/// The scheme of a registry reference in a plugin TOML.
pub const SCHEME: &str = "oci://";

/// A Wasm artifact in a registry.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OciReference {
    /// `host[:port]`, as written (lowercase).
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

/// Why a `wasm = "oci://..."` value is not a reference.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("`{0}` does not start with `oci://`")]
    Scheme(String),
    #[error("`{0}` names no registry: write the registry host first, e.g. `oci://ghcr.io/org/plugin:1.0`")]
    NoRegistry(String),
    #[error("`{reference}` is not a valid reference: {why}")]
    Invalid { reference: String, why: String },
}

impl OciReference {
    /// Whether a plugin TOML's `wasm` value names a registry rather than a file.
    pub fn is_registry_value(value: &str) -> bool {
        value.starts_with(SCHEME)
    }

    /// The registry, `host[:port]`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository within the registry (`org/plugin`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, when one was written (or `latest` when neither a tag nor a digest was).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, when the reference is pinned.
    pub fn digest(&self) -> Option<Digest> {
        self.digest
    }

    /// The same artifact pinned to `digest` (the tag is kept as a label).
    pub fn with_digest(&self, digest: Digest) -> OciReference {
        OciReference { digest: Some(digest), ..self.clone() }
    }

    /// The same repository with another tag and no digest (cosign's `sha256-<hex>.sig`).
    pub fn with_tag(&self, tag: &str) -> OciReference {
        OciReference { tag: Some(tag.to_owned()), digest: None, ..self.clone() }
    }

    /// `registry/repository`, as cosign's payload names the image.
    pub fn repository_path(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// Whether the registry's host is a loopback address (`localhost`, `127.0.0.0/8`, `[::1]`).
    pub fn is_loopback(&self) -> bool {
        is_loopback_registry(&self.registry)
    }

    /// The reference as `oci-client` takes it: by digest when pinned, else by tag.
    pub(crate) fn to_client(&self) -> oci_client::Reference {
        match (self.digest, &self.tag) {
            (Some(d), _) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                d.to_string(),
            ),
            (None, tag) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone().unwrap_or_else(|| "latest".to_owned()),
            ),
        }
    }
}

/// Whether `registry` (`host[:port]`) is on a loopback address: `localhost`, an IPv4
/// address in `127.0.0.0/8` or `[::1]`.
pub fn is_loopback_registry(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, _)) => return h.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback()),
            None => return false,
        }
    } else {
        registry.split(':').next().unwrap_or_default()
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

impl FromStr for OciReference {
    type Err = ReferenceError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let Some(rest) = value.strip_prefix(SCHEME) else {
            return Err(ReferenceError::Scheme(value.to_owned()));
        };
        let invalid = |why: String| ReferenceError::Invalid { reference: value.to_owned(), why };
        // Docker's rule for "the first component is a registry": it has a dot or a port, or
        // is `localhost` (an IPv6 literal is bracketed, so it has a colon).
        let first = rest.split('/').next().unwrap_or_default();
        let names_registry =
            rest.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
        if !names_registry {
            return Err(ReferenceError::NoRegistry(value.to_owned()));
        }
        if first.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(invalid("the registry host must be lowercase".into()));
        }
        // `oci-spec`'s parser is the distribution grammar `oci-client` requests by.
        let parsed = oci_client::Reference::try_from(rest).map_err(|e| invalid(e.to_string()))?;
        if parsed.registry() != first {
            // Only the Docker Hub aliases are rewritten; keep what the user wrote, or refuse.
            return Err(invalid(format!(
                "the registry `{first}` would be read as `{}`; write that instead",
                parsed.registry()
            )));
        }
        let digest = match parsed.digest() {
            Some(d) => Some(d.parse::<Digest>().map_err(|e| invalid(e.to_string()))?),
            None => None,
        };
        Ok(OciReference {
            registry: parsed.registry().to_owned(),
            repository: parsed.repository().to_owned(),
            tag: parsed.tag().map(str::to_owned).or_else(|| digest.is_none().then(|| "latest".to_owned())),
            digest,
        })
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn tags_digests_and_ports() {
        let r: OciReference = "oci://ghcr.io/org/plugins/mirror:1.2.0".parse().unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            ("ghcr.io", "org/plugins/mirror", Some("1.2.0"), None)
        );
        assert_eq!(r.to_string(), "oci://ghcr.io/org/plugins/mirror:1.2.0");

        let r: OciReference = format!("oci://127.0.0.1:5000/mirror@{D}").parse().unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest().unwrap().to_string(), D);
        assert_eq!(r.to_string(), format!("oci://127.0.0.1:5000/mirror@{D}"));

        let r: OciReference = format!("oci://localhost:5000/a/b:v1@{D}").parse().unwrap();
        assert_eq!((r.tag(), r.digest().is_some()), (Some("v1"), true));
        assert_eq!(r.to_client().to_string(), format!("localhost:5000/a/b@{D}"));

        let r: OciReference = "oci://registry.example.com/mirror".parse().unwrap();
        assert_eq!(r.tag(), Some("latest"));
        assert_eq!(r.to_client().to_string(), "registry.example.com/mirror:latest");
        assert_eq!(
            r.with_tag("sha256-ab.sig").to_string(),
            "oci://registry.example.com/mirror:sha256-ab.sig"
        );
    }

    #[test]
    fn refuses_what_is_not_an_explicit_well_formed_reference() {
        assert!(matches!("ghcr.io/a:1".parse::<OciReference>(), Err(ReferenceError::Scheme(_))));
        for no_registry in ["oci://mirror:1", "oci://org/mirror:1", "oci://ghcr.io"] {
            assert!(
                matches!(no_registry.parse::<OciReference>(), Err(ReferenceError::NoRegistry(_))),
                "{no_registry}"
            );
        }
        for bad in [
            "oci://ghcr.io/Org/mirror:1",
            "oci://GHCR.io/org/mirror:1",
            "oci://ghcr.io/org/mirror:",
            "oci://ghcr.io/org/mirror:a b",
            "oci://ghcr.io/org/mirror@sha256:1234",
            "oci://ghcr.io/org/mirror@sha512:1234",
            "oci://index.docker.io/org/mirror:1",
        ] {
            assert!(matches!(bad.parse::<OciReference>(), Err(ReferenceError::Invalid { .. })), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any text is refused or parsed, never a panic; what parses prints back to itself.
        #[test]
        fn any_text_parses_or_is_refused(text in "\\PC{0,80}", tail in "[a-z0-9./:@_-]{0,60}") {
            for value in [format!("oci://{text}"), format!("oci://registry.example.com/{tail}"), text.clone()] {
                if let Ok(r) = value.parse::<OciReference>() {
                    proptest::prop_assert_eq!(r.to_string().parse::<OciReference>().ok(), Some(r.clone()));
                    let _ = is_loopback_registry(r.registry());
                }
            }
            let _ = is_loopback_registry(&text);
        }
    }

    #[test]
    fn loopback_registries() {
        for yes in ["localhost:5000", "127.0.0.1:5000", "127.1.2.3", "[::1]:5000", "LOCALHOST"] {
            assert!(is_loopback_registry(yes), "{yes}");
        }
        for no in
            ["ghcr.io", "10.0.0.1:5000", "localhost.example.com:5000", "[::2]:5000", "[::1", "0.0.0.0:5000"]
        {
            assert!(!is_loopback_registry(no), "{no}");
        }
    }
}
