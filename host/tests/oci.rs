//! Plugins from OCI registries, against a real registry: the CNCF Distribution registry built
//! from its Go module (`wasmctrl_testkit::registry`), never a mock; signatures and the
//! artifact layout also against the real `cosign` and `oras`, built from theirs. Each test
//! that needs Go says it is skipped when Go is not installed.
//!
//! The plugins manager's part (a plugin whose TOML names `wasm = "oci://..."` runs, and
//! hot-reloads when its tag moves) runs on a Kubernetes API server of either backend (the
//! dev cluster, or a real kube-apiserver with `WASMCTRL_TEST_BACKEND=real`).
//!
//! Needs the guests built: `cargo xtask build-guests`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::mpsc;
use wasmctrl::config::{HostConfig, PluginConfig, PluginDefaults};
use wasmctrl::oci::client::RegistryError;
use wasmctrl::oci::push::sign_artifact;
use wasmctrl::oci::signature::SignatureError;
use wasmctrl::oci::{
    Digest, OciOptions, OciReference, OciSource, PullError, RegistryClient, RegistryOptions, SigningKey,
    SourceChange, VerifyKey, push_plugin,
};
use wasmctrl::reload::{CheckOptions, ManagerOptions, PluginState, PluginStatus, check_paths, version_of};
use wasmctrl::server::StatusSource;
use wasmctrl_testkit::guests::wasm;
use wasmctrl_testkit::{RegistryConfig, TestCluster, TestRegistry, tools};

/// Bound on every wait for the system to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Helpers

fn registry(test: &str) -> Option<TestRegistry> {
    TestRegistry::start_or_skip(test, RegistryConfig::default())
}

/// Options for a source that reaches `registry` over plain HTTP and polls every 100 ms.
fn options(registry: &str, store: &Path) -> OciOptions {
    let mut o = OciOptions::new(store);
    o.registry.insecure_registries = vec![registry.to_owned()];
    o.poll_interval = Duration::from_millis(100);
    o
}

fn at(registry: &str, path: &str) -> OciReference {
    format!("oci://{registry}/{path}").parse().unwrap_or_else(|e| panic!("{e}"))
}

fn plain_client(registry: &str) -> RegistryClient {
    RegistryClient::new(RegistryOptions {
        insecure_registries: vec![registry.to_owned()],
        ..Default::default()
    })
    .expect("registry client")
}

