//! Label keys and values as apimachinery's `validation.IsQualifiedName` and
//! `IsValidLabelValue` accept them.
//!
//! Hand-written rather than a regex crate: the grammar is a few character classes and
//! length limits, and it runs on every selector the dev cluster receives.
//!
//! Invariant: both checks are pure and accept exactly the strings the API server accepts.

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

/// A lowercase RFC 1123 subdomain of at most 253 bytes.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Checks a label key: `[prefix/]name` (a qualified name).
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
}
