//! Plugin code from registries: what the plugins manager asks for a plugin whose TOML says
//! `wasm = "oci://..."`, and how it learns that a tag moved.
//!
//! The seam with the manager is narrow: [`OciSource::pull`] takes the TOML (as the key of
//! the plugin), the reference and the plugin's verification keys, and returns the
//! component's bytes, the file they are kept in and the digest that names them; every
//! plugin pulled is then followed, and when the tag it names moves to another digest (or a
//! pull that failed for a reason that may pass, such as an unreachable registry, may now
//! succeed), its listeners hear of it ([`OciSource::on_change`], with the TOML's path) —
//! the manager treats that as a change of the file, with the same hand-off rules.
//!
//! Pulling, step by step: the tag is resolved to a manifest digest (a pinned reference is
//! not); the manifest is taken from the store or pulled by digest and checked against it;
//! it must be a Wasm artifact ([`super::artifact`]); when keys apply (the host's and the
//! plugin's), cosign signatures of that digest are fetched and checked before anything else
//! is pulled; then the layer is taken from the store or pulled, bounded by
//! `max-wasm-size`, and checked against its digest. When the registry cannot be reached,
//! a tag falls back to the digest it resolved to last, and signatures to the ones last
//! fetched for that digest (checked again), so a host restarts with what it ran.
//!
//! Invariants: the code returned is exactly the layer the (verified) manifest names; a
//! plugin with keys never gets code whose manifest digest has no valid signature by each
//! key; a moved tag is reported to the manager once per new digest — a digest that was
//! loaded or refused for good is not reported again, one whose pull failed for a reason
//! that may pass (an unreachable registry, a signature not pushed yet) is, every poll, and
//! one loaded from the store because the registry was unreachable is, once it answers; a
//! pull never blocks another plugin's (no lock is held across a request); the store keeps
//! the blobs of every followed plugin's current digest.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::artifact::{self, ArtifactError};
use super::client::{MAX_MANIFEST_BYTES, RegistryClient, RegistryError, RegistryOptions};
use super::digest::Digest;
use super::keys::VerifyKey;
use super::reference::OciReference;
use super::signature::{
    self, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, SignatureError, SignedPayload,
};
use super::store::{OciStore, StoreError, StorePutError};

/// The largest simple-signing payload read (cosign's are a few hundred bytes).
const MAX_PAYLOAD_BYTES: u64 = 1 << 20;
/// At most this many signature layers are looked at.
const MAX_SIGNATURES: usize = 64;
/// Tags resolved at once in a poll round.
const POLL_CONCURRENCY: usize = 8;

/// How plugins are pulled and followed (the host TOML's `[oci]`).
#[derive(Clone, Debug)]
pub struct OciOptions {
    pub registry: RegistryOptions,
    /// The local store (`<cache-dir>/oci`).
    pub store_dir: PathBuf,
    /// Byte budget of the store; the blobs of plugins in use always stay.
    pub store_max_bytes: u64,
    /// The largest component pulled.
    pub max_wasm_bytes: u64,
    /// How often tags are resolved again.
    pub poll_interval: Duration,
    /// Keys every pulled plugin must be signed with (besides its own).
    pub verify_keys: Vec<VerifyKey>,
}

impl OciOptions {
    /// Options with the documented defaults, keeping the store in `store_dir`.
    pub fn new(store_dir: impl Into<PathBuf>) -> Self {
        OciOptions {
            registry: RegistryOptions::default(),
            store_dir: store_dir.into(),
            store_max_bytes: DEFAULT_STORE_MAX_BYTES,
            max_wasm_bytes: DEFAULT_MAX_WASM_BYTES,
            poll_interval: DEFAULT_POLL_INTERVAL,
            verify_keys: Vec::new(),
        }
    }
}

/// `[oci] poll-interval` by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// `[oci] cache-max-size` by default.
pub const DEFAULT_STORE_MAX_BYTES: u64 = 512 << 20;
/// `[oci] max-wasm-size` by default.
pub const DEFAULT_MAX_WASM_BYTES: u64 = 256 << 20;

