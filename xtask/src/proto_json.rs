//! `cargo xtask gen-proto-json`: writes `devcluster/src/proto/messages.rs`, the conversion of
//! the Kubernetes protobuf messages (k8s-pb's prost types) of the kinds the dev cluster serves
//! to their JSON form.
//!
//! prost generates no reflection and k8s-pb no serde, so the field list of each message is read
//! here from k8s-pb's source (the `#[prost(...)]` attribute and the field after it), and the
//! JSON name of each field from k8s-openapi's source (its `"jsonName" => Field::Key_rust_name`
//! deserializer arms): both crates are generated from the same Go types, so a type and a field
//! are matched by name, ignoring case and underscores. The output is checked in and
//! regenerated when either crate is upgraded; nothing here runs at build time.
//!
//! Invariants: every message reachable from [`ROOTS`] gets an impl, except the [`SPECIAL`]
//! ones, whose JSON form is not their field list (they are written by hand in
//! `devcluster/src/proto/special.rs`); the run fails on a field shape it does not know.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The messages of the kinds the dev cluster serves (k8s-pb module path, type).
const ROOTS: &[&str] = &[
    "api::core::v1::Namespace",
    "api::core::v1::ConfigMap",
    "api::core::v1::Secret",
    "api::core::v1::Service",
    "api::core::v1::Pod",
    "api::core::v1::Node",
    "api::core::v1::Event",
    "api::events::v1::Event",
    "api::apps::v1::Deployment",
    "api::coordination::v1::Lease",
    "apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition",
];

/// Messages whose JSON form is not an object of their fields: written by hand.
const SPECIAL: &[&str] = &[
    "apimachinery::pkg::apis::meta::v1::Time",
    "apimachinery::pkg::apis::meta::v1::MicroTime",
    "apimachinery::pkg::apis::meta::v1::Duration",
    "apimachinery::pkg::apis::meta::v1::FieldsV1",
    "apimachinery::pkg::runtime::RawExtension",
    "apimachinery::pkg::util::intstr::IntOrString",
    "apimachinery::pkg::api::resource::Quantity",
    "apiextensions_apiserver::pkg::apis::apiextensions::v1::Json",
    "apiextensions_apiserver::pkg::apis::apiextensions::v1::JsonSchemaPropsOrArray",
    "apiextensions_apiserver::pkg::apis::apiextensions::v1::JsonSchemaPropsOrBool",
    "apiextensions_apiserver::pkg::apis::apiextensions::v1::JsonSchemaPropsOrStringArray",
];

/// JSON names k8s-openapi spells under another Rust name: (k8s-pb type, field, JSON name).
const RENAMED: &[(&str, &str, &str)] =
    &[("apiextensions_apiserver::pkg::apis::apiextensions::v1::JsonSchemaProps", "r#ref", "$ref")];

/// How a field is rendered.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// Through the `ToJson` trait (scalars, messages, lists and maps of them).
    Value,
    /// `Option<Vec<u8>>`: base64.
    Bytes,
    /// `BTreeMap<String, Vec<u8>>`: base64 values.
    BytesMap,
}

#[derive(Debug)]
struct Field {
    rust: String,
    shape: Shape,
    /// The message type the field holds, if any (absolute k8s-pb path).
    message: Option<String>,
}

#[derive(Debug, Default)]
struct Message {
    fields: Vec<Field>,
}

