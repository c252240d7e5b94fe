//! Signing and verification keys, in the files cosign writes: a public key as PEM
//! (`PUBLIC KEY`, SubjectPublicKeyInfo), a private key as cosign's encrypted PEM
//! (`ENCRYPTED SIGSTORE PRIVATE KEY` / `ENCRYPTED COSIGN PRIVATE KEY`: scrypt, then NaCl
//! secretbox, around PKCS#8), or unencrypted PKCS#8 (`PRIVATE KEY`) / SEC1 (`EC PRIVATE KEY`).
//!
//! Only ECDSA P-256 keys are read: what `cosign generate-key-pair` makes. The decryption
//! of cosign's key format is written here from its definition (go-securesystemslib's
//! `encrypted` package: JSON naming the KDF and cipher, byte fields in base64) over the
//! RustCrypto `scrypt` and `crypto_secretbox` crates; no crate reads that envelope alone.
//!
//! Invariants: a loaded key is a valid P-256 key; a wrong password is an error that says
//! so; the KDF's cost is bounded (a key file cannot make the host allocate gigabytes); an
//! error names the key file.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use p256::ecdsa::{SigningKey as EcdsaSigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use serde::Deserialize;

/// Why a key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key {path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("key {path}: wrong password (cosign's encrypted key could not be opened)")]
    WrongPassword { path: PathBuf },
}

/// A public key that verifies signatures.
#[derive(Clone)]
pub struct VerifyKey {
    key: VerifyingKey,
    /// Where it came from, for messages.
    origin: String,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({})", self.origin)
    }
}

impl PartialEq for VerifyKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for VerifyKey {}

impl VerifyKey {
    /// Reads a PEM public key file.
    pub fn load(path: &Path) -> Result<VerifyKey, KeyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| KeyError::Read { path: path.to_owned(), source })?;
        VerifyKey::from_pem(&text, &path.display().to_string())
            .map_err(|why| KeyError::Invalid { path: path.to_owned(), why })
    }

    /// Parses a PEM public key; `origin` names it in messages.
    pub fn from_pem(text: &str, origin: &str) -> Result<VerifyKey, String> {
        let key = VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| {
            format!("not an ECDSA P-256 public key in PEM (`-----BEGIN PUBLIC KEY-----`, as `cosign generate-key-pair` writes): {e}")
        })?;
        Ok(VerifyKey { key, origin: origin.to_owned() })
    }

    /// Where the key came from (its file).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The key as PEM.
    pub fn to_pem(&self) -> String {
        self.key.to_public_key_pem(Default::default()).unwrap_or_default()
    }

    pub(crate) fn ecdsa(&self) -> &VerifyingKey {
        &self.key
    }
}

/// A private key that signs.
pub struct SigningKey {
    key: EcdsaSigningKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

/// cosign's encrypted key envelope (go-securesystemslib `encrypted`).
#[derive(Deserialize)]
struct Envelope {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    salt: String,
}

#[derive(Deserialize)]
struct KdfParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// The largest scrypt cost accepted: cosign uses 2^15 or 2^16; 2^20 with r = 8 needs 1 GiB.
const MAX_LOG_N: u8 = 20;

impl SigningKey {
    /// Reads a private key file; `password` opens a cosign-encrypted one (cosign reads it
    /// from `COSIGN_PASSWORD`).
    pub fn load(path: &Path, password: Option<&[u8]>) -> Result<SigningKey, KeyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| KeyError::Read { path: path.to_owned(), source })?;
        SigningKey::from_pem(&text, password).map_err(|e| match e {
            PemKeyError::WrongPassword => KeyError::WrongPassword { path: path.to_owned() },
            PemKeyError::Invalid(why) => KeyError::Invalid { path: path.to_owned(), why },
        })
    }

    /// Parses a PEM private key (see the module docs for the forms).
    pub fn from_pem(text: &str, password: Option<&[u8]>) -> Result<SigningKey, PemKeyError> {
        let invalid = |why: String| PemKeyError::Invalid(why);
        let (label, der) = p256::pkcs8::der::pem::decode_vec(text.trim().as_bytes())
            .map_err(|e| invalid(format!("not a PEM file: {e}")))?;
        let key = match label {
            "PRIVATE KEY" => EcdsaSigningKey::from_pkcs8_der(&der)
                .map_err(|e| invalid(format!("not an ECDSA P-256 PKCS#8 key: {e}")))?,
            "EC PRIVATE KEY" => p256::SecretKey::from_sec1_der(&der)
                .map(EcdsaSigningKey::from)
                .map_err(|e| invalid(format!("not an ECDSA P-256 SEC1 key: {e}")))?,
            "ENCRYPTED SIGSTORE PRIVATE KEY" | "ENCRYPTED COSIGN PRIVATE KEY" => {
                let Some(password) = password else {
                    return Err(invalid("the key is encrypted: set COSIGN_PASSWORD to its password".into()));
                };
                let plain = decrypt(&der, password)?;
                EcdsaSigningKey::from_pkcs8_der(&plain).map_err(|e| {
                    invalid(format!("the decrypted key is not an ECDSA P-256 PKCS#8 key: {e}"))
                })?
            }
            other => {
                return Err(invalid(format!(
                    "a `{other}` PEM block is not a private key this reads (cosign's encrypted key, PKCS#8 or SEC1)"
                )));
            }
        };
        Ok(SigningKey { key })
    }

    /// A fresh random key (for tests and tools).
    pub fn generate() -> SigningKey {
        let mut bytes = [0u8; 32];
        loop {
            rand::fill(&mut bytes);
            if let Ok(key) = EcdsaSigningKey::from_slice(&bytes) {
                return SigningKey { key };
            }
        }
    }

    /// The key as unencrypted PKCS#8 PEM (for tests and tools).
    pub fn to_pkcs8_pem(&self) -> String {
        use p256::pkcs8::EncodePrivateKey;
        self.key.to_pkcs8_pem(Default::default()).map(|s| s.to_string()).unwrap_or_default()
    }

    /// The public half.
    pub fn verify_key(&self, origin: &str) -> VerifyKey {
        VerifyKey { key: *self.key.verifying_key(), origin: origin.to_owned() }
    }

    pub(crate) fn ecdsa(&self) -> &EcdsaSigningKey {
        &self.key
    }
}

