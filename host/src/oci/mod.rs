//! Plugins from OCI registries: a plugin TOML may name its component as
//! `wasm = "oci://registry/repository:tag"` (or `@sha256:...`), and `wasmctrl push` publishes
//! one there.
//!
//! - [`reference`]: the `oci://` references of plugin TOMLs;
//! - [`digest`]: content digests, the one check of every byte taken from a registry or the store;
//! - [`artifact`]: the Wasm OCI artifact layout (CNCF: config `application/vnd.wasm.config.v0+json`,
//!   layer `application/wasm`);
//! - [`client`]: the registry client (`oci-client` with the host's TLS, credentials and limits);
//! - [`credentials`]: Docker `config.json` / imagePullSecret credentials;
//! - [`store`]: the content-addressed store of pulled plugins under the cache directory;
//! - [`keys`], [`signature`]: cosign-compatible signatures, checked offline with a public key;
//! - [`source`]: what the plugins manager asks — pull by digest, follow tags, report moves;
//! - [`push`]: `wasmctrl push`.
//!
//! Invariants of the module: code reaches a plugin only after its bytes were checked against
//! the digest that names them, and — when a key applies — after the manifest digest's
//! signatures were checked against each key; plain HTTP only to loopback registries named in
//! the host TOML; nothing here depends on the plugins manager: it sees only paths, references
//! and bytes.

pub mod artifact;
pub mod client;
pub mod credentials;
pub mod digest;
pub mod keys;
pub mod push;
pub mod reference;
pub mod signature;
pub mod source;
pub mod store;

pub use client::{RegistryClient, RegistryError, RegistryOptions};
pub use digest::Digest;
pub use keys::{KeyError, SigningKey, VerifyKey};
pub use push::{PushOutcome, push_plugin};
pub use reference::OciReference;
pub use source::{OciOptions, OciSource, PullError, PulledCode, SourceChange};
