//! The map of `plugin/mod.rs` kept true: reads the sources of the floor, `compile` and
//! `imports` and fails on a reference against the direction of the rooms (the floor and
//! `compile/settings.rs` import no room, `compile` and `imports` import neither each other
//! nor `runtime`), and the sources of every room and fails on a module importing one its
//! room's `mod.rs` lists after it ([`ROOM_ORDER`]), so no room has an import cycle inside.
//!
//! A reference is a path through `crate::plugin::` or through enough `super::` to reach
//! `plugin` from the file's module (one more inside an inline module such as `mod tests`,
//! which comes last in a file); comments are left out. The plugin-level name it reaches
//! must be one the file's room may import. A re-export of `plugin/mod.rs` counts as its
//! room's, not as the floor's, so a path like `crate::plugin::Plugin` from `compile` is
//! refused too.

use std::path::{Path, PathBuf};

/// What every file may reach at the plugin level: the floor.
const FLOOR: &[&str] = &["PluginError", "bindings", "metrics", "spec"];

/// The plugin-level names `source` reaches, for a file whose module is `depth` modules
/// below `plugin` (`compile/optimizer.rs`: 2).
fn plugin_level_names(source: &str, depth: usize) -> Vec<String> {
    names_reached(source, "crate::plugin::", depth)
}

/// The names `source` reaches through `prefix` or through exactly `ups` `super::` (one more
/// past the start of an inline module: `mod tests {`, in these files always the last item).
fn names_reached(source: &str, prefix: &str, ups: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_inline_module = false;
    for line in source.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let declared = code.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
        if declared.starts_with("mod ") && code.trim_end().ends_with('{') {
            in_inline_module = true;
        }
        let code = code.split(" //").next().unwrap_or(code);
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            names.extend(names_at(rest));
        }
        let chain = "super::".repeat(if in_inline_module { ups + 1 } else { ups });
        for (at, _) in code.match_indices(&chain) {
            let rest = &code[at + chain.len()..];
            if !code[..at].ends_with("super::") && !rest.starts_with("super::") {
                names.extend(names_at(rest));
            }
        }
    }
    names
}

