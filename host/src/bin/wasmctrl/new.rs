//! `wasmctrl new NAME --kind <apiVersion/Kind> [--admission]`: scaffolds a plugin crate that
//! builds with `cargo build --release --target wasm32-wasip2`, with its TOML, a native test
//! on the SDK's test host and a `wasmctrl test` fixture; with `--admission`, a validating and
//! a mutating webhook on the kind too (their traits, `[[admission]]` sections, tests and
//! fixture steps). `--lang ts` and `--lang python` scaffold the same plugin in TypeScript
//! ([`typescript`]) or Python ([`python`]), depending on that language's SDK package.
//!
//! Invariants: nothing is overwritten (an existing directory is an error); the crate is its
//! own workspace, so it builds wherever it is put; a built-in kind maps to its k8s-openapi
//! type, any other group to a CRD struct (and a CRD manifest for the fixture's world).

mod python;
mod typescript;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use wasmctrl::config::{BuiltinKinds, KindResolver};
use wasmctrl::plugin::Gvk;
use wasmctrl_selectors::is_dns1035_label;

/// `wasmctrl new`.
#[derive(Args, Debug)]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `-` (it names the crate, the TOML
    /// and the field manager).
    pub name: String,
    /// The kind the plugin reconciles, as `apiVersion/Kind` (`v1/ConfigMap`,
    /// `apps/v1/Deployment`, `example.com/v1/Widget` for a CRD).
    #[arg(long)]
    pub kind: String,
    /// Where to create the crate (default: `./NAME`).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// The language of the plugin.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// The SDK the plugin depends on by path: `guests/sdk` (Rust), `guests/ts/sdk` (the
    /// npm package `@wasmctrl/guest`) or `guests/python/sdk` (the pip package
    /// `wasmctrl-guest`) of a wasmctrl checkout. Default: the checkout this binary was built
    /// from.
    #[arg(long)]
    pub sdk: Option<PathBuf>,
    /// wasmctrl's WIT package, which the TypeScript and Python builds read (default: `wit/`
    /// of the checkout the SDK is in).
    #[arg(long)]
    pub wit: Option<PathBuf>,
    /// Also validate and mutate objects of the kind: admission webhooks the host serves
    /// (`Validate`, `Mutate`, `[[admission]]` sections; see docs/admission.md). Rust only.
    #[arg(long)]
    pub admission: bool,
}

/// The language `wasmctrl new` writes the plugin in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Ts,
    Python,
}

impl Lang {
    /// The SDK's directory in a wasmctrl checkout, and the file that marks it.
    fn sdk(self) -> (&'static str, &'static str) {
        match self {
            Lang::Rust => ("guests/sdk", "Cargo.toml"),
            Lang::Ts => ("guests/ts/sdk", "package.json"),
            Lang::Python => ("guests/python/sdk", "pyproject.toml"),
        }
    }
}

