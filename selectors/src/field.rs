//! Field selectors (`k8s.io/apimachinery/pkg/fields`): comma-separated `path=value`,
//! `path==value` and `path!=value` requirements on dotted field paths.
//!
//! Invariants: every requirement has an operator and a field path of non-empty alphanumeric
//! segments (`metadata.name`, `spec.nodeName`); values are read as the API server reads them
//! (`fields.ParseSelector`): requirements split at commas not escaped with `\`, a requirement
//! at its first operator, and in a value `\\`, `\,` and `\=` stand for `\`, `,` and `=` while
//! any other escape, or a bare `=`, is an error; the string form escapes them back, so it
//! parses to the same selector. Paths and values are trimmed of surrounding spaces; the empty
//! selector matches everything. Which fields a kind supports is the server's business, not
//! this grammar's.

use std::fmt;

/// Why a field selector was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldSelectorError {
    /// A requirement without `=`, `==` or `!=`.
    #[error("`{requirement}` in field selector `{selector}` has no operator (`=`, `==` or `!=`)")]
    NoOperator { selector: String, requirement: String },
    /// A field that is not a dotted path.
    #[error("`{field}` in field selector `{selector}` is not a field path like `metadata.name`")]
    BadPath { selector: String, field: String },
    /// A value with an unknown escape, or a `=` not escaped.
    #[error("`{requirement}` in field selector `{selector}`: {reason} (escape `\\`, `,` and `=` with `\\`)")]
    BadValue { selector: String, requirement: String, reason: String },
}

/// One requirement: the field at `path` equals (or not) `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    path: String,
    value: String,
    equal: bool,
}

impl FieldRequirement {
    /// The dotted field path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value compared with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// `true` for `=` / `==`, `false` for `!=`.
    pub fn equal(&self) -> bool {
        self.equal
    }
}

/// A parsed field selector.
///
/// ```
/// use wasmctrl_selectors::FieldSelector;
/// let sel = FieldSelector::parse("metadata.name=a, status.phase!=Failed").unwrap();
/// assert!(sel.matches_with(|path| if path == "metadata.name" { "a" } else { "Running" }));
/// assert!(FieldSelector::parse("metadata.name").is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the string form of a field selector.
    pub fn parse(selector: &str) -> Result<Self, FieldSelectorError> {
        let mut requirements = Vec::new();
        if selector.trim().is_empty() {
            return Ok(Self::default());
        }
        for part in split_terms(selector) {
            let part = part.trim();
            let Some((path, op, value)) = split_term(part) else {
                return Err(FieldSelectorError::NoOperator {
                    selector: selector.to_owned(),
                    requirement: part.to_owned(),
                });
            };
            let path = path.trim();
            let ok = !path.is_empty()
                && path.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric()));
            if !ok {
                return Err(FieldSelectorError::BadPath {
                    selector: selector.to_owned(),
                    field: path.to_owned(),
                });
            }
            let value = unescape(value.trim()).map_err(|reason| FieldSelectorError::BadValue {
                selector: selector.to_owned(),
                requirement: part.to_owned(),
                reason,
            })?;
            requirements.push(FieldRequirement { path: path.to_owned(), value, equal: op != "!=" });
        }
        Ok(Self { requirements })
    }

    /// The requirements, in the order given.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether every requirement is on `metadata.name` or `metadata.namespace`.
    pub fn only_metadata(&self) -> bool {
        self.requirements.iter().all(|r| r.path == "metadata.name" || r.path == "metadata.namespace")
    }

    /// Whether the fields given by `lookup` (the string form of the value at a path, empty
    /// when absent) satisfy every requirement.
    pub fn matches_with<S: AsRef<str>>(&self, lookup: impl Fn(&str) -> S) -> bool {
        self.requirements.iter().all(|r| (lookup(&r.path).as_ref() == r.value) == r.equal)
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = FieldSelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The requirements of `selector`: split at each comma not escaped with a backslash (the
/// escape is kept, for [`unescape`]).
fn split_terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in selector.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// `path`, operator and raw value of one requirement, split at the first place an operator
/// starts (`!=`, then `==`, then `=` tried there): a path has no escapes.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    term.char_indices().find_map(|(i, _)| {
        ["!=", "==", "="]
            .into_iter()
            .find(|op| term[i..].starts_with(op))
            .map(|op| (&term[..i], op, &term[i + op.len()..]))
    })
}

