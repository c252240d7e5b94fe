//! `wasmctrl push FILE.wasm oci://registry/repository:tag [--sign-key KEY]`: publishes a
//! plugin's component as a Wasm OCI artifact (see `wasmctrl::oci::push`), signed with a
//! cosign-compatible signature when a key is given.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use wasmctrl::oci::{OciReference, RegistryClient, RegistryOptions, SigningKey, push_plugin};

/// `wasmctrl push`.
#[derive(Args, Debug)]
pub struct PushArgs {
    /// The component to publish (`.wasm`).
    pub file: PathBuf,
    /// Where: `oci://registry/repository:tag`.
    pub reference: String,
    /// Sign the artifact (as `cosign sign --key` does) with this private key: cosign's
    /// encrypted key (its password in COSIGN_PASSWORD), or an unencrypted PKCS#8 or SEC1 PEM.
    #[arg(long, value_name = "KEY")]
    pub sign_key: Option<PathBuf>,
    /// Registry credentials: a Docker config.json (default: $DOCKER_CONFIG/config.json or
    /// ~/.docker/config.json, when there).
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// Plain HTTP instead of HTTPS; only for a loopback registry (localhost, 127.0.0.0/8, [::1]).
    #[arg(long)]
    pub plain_http: bool,
    /// A CA (PEM) to trust besides the system's; may be repeated.
    #[arg(long, value_name = "PEM")]
    pub ca_certificate: Vec<PathBuf>,
}

/// Docker's own credentials file, when there is one.
fn docker_config() -> Option<PathBuf> {
    let dir = std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker")))?;
    Some(dir.join("config.json")).filter(|p| p.is_file())
}

pub fn push(args: PushArgs) -> Result<ExitCode> {
    let reference: OciReference = args.reference.parse().context("the reference to push to")?;
    let wasm = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let key = match &args.sign_key {
        Some(path) => {
            let password = std::env::var_os("COSIGN_PASSWORD").map(|p| p.into_encoded_bytes());
            Some(SigningKey::load(path, password.as_deref()).context("the signing key")?)
        }
        None => None,
    };
    let options = RegistryOptions {
        insecure_registries: if args.plain_http { vec![reference.registry().to_owned()] } else { Vec::new() },
        ca_certificates: args.ca_certificate.clone(),
        credentials: args.credentials.clone().or_else(docker_config),
    };
    let title = args.file.file_name().and_then(|n| n.to_str()).unwrap_or("plugin.wasm").to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let outcome = runtime.block_on(async {
        let client = RegistryClient::new(options).context("setting up the registry client")?;
        push_plugin(&client, wasm, &title, &reference, key.as_ref())
            .await
            .with_context(|| format!("pushing {} to {reference}", args.file.display()))
    })?;
    println!("pushed {}", outcome.reference);
    if let Some(signatures) = &outcome.signatures {
        println!("signed {signatures}");
    }
    Ok(ExitCode::SUCCESS)
}