/// Code pulled for a plugin.
#[derive(Clone, Debug)]
pub struct PulledCode {
    /// The component.
    pub bytes: Vec<u8>,
    /// The file in the store holding exactly these bytes.
    pub path: PathBuf,
    /// The reference, pinned to the manifest pulled.
    pub reference: OciReference,
    pub layer: Digest,
    /// The keys that verified it.
    pub verified_by: Vec<String>,
    /// The registry could not be reached: the tag's last digest (and its signatures) came
    /// from the store.
    pub offline: bool,
}

/// Why a plugin could not be pulled.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{reference}: {source}")]
    Artifact {
        reference: String,
        #[source]
        source: ArtifactError,
    },
    #[error("{reference}: the layer is {actual} bytes, but the manifest says {declared}")]
    SizeMismatch { reference: String, declared: u64, actual: u64 },
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("the store of pulled plugins: {0}")]
    Store(#[from] StoreError),
}

impl PullError {
    /// Whether pulling the same reference again may succeed without a change here: the
    /// registry may come back, credentials be rotated, a tag be pushed — or a signature be
    /// added (`cosign sign` runs after the push), so a signature failure is tried again at
    /// every poll too. Content that is not a plugin is refused for good (until the tag moves).
    pub fn is_transient(&self) -> bool {
        match self {
            PullError::Registry(e) => e.is_transient(),
            PullError::Store(_) | PullError::Signature(_) => true,
            PullError::Artifact { .. } | PullError::SizeMismatch { .. } => false,
        }
    }

    /// Whether the registry has no such tag or repository (yet).
    pub fn is_not_found(&self) -> bool {
        matches!(self, PullError::Registry(RegistryError::NotFound { .. }))
    }
}

/// A followed plugin's source changed: its tag names another digest, or a pull that failed
/// for a passing reason is worth trying again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceChange {
    /// The plugin TOML that names the reference.
    pub toml: PathBuf,
    pub reference: OciReference,
    /// The digest the reference names now.
    pub digest: Digest,
}

/// What hears of source changes.
type Listener = Box<dyn Fn(&SourceChange) + Send + Sync>;

/// One followed plugin.
struct Watch {
    reference: OciReference,
    /// The manifest digest of the last pull that ended for good (loaded, or refused for a
    /// reason that will not pass); `None` while a pull has to be tried again.
    settled: Option<Digest>,
    /// The blobs its current code needs (kept by the store's pruning).
    in_use: Vec<Digest>,
}

struct Inner {
    options: OciOptions,
    client: RegistryClient,
    store: Mutex<Option<OciStore>>,
    /// TOML path → what it follows.
    watches: Mutex<BTreeMap<PathBuf, Watch>>,
    listeners: Mutex<Vec<Listener>>,
    /// Poll rounds completed (each after its changes were reported).
    rounds: watch::Sender<u64>,
    /// References whose last resolution failed (their failures log once, not every poll).
    failing: Mutex<HashSet<OciReference>>,
    poller: OnceLock<tokio::task::JoinHandle<()>>,
}

/// Pulls plugins from registries and follows their tags. Cheap to clone.
#[derive(Clone)]
pub struct OciSource {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSource").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.poller.get() {
            task.abort();
        }
    }
}

impl OciSource {
    /// A source with `options`: the registry client is set up now (CA files are read); the
    /// store is opened at the first pull.
    pub fn new(options: OciOptions) -> Result<OciSource, RegistryError> {
        let client = RegistryClient::new(options.registry.clone())?;
        Ok(OciSource {
            inner: Arc::new(Inner {
                options,
                client,
                store: Mutex::default(),
                watches: Mutex::default(),
                listeners: Mutex::default(),
                rounds: watch::Sender::new(0),
                failing: Mutex::default(),
                poller: OnceLock::new(),
            }),
        })
    }

    /// Calls `listener` for each change of a followed plugin's source (from the poller's
    /// task: it must not block).
    pub fn on_change(&self, listener: impl Fn(&SourceChange) + Send + Sync + 'static) {
        self.inner.listeners.lock().push(Box::new(listener));
    }

    /// The number of poll rounds completed, as it grows: a round's changes were reported
    /// before it counts.
    pub fn poll_rounds(&self) -> watch::Receiver<u64> {
        self.inner.rounds.subscribe()
    }

