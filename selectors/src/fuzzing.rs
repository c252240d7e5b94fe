//! The checks the selector fuzz targets (`fuzz/fuzz_targets/{label,field}_selector.rs`) run on
//! each input, here so that the stable test suite runs them too (on the committed seeds and
//! on generated inputs). Not part of the API (hidden from the docs).
//!
//! Invariants checked: parsing any text is an error or a selector, never a panic; a
//! selector's string form parses back to an equal selector that matches the same label (or
//! field) sets; a structured selector matches its own `matchLabels`.

use std::collections::BTreeMap;

use crate::{FieldSelector, LabelSelector};

/// The `label_selector` target. Input: the selector on the first line; each further line is a
/// label `key=value` of the set matched against, and also a `matchLabels` pair, or
/// `key Operator v1 v2 ...` (a line with no `=`), a `matchExpressions` entry.
pub fn label_selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let selector = lines.next().unwrap_or_default();
    let mut labels = BTreeMap::new();
    let mut expressions: Vec<(&str, &str, Vec<String>)> = Vec::new();
    for line in lines {
        if let Some((k, v)) = line.split_once('=') {
            labels.insert(k.to_owned(), v.to_owned());
        } else {
            let mut words = line.split(' ');
            let key = words.next().unwrap_or_default();
            let op = words.next().unwrap_or_default();
            expressions.push((key, op, words.map(str::to_owned).collect()));
        }
    }

    if let Ok(parsed) = LabelSelector::parse(selector) {
        let shown = parsed.to_string();
        let again = LabelSelector::parse(&shown)
            .unwrap_or_else(|e| panic!("{selector:?} parses but its form {shown:?} does not: {e}"));
        assert_eq!(
            parsed.matches(&labels),
            again.matches(&labels),
            "{selector:?} vs {shown:?} on {labels:?}"
        );
        assert_eq!(parsed.to_string(), again.to_string());
        let _ = parsed.is_everything();
    }

    let pairs = labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let exprs = expressions.iter().map(|(k, op, values)| (*k, *op, values.as_slice()));
    if let Ok(built) = LabelSelector::from_parts(selector, pairs, exprs) {
        let shown = built.to_string();
        let again = LabelSelector::parse(&shown)
            .unwrap_or_else(|e| panic!("a structured selector's form {shown:?} does not parse: {e}"));
        assert_eq!(built.matches(&labels), again.matches(&labels), "{shown:?} on {labels:?}");
        if expressions.is_empty() {
            assert!(built.matches(&labels), "{shown:?} does not match its own matchLabels {labels:?}");
        }
    }
}

/// The `field_selector` target. Input: the selector on the first line; each further line
/// `path=value` is a field of the object matched against.
pub fn field_selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let selector = lines.next().unwrap_or_default();
    let fields: BTreeMap<&str, &str> = lines.filter_map(|l| l.split_once('=')).collect();
    let Ok(parsed) = FieldSelector::parse(selector) else { return };
    let shown = parsed.to_string();
    let again = FieldSelector::parse(&shown)
        .unwrap_or_else(|e| panic!("{selector:?} parses but its form {shown:?} does not: {e}"));
    assert_eq!(parsed, again, "{selector:?} vs {shown:?}");
    let lookup = |path: &str| fields.get(path).copied().unwrap_or("");
    assert_eq!(parsed.matches_with(lookup), again.matches_with(lookup));
    let _ = parsed.only_metadata();
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The committed seeds of a fuzz target (`fuzz/seeds/<target>`).
    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let seeds: Vec<Vec<u8>> = entries
            .map(|e| {
                std::fs::read(e.unwrap_or_else(|e| panic!("{e}")).path()).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        assert!(!seeds.is_empty(), "{} holds no seed", dir.display());
        seeds
    }

    #[test]
    fn the_seeds_pass_the_fuzz_checks() {
        seeds("label_selector").iter().for_each(|s| label_selector(s));
        seeds("field_selector").iter().for_each(|s| field_selector(s));
    }

    /// Selector-shaped text: the characters the grammars give meaning to, and a few others.
    fn selector_text() -> impl Strategy<Value = String> {
        proptest::string::string_regex(r"[a-z0-9./\-_=!,() \\\n]{0,60}|[a-z]{1,4}(=|==|!=| in | notin |>|<)[a-z0-9(),\\]{0,8}(\n[a-z]{1,3}(=| In | NotIn | Exists)[a-z ]{0,6}){0,3}")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    proptest! {
        #[test]
        fn generated_label_selectors_pass_the_fuzz_checks(text in selector_text()) {
            label_selector(text.as_bytes());
        }

        #[test]
        fn generated_field_selectors_pass_the_fuzz_checks(text in selector_text()) {
            field_selector(text.as_bytes());
        }

        #[test]
        fn any_bytes_pass_the_fuzz_checks(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            label_selector(&data);
            field_selector(&data);
        }
    }
}
