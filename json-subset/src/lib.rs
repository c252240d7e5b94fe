//! Whether one JSON document is a *subset* of another: every key the expected object sets is
//! in the actual object with a matching value (recursively), arrays have the same length and
//! match element by element, numbers compare by value (`1` matches `1.0`) and other scalars
//! by equality; `key: null` expects the key to be absent (or null).
//!
//! The one home of this check: `wasmctrl test` matches a fixture's expected writes and
//! Events with it, and the guest SDK's `diff::contains` asks it whether the cluster already
//! has what a reconcile wants (so a fixture and a plugin agree on what "already there"
//! means). No dependency beyond `serde_json`, so it builds for `wasm32-wasip2` too.
//!
//! Invariants: the check is a pure function of the two documents; it allocates nothing when
//! the expected document is a subset (a plugin runs it on every reconcile), and a
//! [`Mismatch`] names the first differing place in document order.
//!
//! ```
//! use serde_json::json;
//! use wasmctrl_json_subset::{is_subset, first_mismatch, Segment};
//!
//! let actual = json!({"metadata": {"name": "a", "uid": "u"}, "data": {"k": "v"}});
//! assert!(is_subset(&json!({"data": {"k": "v"}}), &actual));
//! let expected = json!({"data": {"k": "w"}});
//! let m = first_mismatch(&expected, &actual).unwrap();
//! assert_eq!(m.path, [Segment::Key("data"), Segment::Key("k")]);
//! ```

use serde_json::Value;

/// One step into a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    /// An object's key.
    Key(&'a str),
    /// An array's index.
    Index(usize),
}

/// How the expected document differs at [`Mismatch::path`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Difference<'a> {
    /// The actual object lacks the key the expected one sets (to something other than null).
    Missing { expected: &'a Value },
    /// Arrays of different lengths (`actual` is the whole actual array).
    Length { expected: usize, actual: &'a Value },
    /// Different values (or types).
    Value { expected: &'a Value, actual: &'a Value },
}

/// Where and how the expected document first fails to be a subset of the actual one.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch<'a> {
    /// From the root, outermost first (empty: the documents themselves).
    pub path: Vec<Segment<'a>>,
    pub difference: Difference<'a>,
}

/// Whether `expected` is a subset of `actual`.
pub fn is_subset(expected: &Value, actual: &Value) -> bool {
    first_mismatch(expected, actual).is_none()
}

/// The first place where `expected` is not a subset of `actual`, or `None` when it is.
pub fn first_mismatch<'a>(expected: &'a Value, actual: &'a Value) -> Option<Mismatch<'a>> {
    let mut m = mismatch(expected, actual)?;
    // Built innermost first on the way back up, so nothing is allocated on a match.
    m.path.reverse();
    Some(m)
}

fn mismatch<'a>(expected: &'a Value, actual: &'a Value) -> Option<Mismatch<'a>> {
    let at = |segment, mut m: Mismatch<'a>| {
        m.path.push(segment);
        m
    };
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => e.iter().find_map(|(k, ev)| match a.get(k) {
            Some(av) => mismatch(ev, av).map(|m| at(Segment::Key(k), m)),
            None if ev.is_null() => None,
            None => Some(Mismatch {
                path: vec![Segment::Key(k)],
                difference: Difference::Missing { expected: ev },
            }),
        }),
        (Value::Array(e), Value::Array(a)) if e.len() != a.len() => {
            Some(Mismatch { path: Vec::new(), difference: Difference::Length { expected: e.len(), actual } })
        }
        (Value::Array(e), Value::Array(a)) => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (ev, av))| mismatch(ev, av).map(|m| at(Segment::Index(i), m))),
        (Value::Number(e), Value::Number(a))
            if e == a || e.as_f64().zip(a.as_f64()).is_some_and(|(e, a)| e == a) =>
        {
            None
        }
        (e, a) if e == a => None,
        (e, a) => {
            Some(Mismatch { path: Vec::new(), difference: Difference::Value { expected: e, actual: a } })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_fields_in_actual_are_fine() {
        let actual = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}});
        assert!(is_subset(&json!({"metadata": {"name": "a", "labels": {"x": "1"}}}), &actual));
        assert!(!is_subset(&json!({"metadata": {"labels": {"x": "2"}}}), &actual));
        assert!(!is_subset(&json!({"data": {"other": "v"}}), &actual));
    }

    #[test]
    fn null_means_absent() {
        assert!(is_subset(&json!({"b": null}), &json!({"a": 1})));
        assert!(is_subset(&json!({"a": null}), &json!({"a": null})));
        assert!(!is_subset(&json!({"a": null}), &json!({"a": 1})));
    }

    #[test]
    fn arrays_are_ordered_and_sized() {
        let actual = json!({"ports": [{"port": 80, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}]});
        assert!(is_subset(&json!({"ports": [{"port": 80}, {"port": 443}]}), &actual));
        assert!(!is_subset(&json!({"ports": [{"port": 443}, {"port": 80}]}), &actual));
        assert!(!is_subset(&json!({"ports": [{"port": 80}]}), &actual));
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(is_subset(&json!(1), &json!(1.0)));
        assert!(is_subset(&json!(1.0), &json!(1)));
        assert!(!is_subset(&json!(1), &json!(2)));
        assert!(!is_subset(&json!(1), &json!("1")));
    }

    #[test]
    fn a_mismatch_names_the_first_difference_outermost_first() {
        let actual = json!({"a": [{"b": 1}, {"b": 2}], "c": "x"});
        let (two, three, one) = (json!(2), json!(3), json!(1));
        let expected = json!({"a": [{"b": 1}, {"b": 3}]});
        let m = first_mismatch(&expected, &actual).unwrap();
        assert_eq!(m.path, [Segment::Key("a"), Segment::Index(1), Segment::Key("b")]);
        assert_eq!(m.difference, Difference::Value { expected: &three, actual: &two });
        let expected = json!({"d": 1});
        let m = first_mismatch(&expected, &actual).unwrap();
        assert_eq!((m.path, m.difference), (vec![Segment::Key("d")], Difference::Missing { expected: &one }));
        let expected = json!({"a": []});
        let m = first_mismatch(&expected, &actual).unwrap();
        assert_eq!(m.path, [Segment::Key("a")]);
        assert!(matches!(m.difference, Difference::Length { expected: 0, .. }));
        assert!(first_mismatch(&json!("x"), &json!("y")).unwrap().path.is_empty());
    }
}
