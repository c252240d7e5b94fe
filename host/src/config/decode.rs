//! From a parsed TOML file to its typed form (`PluginToml`, `HostToml`), with every serde
//! error turned into a [`ConfigError`] in our words.
//!
//! Invariants: serde's error kinds (unknown key, missing key, unknown value, wrong type, ...)
//! reach the message as data, never by reading serde's or toml's message text; the field
//! path comes from `serde_path_to_error`; the place is the span of the key or value the
//! error is about (the innermost one that raised it); a syntax error is toml's own message
//! at toml's own place. Values are handed to serde as `toml::from_str` hands them (integers
//! as `i64`, then `u64`, `i128`, `u128`; datetimes as toml's datetime map; unit enum
//! variants as strings), so for the types of these files (no `toml::Spanned`, no enum
//! written as a table) a file decodes here exactly when, and to what, `toml::from_str`
//! decodes it.

use std::fmt;
use std::ops::Range;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use toml::de::{DeTable, DeValue};

use super::error::{ConfigError, ConfigErrors, did_you_mean};
use super::source::{PathSeg, SourceMap, render_path};

/// Deserializes the file `map` holds into `T`. serde stops at the first problem, so the
/// error holds one.
pub(crate) fn decode<T: DeserializeOwned>(map: &SourceMap<'_>) -> Result<T, ConfigErrors> {
    let tree = match map.parsed() {
        Ok(tree) => tree,
        Err(e) => return Err(syntax_error(map, e).into()),
    };
    // The root's own span is the start of the file: the only error placed at the root
    // itself is a missing top-level key, shown at line 1.
    let root = Node { tree: Tree::Table(tree.get_ref()), span: 0..0 };
    serde_path_to_error::deserialize(root).map_err(|e| {
        let path = e.path().iter().map(segment).collect::<Vec<_>>();
        schema_error(map, path, e.into_inner()).into()
    })
}

fn segment(s: &serde_path_to_error::Segment) -> PathSeg {
    match s {
        serde_path_to_error::Segment::Seq { index } => PathSeg::Index(*index),
        serde_path_to_error::Segment::Map { key } => PathSeg::Key(key.clone()),
        serde_path_to_error::Segment::Enum { variant } => PathSeg::Key(variant.clone()),
        // Only a non-string map key gives an unknown segment; TOML keys are strings.
        serde_path_to_error::Segment::Unknown => PathSeg::Key("?".to_owned()),
    }
}

/// Invalid TOML: toml's message (first line) and place; the rest of its message as a hint.
fn syntax_error(map: &SourceMap<'_>, err: &toml::de::Error) -> ConfigError {
    let raw = err.message().trim();
    let first = raw.lines().next().unwrap_or_default();
    let mut e = map.error_at_span(err.span(), format!("invalid TOML: {first}"));
    let rest: Vec<&str> = raw.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
    if !rest.is_empty() {
        e.hint = Some(rest.join("; "));
    }
    e
}

/// A serde error, at the path `serde_path_to_error` tracked, in our words.
fn schema_error(map: &SourceMap<'_>, mut path: Vec<PathSeg>, err: DecodeError) -> ConfigError {
    let table_name = |table: &[PathSeg]| {
        if table.is_empty() { "the top level".to_owned() } else { format!("table `{}`", render_path(table)) }
    };
    let (message, hint) = match err.problem {
        Problem::UnknownField { field, expected } => {
            // The path ends in the unknown key when it could be captured.
            if path.last() != Some(&PathSeg::Key(field.clone())) {
                path.push(PathSeg::Key(field.clone()));
            }
            let hint = match did_you_mean(&field, expected.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None if expected.is_empty() => "this table takes no keys".to_owned(),
                None => format!("allowed keys: {}", expected.join(", ")),
            };
            (format!("unknown key `{field}` in {}", table_name(&path[..path.len() - 1])), Some(hint))
        }
        Problem::MissingField(field) => {
            let within = table_name(&path);
            let hint = (field == "for" && path.is_empty())
                .then(|| "add a `[for]` table with the `api-version` and `kind` to reconcile".to_owned());
            path.push(PathSeg::Key(field.to_owned()));
            (format!("missing required key `{field}` in {within}"), hint)
        }
        Problem::DuplicateField(field) => (format!("key `{field}` is given twice"), None),
        Problem::UnknownVariant { variant, expected } => {
            let quoted = expected.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
            let hint =
                did_you_mean(&variant, expected.iter().copied()).map(|s| format!("did you mean \"{s}\"?"));
            (format!("unknown value \"{variant}\"; expected one of: {quoted}"), hint)
        }
        Problem::InvalidType { found, expected } | Problem::InvalidValue { found, expected } => {
            (format!("expected {}, found {found}", friendly_type(&expected)), None)
        }
        Problem::InvalidLength { len, expected } => {
            (format!("expected {expected}, found {len} elements"), None)
        }
        Problem::Custom(message) => (message, None),
    };
    let mut e = map.error_at_span(err.span, message);
    e.field = (!path.is_empty()).then(|| render_path(&path));
    e.hint = hint;
    e
}

