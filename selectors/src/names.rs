//! Names as apimachinery's `pkg/util/validation` accepts them: DNS labels and subdomains
//! (`IsDNS1123Label`, `IsDNS1123Subdomain`, `IsDNS1035Label`), label keys
//! (`IsQualifiedName`) and label values (`IsValidLabelValue`).
//!
//! The one home of these checks: the selector parser, the host's configuration check,
//! `wasmctrl new` and the guest SDK's test host all call them, so a name is accepted or
//! refused the same way everywhere.
//!
//! Hand-written rather than a regex crate: the grammar is a few character classes and
//! length limits, and it runs on every selector the dev cluster receives.
//!
//! Invariant: every check is pure and accepts exactly the strings the API server accepts.

/// A name part or label value: alphanumerics, `-`, `_`, `.`, starting and ending with an
/// alphanumeric, at most `max` bytes.
fn is_name_segment(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// An RFC 1123 label (`IsDNS1123Label`): lowercase alphanumerics and `-`, starting and
/// ending with an alphanumeric, at most 63 bytes. Namespaces and most object names.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// An RFC 1035 label (`IsDNS1035Label`): an RFC 1123 label that starts with a letter.
/// Service names, and names that become identifiers (a plugin's crate name).
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// A lowercase RFC 1123 subdomain (`IsDNS1123Subdomain`): dot-separated RFC 1123 labels,
/// at most 253 bytes.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks a label key (also an annotation key): `[prefix/]name` (a qualified name).
pub fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!("label key {key:?} has an invalid prefix (must be a DNS subdomain)"));
    }
    if !is_name_segment(name, 63) {
        return Err(format!(
            "label key {key:?} is invalid (name part: up to 63 alphanumerics, '-', '_' or '.', \
             starting and ending with an alphanumeric)"
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or up to 63 characters as a name segment.
pub fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_segment(value, 63) {
        Ok(())
    } else {
        Err(format!("label value {value:?} is invalid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        for ok in ["a", "app.kubernetes.io/name", "A_b-c.d", "x/y", &"k".repeat(63)] {
            assert!(validate_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a/b/c", "UPPER.com/x", "/x", "x/", &"k".repeat(64)] {
            assert!(validate_key(bad).is_err(), "{bad}");
        }
        for ok in ["", "v", "My_Value-1.2", &"v".repeat(63)] {
            assert!(validate_value(ok).is_ok(), "{ok}");
        }
        for bad in ["-a", "a-", "+3", "a b", "a/b", &"v".repeat(64)] {
            assert!(validate_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dns_labels() {
        for ok in ["a", "configmap-mirror", "0abc", "a-1", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "ConfigMap", "-a", "a-", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn dns1035_labels_start_with_a_letter() {
        assert!(is_dns1035_label("stamp-2"));
        for bad in ["Stamp", "-a", "2stamp", ""] {
            assert!(!is_dns1035_label(bad), "{bad}");
        }
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["example.com", "a", "a-b.c-d.e", &format!("{}.{}", "a".repeat(63), "b".repeat(63))] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        let long = vec!["a".repeat(63); 4].join(".");
        for bad in ["", ".", "a..b", ".a", "a.", "Example.com", "a_b.c", long.as_str()] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
