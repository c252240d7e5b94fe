//! `cargo xtask check-docs` (and the first step of `ci`): every path of this repository that
//! the user-facing documents name exists.
//!
//! A document names a path in two ways: in backticks (`` `host/src/reload/manager.rs` ``,
//! optionally followed by `:line` or `(item)`), relative to the repository root or to the
//! document's folder (`guests/README.md` names `examples/...` of `guests/`), and as a
//! Markdown link target (`[text](configuration.md#keys)`), relative to the document. Only
//! names that start with one of the repository's top-level folders count as paths in
//! backticks, so TOML keys, commands and placeholders (`<name>.wasm`, `*.toml`) are not taken
//! for paths. A path git ignores (a build output such as `guests/target/ts/`, which a fresh
//! clone lacks) is not required to exist. The check is plain text scanning on purpose: a Markdown parser would add a
//! dependency to tell us no more than where backticks and link targets are.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The documents that are checked (and every `.md` file under `docs/`).
const DOCUMENTS: &[&str] =
    &["README.md", "guests/README.md", "examples/README.md", "realcluster/README.md", "runtime/README.md"];

/// A path in backticks counts when it starts with one of these folders.
const TOP_LEVEL: &[&str] = &[
    "bench/",
    "deploy/",
    "devcluster/",
    "docs/",
    "examples/",
    "fuzz/",
    "guests/",
    "host/",
    "json-subset/",
    "realcluster/",
    "runtime/",
    "selectors/",
    "testkit/",
    "wit/",
    "xtask/",
    ".ci/",
];

/// One named path that does not exist.
#[derive(Debug, PartialEq, Eq)]
pub struct Missing {
    pub document: PathBuf,
    pub line: usize,
    pub path: String,
}

/// Checks every document under `root`; fails listing each missing path with its line.
pub fn check(root: &Path) -> Result<()> {
    let mut documents: Vec<PathBuf> =
        DOCUMENTS.iter().map(|d| root.join(d)).filter(|p| p.is_file()).collect();
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        docs.sort();
        documents.extend(docs);
    }
    let mut missing = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document)?;
        let dir = document.parent().unwrap_or(root);
        missing.extend(missing_paths(&text, root, dir, document));
    }
    if missing.is_empty() {
        eprintln!("xtask: check-docs: every path named in {} documents exists", documents.len());
        return Ok(());
    }
    for m in &missing {
        let shown = m.document.strip_prefix(root).unwrap_or(&m.document);
        eprintln!("{}:{}: `{}` does not exist", shown.display(), m.line, m.path);
    }
    bail!("{} path(s) named in the documentation do not exist", missing.len())
}

/// The paths `text` names that are neither under `root` (backticks) nor under `dir` (links).
fn missing_paths(text: &str, root: &Path, dir: &Path, document: &Path) -> Vec<Missing> {
    let mut missing = Vec::new();
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut report =
            |path: String| missing.push(Missing { document: document.to_path_buf(), line: i + 1, path });
        for quoted in backticked(line) {
            if let Some(path) = repo_path(quoted)
                && !root.join(path).exists()
                && !dir.join(path).exists()
                && !ignored_by_git(root, path)
            {
                report(path.to_owned());
            }
        }
        for target in link_targets(line) {
            if let Some(path) = local_link(target)
                && !dir.join(path).exists()
            {
                report(path.to_owned());
            }
        }
    }
    missing
}

/// Whether git ignores `path` (a build output): asked of git itself, so the answer follows
/// every `.gitignore` without a second implementation of its rules here.
fn ignored_by_git(root: &Path, path: &str) -> bool {
    std::process::Command::new("git")
        .current_dir(root)
        .args(["check-ignore", "--quiet", "--no-index", path])
        .status()
        .is_ok_and(|s| s.success())
}

/// The spans between pairs of backticks on one line.
fn backticked(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// `quoted` as a repository path, if it is one: its first word, without a `:line` or
/// `(item)` suffix, starting with a top-level folder and free of placeholders.
fn repo_path(quoted: &str) -> Option<&str> {
    let word = quoted.split_whitespace().next()?;
    let word = word.split(['(', ':', '#']).next()?.trim_end_matches([',', '.', ';']);
    let placeholder = word.contains(['<', '>', '*', '{', '}', '$', '[']) || word.contains("...");
    (TOP_LEVEL.iter().any(|t| word.starts_with(t)) && !placeholder).then_some(word)
}

/// The targets of Markdown links `[text](target)` on one line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                targets.push(&after[..end]);
                rest = &after[end..];
            }
            None => break,
        }
    }
    targets
}

/// A link target as a local path (no scheme, no pure anchor), without its `#anchor`.
fn local_link(target: &str) -> Option<&str> {
    let target = target.split_whitespace().next()?;
    if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
        return None;
    }
    let path = target.split('#').next()?;
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_backticks_and_links_are_found_and_placeholders_are_not() {
        assert_eq!(repo_path("host/src/reload/manager.rs (`plan`)"), Some("host/src/reload/manager.rs"));
        assert_eq!(repo_path("host/src/lib.rs:12"), Some("host/src/lib.rs"));
        assert_eq!(repo_path("examples/plugins/<name>.wasm"), None);
        assert_eq!(repo_path("deploy/*.yaml"), None);
        assert_eq!(repo_path("permissions.read"), None);
        assert_eq!(repo_path("cargo xtask ci"), None);
        assert_eq!(
            link_targets("see [a](docs/a.md#x) and [b](https://x.io/y)"),
            ["docs/a.md#x", "https://x.io/y"]
        );
        assert_eq!(local_link("docs/a.md#x"), Some("docs/a.md"));
        assert_eq!(local_link("https://x.io/y"), None);
        assert_eq!(local_link("#top"), None);
    }

    #[test]
    fn a_missing_path_is_reported_with_its_line_and_fences_are_skipped() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let text = "ok: `xtask/src/main.rs`\n```\n`host/src/none.rs`\n```\nbad: `host/src/object.rs`\n[x](nowhere.md)\nbuilt: `guests/target/none/`\n";
        let missing = missing_paths(text, root, root, Path::new("doc.md"));
        let found: Vec<(usize, &str)> = missing.iter().map(|m| (m.line, m.path.as_str())).collect();
        assert_eq!(found, [(5, "host/src/object.rs"), (6, "nowhere.md")]);
    }
}