    /// Follows the plugins of `tomls` only: the others (removed, renamed, or no longer from
    /// a registry) are no longer polled, and their blobs may be pruned.
    pub fn follow_only(&self, tomls: &BTreeSet<PathBuf>) {
        self.inner.watches.lock().retain(|toml, _| tomls.contains(toml));
    }

    /// The store, opened on first use (and again after a failure: the directory may have
    /// been fixed meanwhile).
    fn store(&self) -> Result<OciStore, PullError> {
        let mut store = self.inner.store.lock();
        if let Some(s) = &*store {
            return Ok(s.clone());
        }
        let opened = OciStore::open(&self.inner.options.store_dir)?;
        *store = Some(opened.clone());
        Ok(opened)
    }

    /// Pulls the component `reference` names for the plugin of `toml`, checking signatures
    /// with the host's keys and `plugin_keys`; from then on the plugin's tag is followed.
    pub async fn pull(
        &self,
        toml: &Path,
        reference: &OciReference,
        plugin_keys: &[VerifyKey],
    ) -> Result<PulledCode, PullError> {
        self.follow(toml, reference);
        let result = self.pull_inner(reference, plugin_keys).await;
        let mut watches = self.inner.watches.lock();
        if let Some(w) = watches.get_mut(toml).filter(|w| w.reference == *reference) {
            match &result {
                Ok((code, in_use)) => {
                    // Code from the store while the registry was unreachable is tried
                    // again once the registry answers.
                    w.settled = if code.offline { None } else { code.reference.digest() };
                    w.in_use = in_use.clone();
                }
                Err((e, digest)) if !e.is_transient() => w.settled = *digest,
                Err(_) => w.settled = None,
            }
        }
        drop(watches);
        match result {
            Ok((code, _)) => {
                self.prune();
                Ok(code)
            }
            Err((e, _)) => Err(e),
        }
    }

    fn follow(&self, toml: &Path, reference: &OciReference) {
        {
            let mut watches = self.inner.watches.lock();
            let w = watches.entry(toml.to_owned()).or_insert_with(|| Watch {
                reference: reference.clone(),
                settled: None,
                in_use: Vec::new(),
            });
            if w.reference != *reference {
                *w = Watch { reference: reference.clone(), settled: None, in_use: Vec::new() };
            }
        }
        self.inner.poller.get_or_init(|| {
            let weak = Arc::downgrade(&self.inner);
            tokio::spawn(poll_loop(weak, self.inner.options.poll_interval))
        });
    }