async fn push(registry: &str, bytes: &[u8], path: &str, key: Option<&SigningKey>) -> OciReference {
    let outcome =
        push_plugin(&plain_client(registry), bytes.to_vec(), "plugin.wasm", &at(registry, path), key)
            .await
            .unwrap_or_else(|e| panic!("push {path}: {e}"));
    outcome.reference
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

/// Waits until `rounds` more poll rounds have completed.
async fn wait_rounds(source: &OciSource, rounds: u64) {
    let mut rx = source.poll_rounds();
    let start = *rx.borrow_and_update();
    tokio::time::timeout(PATIENCE, rx.wait_for(|n| *n >= start + rounds))
        .await
        .expect("poll rounds go on")
        .expect("the source is alive");
}

/// The changes a source reports, in a channel.
fn changes(source: &OciSource) -> mpsc::UnboundedReceiver<SourceChange> {
    let (tx, rx) = mpsc::unbounded_channel();
    source.on_change(move |c| {
        let _ = tx.send(c.clone());
    });
    rx
}

fn docker_config(registry: &str, user: &str, password: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!(r#"{{"auths": {{"{registry}": {{"auth": "{auth}"}}}}}}"#)
}

/// Writes `text` to `path` as a Secret volume update does: a new file renamed over it.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

// ---------------------------------------------------------------------------------------
// Pull, store, tags

#[tokio::test]
async fn a_pushed_plugin_is_pulled_by_tag_and_by_digest_as_a_cncf_wasm_artifact() {
    let Some(reg) = registry("a_pushed_plugin_is_pulled_by_tag_and_by_digest_as_a_cncf_wasm_artifact") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let component = wasm("configmap-mirror");
    let pushed = push(reg.address(), &component, "plugins/mirror:v1", None).await;
    assert_eq!(pushed.tag(), Some("v1"));
    let digest = pushed.digest().expect("pinned");

    // The layout the CNCF Wasm OCI artifact names, as the registry holds it.
    let client = plain_client(reg.address());
    let manifest: serde_json::Value =
        serde_json::from_slice(&client.manifest(&pushed, &digest).await.unwrap()).unwrap();
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(manifest["layers"][0]["digest"], Digest::of(&component).to_string());
    let config_digest: Digest = manifest["config"]["digest"].as_str().unwrap().parse().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&client.blob(&pushed, &config_digest, 0, 1 << 20).await.unwrap()).unwrap();
    assert_eq!((config["architecture"].as_str(), config["os"].as_str()), (Some("wasm"), Some("wasip2")));
    assert_eq!(config["layerDigests"][0], Digest::of(&component).to_string());
    let exports: Vec<&str> =
        config["component"]["exports"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
    assert!(exports.iter().any(|e| e.starts_with("wasmctrl:controller/reconciler@")), "{exports:?}");

    // Pulled by tag: resolved to the pushed digest, kept in the store (0600) as the bytes.
    let source = OciSource::new(options(reg.address(), &tmp.path().join("oci"))).unwrap();
    let code = source
        .pull(&tmp.path().join("mirror.toml"), &at(reg.address(), "plugins/mirror:v1"), &[])
        .await
        .unwrap();
    assert_eq!(code.bytes, component);
    assert_eq!(code.reference, pushed);
    assert_eq!(code.layer, Digest::of(&component));
    assert!(!code.offline);
    assert_eq!(std::fs::read(&code.path).unwrap(), component);
    assert_eq!(mode(&code.path), 0o600);
    assert!(code.path.starts_with(tmp.path().join("oci")));

    // Pulled by digest, for another plugin.
    let again = source.pull(&tmp.path().join("other.toml"), &pushed, &[]).await.unwrap();
    assert_eq!((again.bytes, again.reference), (component, pushed));
}

#[tokio::test]
async fn a_restart_without_the_registry_runs_from_the_store() {
    let Some(reg) = registry("a_restart_without_the_registry_runs_from_the_store") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("oci");
    let address = reg.address().to_owned();
    let component = wasm("configmap-mirror");
    let key = SigningKey::generate();
    let pushed = push(&address, &component, "plugins/mirror:v1", Some(&key)).await;
    let mut opts = options(&address, &store);
    opts.verify_keys = vec![key.verify_key("host.pub")];
    // A budget nothing fits in: only what a followed plugin uses stays.
    opts.store_max_bytes = 1;
    let toml = tmp.path().join("mirror.toml");
    let first = OciSource::new(opts.clone()).unwrap();
    let stamp = wasm("reload-stamp-a");
    push(&address, &stamp, "plugins/stamp:v1", Some(&key)).await;
    let gone =
        first.pull(&tmp.path().join("stamp.toml"), &at(&address, "plugins/stamp:v1"), &[]).await.unwrap();
    // Its TOML gone: only mirror.toml is followed from now on.
    first.follow_only(&BTreeSet::from([toml.clone()]));
    first.pull(&toml, &at(&address, "plugins/mirror:v1"), &[]).await.unwrap();
    assert!(!gone.path.exists(), "a plugin no longer followed is pruned beyond the budget");

    reg.stop();
    // A new source on the same store: the host restarted while the registry is down.
    let restarted = OciSource::new(opts).unwrap();
    let by_tag = restarted.pull(&toml, &at(&address, "plugins/mirror:v1"), &[]).await.unwrap();
    assert!(by_tag.offline, "the tag's last digest and its signatures came from the store");
    assert_eq!((by_tag.bytes.as_slice(), &by_tag.reference), (component.as_slice(), &pushed));
    let by_digest = restarted.pull(&toml, &pushed, &[]).await.unwrap();
    assert_eq!(by_digest.bytes, component);
    // Something never pulled cannot come from anywhere: an error that may pass.
    let err = restarted.pull(&toml, &at(&address, "plugins/other:v1"), &[]).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(matches!(err, PullError::Registry(RegistryError::Unavailable { .. })), "{err}");
}

#[tokio::test]
async fn a_moved_tag_is_reported_until_its_digest_is_pulled_and_then_no_more() {
    let Some(reg) = registry("a_moved_tag_is_reported_until_its_digest_is_pulled_and_then_no_more") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (wasm("reload-stamp-a"), wasm("reload-stamp-b"));
    let first = push(reg.address(), &a, "plugins/stamp:v1", None).await;
    let source = OciSource::new(options(reg.address(), &tmp.path().join("oci"))).unwrap();
    let toml = tmp.path().join("stamp.toml");
    let pinned_toml = tmp.path().join("pinned.toml");
    let tag = at(reg.address(), "plugins/stamp:v1");
    assert_eq!(source.pull(&toml, &tag, &[]).await.unwrap().bytes, a);
    // A pinned reference is never reported: its digest cannot move.
    source.pull(&pinned_toml, &first, &[]).await.unwrap();
    let mut rx = changes(&source);

    wait_rounds(&source, 2).await;
    assert!(rx.try_recv().is_err(), "nothing moved, nothing reported");

    let moved = push(reg.address(), &b, "plugins/stamp:v1", None).await;
    let change = tokio::time::timeout(PATIENCE, rx.recv()).await.expect("reported").expect("channel open");
    assert_eq!(
        change,
        SourceChange { toml: toml.clone(), reference: tag.clone(), digest: moved.digest().unwrap() }
    );

    // Not pulled yet: reported again, as a pull that did not happen may be retried.
    wait_rounds(&source, 2).await;
    assert_eq!(rx.try_recv().map(|c| c.digest).ok(), moved.digest());

    assert_eq!(source.pull(&toml, &tag, &[]).await.unwrap().bytes, b);
    wait_rounds(&source, 1).await; // a round that began before the pull ended
    while rx.try_recv().is_ok() {}
    wait_rounds(&source, 2).await;
    assert!(rx.try_recv().is_err(), "a pulled digest is not reported again");

    // No longer followed (its TOML removed): no more reports.
    source.follow_only(&BTreeSet::from([pinned_toml.clone()]));
    push(reg.address(), &a, "plugins/stamp:v1", None).await;
    wait_rounds(&source, 2).await;
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn what_is_not_a_plugin_artifact_is_refused_for_good() {
    let Some(reg) = registry("what_is_not_a_plugin_artifact_is_refused_for_good") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let client = plain_client(reg.address());
    // A container image's manifest: config `application/vnd.oci.image.config.v1+json`.
    let image = at(reg.address(), "images/app:v1");
    let config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let layer = b"not a component".to_vec();
    let config_digest = client.push_blob(&image, config.clone()).await.unwrap();
    let layer_digest = client.push_blob(&image, layer.clone()).await.unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest.to_string(), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest.to_string(), "size": layer.len()}],
    });
    client.push_manifest(&image, serde_json::to_vec(&manifest).unwrap()).await.unwrap();
    let source = OciSource::new(options(reg.address(), &tmp.path().join("oci"))).unwrap();
    let err = source.pull(&tmp.path().join("a.toml"), &image, &[]).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("not a Wasm artifact"), "{err}");

    // Larger than `max-wasm-size`.
    push(reg.address(), &wasm("configmap-mirror"), "plugins/mirror:v1", None).await;
    let mut small = options(reg.address(), &tmp.path().join("oci"));
    small.max_wasm_bytes = 4096;
    let err = OciSource::new(small)
        .unwrap()
        .pull(&tmp.path().join("b.toml"), &at(reg.address(), "plugins/mirror:v1"), &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("more than the 4096 allowed"), "{err}");

    // A tag that does not exist (yet).
    let err = source
        .pull(&tmp.path().join("c.toml"), &at(reg.address(), "plugins/missing:v1"), &[])
        .await
        .unwrap_err();
    assert!(err.is_not_found() && err.is_transient(), "{err}");

    // Only a component is pushed; a core module is refused before anything is uploaded.
    let err = push_plugin(
        &client,
        b"\0asm\x01\0\0\0".to_vec(),
        "m.wasm",
        &at(reg.address(), "plugins/core:v1"),
        None,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("core module"), "{err}");
    assert!(client.manifest_if_any(&at(reg.address(), "plugins/core:v1")).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------------------
// Signatures

#[tokio::test]
async fn signatures_by_each_configured_key_are_required() {
    let Some(reg) = registry("signatures_by_each_configured_key_are_required") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (host_key, plugin_key, stranger) =
        (SigningKey::generate(), SigningKey::generate(), SigningKey::generate());
    let client = plain_client(reg.address());
    let tag = at(reg.address(), "plugins/mirror:v1");
    let pushed = push(reg.address(), &wasm("configmap-mirror"), "plugins/mirror:v1", None).await;
    let digest = pushed.digest().unwrap();
    let mut opts = options(reg.address(), &tmp.path().join("oci"));
    opts.verify_keys = vec![host_key.verify_key("host.pub")];
    let source = OciSource::new(opts).unwrap();
    let toml = tmp.path().join("mirror.toml");

    let err = source.pull(&toml, &tag, &[]).await.unwrap_err();
    assert!(matches!(err, PullError::Signature(SignatureError::Unsigned { .. })), "{err}");
    assert!(err.to_string().contains(&format!("{pushed} is not signed")), "{err}");
    assert!(err.to_string().contains(&format!(":sha256-{}.sig", digest.hex())), "{err}");
    assert!(err.is_transient(), "a signature may still be pushed");

    sign_artifact(&client, &tag, &digest, &stranger).await.unwrap();
    let err = source.pull(&toml, &tag, &[]).await.unwrap_err();
    assert!(err.to_string().contains("verifies with the key host.pub"), "{err}");
    assert!(err.to_string().contains("does not verify with this key"), "{err}");

    sign_artifact(&client, &tag, &digest, &host_key).await.unwrap();
    let code = source.pull(&toml, &tag, &[]).await.unwrap();
    assert_eq!(code.verified_by, ["host.pub"]);

    // The plugin's own key adds to the host's: both must have signed.
    let plugin_keys = [plugin_key.verify_key("plugin.pub")];
    let err = source.pull(&toml, &tag, &plugin_keys).await.unwrap_err();
    assert!(err.to_string().contains("plugin.pub"), "{err}");
    sign_artifact(&client, &tag, &digest, &plugin_key).await.unwrap();
    let code = source.pull(&toml, &tag, &plugin_keys).await.unwrap();
    assert_eq!(code.verified_by, ["host.pub", "plugin.pub"]);

    // Every signature stayed: three layers at the signature tag; signing again adds none.
    sign_artifact(&client, &tag, &digest, &plugin_key).await.unwrap();
    let sig_tag = at(reg.address(), &format!("plugins/mirror:sha256-{}.sig", digest.hex()));
    let (sig_manifest, _) = client.manifest_if_any(&sig_tag).await.unwrap().unwrap();
    let sig_manifest: serde_json::Value = serde_json::from_slice(&sig_manifest).unwrap();
    assert_eq!(sig_manifest["layers"].as_array().unwrap().len(), 3);
}

/// The real cosign verifies what `wasmctrl push --sign-key` signs with a key cosign made,
/// and wasmctrl verifies what cosign signs.
#[tokio::test]
async fn signatures_interoperate_with_cosign() {
    let test = "signatures_interoperate_with_cosign";
    let Some(reg) = registry(test) else { return };
    let Some(cosign) = tools::or_skip(test, "cosign", tools::build_cosign) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cosign_cmd = |args: &[&str]| {
        let out = Command::new(&cosign)
            .args(args)
            .current_dir(tmp.path())
            .env("COSIGN_PASSWORD", "test-password")
            .env("HOME", tmp.path())
            .env("TUF_ROOT", tmp.path().join("tuf"))
            .output()
            .expect("cosign runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cosign_cmd(&["generate-key-pair"]);
    assert!(ok, "cosign generate-key-pair: {out}");
    let file = tmp.path().join("mirror.wasm");
    std::fs::write(&file, wasm("configmap-mirror")).unwrap();

    // wasmctrl push (the binary) signs with cosign's encrypted key...
    let out = Command::new(env!("CARGO_BIN_EXE_wasmctrl"))
        .args(["push", file.to_str().unwrap(), &format!("oci://{}/plugins/mirror:v1", reg.address())])
        .args(["--sign-key", "cosign.key", "--plain-http"])
        .current_dir(tmp.path())
        .env("COSIGN_PASSWORD", "test-password")
        .output()
        .expect("wasmctrl push runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "wasmctrl push: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let pushed: OciReference = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pushed "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .parse()
        .unwrap();
    let digest = pushed.digest().unwrap();
    assert!(
        stdout.contains(&format!(
            "signed oci://{}/plugins/mirror:sha256-{}.sig",
            reg.address(),
            digest.hex()
        )),
        "{stdout}"
    );

    // ...and cosign verifies it, offline, with the public key.
    let image = format!("{}/plugins/mirror@{digest}", reg.address());
    let (ok, out) = cosign_cmd(&[
        "verify",
        "--key",
        "cosign.pub",
        "--insecure-ignore-tlog=true",
        "--allow-http-registry",
        &image,
    ]);
    assert!(ok, "cosign verify: {out}");
    assert!(out.contains(&digest.to_string()), "{out}");
    // cosign refuses it with another key (a check that can fail).
    let other = tmp.path().join("other.pub");
    std::fs::write(&other, SigningKey::generate().verify_key("other").to_pem()).unwrap();
    let (ok, _) = cosign_cmd(&[
        "verify",
        "--key",
        "other.pub",
        "--insecure-ignore-tlog=true",
        "--allow-http-registry",
        &image,
    ]);
    assert!(!ok, "cosign verify with another key must fail");

    // cosign signs an artifact wasmctrl pushed unsigned; wasmctrl verifies cosign's signature.
    let unsigned = push(reg.address(), &wasm("reload-stamp-a"), "plugins/stamp:v1", None).await;
    let image = format!("{}/plugins/stamp@{}", reg.address(), unsigned.digest().unwrap());
    let (ok, out) = cosign_cmd(&[
        "sign",
        "--key",
        "cosign.key",
        "--tlog-upload=false",
        "--allow-http-registry",
        "--yes",
        &image,
    ]);
    assert!(ok, "cosign sign: {out}");
    let mut opts = options(reg.address(), &tmp.path().join("oci"));
    opts.verify_keys = vec![VerifyKey::load(&tmp.path().join("cosign.pub")).unwrap()];
    let source = OciSource::new(opts).unwrap();
    let code = source
        .pull(&tmp.path().join("stamp.toml"), &at(reg.address(), "plugins/stamp:v1"), &[])
        .await
        .unwrap();
    assert_eq!(code.bytes, wasm("reload-stamp-a"));
    let err = source
        .pull(&tmp.path().join("x.toml"), &unsigned, &[VerifyKey::load(&other).unwrap()])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not verify with this key"), "{err}");
}

/// oras, the ORAS project's artifact tool, reads what `wasmctrl push` writes: the
/// component comes back as the file it was pushed from.
#[tokio::test]
async fn oras_pulls_what_wasmctrl_pushes() {
    let test = "oras_pulls_what_wasmctrl_pushes";
    let Some(reg) = registry(test) else { return };
    let Some(oras) = tools::or_skip(test, "oras", tools::build_oras) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let component = wasm("configmap-mirror");
    let client = plain_client(reg.address());
    push_plugin(&client, component.clone(), "mirror.wasm", &at(reg.address(), "plugins/mirror:v1"), None)
        .await
        .unwrap();
    let out_dir = tmp.path().join("pulled");
    let out = Command::new(&oras)
        .args(["pull", "--plain-http", &format!("{}/plugins/mirror:v1", reg.address()), "-o"])
        .arg(&out_dir)
        .env("HOME", tmp.path())
        .output()
        .expect("oras runs");
    assert!(
        out.status.success(),
        "oras pull: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(out_dir.join("mirror.wasm")).expect("oras wrote mirror.wasm"), component);
}

// ---------------------------------------------------------------------------------------
// Credentials, TLS, plain HTTP

#[tokio::test]
async fn credentials_come_from_a_docker_config_and_rotate_without_a_restart() {
    let config =
        RegistryConfig { htpasswd: Some(("wasmctrl".into(), "s3cret".into())), ..Default::default() };
    let Some(reg) = TestRegistry::start_or_skip("credentials_come_from_a_docker_config", config) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let creds = tmp.path().join(".dockerconfigjson");
    std::fs::write(&creds, docker_config(reg.address(), "wasmctrl", "s3cret")).unwrap();
    let with_creds = |path: Option<PathBuf>| RegistryOptions {
        insecure_registries: vec![reg.address().to_owned()],
        credentials: path,
        ..Default::default()
    };
    let tag = at(reg.address(), "plugins/mirror:v1");
    let component = wasm("configmap-mirror");
    push_plugin(
        &RegistryClient::new(with_creds(Some(creds.clone()))).unwrap(),
        component.clone(),
        "m.wasm",
        &tag,
        None,
    )
    .await
    .unwrap();

    // No credentials: denied, and said so.
    let mut opts = options(reg.address(), &tmp.path().join("oci"));
    opts.registry = with_creds(None);
    let err =
        OciSource::new(opts.clone()).unwrap().pull(&tmp.path().join("a.toml"), &tag, &[]).await.unwrap_err();
    assert!(matches!(err, PullError::Registry(RegistryError::Denied { .. })), "{err}");
    assert!(err.is_transient(), "credentials may be rotated: {err}");

    // A wrong password, then the file replaced (as a Secret volume update does): the same
    // source picks the new credentials up.
    replace_file(&creds, &docker_config(reg.address(), "wasmctrl", "wrong"));
    opts.registry = with_creds(Some(creds.clone()));
    let source = OciSource::new(opts).unwrap();
    let err = source.pull(&tmp.path().join("b.toml"), &tag, &[]).await.unwrap_err();
    assert!(matches!(err, PullError::Registry(RegistryError::Denied { .. })), "{err}");
    assert!(!err.to_string().contains("wrong"), "no secret in errors: {err}");
    replace_file(&creds, &docker_config(reg.address(), "wasmctrl", "s3cret"));
    assert_eq!(source.pull(&tmp.path().join("b.toml"), &tag, &[]).await.unwrap().bytes, component);
}

#[tokio::test]
async fn tls_registries_are_verified_against_the_configured_ca() {
    let config = RegistryConfig { tls: true, ..Default::default() };
    let Some(reg) = TestRegistry::start_or_skip("tls_registries_are_verified", config) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ca = reg.ca_pem().expect("a CA");
    let tag = at(reg.address(), "plugins/mirror:v1");
    let component = wasm("configmap-mirror");
    let tls = RegistryOptions { ca_certificates: vec![ca], ..Default::default() };
    push_plugin(&RegistryClient::new(tls.clone()).unwrap(), component.clone(), "m.wasm", &tag, None)
        .await
        .unwrap();
    let mut opts = OciOptions::new(tmp.path().join("oci"));
    opts.registry = tls;
    let code = OciSource::new(opts).unwrap().pull(&tmp.path().join("a.toml"), &tag, &[]).await.unwrap();
    assert_eq!(code.bytes, component);

    // Without the CA the certificate is not trusted.
    let err = OciSource::new(OciOptions::new(tmp.path().join("oci2")))
        .unwrap()
        .pull(&tmp.path().join("b.toml"), &tag, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Registry(RegistryError::Unavailable { .. })), "{err}");
}

#[tokio::test]
async fn plain_http_only_to_loopback_registries_named_in_the_configuration() {
    let err = RegistryClient::new(RegistryOptions {
        insecure_registries: vec!["registry.example.com:5000".into()],
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("not a loopback registry"), "{err}");

    let Some(reg) = registry("plain_http_only_to_loopback_registries_named_in_the_configuration") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    push(reg.address(), &wasm("configmap-mirror"), "plugins/mirror:v1", None).await;
    // Not named: HTTPS is spoken to the plain-HTTP registry, and fails.
    let err = OciSource::new(OciOptions::new(tmp.path().join("oci")))
        .unwrap()
        .pull(&tmp.path().join("a.toml"), &at(reg.address(), "plugins/mirror:v1"), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Registry(RegistryError::Unavailable { .. })), "{err}");
}

// ---------------------------------------------------------------------------------------
// Configuration

#[test]
fn plugin_tomls_name_registry_references_and_keys_with_errors_in_place() {
    let defaults = PluginDefaults::default();
    let path = Path::new("/etc/wasmctrl/plugins/mirror.toml");
    let body = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";
    let p = PluginConfig::parse(
        path,
        &format!("wasm = \"oci://ghcr.io/example/mirror:1.0\"\nverify-key = \"keys/cosign.pub\"\n{body}"),
        &defaults,
    )
    .unwrap();
    let r = p.wasm_registry.as_ref().expect("a registry component");
    assert_eq!(r.reference.to_string(), "oci://ghcr.io/example/mirror:1.0");
    assert_eq!(r.verify_key.as_deref(), Some(Path::new("/etc/wasmctrl/plugins/keys/cosign.pub")));

    let err =
        PluginConfig::parse(path, &format!("wasm = \"oci://mirror:1.0\"\n{body}"), &defaults).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "error: /etc/wasmctrl/plugins/mirror.toml:1:8: `wasm`: `oci://mirror:1.0` names no registry"
        ),
        "{text}"
    );

    let err = PluginConfig::parse(path, &format!("verify-key = \"k.pub\"\n{body}"), &defaults).unwrap_err();
    assert!(
        err.to_string().contains("`verify-key`: `verify-key` applies to a component from a registry"),
        "{err}"
    );
}

#[test]
fn the_host_oci_section_is_checked() {
    let path = Path::new("/etc/wasmctrl/wasmctrl.toml");
    let host = HostConfig::parse(
        path,
        "[oci]\npoll-interval = \"30s\"\ncredentials = \"registry/.dockerconfigjson\"\ninsecure-registries = [\"localhost:5000\", \"127.0.0.1:5001\"]\nca-certificates = [\"ca.pem\"]\nverify-key = \"cosign.pub\"\ncache-max-size = \"1GiB\"\nmax-wasm-size = \"64MiB\"\n",
    )
    .unwrap();
    let o = &host.oci;
    assert_eq!(o.poll_interval, Duration::from_secs(30));
    assert_eq!(o.credentials.as_deref(), Some(Path::new("/etc/wasmctrl/registry/.dockerconfigjson")));
    assert_eq!(o.insecure_registries, ["localhost:5000", "127.0.0.1:5001"]);
    assert_eq!(o.ca_certificates, [PathBuf::from("/etc/wasmctrl/ca.pem")]);
    assert_eq!(o.verify_key.as_deref(), Some(Path::new("/etc/wasmctrl/cosign.pub")));
    assert_eq!((o.cache_max_bytes, o.max_wasm_bytes), (1 << 30, 64 << 20));
    let defaults = HostConfig::parse(path, "").unwrap().oci;
    assert_eq!(defaults.poll_interval, Duration::from_secs(60));

    let err = HostConfig::parse(
        path,
        "[oci]\ninsecure-registries = [\"localhost:5000\", \"registry.internal:5000\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("wasmctrl.toml:2:42: `oci.insecure-registries[1]`: `registry.internal:5000` is not a loopback registry"), "{err}");
    let err = HostConfig::parse(path, "[oci]\npoll-interval = \"100ms\"\n").unwrap_err().to_string();
    assert!(err.contains("`oci.poll-interval`: poll-interval `100ms` is below the minimum, 1s"), "{err}");
    let err = HostConfig::parse(path, "[oci]\npoll-intervall = \"1m\"\n").unwrap_err().to_string();
    assert!(err.contains("did you mean `poll-interval`?"), "{err}");
}

#[test]
fn check_reports_a_registry_plugin_without_pulling_it_and_checks_its_key() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = tmp.path().join("mirror.toml");
    let body = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";
    std::fs::write(
        &toml,
        format!("wasm = \"oci://ghcr.io/example/mirror:1.0\"\nverify-key = \"cosign.pub\"\n{body}"),
    )
    .unwrap();
    std::fs::write(tmp.path().join("cosign.pub"), SigningKey::generate().verify_key("k").to_pem()).unwrap();
    let report = check_paths(std::slice::from_ref(&toml), &CheckOptions::default());
    assert!(report.ok(), "{}", report.render());
    let text = report.render();
    assert!(
        text.contains(
            "wasm     oci://ghcr.io/example/mirror:1.0 (pulled when the host loads it, signed with"
        ),
        "{text}"
    );

    std::fs::write(tmp.path().join("cosign.pub"), "not a key").unwrap();
    let report = check_paths(&[toml], &CheckOptions::default());
    assert!(!report.ok());
    assert!(report.render().contains("`verify-key`: key"), "{}", report.render());
}

#[test]
fn check_reads_the_files_the_oci_section_names() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("plugins")).unwrap();
    let host = tmp.path().join("wasmctrl.toml");
    std::fs::write(
        &host,
        "[oci]\nverify-key = \"cosign.pub\"\ncredentials = \"config.json\"\nca-certificates = [\"ca.pem\"]\n",
    )
    .unwrap();
    let report = check_paths(std::slice::from_ref(&host), &CheckOptions::default());
    let text = report.render();
    assert!(!report.ok(), "{text}");
    for field in ["`oci.verify-key`", "`oci.credentials`", "`oci.ca-certificates`"] {
        assert!(text.contains(field), "{field} in {text}");
    }
    std::fs::write(tmp.path().join("cosign.pub"), SigningKey::generate().verify_key("k").to_pem()).unwrap();
    std::fs::write(tmp.path().join("config.json"), docker_config("ghcr.io", "u", "p")).unwrap();
    std::fs::write(tmp.path().join("ca.pem"), "").unwrap();
    let report = check_paths(&[host], &CheckOptions::default());
    assert!(report.ok(), "{}", report.render());
}