/// `cargo xtask gen-proto-json`.
pub fn generate(root: &Path) -> Result<()> {
    let (pb_src, openapi_src) = crate_sources(root)?;
    let messages = read_messages(&pb_src)?;
    let names = read_json_names(&openapi_src)?;
    let mut module_names: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for ((module, _), fields) in &names {
        module_names.entry(module.clone()).or_default().extend(fields.clone());
    }
    let mut needed = BTreeSet::new();
    let mut todo: Vec<String> = ROOTS.iter().map(|s| s.to_string()).collect();
    while let Some(m) = todo.pop() {
        if SPECIAL.contains(&m.as_str()) || !needed.insert(m.clone()) {
            continue;
        }
        let msg = messages.get(&m).with_context(|| format!("k8s-pb has no message {m}"))?;
        todo.extend(msg.fields.iter().filter_map(|f| f.message.clone()));
    }
    let mut out = String::from(HEADER);
    for path in &needed {
        let msg = &messages[path];
        let json = lookup_type(&names, path);
        // A type k8s-openapi does not have (one Go embeds and inlines everywhere, such as
        // `EphemeralContainerCommon`): its fields are named as elsewhere in its API group.
        let module = path.rsplit_once("::").map_or("", |(m, _)| m);
        let json = json.or_else(|| module_names.get(module));
        writeln!(out, "\nimpl ToJson for pb::{path} {{")?;
        writeln!(out, "    fn value(&self) -> Value {{")?;
        let mut_kw = if msg.fields.is_empty() { "" } else { "mut " };
        writeln!(out, "        let {mut_kw}m = Map::new();")?;
        for f in &msg.fields {
            let name = match (json_name(path, &f.rust, json), &f.message) {
                (Ok(name), _) => name,
                // A Go struct embedded in another (`Volume` embeds `VolumeSource`): a field of
                // the message whose own fields are all fields of the outer JSON object.
                (Err(_), Some(inner))
                    if f.shape == Shape::Value
                        && messages.get(inner).is_some_and(|m| {
                            m.fields.iter().all(|g| json.is_some_and(|n| n.contains_key(&squash(&g.rust))))
                        }) =>
                {
                    writeln!(out, "        put_inline(&mut m, &self.{});", f.rust)?;
                    continue;
                }
                // A field k8s-openapi does not know (newer than its newest Kubernetes version):
                // Go's JSON name is the lowerCamelCase of the proto name; said, to be checked.
                (Err(_), _) => {
                    let name = lower_camel(&f.rust);
                    eprintln!("xtask: {path}.{}: no JSON name in k8s-openapi, using {name:?}", f.rust);
                    name
                }
            };
            let func = match f.shape {
                Shape::Value => "put",
                Shape::Bytes => "put_bytes",
                Shape::BytesMap => "put_bytes_map",
            };
            writeln!(out, "        {func}(&mut m, {name:?}, &self.{});", f.rust)?;
        }
        writeln!(out, "        Value::Object(m)\n    }}\n}}")?;
    }
    let target = root.join("devcluster/src/proto/messages.rs");
    std::fs::write(&target, out).with_context(|| format!("writing {}", target.display()))?;
    let status = Command::new("rustfmt").args(["--edition", "2024"]).arg(&target).status()?;
    if !status.success() {
        bail!("rustfmt {} failed", target.display());
    }
    eprintln!("xtask: wrote {} ({} messages)", target.display(), needed.len());
    Ok(())
}

const HEADER: &str =
    "//! The JSON form of the Kubernetes protobuf messages of the kinds the dev cluster serves.
//!
//! Generated by `cargo xtask gen-proto-json` from k8s-pb's message definitions and
//! k8s-openapi's JSON field names (see `xtask/src/proto_json.rs`); do not edit by hand.

use serde_json::{Map, Value};

use super::json::{ToJson, put, put_bytes, put_bytes_map, put_inline};
use k8s_pb as pb;
";

/// The source directories of the k8s-pb and k8s-openapi versions the workspace builds.
fn crate_sources(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let dir = |name: &str| -> Result<PathBuf> {
        meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["manifest_path"].as_str())
            .and_then(|m| Path::new(m).parent().map(|d| d.join("src")))
            .with_context(|| format!("{name} is not a dependency of the workspace"))
    };
    let openapi = dir("k8s-openapi")?;
    // The newest Kubernetes version the crate has: the workspace enables `latest`.
    let newest = std::fs::read_dir(&openapi)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("v1_"))
        .max_by_key(|n| n[3..].parse::<u32>().unwrap_or(0))
        .context("k8s-openapi has no version directory")?;
    Ok((dir("k8s-pb")?, openapi.join(newest)))
}

/// Every `.rs` file under `dir` with its module path relative to `base`.
fn modules(base: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            modules(base, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.parent().unwrap_or(base).strip_prefix(base)?;
            let module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            out.push((module.join("::"), path));
        }
    }
    Ok(())
}

/// k8s-pb's messages by absolute path, with their fields.
fn read_messages(src: &Path) -> Result<BTreeMap<String, Message>> {
    let mut files = Vec::new();
    modules(src, src, &mut files)?;
    let mut messages = BTreeMap::new();
    for (module, file) in files {
        let text = std::fs::read_to_string(&file)?;
        let mut lines = text.lines().peekable();
        let mut current: Option<(String, Message)> = None;
        let mut attr: Option<String> = None;
        while let Some(line) = lines.next() {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("pub struct ").and_then(|r| r.strip_suffix(" {}")) {
                messages.insert(format!("{module}::{rest}"), Message::default());
            } else if let Some(rest) = t.strip_prefix("pub struct ").and_then(|r| r.strip_suffix(" {")) {
                current = Some((format!("{module}::{rest}"), Message::default()));
            } else if t == "}" && line.starts_with('}') {
                if let Some((name, msg)) = current.take() {
                    messages.insert(name, msg);
                }
            } else if t.starts_with("#[prost(") {
                attr = Some(t.to_owned());
            } else if let (Some(a), Some(rest)) = (attr.as_ref(), t.strip_prefix("pub "))
                && let Some((_, msg)) = current.as_mut()
            {
                let (rust, ty_start) = rest.split_once(':').context("a field without a type")?;
                let mut ty = ty_start.to_owned();
                let open = |t: &str| t.matches('<').count() != t.matches('>').count();
                while !ty.trim_end().ends_with(',') || open(&ty) {
                    ty.push_str(lines.next().context("a field type without an end")?.trim());
                }
                msg.fields.push(field(&module, rust.trim(), a, &ty)?);
                attr = None;
            }
        }
    }
    Ok(messages)
}