/// Why a PEM private key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PemKeyError {
    #[error("wrong password")]
    WrongPassword,
    #[error("{0}")]
    Invalid(String),
}

/// Opens cosign's envelope: scrypt(password, salt, N, r, p) → 32-byte key → secretbox.
fn decrypt(envelope: &[u8], password: &[u8]) -> Result<Vec<u8>, PemKeyError> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    let invalid = |why: String| PemKeyError::Invalid(format!("cosign's encrypted key: {why}"));
    let b64 = |field: &str, s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| invalid(format!("`{field}` is not base64: {e}")))
    };
    let env: Envelope = serde_json::from_slice(envelope).map_err(|e| invalid(e.to_string()))?;
    if env.kdf.name != "scrypt" || env.cipher.name != "nacl/secretbox" {
        return Err(invalid(format!("unknown KDF `{}` or cipher `{}`", env.kdf.name, env.cipher.name)));
    }
    let KdfParams { n, r, p } = env.kdf.params;
    if !n.is_power_of_two()
        || n < 2
        || n.trailing_zeros() > u32::from(MAX_LOG_N)
        || r == 0
        || r > 32
        || p == 0
        || p > 16
    {
        return Err(invalid(format!("scrypt parameters N={n} r={r} p={p} are out of the accepted range")));
    }
    let params = scrypt::Params::new(n.trailing_zeros() as u8, r, p).map_err(|e| invalid(e.to_string()))?;
    let salt = b64("kdf.salt", &env.kdf.salt)?;
    let nonce = b64("cipher.nonce", &env.cipher.nonce)?;
    let ciphertext = b64("ciphertext", &env.ciphertext)?;
    if nonce.len() != 24 {
        return Err(invalid(format!("the nonce is {} bytes, not 24", nonce.len())));
    }
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &salt, &params, &mut key).map_err(|e| invalid(e.to_string()))?;
    let cipher = crypto_secretbox::XSalsa20Poly1305::new((&key).into());
    cipher
        .decrypt(crypto_secretbox::Nonce::from_slice(&nonce), ciphertext.as_slice())
        .map_err(|_| PemKeyError::WrongPassword)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_KEY: &str = include_str!("testdata/cosign/cosign.key");
    const VECTOR_PUB: &str = include_str!("testdata/cosign/cosign.pub");

    #[test]
    fn opens_a_key_cosign_generated() {
        let key = SigningKey::from_pem(VECTOR_KEY, Some(b"vector-password")).unwrap();
        let public = VerifyKey::from_pem(VECTOR_PUB, "cosign.pub").unwrap();
        assert_eq!(key.verify_key("x"), public);
        assert!(matches!(SigningKey::from_pem(VECTOR_KEY, Some(b"wrong")), Err(PemKeyError::WrongPassword)));
        let e = SigningKey::from_pem(VECTOR_KEY, None).unwrap_err().to_string();
        assert!(e.contains("COSIGN_PASSWORD"), "{e}");
    }

    proptest::proptest! {
        /// Any PEM-looking text: a key or an error, never a panic.
        #[test]
        fn any_pem_is_read_or_refused(label in "[A-Z ]{0,40}", body in "[A-Za-z0-9+/=]{0,200}") {
            let pem = format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n");
            let _ = SigningKey::from_pem(&pem, Some(b"pw"));
            let _ = VerifyKey::from_pem(&pem, "k");
        }
    }

    #[test]
    fn unencrypted_pkcs8_and_sec1() {
        let key = SigningKey::generate();
        let pem = key.to_pkcs8_pem();
        let back = SigningKey::from_pem(&pem, None).unwrap();
        assert_eq!(back.verify_key("a"), key.verify_key("b"));
        let sec1 = p256::SecretKey::from(key.ecdsa()).to_sec1_pem(Default::default()).unwrap();
        assert_eq!(SigningKey::from_pem(&sec1, None).unwrap().verify_key("c"), key.verify_key("d"));
    }

    #[test]
    fn refuses_what_is_not_a_p256_key_with_the_file_named() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k.pub");
        std::fs::write(&path, "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").unwrap();
        let e = VerifyKey::load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("key {}: ", path.display())), "{e}");
        assert!(VerifyKey::load(&tmp.path().join("missing.pub")).is_err());
        let e = SigningKey::from_pem(VECTOR_PUB, None).unwrap_err().to_string();
        assert!(e.contains("`PUBLIC KEY`"), "{e}");
        // A key file asking for an absurd scrypt cost is refused before any work.
        let envelope = serde_json::json!({
            "kdf": {"name": "scrypt", "params": {"N": 1u64 << 40, "r": 8, "p": 1}, "salt": "AAAA"},
            "cipher": {"name": "nacl/secretbox", "nonce": "AAAA"},
            "ciphertext": "AAAA"
        });
        let e = decrypt(envelope.to_string().as_bytes(), b"pw").unwrap_err().to_string();
        assert!(e.contains("out of the accepted range"), "{e}");
    }
}