/// The deploy variant whose plugin TOMLs come from a ConfigMap and whose components come
/// from a registry: its host and plugin TOMLs pass the host's checks.
#[test]
fn the_oci_deploy_variant_configures_a_registry_plugin() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/wasmctrl-oci.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/kubernetes/wasmctrl-oci.yaml");
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let doc: serde_json::Value = serde::Deserialize::deserialize(doc).expect("YAML");
        if doc["kind"] == "ConfigMap" {
            for (k, v) in doc["data"].as_object().into_iter().flatten() {
                files.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
            }
        }
    }
    let host = HostConfig::parse(Path::new("/etc/wasmctrl/wasmctrl.toml"), &files["wasmctrl.toml"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(host.plugins_dir, Path::new("/etc/wasmctrl/plugins"));
    assert!(host.oci.credentials.is_some() && host.oci.verify_key.is_some(), "{:?}", host.oci);
    // The key shipped in the example is a placeholder the host refuses (it fails closed).
    assert!(VerifyKey::from_pem(&files["cosign.pub"], "cosign.pub").is_err());
    let plugins: Vec<PluginConfig> = files
        .iter()
        .filter(|(k, _)| k.ends_with(".toml") && *k != "wasmctrl.toml")
        .map(|(k, v)| {
            PluginConfig::parse(&Path::new("/etc/wasmctrl/plugins").join(k), v, &host.plugin_defaults)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    assert!(!plugins.is_empty());
    for p in &plugins {
        assert!(p.wasm_registry.is_some(), "{}: its component comes from a registry", p.name);
    }
}

// ---------------------------------------------------------------------------------------
// The plugins manager: a plugin from a registry runs and hot-reloads as its tag moves

#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

#[path = "common/process.rs"]
mod process;

use process::HostProcess;

/// A host over a test cluster of its own, in a fresh namespace, running the plugin `stamp`.
struct Host {
    /// Dropped with the host: the dev cluster stops, or the test's namespace is deleted.
    cluster: TestCluster,
    ns: String,
    host: TestHost,
}

impl std::ops::Deref for Host {
    type Target = TestHost;

    fn deref(&self) -> &TestHost {
        &self.host
    }
}

impl Host {
    /// A host pulling from `registry`, whose plugins directory (`plugins`, with what the test
    /// put there) has `stamp.toml`, its component `wasm` (a registry reference, or a file).
    async fn start(namespace: &str, registry: OciSource, wasm: &str, plugins: PluginsDir) -> Host {
        let cluster = TestCluster::start().await.expect("test cluster");
        let ns = cluster.namespace_named(namespace).await.expect("namespace");
        plugins.write("stamp.toml", stamp_toml(&ns, wasm).as_bytes());
        let setup = HostSetup {
            options: Box::new(move |o| ManagerOptions {
                debounce: Duration::from_millis(50),
                cache_sync_timeout: Duration::from_secs(30),
                registry: Some(registry),
                ..o
            }),
            ..HostSetup::new("oci-test", PATIENCE)
        };
        let host = TestHost::start(cluster.client(), plugins, setup).await;
        Host { cluster, ns, host }
    }

    /// Waits until the status of `stamp` passes `cond`.
    async fn until_stamp(&self, what: &str, cond: impl Fn(&PluginStatus) -> bool) {
        self.until(what, |h| h.status("stamp").is_some_and(|s| cond(&s))).await;
    }

    /// Stops the host, then drops the cluster.
    async fn stop(self) {
        self.host.stop().await;
        drop(self.cluster);
    }
}

/// The TOML of the stamp plugin (it copies each `role=src` ConfigMap to `out-<name>`,
/// stamped with its build's letter), its component named by `reference`.
fn stamp_toml(namespace: &str, reference: &str) -> String {
    format!(
        "wasm = \"{reference}\"\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{namespace}\"\nlabel-selector = \"role=src\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n"
    )
}

async fn apply_src(api: &Api<ConfigMap>, name: &str, value: &str) {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": { "role": "src" } },
        "data": { "value": value },
    });
    api.patch(name, &PatchParams::apply("oci-test").force(), &Patch::Apply(&cm)).await.expect("apply src");
}

/// Waits until `out-src-<n>` exists for each of `names`, stamped `stamp`.
async fn until_stamped(api: &Api<ConfigMap>, names: &[&str], stamp: &str) {
    let outcome = tokio::time::timeout(PATIENCE, async {
        loop {
            let mut all = true;
            for n in names {
                let got = api.get_opt(&format!("out-{n}")).await.expect("get").and_then(|cm| cm.data);
                all &= got.is_some_and(|d| d.get("stamp").map(String::as_str) == Some(stamp));
            }
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    outcome.unwrap_or_else(|_| panic!("timed out waiting for {names:?} to be stamped {stamp:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_from_a_registry_waits_for_its_tag_runs_and_hot_reloads_when_the_tag_moves() {
    let Some(reg) = registry("a_plugin_from_a_registry_waits_for_its_tag_runs_and_hot_reloads") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key = SigningKey::generate();
    let mut opts = options(reg.address(), &dir.path().join("cache/oci"));
    opts.verify_keys = vec![key.verify_key("host.pub")];
    let source = OciSource::new(opts).unwrap();
    let tag = at(reg.address(), "plugins/stamp:v1");
    let host = Host::start("oci-reload", source, &tag.to_string(), PluginsDir::new()).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), &host.ns);

    // Nothing pushed yet: waiting for the tag, and saying so.
    host.until_stamp("waiting for the tag", |s| s.state == PluginState::WaitingForWasm).await;
    let s = host.status("stamp").unwrap();
    assert_eq!(s.source.as_deref(), Some(tag.to_string().as_str()));
    assert_eq!(s.last_error, None, "waiting is not an error (as for a `.wasm` not there yet)");
    let readiness = host.manager().status().readiness();
    assert!(!readiness.ready);
    assert!(
        readiness.details.iter().any(|d| d.contains(&format!("waiting for its .wasm ({tag})"))),
        "{readiness:?}"
    );

    // Pushed (signed): the poll sees it and the plugin starts.
    let (a, b) = (wasm("reload-stamp-a"), wasm("reload-stamp-b"));
    let v1 = push(reg.address(), &a, "plugins/stamp:v1", Some(&key)).await;
    host.until_stamp("version a", |s| s.version.as_deref() == Some(&version_of(&a)) && s.ready).await;
    let s = host.status("stamp").unwrap();
    assert_eq!(s.source.as_deref(), Some(v1.to_string().as_str()));
    assert!(s.wasm.as_ref().is_some_and(|w| std::fs::read(w).ok().as_ref() == Some(&a)), "{s:?}");
    apply_src(&api, "src-1", "one").await;
    until_stamped(&api, &["src-1"], "a").await;

    // The tag moves to an unsigned build: refused, and version a keeps running.
    let unsigned = push(reg.address(), &b, "plugins/stamp:v1", None).await;
    host.until_stamp("the unsigned build refused", |s| {
        s.last_error.as_deref().is_some_and(|e| e.contains("is not signed"))
    })
    .await;
    let s = host.status("stamp").unwrap();
    assert_eq!((s.state, s.version.as_deref()), (PluginState::Running, Some(version_of(&a).as_str())));
    apply_src(&api, "src-2", "two").await;
    until_stamped(&api, &["src-1", "src-2"], "a").await;

    // Signed, but by another key: still refused, and version a keeps running and serving;
    // `/readyz` names the refusal without making the host unready.
    let stranger = SigningKey::generate();
    sign_artifact(&plain_client(reg.address()), &tag, &unsigned.digest().unwrap(), &stranger).await.unwrap();
    host.until_stamp("the wrongly signed build refused", |s| {
        s.last_error.as_deref().is_some_and(|e| e.contains("verifies with the key host.pub"))
    })
    .await;
    let s = host.status("stamp").unwrap();
    assert_eq!((s.state, s.version.as_deref()), (PluginState::Running, Some(version_of(&a).as_str())));
    assert_eq!(s.source.as_deref(), Some(v1.to_string().as_str()), "the pinned source is the running one");
    let readiness = host.manager().status().readiness();
    assert!(readiness.ready, "{readiness:?}");
    assert!(
        readiness.details.iter().any(|d| d.contains("reload rejected, still running version")
            && d.contains("verifies with the key host.pub")),
        "{readiness:?}"
    );
    apply_src(&api, "src-3", "three").await;
    until_stamped(&api, &["src-1", "src-2", "src-3"], "a").await;

    // Signed by the configured key after the push (as `cosign sign` is run after `docker
    // push`): the next poll tries again, and the plugin swaps to b with the usual hand-off —
    // every key reconciled again by b, nothing left to a.
    sign_artifact(&plain_client(reg.address()), &tag, &unsigned.digest().unwrap(), &key).await.unwrap();
    host.until_stamp("version b", |s| {
        s.version.as_deref() == Some(&version_of(&b)) && s.last_error.is_none()
    })
    .await;
    let s = host.status("stamp").unwrap();
    assert_eq!(s.source.as_deref(), Some(unsigned.to_string().as_str()));
    assert_eq!(s.reloads, 2, "loaded a, then reloaded b once: {s:?}");
    until_stamped(&api, &["src-1", "src-2", "src-3"], "b").await;
    assert!(host.manager().status().readiness().ready);
    host.stop().await;
}

/// Whether the client side of `stream` is still connected (what it sent is read and dropped).
fn still_open(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    stream.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// A pull from a registry that never answers runs outside the plugin's lock: the plugin is
/// stopped when its TOML goes, and the manager shuts down, while the pull still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_never_answers_holds_up_no_stop_and_no_shutdown() {
    // Accepts connections and never answers them (each kept open until the test ends).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap().to_string();
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in silent.incoming() {
            let Ok(stream) = stream else { return };
            if accepted_tx.send(stream).is_err() {
                return;
            }
        }
    });
    let next_connection = || accepted.recv_timeout(PATIENCE).expect("the manager asks the registry");

    let dir = tempfile::tempdir().unwrap();
    let a = wasm("reload-stamp-a");
    let plugins = PluginsDir::new();
    plugins.write("stamp.wasm", &a);
    // Only pulls ask it (no poll round in this test's time).
    let mut opts = options(&address, &dir.path().join("cache/oci"));
    opts.poll_interval = Duration::from_secs(3600);
    let source = OciSource::new(opts).unwrap();
    let host = Host::start("oci-silent", source, "stamp.wasm", plugins).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), &host.ns);
    host.until_stamp("version a", |s| s.version.as_deref() == Some(&version_of(&a)) && s.ready).await;
    apply_src(&api, "src-1", "one").await;
    until_stamped(&api, &["src-1"], "a").await;

    // Its TOML now names a component in the silent registry: the pull waits.
    let toml = host.plugins.path().join("stamp.toml");
    let silent_tag = at(&address, "plugins/stamp:v1").to_string();
    replace_file(&toml, &stamp_toml(&host.ns, &silent_tag));
    let mut first = next_connection();
    // Its TOML removed meanwhile: the plugin stops, while that pull still waits.
    std::fs::remove_file(&toml).unwrap();
    host.until("the plugin to stop", |h| h.status("stamp").is_none()).await;
    assert!(still_open(&mut first), "the plugin stopped while its pull was still waiting");

    // Back, still naming the silent registry: a shutdown does not wait for its pull either
    // (it ends the pull, which so never fails for the registry's silence).
    while accepted.try_recv().is_ok() {}
    std::fs::write(&toml, stamp_toml(&host.ns, &silent_tag)).unwrap();
    let mut second = next_connection();
    host.until_stamp("starting", |s| s.state == PluginState::Starting).await;
    assert!(still_open(&mut second));
    let board = host.manager().status();
    host.stop().await;
    let s = board.get("stamp").expect("its status stays until the end");
    assert_eq!((s.state, s.last_error), (PluginState::Starting, None), "the pull was ended, not waited for");
}