fn field(module: &str, rust: &str, attr: &str, ty: &str) -> Result<Field> {
    let kind = attr.trim_start_matches("#[prost(");
    let shape = if kind.starts_with("bytes") {
        if kind.contains("repeated") {
            bail!("{module}: repeated bytes field {rust} is not supported");
        }
        Shape::Bytes
    } else if kind.starts_with("btree_map = \"string, bytes\"") {
        Shape::BytesMap
    } else if ["message", "string", "bool", "int32", "int64", "double", "btree_map"]
        .iter()
        .any(|k| kind.starts_with(k))
    {
        Shape::Value
    } else {
        bail!("{module}: field {rust} has an unknown shape {attr}");
    };
    let message = (kind.starts_with("message") || kind.contains(", message\"")).then(|| resolve(module, ty));
    Ok(Field { rust: rust.to_owned(), shape, message })
}

/// The absolute path of the message type named in a field's type.
fn resolve(module: &str, ty: &str) -> String {
    // The innermost generic argument that is not a String (the map key) is the message.
    let inner = ty
        .split(['<', '>', ',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .rfind(|s| !s.starts_with("::core::") && !s.starts_with("::prost::") && !s.starts_with("::std::"))
        .unwrap_or(ty);
    let mut base: Vec<&str> = module.split("::").collect();
    let mut rest = inner;
    let mut relative = true;
    while let Some(r) = rest.strip_prefix("super::") {
        base.pop();
        rest = r;
        relative = false;
    }
    if relative && !rest.contains("::") {
        return format!("{module}::{rest}");
    }
    if relative {
        return rest.trim_start_matches("crate::").to_owned();
    }
    if base.is_empty() { rest.to_owned() } else { format!("{}::{rest}", base.join("::")) }
}

fn squash(s: &str) -> String {
    s.trim_start_matches("r#")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_lowercase()
}

/// k8s-openapi's JSON names: (module, squashed type) → squashed Rust field → JSON name.
type Names = BTreeMap<(String, String), BTreeMap<String, String>>;

fn read_json_names(src: &Path) -> Result<Names> {
    let mut files = Vec::new();
    modules(src, src, &mut files)?;
    let mut names = Names::new();
    for (module, file) in files {
        let text = std::fs::read_to_string(&file)?;
        let mut ty = None;
        for line in text.lines() {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("impl<'de> crate::serde::Deserialize<'de> for ")
                && rest != "Field {"
            {
                ty = Some(squash(rest.trim_end_matches(" {")));
            } else if let (Some(ty), Some(rest)) = (ty.as_ref(), t.strip_prefix('"'))
                && let Some((json, arm)) = rest.split_once("\" => Field::Key_")
            {
                let rust = squash(arm.trim_end_matches(','));
                names.entry((module.clone(), ty.clone())).or_default().insert(rust, json.to_owned());
            }
        }
    }
    Ok(names)
}

fn lookup_type<'a>(names: &'a Names, path: &str) -> Option<&'a BTreeMap<String, String>> {
    let (module, ty) = path.rsplit_once("::")?;
    names.get(&(module.to_owned(), squash(ty)))
}

fn lower_camel(rust: &str) -> String {
    let mut out = String::new();
    for (i, part) in rust.trim_start_matches("r#").split('_').enumerate() {
        let mut chars = part.chars();
        match chars.next() {
            Some(c) if i > 0 => out.extend(c.to_uppercase().chain(chars)),
            Some(c) => out.extend(std::iter::once(c).chain(chars)),
            None => {}
        }
    }
    out
}

fn json_name(path: &str, rust: &str, names: Option<&BTreeMap<String, String>>) -> Result<String> {
    if let Some((_, _, json)) = RENAMED.iter().find(|(t, f, _)| *t == path && *f == rust) {
        return Ok((*json).to_owned());
    }
    names
        .and_then(|n| n.get(&squash(rust)))
        .cloned()
        .with_context(|| format!("k8s-openapi has no JSON name for {path}.{rust}: add it to RENAMED"))
}
