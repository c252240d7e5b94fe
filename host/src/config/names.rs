//! Syntax checks for names and selectors that configuration files carry to the API server:
//! DNS labels and subdomains, label keys and values, field selectors. (Selectors are parsed
//! by the workspace's `wasmctrl-selectors` crate, the parser the cache and the dev cluster
//! use, so what passes here is what the server accepts.)
//!
//! These only validate (so a typo is reported at load time with its place in the file);
//! matching objects against selectors is the cache's job.

/// RFC 1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric, ≤ 63.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, ≤ 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label/annotation name part or value: alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric, ≤ 63 (empty allowed for values only).
fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// Checks a label or annotation key: `[prefix/]name`.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!("`{p}` in key `{key}` is not a DNS subdomain prefix"));
    }
    if !is_qualified_name_part(name) {
        return Err(format!(
            "`{key}` is not a valid label key (alphanumerics, `-`, `_`, `.`; at most 63 characters; optionally prefixed by `domain/`)"
        ));
    }
    Ok(())
}

/// Checks a label value (may be empty).
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_qualified_name_part(value) {
        Ok(())
    } else {
        Err(format!("`{value}` is not a valid label value"))
    }
}

/// Checks a field selector (`metadata.name!=x,status.phase=Running`) with the workspace's
/// selector grammar, the one the dev cluster applies.
pub fn check_field_selector(selector: &str) -> Result<(), String> {
    wasmctrl_selectors::FieldSelector::parse(selector).map(drop).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_selectors() {
        assert!(check_field_selector("metadata.name!=x,status.phase=Running").is_ok());
        assert!(check_field_selector("metadata.name").is_err());
        assert!(check_field_selector("metadata..name=x").is_err());
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_label("configmap-mirror"));
        assert!(!is_dns_label("ConfigMap"));
        assert!(!is_dns_label("-a"));
        assert!(is_dns_subdomain("example.com"));
    }
}