    /// The pull, with the blobs the code needs (manifest, layer, signatures); on failure,
    /// also the manifest digest it concerned (if known).
    async fn pull_inner(
        &self,
        reference: &OciReference,
        plugin_keys: &[VerifyKey],
    ) -> Result<(PulledCode, Vec<Digest>), (PullError, Option<Digest>)> {
        let store = &self.store().map_err(|e| (e, None))?;
        let client = &self.inner.client;
        let shown = reference.to_string();
        let mut offline = false;

        let digest = match reference.digest() {
            Some(d) => d,
            None => match client.resolve(reference).await {
                Ok(d) => {
                    if store.recorded(&tag_record(reference)) != Some(d)
                        && let Err(e) = store.record(&tag_record(reference), &d)
                    {
                        tracing::warn!(reference = %shown, error = %e, "cannot record the digest of a tag");
                    }
                    d
                }
                Err(e @ RegistryError::Unavailable { .. }) => match store.recorded(&tag_record(reference)) {
                    Some(d) => {
                        tracing::warn!(reference = %shown, digest = %d, error = %e,
                            "registry unavailable: using the digest this tag had when last resolved");
                        offline = true;
                        d
                    }
                    None => return Err((e.into(), None)),
                },
                Err(e) => return Err((e.into(), None)),
            },
        };
        let pinned = reference.with_digest(digest);
        let fail = |e: PullError| (e, Some(digest));
        let artifact_error = |source| PullError::Artifact { reference: pinned.to_string(), source };

        let manifest_bytes = match store.get(&digest, MAX_MANIFEST_BYTES) {
            Some(bytes) => bytes,
            None => {
                let bytes = client.manifest(reference, &digest).await.map_err(|e| fail(e.into()))?;
                put(store, &digest, &bytes).map_err(fail)?;
                bytes
            }
        };
        let manifest = artifact::parse_manifest(&manifest_bytes).map_err(|e| fail(artifact_error(e)))?;
        let (layer, size) = artifact::wasm_layer(&manifest, self.inner.options.max_wasm_bytes)
            .map_err(|e| fail(artifact_error(e)))?;

        let keys: Vec<VerifyKey> =
            self.inner.options.verify_keys.iter().chain(plugin_keys).cloned().collect();
        let mut in_use = vec![digest, layer];
        if !keys.is_empty() {
            let (from_store, signatures) =
                self.check_signatures(store, reference, &digest, &keys).await.map_err(fail)?;
            offline |= from_store;
            in_use.extend(signatures);
        }

        let bytes = match store.get(&layer, self.inner.options.max_wasm_bytes) {
            Some(bytes) => bytes,
            None => {
                let bytes = client
                    .blob(reference, &layer, size, self.inner.options.max_wasm_bytes)
                    .await
                    .map_err(|e| fail(e.into()))?;
                put(store, &layer, &bytes).map_err(fail)?;
                bytes
            }
        };
        if bytes.len() as u64 != size {
            return Err(fail(PullError::SizeMismatch {
                reference: pinned.to_string(),
                declared: size,
                actual: bytes.len() as u64,
            }));
        }
        let verified_by = keys.iter().map(|k| k.origin().to_owned()).collect();
        tracing::info!(reference = %pinned, layer = %layer, bytes = bytes.len(), offline, signed = !keys.is_empty(),
            "plugin code pulled");
        Ok((
            PulledCode {
                path: store.blob_path(&layer),
                bytes,
                reference: pinned,
                layer,
                verified_by,
                offline,
            },
            in_use,
        ))
    }

