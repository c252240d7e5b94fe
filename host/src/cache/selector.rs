//! Kubernetes label selectors, parsed and evaluated as `k8s.io/apimachinery/pkg/labels` does.
//!
//! Grammar (comma-separated requirements, whitespace ignored between tokens):
//! `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
//! `key notin (v1,v2)`, `key>n`, `key<n` (integers). The empty selector matches everything.
//!
//! Invariants: keys are valid qualified names and values valid label values (checked on
//! parse); requirements are kept sorted by key so [`Display`](std::fmt::Display) is canonical.

use std::collections::BTreeSet;
use std::fmt;

use crate::object::Object;

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
/// use wasmctrl::cache::LabelSelector;
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

    /// Builds a selector from the structured `metav1.LabelSelector` form.
    pub fn from_match(
        selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    ) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        let text = || format!("{selector:?}");
        let err = |reason: String| SelectorError { selector: text(), reason };
        for (k, v) in selector.match_labels.iter().flatten() {
            validate_key(k).map_err(err)?;
            validate_value(v).map_err(err)?;
            requirements.push(Requirement {
                key: k.clone(),
                op: Operator::In,
                values: BTreeSet::from([v.clone()]),
                equality: Some("="),
            });
        }
        for e in selector.match_expressions.iter().flatten() {
            validate_key(&e.key).map_err(err)?;
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(err(format!("unknown operator {other:?}"))),
            };
            let needs_values = matches!(op, Operator::In | Operator::NotIn);
            if needs_values == values.is_empty() {
                return Err(err(format!("operator {} for key {:?} has wrong values", e.operator, e.key)));
            }
            for v in &values {
                validate_value(v).map_err(err)?;
            }
            requirements.push(Requirement { key: e.key.clone(), op, values, equality: None });
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

    /// Whether an object's labels satisfy every clause.
    pub fn matches(&self, obj: &Object) -> bool {
        self.matches_with(|k| obj.label(k))
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
            if matches!(op, Operator::GreaterThan | Operator::LessThan) {
                v.parse::<i64>().map_err(|_| format!("value {v:?} for {key:?} must be an integer"))?;
            } else {
                validate_value(&v)?;
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

fn is_name_segment(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

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
pub(crate) fn validate_key(key: &str) -> Result<(), String> {
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
pub(crate) fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_segment(value, 63) {
        Ok(())
    } else {
        Err(format!("label value {value:?} is invalid"))
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
    fn selector_from_match_labels_and_expressions() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
        let sel = meta::LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![meta::LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        let sel = LabelSelector::from_match(&sel).unwrap();
        assert_eq!(sel.to_string(), "app=web,tier notin (db)");
        assert!(sel.matches_with(labels(&[("app", "web")])));
        assert!(!sel.matches_with(labels(&[("app", "web"), ("tier", "db")])));
    }
}