/// A value as written (`\\`, `\,` and `\=` escapes) → the value.
fn unescape(raw: &str) -> Result<String, String> {
    let mut value = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => value.push(e),
                Some(e) => return Err(format!("invalid escape sequence `\\{e}`")),
                None => return Err("the value ends with a lone `\\`".to_owned()),
            },
            ',' | '=' => return Err(format!("`{c}` in a value must be escaped")),
            c => value.push(c),
        }
    }
    Ok(value)
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if r.equal { "=" } else { "!=" };
            write!(f, "{}{op}", r.path)?;
            for c in r.value.chars() {
                if matches!(c, '\\' | ',' | '=') {
                    f.write_str("\\")?;
                }
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parse_and_match() {
        let s = FieldSelector::parse("metadata.name=a,spec.nodeName==n1").unwrap();
        assert!(!s.only_metadata());
        let fields = |name: &'static str| move |p: &str| if p == "metadata.name" { name } else { "n1" };
        assert!(s.matches_with(fields("a")));
        assert!(!s.matches_with(fields("b")));
        let s = FieldSelector::parse("metadata.namespace!=kube-system").unwrap();
        assert!(s.only_metadata());
        assert!(s.matches_with(|_| "default"));
        assert!(!s.matches_with(|_| "kube-system"));
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert_eq!(FieldSelector::parse("a.b == x , c!=").unwrap().to_string(), "a.b=x,c!=");
    }

    #[test]
    fn rejects() {
        assert_eq!(
            FieldSelector::parse("metadata.name").unwrap_err().to_string(),
            "`metadata.name` in field selector `metadata.name` has no operator (`=`, `==` or `!=`)"
        );
        for bad in ["metadata..name=x", "=x", "a>1", "a,b=c", "spec.x[0]=y", "metadata.name=a,"] {
            assert!(FieldSelector::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Found by the `field_selector` fuzz target: `a==b==c` was read as the value `b==c`,
    /// written back as `a=b==c`, which did not parse. The API server refuses a bare `=` in a
    /// value, and splits at the first operator.
    #[test]
    fn values_are_read_and_written_with_the_api_servers_escapes() {
        let error = FieldSelector::parse("status.phase==Ru==ing").unwrap_err().to_string();
        assert!(error.contains("`=` in a value must be escaped"), "{error}");
        assert!(FieldSelector::parse("a=b!=c").is_err());
        let s = FieldSelector::parse(r"metadata.name=a\,b\=c\\d,spec.x!=\,").unwrap();
        assert_eq!(s.requirements()[0].value(), r"a,b=c\d");
        assert_eq!((s.requirements()[1].value(), s.requirements()[1].equal()), (",", false));
        assert_eq!(s.to_string(), r"metadata.name=a\,b\=c\\d,spec.x!=\,");
        assert_eq!(FieldSelector::parse(&s.to_string()).unwrap(), s);
        assert!(FieldSelector::parse("a=x!=y").is_err(), "split at the first operator: the path is `a`");
        for bad in [r"a=\n", r"a=b\", "a==="] {
            let error = FieldSelector::parse(bad).unwrap_err();
            assert!(matches!(error, FieldSelectorError::BadValue { .. }), "{bad:?}: {error}");
        }
        assert!(FieldSelector::parse("a!==b").unwrap_err().to_string().contains("escaped"));
    }

    proptest! {
        /// The canonical form parses back to the same selector.
        #[test]
        fn display_round_trips(parts in proptest::collection::vec(("[a-z]{1,5}(\\.[a-zA-Z0-9]{1,5}){0,2}", "[a-z0-9-]{0,3}(\\\\[,=\\\\])?[a-z]{0,2}", any::<bool>()), 0..4)) {
            let text = parts.iter().map(|(p, v, eq)| format!("{p}{}{v}", if *eq { "=" } else { "!=" })).collect::<Vec<_>>().join(",");
            let sel = FieldSelector::parse(&text).unwrap();
            prop_assert_eq!(FieldSelector::parse(&sel.to_string()).unwrap(), sel);
        }
    }
}