    /// Checks the cosign signatures of manifest `digest` against `keys`. Returns whether the
    /// registry was unavailable and the signatures last fetched were used, and the blobs
    /// read (the signature manifest and its payloads: kept for a restart without the
    /// registry).
    async fn check_signatures(
        &self,
        store: &OciStore,
        reference: &OciReference,
        digest: &Digest,
        keys: &[VerifyKey],
    ) -> Result<(bool, Vec<Digest>), PullError> {
        let client = &self.inner.client;
        let tag = reference.with_tag(&signature::signature_tag(digest));
        let artifact = reference.with_digest(*digest).to_string();
        let mut offline = false;
        let (sig_manifest, sig_digest) = match client.manifest_if_any(&tag).await {
            Ok(Some((bytes, sig_digest))) => {
                if !store.blob_path(&sig_digest).is_file() {
                    put(store, &sig_digest, &bytes)?;
                }
                if store.recorded(&signature_record(digest)) != Some(sig_digest) {
                    store.record(&signature_record(digest), &sig_digest)?;
                }
                (bytes, sig_digest)
            }
            Ok(None) => {
                return Err(SignatureError::Unsigned { artifact, tag: tag.to_string() }.into());
            }
            Err(e @ RegistryError::Unavailable { .. }) => {
                match store
                    .recorded(&signature_record(digest))
                    .and_then(|d| store.get(&d, MAX_MANIFEST_BYTES).map(|bytes| (bytes, d)))
                {
                    Some(found) => {
                        tracing::warn!(reference = %artifact, error = %e,
                            "registry unavailable: checking the signatures fetched last for this digest");
                        offline = true;
                        found
                    }
                    None => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let manifest: oci_client::manifest::OciImageManifest = serde_json::from_slice(&sig_manifest)
            .map_err(|e| PullError::Artifact {
                reference: tag.to_string(),
                source: ArtifactError::NotAManifest(e.to_string()),
            })?;
        let mut signed = Vec::new();
        let mut read = vec![sig_digest];
        for layer in
            manifest.layers.iter().filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE).take(MAX_SIGNATURES)
        {
            let Ok(d) = layer.digest.parse::<Digest>() else { continue };
            let payload = match store.get(&d, MAX_PAYLOAD_BYTES) {
                Some(bytes) => bytes,
                None => {
                    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
                    let bytes = client.blob(reference, &d, size, MAX_PAYLOAD_BYTES).await?;
                    put(store, &d, &bytes)?;
                    bytes
                }
            };
            let signature = layer.annotations.as_ref().and_then(|a| a.get(SIGNATURE_ANNOTATION)).cloned();
            read.push(d);
            signed.push(SignedPayload { digest: d, payload, signature });
        }
        signature::verify(&artifact, digest, &signed, keys)?;
        Ok((offline, read))
    }

    /// Keeps the store within its budget, sparing what followed plugins use.
    fn prune(&self) {
        let Ok(store) = self.store() else { return };
        let keep: HashSet<Digest> =
            self.inner.watches.lock().values().flat_map(|w| w.in_use.iter().copied()).collect();
        let removed = store.prune(self.inner.options.store_max_bytes, &keep);
        if removed > 0 {
            tracing::debug!(removed, "pruned the store of pulled plugins");
        }
    }
}

fn put(store: &OciStore, digest: &Digest, bytes: &[u8]) -> Result<(), PullError> {
    match store.put(digest, bytes) {
        Ok(_) => Ok(()),
        Err(StorePutError::Store(e)) => Err(PullError::Store(e)),
        // The client checked it already; reaching this is a bug, reported as bad content.
        Err(StorePutError::Mismatch(e)) => Err(PullError::Registry(RegistryError::Unavailable {
            what: "storing",
            reference: digest.to_string(),
            detail: e.to_string(),
        })),
    }
}

fn tag_record(reference: &OciReference) -> String {
    format!("tag {reference}")
}

fn signature_record(digest: &Digest) -> String {
    format!("signatures {digest}")
}

/// Resolves every followed tag each `interval`, and reports the plugins whose tag moved
/// (or whose last pull may now succeed). Ends when the source is dropped.
async fn poll_loop(source: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = source.upgrade() else { return };
        poll_once(&inner).await;
    }
}

async fn poll_once(inner: &Inner) {
    use futures::StreamExt;
    let watches: Vec<(PathBuf, OciReference, Option<Digest>)> =
        inner.watches.lock().iter().map(|(p, w)| (p.clone(), w.reference.clone(), w.settled)).collect();
    // Each distinct tag once, a few at a time.
    let tags: HashSet<OciReference> =
        watches.iter().filter(|w| w.1.digest().is_none()).map(|w| w.1.clone()).collect();
    let resolved: BTreeMap<OciReference, Option<Digest>> = futures::stream::iter(tags)
        .map(|reference| async move {
            let digest = resolve_logged(inner, &reference).await;
            (reference, digest)
        })
        .buffer_unordered(POLL_CONCURRENCY)
        .collect()
        .await;
    let mut changes = Vec::new();
    for (toml, reference, settled) in watches {
        let now = reference.digest().or_else(|| resolved.get(&reference).copied().flatten());
        if let Some(digest) = now
            && settled != Some(digest)
        {
            match settled {
                Some(previous) => tracing::info!(plugin_toml = %toml.display(), reference = %reference,
                    digest = %digest, previous = %previous, "the plugin's tag moved in the registry"),
                None => tracing::debug!(plugin_toml = %toml.display(), reference = %reference,
                    digest = %digest, "trying the plugin's last pull again"),
            }
            changes.push(SourceChange { toml, reference, digest });
        }
    }
    {
        let listeners = inner.listeners.lock();
        for change in &changes {
            for listener in listeners.iter() {
                listener(change);
            }
        }
    }
    inner.rounds.send_modify(|n| *n += 1);
}

/// Resolves `reference`, logging a failure once until it resolves again.
async fn resolve_logged(inner: &Inner, reference: &OciReference) -> Option<Digest> {
    match inner.client.resolve(reference).await {
        Ok(d) => {
            if inner.failing.lock().remove(reference) {
                tracing::info!(reference = %reference, digest = %d, "registry reachable again");
            }
            Some(d)
        }
        Err(e) => {
            if inner.failing.lock().insert(reference.clone()) {
                tracing::warn!(reference = %reference, error = %e, "cannot poll the plugin's tag; trying again every poll");
            } else {
                tracing::debug!(reference = %reference, error = %e, "cannot poll the plugin's tag");
            }
            None
        }
    }
}