/// serde's names of Rust types in words.
fn friendly_type(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" => "an array",
        other if other.starts_with("struct ") => "a table",
        other => other,
    }
}

/// What serde reported, as data. serde builds these through the `de::Error` constructors
/// below; toml's own error type keeps only their text, which is why the tree is handed to
/// serde through [`Node`] with this error type instead of through `toml::Deserializer`.
#[derive(Debug)]
enum Problem {
    UnknownField { field: String, expected: &'static [&'static str] },
    MissingField(&'static str),
    DuplicateField(&'static str),
    UnknownVariant { variant: String, expected: &'static [&'static str] },
    InvalidType { found: String, expected: String },
    InvalidValue { found: String, expected: String },
    InvalidLength { len: usize, expected: String },
    Custom(String),
}

/// A serde error and the span of the key or value that raised it.
#[derive(Debug)]
pub(crate) struct DecodeError {
    problem: Problem,
    span: Option<Range<usize>>,
}

impl DecodeError {
    fn new(problem: Problem) -> Self {
        DecodeError { problem, span: None }
    }

    /// Places the error at `span` unless an inner key or value already did.
    fn at(mut self, span: &Range<usize>) -> Self {
        self.span.get_or_insert_with(|| span.clone());
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.problem)
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::new(Problem::Custom(msg.to_string()))
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::new(Problem::InvalidType { found: unexp.to_string(), expected: exp.to_string() })
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::new(Problem::InvalidValue { found: unexp.to_string(), expected: exp.to_string() })
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        Self::new(Problem::InvalidLength { len, expected: exp.to_string() })
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::new(Problem::UnknownVariant { variant: variant.to_owned(), expected })
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::new(Problem::UnknownField { field: field.to_owned(), expected })
    }

    fn missing_field(field: &'static str) -> Self {
        Self::new(Problem::MissingField(field))
    }

    fn duplicate_field(field: &'static str) -> Self {
        Self::new(Problem::DuplicateField(field))
    }
}

#[derive(Clone, Copy)]
enum Tree<'a> {
    Table(&'a DeTable<'a>),
    Value(&'a DeValue<'a>),
}

/// A key or value of the span-annotated tree as a serde `Deserializer`. Tables and arrays
/// go through serde's own `MapDeserializer` / `SeqDeserializer`; what is written by hand
/// is only the mapping of toml's scalar kinds to visitor calls (as `toml::de` does it).
struct Node<'a> {
    tree: Tree<'a>,
    span: Range<usize>,
}

impl<'a> Node<'a> {
    fn value(v: &'a toml::Spanned<DeValue<'a>>) -> Self {
        Node { tree: Tree::Value(v.get_ref()), span: v.span() }
    }

    fn table<'de, V: Visitor<'de>>(t: &'a DeTable<'a>, visitor: V) -> Result<V::Value, DecodeError> {
        let entries = t.iter().map(|(k, v)| (Key { name: k.get_ref(), span: k.span() }, Node::value(v)));
        MapDeserializer::new(entries).deserialize_any(visitor)
    }
}

