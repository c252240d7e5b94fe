//! Kubernetes label selectors (`app=web,tier in (a,b),!legacy`) for the test host's
//! `cache::list`.
//!
//! Hand-written: the well-kept implementations live in crates a guest SDK should not pull
//! in (kube-core and its HTTP stack); the grammar is small. Invariant: a selector that does
//! not parse is an error, never "matches everything".

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses the text form; the empty string selects everything.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Selector(requirements))
    }

    /// Whether `labels` satisfy every requirement.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(k: &str) -> Result<String, String> {
    let ok =
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok { Ok(k.to_owned()) } else { Err(format!("invalid label key {k:?}")) }
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised list, found {rest:?}"))?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(valid_key(key.trim())?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(valid_key(k.trim())?, v.trim().to_owned()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(valid_key(k.trim())?, v.trim().to_owned()));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if let Some(set) = rest.strip_prefix("notin") {
        return Ok(Requirement::NotIn(valid_key(key)?, parse_set(set)?));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return Ok(Requirement::In(valid_key(key)?, parse_set(set)?));
    }
    if rest.is_empty() {
        return Ok(Requirement::Exists(valid_key(key)?));
    }
    Err(format!("cannot parse label selector requirement {part:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator() {
        let s = Selector::parse("app=web,tier in (a, b),!legacy,env!=prod,zone notin (x),team").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a"), ("team", "t")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("team", "t")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("team", "t"), ("legacy", "")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("team", "t"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("team", "t"), ("zone", "x")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(Selector::parse("").unwrap().matches(&labels(&[])));
        assert!(Selector::parse("a b c").is_err());
        assert!(Selector::parse("=x").is_err());
    }
}