/// `my-plugin` → `MyPlugin`.
fn camel(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The k8s-openapi module of a built-in API group: `""` → `core`, `apps` → `apps`,
/// `rbac.authorization.k8s.io` → `rbac`.
fn openapi_module(group: &str) -> String {
    match group {
        "" => "core".to_owned(),
        g => g.split('.').next().unwrap_or(g).to_owned(),
    }
}

/// The kind as the generated code names it.
struct KindInfo {
    gvk: Gvk,
    /// `use` line for the Rust type (built-in), or the CRD struct definition.
    rust: String,
    namespaced: bool,
    /// A CRD manifest serving the kind (CRDs only).
    crd: Option<String>,
}

fn kind_info(text: &str) -> Result<KindInfo> {
    let Some(gvk) = Gvk::parse(text) else {
        bail!("--kind {text:?}: expected apiVersion/Kind, e.g. v1/ConfigMap or example.com/v1/Widget");
    };
    if !gvk.kind.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        || !gvk.kind.chars().all(|c| c.is_ascii_alphanumeric())
    {
        bail!("--kind {text:?}: the kind must be CamelCase, e.g. ConfigMap");
    }
    match BuiltinKinds.resolve(&gvk) {
        Ok(resolved) => {
            let module = openapi_module(gvk.group());
            let rust = if module == "apiextensions" {
                format!(
                    "use wasmctrl_guest::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::{}::{};",
                    gvk.version(),
                    gvk.kind
                )
            } else {
                format!("use wasmctrl_guest::k8s_openapi::api::{module}::{}::{};", gvk.version(), gvk.kind)
            };
            Ok(KindInfo { gvk, rust, namespaced: resolved.namespaced, crd: None })
        }
        Err(wasmctrl::config::KindLookupError::Unknown) => {
            if !gvk.group().contains('.') {
                bail!(
                    "--kind {text:?}: a custom resource's group must be a domain, e.g. example.com/v1/{}",
                    gvk.kind
                );
            }
            let plural = format!("{}s", gvk.kind.to_ascii_lowercase());
            let rust = format!(
                r#"use serde::{{Deserialize, Serialize}};
use wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A `{kind}` (custom resource `{plural}.{group}`). Replace `spec` and `status` with typed
/// structs as the resource takes shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct {kind} {{
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: wasmctrl_guest::serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<wasmctrl_guest::serde_json::Value>,
}}

wasmctrl_guest::impl_kind!({kind}, "{api_version}", "{kind}");"#,
                kind = gvk.kind,
                group = gvk.group(),
                api_version = gvk.api_version,
            );
            let crd = format!(
                r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}}}
  versions:
    - name: {version}
      served: true
      storage: true
      subresources: {{status: {{}}}}
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"#,
                group = gvk.group(),
                singular = gvk.kind.to_ascii_lowercase(),
                kind = gvk.kind,
                version = gvk.version(),
            );
            Ok(KindInfo { gvk, rust, namespaced: true, crd: Some(crd) })
        }
        Err(wasmctrl::config::KindLookupError::UnknownKind { known_kinds }) => {
            bail!(
                "--kind {text:?}: {} has no kind {}; it has {}",
                gvk.api_version,
                gvk.kind,
                known_kinds.join(", ")
            )
        }
        Err(wasmctrl::config::KindLookupError::UnknownApiVersion { known_versions }) => bail!(
            "--kind {text:?}: {} is not a served version{}",
            gvk.api_version,
            if known_versions.is_empty() {
                String::new()
            } else {
                format!("; try {}", known_versions.join(", "))
            }
        ),
        Err(wasmctrl::config::KindLookupError::Unavailable(e)) => bail!("--kind {text:?}: {e}"),
    }
}

/// The SDK of `lang` this binary's checkout has.
fn default_sdk(lang: Lang) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(lang.sdk().0)
}

