//! Configuration errors that point at the exact place in the file: path, line, column,
//! the dotted name of the field, and a hint.
//!
//! Invariants: every [`ConfigError`] names its file; an error that stems from a place in
//! the TOML carries its 1-based line and column (in characters) and the field's dotted path
//! (`for.predicates.label-selector`, `owns[1].kind`); hints never repeat the message. The
//! one-line [`ConfigError::headline`] always names file, line, column and field; the source
//! line, its highlighted span and the hint are laid out by `annotate-snippets`.

use std::fmt;
use std::path::PathBuf;

use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet as Source};

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

impl ConfigError {
    /// Places the error at `location`, highlighting `len` characters of `line` from the
    /// column on (at least one: a caret at the end of the line when the span is empty).
    pub(crate) fn place(&mut self, location: Location, line: &str, len: usize) {
        self.location = Some(location);
        let start = location.column - 1;
        self.snippet = Some(Snippet { text: line.trim_end().to_owned(), start, len });
    }

    /// The error as a report: the headline as its title, then the source line with the
    /// span highlighted, then the hint. `level` names the report (`error: `) or not.
    fn render(&self, level: Level<'_>) -> String {
        let headline = self.headline();
        let mut group = Group::with_title(level.primary_title(headline.as_str()));
        if let (Some(snippet), Some(loc)) = (&self.snippet, self.location) {
            // annotate-snippets takes byte offsets; ours count characters.
            let byte =
                |chars: usize| snippet.text.char_indices().nth(chars).map_or(snippet.text.len(), |(i, _)| i);
            let span = byte(snippet.start)..byte(snippet.start + snippet.len);
            group = group.element(
                Source::source(snippet.text.as_str())
                    .line_start(loc.line)
                    .annotation(AnnotationKind::Primary.span(span)),
            );
        }
        if let Some(hint) = &self.hint {
            group = group.element(Level::HELP.with_name(Some("hint")).message(hint.as_str()));
        }
        // Wide enough that no source line is cut to fit a terminal.
        Renderer::plain().term_width(1 << 16).render(&[group])
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(Level::ERROR.no_name()))
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
            f.write_str(&e.render(Level::ERROR))?;
        }
        Ok(())
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
    fn renders_headline_source_line_and_hint() {
        let mut e = ConfigError::file_level("p.toml", "bad").with_field("a.b").with_hint("fix it");
        e.place(Location { line: 12, column: 3 }, "x = \"é\"  ", 3);
        assert_eq!(
            ConfigErrors::from(e.clone()).to_string(),
            "error: p.toml:12:3: `a.b`: bad\n   |\n12 | x = \"é\"\n   |   ^^^\n   |\n   = hint: fix it"
        );
        assert!(e.to_string().starts_with("p.toml:12:3: `a.b`: bad\n"), "{e}");
        assert_eq!(ConfigError::file_level("p.toml", "cannot read").to_string(), "p.toml: cannot read");
    }

    #[test]
    fn rendering_any_span_of_any_line_does_not_panic() {
        let lines =
            ["", "a", "\tx = 1", "bé = \"ü\"", "k = \"\u{200d}\u{1f600}\"", "x\ry", "\u{7}\u{1b}[31m"];
        for line in lines {
            let chars = line.chars().count();
            for start in 0..=chars + 1 {
                for len in 0..=chars + 2 {
                    let mut e = ConfigError::file_level("f.toml", "m").with_hint("h");
                    e.place(Location { line: 1, column: start + 1 }, line, len);
                    assert!(ConfigErrors::from(e).to_string().starts_with("error: f.toml:1:"));
                }
            }
        }
    }
}