/// The names a path continues with after `plugin::`: one identifier, or each first
/// identifier of a `{...}` group.
fn names_at(rest: &str) -> Vec<String> {
    let ident =
        |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    match rest.strip_prefix('{') {
        Some(group) => {
            let (mut depth, mut names, mut start) = (0usize, Vec::new(), 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.push(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            names.into_iter().filter(|n| !n.is_empty()).collect()
        }
        None => vec![ident(rest)].into_iter().filter(|n| !n.is_empty()).collect(),
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The parent of a `<name>_tests.rs` file that sits beside `<name>.rs` (declared there
/// with `#[path]`), if `file` (relative to `plugin`) is one.
fn tests_parent(plugin: &Path, file: &Path) -> Option<String> {
    let stem = file.file_stem()?.to_string_lossy();
    let parent = stem.strip_suffix("_tests")?;
    plugin.join(file).with_file_name(format!("{parent}.rs")).is_file().then(|| parent.to_owned())
}

/// How many modules below `plugin` the module of `file` (relative to `plugin/`) is: a
/// room's `mod.rs` is one, its files two, a `*_tests.rs` child beside its parent one more.
fn depth_of(plugin: &Path, file: &Path) -> usize {
    let parts = file.components().count();
    let base = if file.ends_with("mod.rs") { parts - 1 } else { parts };
    base + usize::from(tests_parent(plugin, file).is_some())
}

/// Each reference of the files under `plugin/<room>` (every file of `plugin/` itself but
/// `mod.rs` when `room` is empty) to a plugin-level name outside `allowed`, as `file: name`.
fn violations(room: &str, allowed: &[&str]) -> (Vec<String>, usize) {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugin");
    let files: Vec<PathBuf> = if room.is_empty() {
        FLOOR
            .iter()
            .filter(|n| n.chars().next().is_some_and(char::is_lowercase))
            .map(|n| plugin.join(format!("{n}.rs")))
            .collect()
    } else if room.ends_with(".rs") {
        vec![plugin.join(room)]
    } else {
        rust_files(&plugin.join(room))
    };
    let (mut bad, mut seen) = (Vec::new(), 0);
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let relative = file.strip_prefix(&plugin).unwrap_or(&file).to_path_buf();
        for name in plugin_level_names(&source, depth_of(&plugin, &relative)) {
            seen += 1;
            if !allowed.contains(&name.as_str()) {
                bad.push(format!("plugin/{}: {name}", relative.display()));
            }
        }
    }
    (bad, seen)
}

#[test]
fn the_checker_finds_references_through_crate_paths_super_chains_and_groups() {
    let source = "use crate::plugin::runtime::engine::PluginEngine;\n\
                  use super::super::{PluginError, imports::call::CallInfo};\n\
                  use super::sibling::Thing;\n\
                  // use crate::plugin::runtime::Hidden;\n\
                  #[cfg(test)]\n\
                  mod tests {\n    use super::super::super::Plugin;\n    use super::super::sibling;\n}\n";
    assert_eq!(plugin_level_names(source, 2), ["runtime", "PluginError", "imports", "Plugin"]);
    assert_eq!(names_reached(source, "crate::plugin::compile::", 1), ["sibling", "sibling"]);
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugin");
    assert_eq!(depth_of(&plugin, Path::new("compile/optimizer.rs")), 2);
    assert_eq!(depth_of(&plugin, Path::new("compile/mod.rs")), 1);
    assert_eq!(depth_of(&plugin, Path::new("compile/compile_cache_tests.rs")), 3);
    assert_eq!(depth_of(&plugin, Path::new("runtime/plugin/tier_up_tests.rs")), 3);
    assert_eq!(depth_of(&plugin, Path::new("spec.rs")), 1);
}

#[test]
fn rooms_import_only_downwards() {
    let compile: Vec<&str> = FLOOR.iter().copied().chain(["compile"]).collect();
    let imports: Vec<&str> = FLOOR.iter().copied().chain(["imports"]).collect();
    for (room, allowed) in
        [("", FLOOR), ("compile/settings.rs", &[][..]), ("compile", &compile[..]), ("imports", &imports[..])]
    {
        let (bad, seen) = violations(room, allowed);
        assert!(
            bad.is_empty(),
            "plugin/{room} reaches past what the map of plugin/mod.rs allows it ({allowed:?}):\n{}",
            bad.join("\n")
        );
        if room == "compile" || room == "imports" {
            assert!(seen > 0, "plugin/{room}: no reference found at all; the checker reads nothing");
        }
    }
}

/// The modules of each room in the order of its `mod.rs`: each may import only those before
/// it (a file below a module, like `runtime/plugin/admit.rs`, counts as that module).
const ROOM_ORDER: &[(&str, &[&str])] = &[
    (
        "compile",
        &[
            "settings",
            "permits",
            "single_flight",
            "compile_cache",
            "child",
            "optimizer",
            "baseline",
            "tier",
            "tier_up",
        ],
    ),
    (
        "imports",
        &[
            "call",
            "callsites",
            "call_log",
            "event_recorder",
            "output_limit",
            "stdio",
            "access",
            "cluster",
            "cache",
            "client",
            "events",
            "log",
            "config",
            "wasi",
            "fuzzing",
        ],
    ),
    (
        "runtime",
        &[
            "store_data",
            "instance_slots",
            "pool",
            "idle",
            "engine",
            "admission_exports",
            "plugin_code",
            "plugin",
            "inspect",
            "reconciler",
        ],
    ),
];

#[test]
fn the_modules_of_a_room_import_only_those_before_them() {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugin");
    let mut bad = Vec::new();
    for (room, order) in ROOM_ORDER {
        let mut modules: Vec<String> = Vec::new();
        for file in rust_files(&plugin.join(room)) {
            let relative = file.strip_prefix(&plugin).unwrap_or(&file).to_path_buf();
            if relative.ends_with("mod.rs") {
                continue;
            }
            let first = relative.components().nth(1).map(|c| c.as_os_str().to_string_lossy().into_owned());
            let own = tests_parent(&plugin, &relative)
                .or(first)
                .map(|n| n.trim_end_matches(".rs").to_owned())
                .unwrap_or_default();
            modules.push(own.clone());
            let Some(at) = order.iter().position(|m| *m == own) else {
                bad.push(format!("plugin/{}: not in the room's order", relative.display()));
                continue;
            };
            let source = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let prefix = format!("crate::plugin::{room}::");
            for name in names_reached(&source, &prefix, depth_of(&plugin, &relative) - 1) {
                match order.iter().position(|m| *m == name) {
                    Some(i) if i <= at => {}
                    _ => bad.push(format!("plugin/{}: {name}", relative.display())),
                }
            }
        }
        for m in *order {
            assert!(modules.iter().any(|n| n == m), "plugin/{room}: `{m}` is in the order but has no file");
        }
    }
    assert!(bad.is_empty(), "a module of a room imports one after it (or unknown):\n{}", bad.join("\n"));
}