/// `wasmctrl run` as a user runs it: `[oci]` in the host TOML, a plugin TOML naming a signed
/// component in a registry; the plugin reconciles, then reloads when its tag moves.
#[tokio::test]
async fn wasmctrl_run_pulls_a_signed_plugin_and_follows_its_tag() {
    let Some(reg) = registry("wasmctrl_run_pulls_a_signed_plugin_and_follows_its_tag") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let key = SigningKey::generate();
    std::fs::write(dir.join("cosign.pub"), key.verify_key("cosign.pub").to_pem()).unwrap();
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    std::fs::write(
        dir.join("seed.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: src-1, namespace: default, labels: {role: src}}\ndata: {value: one}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("wasmctrl.toml"),
        format!(
            "plugins-dir = \"plugins\"\ncache-dir = \"cache\"\n\n[cluster]\nmode = \"embedded\"\nseed = [\"seed.yaml\"]\n\n\
             [server]\naddress = \"127.0.0.1:0\"\n\n[oci]\npoll-interval = \"1s\"\ninsecure-registries = [\"{}\"]\n\
             verify-key = \"cosign.pub\"\n",
            reg.address()
        ),
    )
    .unwrap();
    let tag = at(reg.address(), "plugins/stamp:v1");
    std::fs::write(dir.join("plugins/stamp.toml"), stamp_toml("default", &tag.to_string())).unwrap();
    let (a, b) = (wasm("reload-stamp-a"), wasm("reload-stamp-b"));
    push(reg.address(), &a, "plugins/stamp:v1", Some(&key)).await;

    let (_host, client) = HostProcess::run_embedded(&dir.join("wasmctrl.toml"), PATIENCE).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    until_stamped(&api, &["src-1"], "a").await;
    // What it pulled is in cache-dir/oci, as the host wrote it.
    let blob = dir.join("cache/oci/blobs/sha256").join(Digest::of(&a).hex());
    assert_eq!(std::fs::read(&blob).unwrap(), a);
    assert_eq!(mode(&blob), 0o600);
    assert_eq!(mode(&dir.join("cache/oci")), 0o700);

    push(reg.address(), &b, "plugins/stamp:v1", Some(&key)).await;
    until_stamped(&api, &["src-1"], "b").await;
}
