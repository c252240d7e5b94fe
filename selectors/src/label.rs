//! Kubernetes label selectors, parsed and evaluated as `k8s.io/apimachinery/pkg/labels` does.
//!
//! Grammar (comma-separated requirements, whitespace ignored between tokens):
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
//! `key notin (v1,v2)`, `key>n`, `key<n` (integers). The empty selector matches everything.
//!
//! `>` and `<` take one integer (the value is first checked as a label value, as the API
//! server does, so `x>-1` is refused).
//!
//! Invariants: keys are valid qualified names and values valid label values (checked on
//! parse); requirements are kept sorted by key so [`Display`](std::fmt::Display) is canonical.

use std::collections::BTreeSet;
use std::fmt;

use crate::labels::Labels;
use crate::names::{validate_key, validate_value};

/// Why a selector string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector text as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The operator of one [`Requirement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `key in (a,b)`, `key=a`, `key==a`.
    In,
    /// `key notin (a,b)`, `key!=a`: also true when the label is absent.
    NotIn,
    /// `key`.
    Exists,
    /// `!key`.
    DoesNotExist,
    /// `key>n`: the label parses as an integer greater than `n`.
    GreaterThan,
    /// `key<n`: the label parses as an integer less than `n`.
    LessThan,
}

/// One clause of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Operator,
    /// Sorted so that display and equality do not depend on input order.
    values: BTreeSet<String>,
    /// Spelling used for single-value equality (`=`, `==`, `!=`), for display.
    equality: Option<&'static str>,
}

impl Requirement {
    /// The label key this clause tests.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.op
    }

    /// The values (empty for `Exists` / `DoesNotExist`).
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(String::as_str)
    }

    /// Whether a label value (or its absence) satisfies this clause.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match self.op {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(v), Some(bound)) = (value, self.values.first()) else { return false };
                let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else { return false };
                if self.op == Operator::GreaterThan { v > bound } else { v < bound }
            }
        }
    }
}

/// A parsed label selector.
///
/// ```
/// use wasmctrl_selectors::LabelSelector;
/// let sel = LabelSelector::parse("app=web, tier in (front,back), !legacy").unwrap();
/// let labels = [("app", "web"), ("tier", "front")];
/// assert!(sel.matches_with(|k| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| *v)));
/// assert!(LabelSelector::parse("app in (a").is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses the Kubernetes string form of a selector.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let err = |reason: String| SelectorError { selector: input.to_owned(), reason };
        let tokens = lex(input).map_err(err)?;
        let mut parser = Parser { tokens, pos: 0 };
        let mut requirements = Vec::new();
        if parser.tokens.is_empty() {
            return Ok(Self::default());
        }
        loop {
            requirements.push(parser.requirement().map_err(err)?);
            match parser.next() {
                None => break,
                Some(Token::Comma) => {}
                Some(t) => return Err(err(format!("expected ',' or end of input, found {t}"))),
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Builds a selector from the structured `metav1.LabelSelector` form: `match_labels`
    /// pairs and `(key, operator, values)` expressions with the operators `In`, `NotIn`,
    /// `Exists` and `DoesNotExist`. `text` names the selector in errors.
    pub fn from_parts<'a>(
        text: &str,
        match_labels: impl IntoIterator<Item = (&'a str, &'a str)>,
        match_expressions: impl IntoIterator<Item = (&'a str, &'a str, &'a [String])>,
    ) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        let err = |reason: String| SelectorError { selector: text.to_owned(), reason };
        for (k, v) in match_labels {
            validate_key(k).map_err(err)?;
            validate_value(v).map_err(err)?;
            requirements.push(Requirement {
                key: k.to_owned(),
                op: Operator::In,
                values: BTreeSet::from([v.to_owned()]),
                equality: Some("="),
            });
        }
        for (key, operator, values) in match_expressions {
            validate_key(key).map_err(err)?;
            let values: BTreeSet<String> = values.iter().cloned().collect();
            let op = match operator {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(err(format!("unknown operator {other:?}"))),
            };
            let needs_values = matches!(op, Operator::In | Operator::NotIn);
            if needs_values == values.is_empty() {
                return Err(err(format!("operator {operator} for key {key:?} has wrong values")));
            }
            for v in &values {
                validate_value(v).map_err(err)?;
            }
            requirements.push(Requirement { key: key.to_owned(), op, values, equality: None });
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// The clauses, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether this selector matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether a label set satisfies every clause.
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        self.requirements.iter().all(|r| r.matches_value(labels.label(&r.key)))
    }

    /// Whether the labels given by `lookup` satisfy every clause.
    pub fn matches_with<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches_value(lookup(&r.key)))
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let first = r.values.first().map(String::as_str).unwrap_or_default();
            let joined = r.values.iter().map(String::as_str).collect::<Vec<_>>().join(",");
            match (r.op, r.equality) {
                (Operator::Exists, _) => write!(f, "{}", r.key)?,
                (Operator::DoesNotExist, _) => write!(f, "!{}", r.key)?,
                (Operator::In | Operator::NotIn, Some(eq)) => write!(f, "{}{eq}{first}", r.key)?,
                (Operator::In, None) => write!(f, "{} in ({joined})", r.key)?,
                (Operator::NotIn, None) => write!(f, "{} notin ({joined})", r.key)?,
                (Operator::GreaterThan, _) => write!(f, "{}>{first}", r.key)?,
                (Operator::LessThan, _) => write!(f, "{}<{first}", r.key)?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    OpenParen,
    CloseParen,
    Comma,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => write!(f, "{s:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Eq => f.write_str("'='"),
            Token::DoubleEq => f.write_str("'=='"),
            Token::NotEq => f.write_str("'!='"),
            Token::Gt => f.write_str("'>'"),
            Token::Lt => f.write_str("'<'"),
            Token::OpenParen => f.write_str("'('"),
            Token::CloseParen => f.write_str("')'"),
            Token::Comma => f.write_str("','"),
        }
    }
}