impl<'de, 'a> IntoDeserializer<'de, DecodeError> for Node<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de, 'a> Deserializer<'de> for Node<'a> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        let span = self.span;
        let value = match self.tree {
            Tree::Table(t) => return Node::table(t, visitor).map_err(|e| e.at(&span)),
            Tree::Value(v) => v,
        };
        match value {
            DeValue::String(s) => visitor.visit_str(s),
            DeValue::Integer(i) => {
                if let Ok(n) = i64::from_str_radix(i.as_str(), i.radix()) {
                    visitor.visit_i64(n)
                } else if let Ok(n) = u64::from_str_radix(i.as_str(), i.radix()) {
                    visitor.visit_u64(n)
                } else if let Ok(n) = i128::from_str_radix(i.as_str(), i.radix()) {
                    visitor.visit_i128(n)
                } else if let Ok(n) = u128::from_str_radix(i.as_str(), i.radix()) {
                    visitor.visit_u128(n)
                } else {
                    Err(de::Error::custom("integer number overflowed"))
                }
            }
            // An infinity not written as `inf` is a literal too large for f64.
            DeValue::Float(x) => match x.as_str().parse::<f64>() {
                Ok(f) if !f.is_infinite() || x.as_str().contains("inf") => visitor.visit_f64(f),
                _ => Err(de::Error::custom("floating-point number overflowed")),
            },
            DeValue::Boolean(b) => visitor.visit_bool(*b),
            DeValue::Datetime(d) => visitor.visit_map(toml_datetime::de::DatetimeDeserializer::new(*d)),
            DeValue::Array(a) => SeqDeserializer::new(a.iter().map(Node::value)).deserialize_any(visitor),
            DeValue::Table(t) => Node::table(t, visitor),
        }
        .map_err(|e| e.at(&span))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        // TOML has no null: a key that is present is `Some`.
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        // A unit variant is written as a string; anything else is refused by the visitor.
        match self.tree {
            Tree::Value(DeValue::String(s)) => {
                let variant: de::value::StrDeserializer<'_, DecodeError> = s.as_ref().into_deserializer();
                visitor.visit_enum(variant).map_err(|e| e.at(&self.span))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// A table key: a string, placed at the key (so an unknown key points at itself).
struct Key<'a> {
    name: &'a str,
    span: Range<usize>,
}

impl<'de, 'a> IntoDeserializer<'de, DecodeError> for Key<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de, 'a> Deserializer<'de> for Key<'a> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        visitor.visit_str(self.name).map_err(|e: DecodeError| e.at(&self.span))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    struct T {
        count: Option<u32>,
        big: Option<u64>,
        ratio: Option<f64>,
        list: Option<Vec<String>>,
        any: Option<toml::Table>,
    }

    fn decode_str(text: &str) -> Result<T, ConfigErrors> {
        decode(&SourceMap::new(Path::new("t.toml"), text))
    }

    fn only(e: ConfigErrors) -> ConfigError {
        assert_eq!(e.0.len(), 1, "{e}");
        e.0[0].clone()
    }

    #[test]
    fn accepts_what_toml_accepts() {
        let text = "count = 0x10\nbig = 18_446_744_073_709_551_615\nratio = 1.5\nlist = [\"a\"]\n\
                    [any]\nwhen = 1979-05-27T07:32:00Z\nn = [1, { x = 2 }]\n";
        let ours = decode_str(text).unwrap();
        let theirs: T = toml::from_str(text).unwrap();
        assert_eq!(ours, theirs);
        assert!(ours.any.unwrap()["when"].is_datetime(), "datetimes stay datetimes");
    }

    #[test]
    fn the_example_files_decode_as_toml_from_str_decodes_them() {
        use crate::config::{HostToml, PluginToml};
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let host = std::fs::read_to_string(examples.join("wasmctrl.toml")).unwrap();
        let ours: HostToml = decode(&SourceMap::new(Path::new("wasmctrl.toml"), &host)).unwrap();
        assert_eq!(ours, toml::from_str::<HostToml>(&host).unwrap());
        let mut plugins = 0;
        for entry in std::fs::read_dir(examples.join("plugins")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let ours: PluginToml = decode(&SourceMap::new(&path, &text)).unwrap();
                assert_eq!(ours, toml::from_str::<PluginToml>(&text).unwrap(), "{}", path.display());
                plugins += 1;
            }
        }
        assert!(plugins >= 3, "found {plugins} example plugin TOMLs");
    }

    #[test]
    fn errors_are_placed_at_the_innermost_key_or_value() {
        let e = only(decode_str("list = [\"a\", 2]\n").unwrap_err());
        assert_eq!((e.field.as_deref(), e.location.map(|l| l.column)), (Some("list[1]"), Some(14)));
        assert_eq!(e.message, "expected a string, found integer `2`");
        let e = only(decode_str("count = -1\n").unwrap_err());
        assert_eq!(e.message, "expected a whole number, found integer `-1`");
        let e = only(decode_str("[any]\n[cont]\n").unwrap_err());
        assert_eq!((e.field.as_deref(), e.location.map(|l| l.line)), (Some("cont"), Some(2)));
        assert_eq!(e.hint.as_deref(), Some("did you mean `count`?"));
    }
}
