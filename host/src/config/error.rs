//! Configuration errors that point at the exact place in the file: path, line, column,
//! the dotted name of the field, and a hint.
//!
//! Invariants: every [`ConfigError`] names its file; an error that stems from a place in
//! the TOML carries its 1-based line and column (in characters) and the field's dotted path
//! (`for.predicates.label-selector`, `owns[1].kind`); hints never repeat the message.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Where in a file an error is: 1-based line and column (columns count characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// One problem in one configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as the user named it (or as found in the plugins directory).
    pub file: PathBuf,
    /// Where in the file, when the problem has a place in it.
    pub location: Option<Location>,
    /// The dotted path of the field (`for.kind`, `owns[0].indexes.by-app`), when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when we can tell (`did you mean `label-selector`?`).
    pub hint: Option<String>,
    /// The source line and the highlighted character range within it, for display.
    snippet: Option<Snippet>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Snippet {
    text: String,
    /// Characters to skip before the caret, and how many carets.
    start: usize,
    len: usize,
}

impl ConfigError {
    /// An error about the file as a whole (unreadable, missing companion file, ...).
    pub fn file_level(file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.into(),
            location: None,
            field: None,
            message: message.into(),
            hint: None,
            snippet: None,
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Names the field without a place in the file (e.g. a default that does not work).
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The one-line summary: `file:line:column: field `x`: message`.
    pub fn headline(&self) -> String {
        let mut s = self.file.display().to_string();
        if let Some(loc) = self.location {
            s.push_str(&format!(":{}:{}", loc.line, loc.column));
        }
        s.push_str(": ");
        if let Some(field) = &self.field {
            s.push_str(&format!("`{field}`: "));
        }
        s.push_str(&self.message);
        s
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.headline())?;
        if let (Some(snippet), Some(loc)) = (&self.snippet, self.location) {
            let gutter = loc.line.to_string().len();
            write!(
                f,
                "\n{:gutter$} |\n{} | {}\n{:gutter$} | {}{}",
                "",
                loc.line,
                snippet.text,
                "",
                " ".repeat(snippet.start),
                "^".repeat(snippet.len.max(1)),
            )?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  = hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one or more files, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn push(&mut self, e: ConfigError) {
        self.0.push(e);
    }

    /// `Ok(value)` when no error was recorded.
    pub fn into_result<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.0.is_empty() { Ok(value) } else { Err(self) }
    }

    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// One segment of a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PathSeg {
    Key(String),
    Index(usize),
}

/// Renders `[Key(for), Key(kind)]` as `for.kind` and `[Key(owns), Index(0)]` as `owns[0]`.
pub(crate) fn render_path(path: &[PathSeg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                let bare =
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if bare {
                    s.push_str(k);
                } else {
                    s.push_str(&format!("{k:?}"));
                }
            }
            PathSeg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The parsed source of one TOML file: text plus a span-annotated tree, to turn byte
/// spans into lines and columns and field paths into spans.
pub(crate) struct SourceMap<'a> {
    pub file: &'a Path,
    pub text: &'a str,
    pub tree: Option<Spanned<DeTable<'a>>>,
}

impl<'a> SourceMap<'a> {
    pub fn new(file: &'a Path, text: &'a str) -> Self {
        SourceMap { file, text, tree: DeTable::parse(text).ok() }
    }

    /// 1-based line and character column of byte offset `at`.
    pub fn location(&self, at: usize) -> Location {
        let at = floor_char_boundary(self.text, at.min(self.text.len()));
        let before = &self.text[..at];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            line: before.matches('\n').count() + 1,
            column: self.text[line_start..at].chars().count() + 1,
        }
    }

    /// An error at `span`, with the field path worked out from the tree.
    pub fn error_at(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let mut e = ConfigError::file_level(self.file, message);
        if let Some(span) = span {
            if let Some(tree) = &self.tree {
                let mut path = Vec::new();
                let mut best = None;
                find_path(tree.get_ref(), &span, &mut path, &mut best);
                if let Some(best) = best.filter(|p: &Vec<PathSeg>| !p.is_empty()) {
                    e.field = Some(render_path(&best));
                }
            }
            self.attach_span(&mut e, span);
        }
        e
    }