fn lex(input: &str) -> Result<Vec<Token>, String> {
    let special = |c: char| matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',');
    let mut tokens = Vec::new();
    let mut chars = input.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if special(c) {
            chars.next();
            let next_is_eq = chars.peek().is_some_and(|&(_, n)| n == '=');
            let tok = match c {
                '!' if next_is_eq => {
                    chars.next();
                    Token::NotEq
                }
                '!' => Token::Not,
                '=' if next_is_eq => {
                    chars.next();
                    Token::DoubleEq
                }
                '=' => Token::Eq,
                '>' => Token::Gt,
                '<' => Token::Lt,
                '(' => Token::OpenParen,
                ')' => Token::CloseParen,
                _ => Token::Comma,
            };
            tokens.push(tok);
            continue;
        }
        let mut end = input.len();
        while let Some(&(j, n)) = chars.peek() {
            if n.is_whitespace() || special(n) {
                end = j;
                break;
            }
            chars.next();
        }
        tokens.push(Token::Ident(input[i..end].to_owned()));
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let negated = matches!(self.peek(), Some(Token::Not));
        if negated {
            self.pos += 1;
        }
        let key = match self.next() {
            Some(Token::Ident(k)) => k,
            Some(t) => return Err(format!("expected a label key, found {t}")),
            None => return Err("expected a label key, found end of input".into()),
        };
        validate_key(&key)?;
        let exists = |op| Requirement { key: key.clone(), op, values: BTreeSet::new(), equality: None };
        if negated {
            return match self.peek() {
                None | Some(Token::Comma) => Ok(exists(Operator::DoesNotExist)),
                Some(t) => Err(format!("expected ',' or end of input after '!{key}', found {t}")),
            };
        }
        let op_token = match self.peek() {
            None | Some(Token::Comma) => return Ok(exists(Operator::Exists)),
            Some(_) => self.next(),
        };
        let (op, equality) = match op_token {
            Some(Token::Eq) => (Operator::In, Some("=")),
            Some(Token::DoubleEq) => (Operator::In, Some("==")),
            Some(Token::NotEq) => (Operator::NotIn, Some("!=")),
            Some(Token::Gt) => (Operator::GreaterThan, None),
            Some(Token::Lt) => (Operator::LessThan, None),
            Some(Token::Ident(w)) if w == "in" => (Operator::In, None),
            Some(Token::Ident(w)) if w == "notin" => (Operator::NotIn, None),
            Some(t) => return Err(format!("expected an operator after {key:?}, found {t}")),
            None => return Err(format!("expected an operator after {key:?}")),
        };
        let values = if equality.is_some() || matches!(op, Operator::GreaterThan | Operator::LessThan) {
            // A single value; `a=` (empty value) is allowed, as in Kubernetes.
            let v = match self.peek() {
                Some(Token::Ident(_)) => match self.next() {
                    Some(Token::Ident(v)) => v,
                    _ => String::new(),
                },
                None | Some(Token::Comma) => String::new(),
                Some(t) => return Err(format!("expected a value for {key:?}, found {t}")),
            };
            validate_value(&v)?;
            if matches!(op, Operator::GreaterThan | Operator::LessThan) {
                v.parse::<i64>().map_err(|_| format!("value {v:?} for {key:?} must be an integer"))?;
            }
            BTreeSet::from([v])
        } else {
            self.value_set(&key)?
        };
        Ok(Requirement { key, op, values, equality })
    }

    /// `( v1, v2, ... )`; like Kubernetes, empty slots stand for the empty value.
    fn value_set(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Some(Token::OpenParen) => {}
            _ => return Err(format!("expected '(' after set operator for {key:?}")),
        }
        let mut values = BTreeSet::new();
        let mut expect_value = true;
        loop {
            match self.next() {
                Some(Token::Ident(v)) if expect_value => {
                    validate_value(&v)?;
                    values.insert(v);
                    expect_value = false;
                }
                Some(Token::Comma) => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    expect_value = true;
                }
                Some(Token::CloseParen) => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    return Ok(values);
                }
                Some(t) => return Err(format!("unexpected {t} in value set for {key:?}")),
                None => return Err(format!("unterminated value set for {key:?}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |k| pairs.iter().find(|(l, _)| *l == k).map(|(_, v)| *v)
    }

    #[test]
    fn selector_parse_and_display_round_trip() {
        let cases = [
            ("x=a,y=b,z=c", "x=a,y=b,z=c"),
            ("z=c , x=a", "x=a,z=c"),
            ("x==a", "x==a"),
            ("x!=a", "x!=a"),
            ("x in (b, a)", "x in (a,b)"),
            ("x notin (a)", "x notin (a)"),
            ("x", "x"),
            ("!x", "!x"),
            ("x>1", "x>1"),
            ("x<1", "x<1"),
            ("x=", "x="),
            ("x in (,a)", "x in (,a)"),
            ("example.com/app=web", "example.com/app=web"),
            ("", ""),
        ];
        for (input, want) in cases {
            let sel = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(sel.to_string(), want, "{input}");
        }
    }

    #[test]
    fn selector_rejects_bad_input() {
        for bad in [
            "x=a||y=b",
            "x==a==b",
            "!x=a",
            "x in a",
            "x in (a",
            "x notin",
            "x>a",
            "x<",
            ",",
            "x=a,",
            "-x=a",
            "x=-a",
            "x==(a)",
            "a/b/c",
            "UPPER.com/x=a",
            "x in (a b)",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn selector_matching() {
        let l = [("app", "web"), ("tier", "front"), ("n", "5")];
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches_with(labels(&l));
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"), "!= matches absent labels");
        assert!(m("tier in (front,back)"));
        assert!(!m("tier in (back)"));
        assert!(m("tier notin (back)"));
        assert!(m("missing notin (x)"), "notin matches absent labels");
        assert!(m("app"));
        assert!(!m("missing"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("n>4"));
        assert!(!m("n>5"));
        assert!(m("n<6"));
        assert!(!m("app>1"), "non-integer labels never satisfy >");
        assert!(!m("missing<1"));
        assert!(m("app=web,tier=front"));
        assert!(!m("app=web,tier=back"));
    }

    #[test]
    fn selector_from_parts() {
        let values = ["db".to_string()];
        let sel =
            LabelSelector::from_parts("sel", [("app", "web")], [("tier", "NotIn", &values[..])]).unwrap();
        assert_eq!(sel.to_string(), "app=web,tier notin (db)");
        assert!(sel.matches_with(labels(&[("app", "web")])));
        assert!(!sel.matches_with(labels(&[("app", "web"), ("tier", "db")])));
        assert!(LabelSelector::from_parts("sel", [], [("tier", "Gt", &values[..])]).is_err());
        assert!(LabelSelector::from_parts("sel", [], [("tier", "Exists", &values[..])]).is_err());
    }

    /// Acceptance as `labels.Parse` of k8s.io/apimachinery v0.34.1 (the API server's parser)
    /// decided each of these, with its canonical form when accepted.
    #[test]
    fn agrees_with_the_api_server_parser() {
        let accepted = [
            ("tier>3", "tier>3"),
            ("tier > 3", "tier>3"),
            ("x>03", "x>03"),
            ("x>1,x<5", "x>1,x<5"),
            ("x=a", "x=a"),
            ("x==a", "x==a"),
            ("x!=a", "x!=a"),
            ("x in (a,b)", "x in (a,b)"),
            ("x notin (a)", "x notin (a)"),
            ("x in ()", "x in ()"),
            ("x in (,a)", "x in (,a)"),
            ("x=", "x="),
            ("!x", "!x"),
            ("x", "x"),
        ];
        for (input, canonical) in accepted {
            let sel = LabelSelector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(sel.to_string(), canonical, "{input}");
        }
        let refused = [
            "tier>a",
            "tier<-1",
            "tier>3.5",
            "x>",
            "x>+3",
            "x,",
            ",",
            "x=a,",
            "!x=a",
            "-x=a",
            "x=-a",
            "a/b/c",
            "UPPER.com/x=a",
            "x in (a b)",
            "x in a",
            "x=a b",
        ];
        for input in refused {
            assert!(LabelSelector::parse(input).is_err(), "{input:?} should be refused");
        }
    }

    mod prop {
        use proptest::prelude::*;

        use super::*;

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z][a-z0-9]{0,5}",
                "[a-z]{1,4}\\.[a-z]{2,3}/[A-Za-z][A-Za-z0-9_.-]{0,4}[A-Za-z0-9]",
            ]
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof!["", "[A-Za-z0-9]", "[A-Za-z0-9][A-Za-z0-9_.-]{0,6}[A-Za-z0-9]"]
        }

        fn clause() -> impl Strategy<Value = String> {
            (key(), 0..8usize, proptest::collection::vec(value(), 1..4), -50i64..50).prop_map(
                |(k, op, vs, n)| match op {
                    0 => format!("{k}={}", vs[0]),
                    1 => format!("{k}=={}", vs[0]),
                    2 => format!("{k}!={}", vs[0]),
                    3 => format!("{k} in ({})", vs.join(",")),
                    4 => format!("{k} notin ({})", vs.join(", ")),
                    5 => k,
                    6 => format!("!{k}"),
                    _ => format!("{k}{}{}", if n % 2 == 0 { ">" } else { "<" }, n.unsigned_abs()),
                },
            )
        }

        proptest! {
            /// Whatever parses displays canonically, and the canonical form parses back equal.
            #[test]
            fn display_round_trips(clauses in proptest::collection::vec(clause(), 0..5)) {
                let text = clauses.join(",");
                let sel = LabelSelector::parse(&text).unwrap();
                let again = LabelSelector::parse(&sel.to_string()).unwrap();
                prop_assert_eq!(&again, &sel);
                prop_assert_eq!(again.to_string(), sel.to_string());
            }

            /// `in` and `notin` over the same values split every label set in two.
            #[test]
            fn in_and_notin_are_complements(
                k in key(),
                vs in proptest::collection::vec(value(), 1..4),
                actual in proptest::option::of(value()),
            ) {
                let set = vs.join(",");
                let yes = LabelSelector::parse(&format!("{k} in ({set})")).unwrap();
                let no = LabelSelector::parse(&format!("{k} notin ({set})")).unwrap();
                let labels: Vec<(&str, &str)> = actual.iter().map(|v| (k.as_str(), v.as_str())).collect();
                prop_assert_ne!(yes.matches(&labels[..]), no.matches(&labels[..]));
            }

            /// Integer comparisons agree with Rust's, and never match non-integers.
            #[test]
            fn greater_and_less_than(bound in 0i64..100, actual in -100i64..100) {
                let labels = [("n", actual.to_string())];
                let lookup = |k: &str| labels.iter().find(|(l, _)| *l == k).map(|(_, v)| v.as_str());
                let gt = LabelSelector::parse(&format!("n>{bound}")).unwrap();
                let lt = LabelSelector::parse(&format!("n<{bound}")).unwrap();
                prop_assert_eq!(gt.matches_with(lookup), actual > bound);
                prop_assert_eq!(lt.matches_with(lookup), actual < bound);
            }

            /// Parsing never panics, whatever the input.
            #[test]
            fn parse_total(input in "[a-z0-9 =!<>(),.-/]{0,24}") {
                let _ = LabelSelector::parse(&input);
            }
        }
    }
}