pub fn new(args: NewArgs) -> Result<ExitCode> {
    if !is_dns1035_label(&args.name) {
        bail!(
            "plugin name {:?}: use lowercase letters, digits and `-` (at most 63, starting with a letter)",
            args.name
        );
    }
    let kind = kind_info(&args.kind)?;
    let dir = args.path.clone().unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists() {
        bail!("{} already exists; choose another --path", dir.display());
    }
    if args.admission && args.lang != Lang::Rust {
        bail!("--admission scaffolds Rust webhooks only: leave it out, or use --lang rust");
    }
    let (sdk_dir, marker) = args.lang.sdk();
    let sdk = args.sdk.clone().unwrap_or_else(|| default_sdk(args.lang));
    let sdk = std::fs::canonicalize(&sdk).with_context(|| {
        format!("the SDK is not at {} (pass --sdk PATH/TO/wasmctrl/{sdk_dir})", sdk.display())
    })?;
    if !sdk.join(marker).is_file() {
        bail!("{} has no {marker}: pass --sdk PATH/TO/wasmctrl/{sdk_dir}", sdk.display());
    }
    let wit = || -> Result<PathBuf> {
        // `guests/ts/sdk` and `guests/python/sdk` are three levels below the checkout.
        let wit = args.wit.clone().unwrap_or_else(|| sdk.join("../../../wit"));
        let wit = std::fs::canonicalize(&wit).with_context(|| {
            format!("no WIT package at {} (pass --wit PATH/TO/wasmctrl/wit)", wit.display())
        })?;
        if !wit.join("wasmctrl.wit").is_file() {
            bail!("{} has no wasmctrl.wit: pass --wit PATH/TO/wasmctrl/wit", wit.display());
        }
        Ok(wit)
    };
    let files = match args.lang {
        Lang::Rust => render(&args.name, &kind, &sdk, args.admission),
        Lang::Ts => typescript::render(&args.name, &kind, &sdk, &wit()?)?,
        Lang::Python => python::render(&args.name, &kind, &sdk, &wit()?)?,
    };
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let name = &args.name;
    match args.lang {
        Lang::Rust => {}
        Lang::Ts => {
            println!("created TypeScript plugin {} ({name} reconciles {})", dir.display(), kind.gvk);
            println!();
            println!("  cd {}", dir.display());
            println!("  npm install                     # the SDK (by path) and the pinned toolchain");
            println!("  npm test                        # native tests on the SDK's fake host");
            println!("  npm run build                   # → {name}.wasm");
            println!("  wasmctrl test tests/fixtures    # the real component against the fixtures");
            println!("  cp {name}.wasm {name}.toml PLUGINS_DIR/");
            return Ok(ExitCode::SUCCESS);
        }
        Lang::Python => {
            println!("created Python plugin {} ({name} reconciles {})", dir.display(), kind.gvk);
            println!();
            println!("  cd {}", dir.display());
            println!("  python3 -m venv .venv && .venv/bin/pip install -r requirements.txt");
            println!(
                "  .venv/bin/python build.py       # native tests on the SDK's fake host, then → {name}.wasm"
            );
            println!("  wasmctrl test tests/fixtures    # the real component against the fixtures");
            println!("  cp {name}.wasm {name}.toml PLUGINS_DIR/");
            return Ok(ExitCode::SUCCESS);
        }
    }
    let lib = args.name.replace('-', "_");
    println!(
        "created plugin crate {} ({} reconciles{} {})",
        dir.display(),
        args.name,
        if args.admission { ", validates and mutates" } else { "" },
        kind.gvk
    );
    println!();
    println!("  cd {}", dir.display());
    println!("  cargo test                                         # native tests on the SDK's test host");
    println!(
        "  cargo build --release --target wasm32-wasip2       # → target/wasm32-wasip2/release/{lib}.wasm"
    );
    println!(
        "  wasmctrl test tests/fixtures                       # the real component against the fixtures"
    );
    println!(
        "  cp target/wasm32-wasip2/release/{lib}.wasm PLUGINS_DIR/{}.wasm && cp {}.toml PLUGINS_DIR/",
        args.name, args.name
    );
    if args.admission {
        println!();
        println!(
            "  its webhooks are served by a host whose TOML has an [admission] table (docs/admission.md)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The scaffold's `wasmctrl test` fixture (`tests/fixtures/basic.yaml`), the same in every
/// language: the object is annotated once, with an Event, and a second pass writes nothing.
/// `wasm` is the component's path relative to the fixture.
fn fixture_yaml(name: &str, kind: &KindInfo, wasm: &str) -> String {
    let k = &kind.gvk.kind;
    let (ns_yaml, key) =
        if kind.namespaced { ("\n    namespace: default", "default/example") } else { ("", "example") };
    let crd_doc = kind
        .crd
        .as_ref()
        .map(|c| format!("  - {}\n", c.trim_end().replace('\n', "\n    ")))
        .unwrap_or_default();
    format!(
        r#"# `wasmctrl test tests/fixtures`: the built component against a fresh embedded API server.
plugin: ../../{name}.toml
wasm: {wasm}
world:
{crd_doc}  - apiVersion: {api_version}
    kind: {k}
    metadata:
      name: example{ns_yaml_indented}
steps:
  - reconcile: {key}
    expect:
      result: done
      writes:
        - verb: patch
          kind: {gvk}
          key: {key}
          body: {{metadata: {{annotations: {{wasmctrl.example.com/seen-by: {name}}}}}}}
      events:
        - {{type: Normal, reason: Seen, regarding: {gvk} {key}}}
  - name: the second pass writes nothing
    reconcile: {key}
    expect:
      result: done
      writes: []
"#,
        api_version = kind.gvk.api_version,
        gvk = kind.gvk,
        ns_yaml_indented = ns_yaml.replace('\n', "\n  "),
    )
}

/// The plugin's TOML, the same in every language: `[for]` the kind, permission to write it.
fn plugin_toml(name: &str, kind: &KindInfo) -> String {
    format!(
        r#"# {name}: the plugin's TOML. Put it next to {name}.wasm in the host's plugins directory.
[for]
api-version = "{api_version}"
kind = "{k}"

[permissions]
write = ["{gvk}"]
"#,
        api_version = kind.gvk.api_version,
        k = kind.gvk.kind,
        gvk = kind.gvk,
    )
}

/// The scaffold's `.cargo/config.toml`: the build flags this repository's own guests use
/// (its root `.cargo/config.toml` explains them; a test keeps the two the same).
const CARGO_CONFIG: &str = r#"# Built for wasm32-wasip2 at the profile's opt-level "s", with LLVM's inline threshold
# raised: at "s" a typed parse of a Kubernetes object stays a great many small calls, and
# each Wasm call pays a prologue under Cranelift. Inlining more makes a reconcile that
# parses an object faster, for a somewhat larger .wasm (wasmctrl's plugin benchmark
# measures both). Build scripts and proc macros (built for the host) do not get these
# flags. Cargo reads this file when run from this directory.
[target.wasm32-wasip2]
rustflags = ["-Cllvm-args=-inline-threshold=500"]
"#;

/// The label the scaffold's mutating webhook sets, and the annotation its validating
/// webhook refuses objects for.
const ADMITTED_BY: &str = "wasmctrl.example.com/admitted-by";
const DENY: &str = "wasmctrl.example.com/deny";

/// `--admission`: the webhooks' code, put after the plugin's `impl`.
fn admission_rs(name: &str, ty: &str, k: &str) -> String {
    format!(
        r#"
/// The label the mutating webhook sets.
pub const ADMITTED_BY: &str = "{ADMITTED_BY}";
/// An annotation the validating webhook refuses objects for (its value is the message).
pub const DENY: &str = "{DENY}";

/// The validating webhook: every method admits unless implemented. Replace the check with
/// what objects of the kind must satisfy; `request.warn(..)` sends the client a warning.
impl Validate for {ty} {{
    fn validate_create(&self, _request: &AdmissionRequest, object: &{k}) -> Result<(), Denied> {{
        check(object)
    }}

    fn validate_update(&self, _request: &AdmissionRequest, _old: &{k}, object: &{k}) -> Result<(), Denied> {{
        check(object)
    }}
}}

fn check(object: &{k}) -> Result<(), Denied> {{
    match object.annotation(DENY) {{
        Some(why) => Err(Denied::invalid(format!("{{DENY}}: {{why}}"))),
        None => Ok(()),
    }}
}}

/// The mutating webhook: change the object; the SDK sends what changed as a JSON patch.
impl Mutate for {ty} {{
    fn mutate(&self, _request: &AdmissionRequest, object: &mut {k}) -> Result<(), Denied> {{
        object.metadata.labels.get_or_insert_with(Default::default).insert(ADMITTED_BY.into(), "{name}".into());
        Ok(())
    }}
}}
"#
    )
}

/// `--admission`: its native tests, inside the generated `mod tests`.
fn admission_tests_rs(ty: &str, k: &str) -> String {
    format!(
        r#"
    #[test]
    fn admits_labels_and_refuses_on_the_annotation() {{
        use wasmctrl_guest::admission::AdmissionRequest;
        let host = TestHost::new();
        let plugin = host.init::<{ty}>().unwrap();
        let (verdict, mutated) = plugin.mutate::<{k}>(&AdmissionRequest::create(&example()).unwrap()).unwrap().unwrap();
        assert!(verdict.allowed());
        assert!(mutated.unwrap().metadata.labels.unwrap().contains_key(ADMITTED_BY));

        let mut denied = example();
        denied.metadata.annotations = Some([(DENY.to_owned(), "not today".to_owned())].into());
        let verdict = plugin.validate(&AdmissionRequest::create(&denied).unwrap()).unwrap();
        assert_eq!(verdict.denied.unwrap().message(), format!("{{DENY}}: not today"));
        assert!(plugin.validate(&AdmissionRequest::create(&example()).unwrap()).unwrap().allowed());
    }}
"#
    )
}

/// The files of the crate, relative to its directory.
fn render(name: &str, kind: &KindInfo, sdk: &Path, admission: bool) -> Vec<(String, String)> {
    let ty = camel(name);
    let lib = name.replace('-', "_");
    let k = &kind.gvk.kind;
    let serde_dep =
        if kind.crd.is_some() { "serde = { version = \"1\", features = [\"derive\"] }\n" } else { "" };
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# cdylib: the WebAssembly component; rlib: native `cargo test`.
crate-type = ["cdylib", "rlib"]

[dependencies]
wasmctrl-guest = {{ path = "{sdk}" }}
{serde_dep}
[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1

# Its own workspace, wherever it is put.
[workspace]
"#,
        sdk = sdk.display(),
    );
    let ns_field =
        if kind.namespaced { "\n                namespace: Some(\"default\".into())," } else { "" };
    let lib_rs = format!(
        r#"//! `{name}`: reconciles `{gvk}` objects. Generated by `wasmctrl new`: replace the body
//! of `reconcile` with what your controller does.
//!
//! As generated, it marks every object it has seen with the annotation [`SEEN_BY`] (one
//! merge patch, only when missing), records a `Normal` Event and logs.

{rust}
use wasmctrl_guest::prelude::*;
use wasmctrl_guest::serde_json::json;

/// The annotation this plugin sets.
pub const SEEN_BY: &str = "wasmctrl.example.com/seen-by";

/// The plugin.
pub struct {ty};

impl Plugin for {ty} {{
    type For = {k};

    fn init(_settings: Settings) -> Result<Self, InitError> {{
        Ok({ty})
    }}

    fn reconcile(&self, target: Target<{k}>) -> Result<Action, ReconcileError> {{
        let Target::Present(object) = target else {{
            return Ok(Action::Done); // deleted: nothing left to do
        }};
        if object.annotation(SEEN_BY) == Some("{name}") {{
            return Ok(Action::Done); // already done: no write
        }}
        let patch = json!({{ "metadata": {{ "annotations": {{ SEEN_BY: "{name}" }} }} }});
        client::patch_merge::<{k}>(object.namespace(), object.name(), &patch).context("annotating")?;
        events::normal(&object, "Seen", "Annotate", "{name} reconciled this object")?;
        log::info!("annotated {{}}", object.key(); annotation = SEEN_BY);
        Ok(Action::Done)
    }}
}}

{admission_impls}
wasmctrl_guest::export_plugin!({ty}{admission_export});

#[cfg(test)]
mod tests {{
    use super::*;
    use wasmctrl_guest::testing::{{TestHost, Write}};

    fn example() -> {k} {{
        let mut object = {k}::default();
        object.metadata = wasmctrl_guest::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {{
                name: Some("example".into()),{ns_field}
                ..Default::default()
            }};
        object
    }}

    #[test]
    fn annotates_once() {{
        let host = TestHost::new();
        host.add(&example()).unwrap();
        let plugin = host.init::<{ty}>().unwrap();
        let request = Request::for_object(&example());

        assert_eq!(plugin.reconcile(request.clone()), Ok(Action::Done));
        let writes = host.take_writes();
        assert!(matches!(&writes[..], [Write::Patch {{ name, .. }}] if name == "example"), "{{writes:?}}");
        assert_eq!(host.events()[0].reason, "Seen");

        // Once the cache has caught up, a second pass writes nothing.
        host.sync_cache();
        assert_eq!(plugin.reconcile(request), Ok(Action::Done));
        assert!(host.writes().is_empty());
    }}
{admission_tests}}}
"#,
        gvk = kind.gvk,
        rust = kind.rust,
        admission_impls = if admission { admission_rs(name, &ty, k) } else { String::new() },
        admission_export = if admission { ", admission = [validate, mutate]" } else { "" },
        admission_tests = if admission { admission_tests_rs(&ty, k) } else { String::new() },
    );
    let mut toml = plugin_toml(name, kind);
    if admission {
        toml.push_str(
            r#"
# Admission webhooks, served by a host whose TOML has an [admission] table: the API server
# calls `mutate` (default) then `validate` before it stores an object of the kind.
[[admission]]
name = "mutate"
mutating = true
operations = ["CREATE", "UPDATE"]

[[admission]]
name = "validate"
operations = ["CREATE", "UPDATE"]
"#,
        );
    }
    let fixture = fixture_yaml(name, kind, &format!("../../target/wasm32-wasip2/release/{lib}.wasm"));
    let fixture = if admission {
        format!(
            r#"{fixture}  - name: the mutating webhook labels the object
    admit: mutate
    object: {{apiVersion: {api_version}, kind: {k}, metadata: {{name: new{ns_inline}}}}}
    expect:
      allowed: true
      patched: {{metadata: {{labels: {{{ADMITTED_BY}: {name}}}}}}}
  - name: the validating webhook refuses an object carrying the annotation
    admit: validate
    object:
      apiVersion: {api_version}
      kind: {k}
      metadata: {{name: new{ns_inline}, annotations: {{{DENY}: not today}}}}
    expect:
      allowed: false
      code: 422
      message: "{DENY}: not today"
"#,
            api_version = kind.gvk.api_version,
            ns_inline = if kind.namespaced { ", namespace: default" } else { "" },
        )
    } else {
        fixture
    };
    let mut files = vec![
        ("Cargo.toml".to_owned(), cargo),
        ("src/lib.rs".to_owned(), lib_rs),
        (format!("{name}.toml"), toml),
        ("tests/fixtures/basic.yaml".to_owned(), fixture),
        (".gitignore".to_owned(), "/target\n".to_owned()),
        (".cargo/config.toml".to_owned(), CARGO_CONFIG.to_owned()),
    ];
    if let Some(crd) = &kind.crd {
        files.push(("crd.yaml".to_owned(), crd.clone()));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_types() {
        let cm = kind_info("v1/ConfigMap").unwrap();
        assert_eq!(cm.rust, "use wasmctrl_guest::k8s_openapi::api::core::v1::ConfigMap;");
        assert!(cm.namespaced && cm.crd.is_none());
        let d = kind_info("apps/v1/Deployment").unwrap();
        assert_eq!(d.rust, "use wasmctrl_guest::k8s_openapi::api::apps::v1::Deployment;");
        let ns = kind_info("v1/Namespace").unwrap();
        assert!(!ns.namespaced);
        let w = kind_info("example.com/v1/Widget").unwrap();
        assert!(w.rust.contains("pub struct Widget"));
        assert!(w.crd.unwrap().contains("name: widgets.example.com"));
        assert!(kind_info("v1/NoSuchKind").is_err());
        assert!(kind_info("ConfigMap").is_err());
        assert!(kind_info("widgets/v1/Widget").is_err());
        assert_eq!(camel("my-first-plugin"), "MyFirstPlugin");
    }

    /// `target.wasm32-wasip2.rustflags` of a Cargo config.
    fn wasm_rustflags(config: &str) -> Vec<String> {
        let value: toml::Value = toml::from_str(config).unwrap();
        let flags = &value["target"]["wasm32-wasip2"]["rustflags"];
        flags.as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn the_scaffold_builds_with_the_flags_of_this_repositorys_guests() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cargo/config.toml");
        let ours = wasm_rustflags(&std::fs::read_to_string(&root).unwrap());
        assert!(!ours.is_empty());
        assert_eq!(wasm_rustflags(CARGO_CONFIG), ours);
        let kind = kind_info("v1/ConfigMap").unwrap();
        let files = render("hello", &kind, Path::new("/sdk"), false);
        assert!(files.iter().any(|(path, text)| path == ".cargo/config.toml" && text == CARGO_CONFIG));
    }

    #[test]
    fn admission_adds_the_webhooks_their_sections_and_fixture_steps() {
        let kind = kind_info("v1/ConfigMap").unwrap();
        let file = |files: &[(String, String)], name: &str| {
            files.iter().find(|(p, _)| p == name).map(|(_, t)| t.clone()).unwrap()
        };
        let plain = render("hello", &kind, Path::new("/sdk"), false);
        assert!(!file(&plain, "src/lib.rs").contains("impl Validate"));
        assert!(!file(&plain, "hello.toml").contains("[[admission]]"));
        let admitting = render("hello", &kind, Path::new("/sdk"), true);
        let lib = file(&admitting, "src/lib.rs");
        for part in ["impl Validate for Hello", "impl Mutate for Hello", "admission = [validate, mutate]"] {
            assert!(lib.contains(part), "{part} missing");
        }
        let toml = file(&admitting, "hello.toml");
        let config =
            wasmctrl::config::PluginConfig::parse(Path::new("hello.toml"), &toml, &Default::default())
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.admission.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["mutate", "validate"]
        );
        let fixture = file(&admitting, "tests/fixtures/basic.yaml");
        assert!(fixture.contains("admit: mutate") && fixture.contains("admit: validate"), "{fixture}");
    }

    #[test]
    fn typescript_and_python_scaffolds_depend_on_their_sdk_package() {
        let kind = kind_info("v1/ConfigMap").unwrap();
        let file = |files: &[(String, String)], name: &str| {
            files
                .iter()
                .find(|(p, _)| p == name)
                .map(|(_, t)| t.clone())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        let (sdk, wit) = (Path::new("/checkout/guests/ts/sdk"), Path::new("/checkout/wit"));
        let ts = typescript::render("hello", &kind, sdk, wit).unwrap();
        let package: serde_json::Value = serde_json::from_str(&file(&ts, "package.json")).unwrap();
        assert_eq!(package["dependencies"]["@wasmctrl/guest"], "file:/checkout/guests/ts/sdk");
        let toolchain: serde_json::Value =
            serde_json::from_str(include_str!("../../../../guests/ts/package.json")).unwrap();
        assert_eq!(package["devDependencies"], toolchain["devDependencies"]);
        assert!(file(&ts, "build.mjs").contains(r#"arg("--wit", "/checkout/wit")"#));
        assert!(file(&ts, "src/index.ts").contains("static forKind = KIND;"));
        assert!(file(&ts, "tests/plugin.test.ts").contains("new FakeHost()"));

        let py = python::render("hello", &kind, Path::new("/checkout/guests/python/sdk"), wit).unwrap();
        let requirements = file(&py, "requirements.txt");
        assert!(
            requirements.contains("wasmctrl-guest @ file:///checkout/guests/python/sdk"),
            "{requirements}"
        );
        assert!(requirements.contains("componentize-py==0.25.1"), "{requirements}");
        assert!(file(&py, "tests/test_app.py").contains("FakeHost().install()"));

        // The same TOML and fixture as the Rust scaffold (only the component's path differs).
        let rust = render("hello", &kind, Path::new("/sdk"), false);
        for files in [&ts, &py] {
            assert_eq!(file(files, "hello.toml"), file(&rust, "hello.toml"));
            assert_eq!(
                file(files, "tests/fixtures/basic.yaml"),
                file(&rust, "tests/fixtures/basic.yaml")
                    .replace("../../target/wasm32-wasip2/release/hello.wasm", "../../hello.wasm")
            );
        }
    }
}