    /// The dotted path of the table whose span is exactly `span` (`None`: the root).
    pub fn table_path_with_span(&self, span: &Range<usize>) -> Option<String> {
        fn walk(t: &DeTable<'_>, span: &Range<usize>, path: &mut Vec<PathSeg>) -> Option<Vec<PathSeg>> {
            for (k, v) in t.iter() {
                path.push(PathSeg::Key(k.get_ref().to_string()));
                if v.span() == *span && (v.get_ref().is_table()) {
                    return Some(path.clone());
                }
                let found = match v.get_ref() {
                    DeValue::Table(inner) => walk(inner, span, path),
                    DeValue::Array(a) => a.iter().enumerate().find_map(|(i, item)| {
                        path.push(PathSeg::Index(i));
                        let r = if item.span() == *span && item.get_ref().is_table() {
                            Some(path.clone())
                        } else {
                            item.get_ref().as_table().and_then(|t| walk(t, span, path))
                        };
                        path.pop();
                        r
                    }),
                    _ => None,
                };
                path.pop();
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        let tree = self.tree.as_ref()?;
        walk(tree.get_ref(), span, &mut Vec::new()).map(|p| render_path(&p))
    }

    /// An error about the field at `path` (its value, or its key when `at_key`), or at the
    /// nearest enclosing table that exists in the file.
    pub fn error_for(&self, path: &[PathSeg], at_key: bool, message: impl Into<String>) -> ConfigError {
        let mut e = ConfigError::file_level(self.file, message);
        e.field = (!path.is_empty()).then(|| render_path(path));
        if let Some(span) = self.span_of(path, at_key) {
            self.attach_span(&mut e, span);
        }
        e
    }

    /// The span of the value (or key) at `path`; falls back to the longest existing prefix.
    pub fn span_of(&self, path: &[PathSeg], at_key: bool) -> Option<Range<usize>> {
        let tree = self.tree.as_ref()?;
        let mut table: Option<&DeTable<'_>> = Some(tree.get_ref());
        let mut array: Option<&[Spanned<DeValue<'_>>]> = None;
        let mut found: Option<Range<usize>> = None;
        for (i, seg) in path.iter().enumerate() {
            let last = i + 1 == path.len();
            let value = match (seg, table, array) {
                (PathSeg::Key(k), Some(t), _) => {
                    let Some((key, value)) = t.get_key_value(k.as_str()) else { break };
                    if last && at_key {
                        return Some(key.span());
                    }
                    found = Some(if last { value.span() } else { key.span() });
                    value
                }
                (PathSeg::Index(n), _, Some(a)) => {
                    let Some(value) = a.get(*n) else { break };
                    found = Some(value.span());
                    value
                }
                _ => break,
            };
            table = value.get_ref().as_table();
            array = value.get_ref().as_array().map(|a| &a[..]);
        }
        found
    }

    fn attach_span(&self, e: &mut ConfigError, span: Range<usize>) {
        let loc = self.location(span.start);
        e.location = Some(loc);
        let line_text = self.text.lines().nth(loc.line - 1).unwrap_or_default();
        let start = loc.column - 1;
        let span_text = self.text.get(span.clone()).unwrap_or_default();
        // Highlight at most to the end of the first line of the span.
        let len = span_text.lines().next().map_or(1, |l| l.chars().count());
        let len = len.min(line_text.chars().count().saturating_sub(start)).max(1);
        e.snippet = Some(Snippet { text: line_text.trim_end().to_owned(), start, len });
    }
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Walks the whole tree for the innermost key or value whose span contains `span`. Every
/// table is searched: the span of a table defined by `[a.b]` headers does not cover the
/// keys of its sub-tables, so containment cannot prune the search.
fn find_path(
    table: &DeTable<'_>,
    span: &Range<usize>,
    path: &mut Vec<PathSeg>,
    best: &mut Option<Vec<PathSeg>>,
) {
    for (key, value) in table.iter() {
        path.push(PathSeg::Key(key.get_ref().to_string()));
        if contains(key.span(), span) || contains(value.span(), span) {
            *best = Some(path.clone());
        }
        find_in_value(value.get_ref(), span, path, best);
        path.pop();
    }
}

fn contains(r: Range<usize>, span: &Range<usize>) -> bool {
    r.start <= span.start && span.end <= r.end.max(r.start + 1)
}

fn find_in_value(
    value: &DeValue<'_>,
    span: &Range<usize>,
    path: &mut Vec<PathSeg>,
    best: &mut Option<Vec<PathSeg>>,
) {
    if let Some(t) = value.as_table() {
        find_path(t, span, path, best);
    } else if let Some(a) = value.as_array() {
        for (i, item) in a.iter().enumerate() {
            path.push(PathSeg::Index(i));
            if contains(item.span(), span) {
                *best = Some(path.clone());
            }
            find_in_value(item.get_ref(), span, path, best);
            path.pop();
        }
    }
}

/// The candidate closest to `input`, if it is close enough to be a likely typo.
pub fn did_you_mean<'c>(input: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let input_n = norm(input);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = strsim::damerau_levenshtein(&input_n, &norm(c));
        if best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    let (d, c) = best?;
    let limit = (input.chars().count().max(c.chars().count()) / 3).max(1);
    (d <= limit).then_some(c)
}

/// Turns a `toml::de::Error` (syntax, or serde's messages) into a [`ConfigError`] with a
/// place, a field path, a message in our words and a hint.
pub(crate) fn from_toml_error(map: &SourceMap<'_>, err: &toml::de::Error) -> ConfigError {
    let raw = err.message().trim().to_owned();
    let span = err.span();
    let mut e = map.error_at(span.clone(), raw.clone());
    let table_name = |field: &Option<String>, drop_last: bool| -> String {
        let Some(f) = field else { return "the top level".to_owned() };
        let parent = if drop_last { f.rsplit_once('.').map(|(p, _)| p.to_owned()) } else { Some(f.clone()) };
        match parent {
            Some(p) if !p.is_empty() => format!("table `{p}`"),
            _ => "the top level".to_owned(),
        }
    };
    if let Some(rest) = raw.strip_prefix("unknown field `") {
        let (field, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let allowed = backticked(expected);
        // The span points at the key itself, so the path ends in the unknown key.
        e.message = format!("unknown key `{field}` in {}", table_name(&e.field, true));
        e.hint = Some(match did_you_mean(field, allowed.iter().map(String::as_str)) {
            Some(s) => format!("did you mean `{s}`?"),
            None if allowed.is_empty() => "this table takes no keys".to_owned(),
            None => format!("allowed keys: {}", allowed.join(", ")),
        });
    } else if let Some(rest) = raw.strip_prefix("missing field `") {
        let field = rest.split_once('`').map_or(rest, |(f, _)| f);
        // The span is the table's: find the table whose value has exactly that span.
        e.field = span.as_ref().and_then(|sp| map.table_path_with_span(sp));
        let within = table_name(&e.field, false);
        if field == "for" && e.field.is_none() {
            e.hint = Some("add a `[for]` table with the `api-version` and `kind` to reconcile".into());
        }
        e.message = format!("missing required key `{field}` in {within}");
        e.field = Some(match &e.field {
            Some(p) => format!("{p}.{field}"),
            None => field.to_owned(),
        });
    } else if let Some(rest) = raw.strip_prefix("unknown variant `") {
        let (value, expected) = rest.split_once('`').unwrap_or((rest, ""));
        let allowed = backticked(expected);
        e.message = format!(
            "unknown value \"{value}\"; expected one of: {}",
            allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
        );
        if let Some(s) = did_you_mean(value, allowed.iter().map(String::as_str)) {
            e.hint = Some(format!("did you mean \"{s}\"?"));
        }
    } else if let Some(rest) = raw.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            e.message = format!("expected {}, found {found}", friendly_type(expected));
        }
    } else if let Some(rest) = raw.strip_prefix("duplicate field `") {
        let field = rest.split_once('`').map_or(rest, |(f, _)| f);
        e.message = format!("key `{field}` is given twice");
    } else if map.tree.is_none() {
        // A syntax error: toml's own message, first line only, is already good.
        let first = raw.lines().next().unwrap_or_default();
        e.message = format!("invalid TOML: {first}");
        let rest: Vec<&str> = raw.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
        if !rest.is_empty() {
            e.hint = Some(rest.join("; "));
        }
    }
    e
}

/// serde's names of Rust types in words.
fn friendly_type(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" => "an array",
        "struct PluginToml" | "struct HostToml" => "a table",
        other if other.starts_with("struct ") => "a table",
        other => other,
    }
}

/// The `a`, `b` out of "one of `a`, `b`" / "`a` or `b`".
fn backticked(s: &str) -> Vec<String> {
    s.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_picks_close_candidates_only() {
        let keys = ["api-version", "kind", "label-selector", "field-selector", "namespace"];
        assert_eq!(did_you_mean("lable-selector", keys), Some("label-selector"));
        assert_eq!(did_you_mean("label_selector", keys), Some("label-selector"));
        assert_eq!(did_you_mean("apiVersion", keys), Some("api-version"));
        assert_eq!(did_you_mean("knd", keys), Some("kind"));
        assert_eq!(did_you_mean("frobnicate", keys), None);
    }

    #[test]
    fn location_counts_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        let map = SourceMap::new(Path::new("f.toml"), text);
        assert_eq!(map.location(0), Location { line: 1, column: 1 });
        let at = text.find('=').map(|_| text.rfind('=').unwrap_or(0)).unwrap_or(0);
        assert_eq!(map.location(at), Location { line: 2, column: 4 });
    }
}
