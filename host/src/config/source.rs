//! The source of one TOML file: its text and span-annotated tree, and the field paths
//! (`owns[1].kind`) that errors are named by.
//!
//! Invariants: lines and columns are 1-based and columns count characters, not bytes; a
//! byte offset is never split inside a character; a field path that does not exist in the
//! file resolves to the longest prefix that does (a missing key is shown at its table), and
//! one that resolves to nothing leaves the error without a place rather than at a wrong one.

use std::ops::Range;
use std::path::Path;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::{ConfigError, Location};

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

/// `owns[1].kind` → `[Key(owns), Index(1), Key(kind)]`.
pub(crate) fn parse_path(field: &str) -> Vec<PathSeg> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, rest) = part.split_once('[').unwrap_or((part, ""));
        if !key.is_empty() {
            out.push(PathSeg::Key(key.to_owned()));
        }
        for idx in rest.split('[') {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(PathSeg::Index(i));
            }
        }
    }
    out
}

/// The parsed source of one TOML file: text plus a span-annotated tree, to turn byte
/// spans into lines and columns and field paths into spans.
pub(crate) struct SourceMap<'a> {
    pub file: &'a Path,
    pub text: &'a str,
    parsed: Result<Spanned<DeTable<'a>>, toml::de::Error>,
}

impl<'a> SourceMap<'a> {
    pub fn new(file: &'a Path, text: &'a str) -> Self {
        SourceMap { file, text, parsed: DeTable::parse(text) }
    }

    /// The tree, or why the text is not TOML.
    pub fn parsed(&self) -> Result<&Spanned<DeTable<'a>>, &toml::de::Error> {
        self.parsed.as_ref()
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

    /// An error at `span` (no field named).
    pub fn error_at_span(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let mut e = ConfigError::file_level(self.file, message);
        if let Some(span) = span {
            self.attach_span(&mut e, span);
        }
        e
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
        let tree = self.parsed.as_ref().ok()?;
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
        let line_text = self.text.lines().nth(loc.line - 1).unwrap_or_default();
        let start = loc.column - 1;
        let span_text = self.text.get(span.clone()).unwrap_or_default();
        // Highlight at most to the end of the first line of the span.
        let len = span_text.lines().next().map_or(1, |l| l.chars().count());
        let len = len.min(line_text.chars().count().saturating_sub(start)).max(1);
        e.place(loc, line_text, len);
    }
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_counts_characters() {
        let text = "a = 1\nbé = \"x\"\n";
        let map = SourceMap::new(Path::new("f.toml"), text);
        assert_eq!(map.location(0), Location { line: 1, column: 1 });
        let at = text.rfind('=').unwrap_or(0);
        assert_eq!(map.location(at), Location { line: 2, column: 4 });
    }

    #[test]
    fn paths_render_and_parse_back() {
        let path = parse_path("owns[1].indexes.by-app");
        assert_eq!(
            path,
            [
                PathSeg::Key("owns".into()),
                PathSeg::Index(1),
                PathSeg::Key("indexes".into()),
                PathSeg::Key("by-app".into())
            ]
        );
        assert_eq!(render_path(&path), "owns[1].indexes.by-app");
        assert_eq!(render_path(&[PathSeg::Key("a.b".into())]), "\"a.b\"");
    }
}
