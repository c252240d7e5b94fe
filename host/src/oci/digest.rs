//! Content digests (`sha256:<64 hex digits>`), as OCI names manifests and blobs.
//!
//! Invariants: a [`Digest`] is always well formed (algorithm `sha256`, 64 lowercase hex
//! digits), so it is safe as a file name; [`Digest::verify`] is the one check that bytes are
//! what a digest names, and everything the host takes from a registry or from its own store
//! passes it before use.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A SHA-256 content digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest([u8; 32]);

/// Why a text is not a digest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DigestParseError {
    #[error("`{0}` is not a digest: the only algorithm supported is sha256 (`sha256:<64 hex digits>`)")]
    Algorithm(String),
    #[error("`{0}` is not a digest: a sha256 digest is 64 lowercase hex digits")]
    Hex(String),
}

/// Bytes that are not what their digest names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("content does not match its digest: expected {expected}, got {actual}")]
pub struct DigestMismatch {
    pub expected: Digest,
    pub actual: Digest,
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// Checks that `bytes` are what this digest names.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), DigestMismatch> {
        let actual = Digest::of(bytes);
        if actual == *self { Ok(()) } else { Err(DigestMismatch { expected: *self, actual }) }
    }

    /// The 64 hex digits (a file name in the store, and cosign's signature tag).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 12 hex digits, for logs and status.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl FromStr for Digest {
    type Err = DigestParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some(hex_digits) = s.strip_prefix("sha256:") else {
            return Err(DigestParseError::Algorithm(s.to_owned()));
        };
        // Lowercase only: the digest's text is its identity (and a file name).
        if hex_digits.len() != 64
            || !hex_digits.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(DigestParseError::Hex(s.to_owned()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut out).map_err(|_| DigestParseError::Hex(s.to_owned()))?;
        Ok(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prints_and_verifies() {
        let d = Digest::of(b"hello");
        let text = d.to_string();
        assert_eq!(text, "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        assert_eq!(text.parse::<Digest>().unwrap(), d);
        assert!(d.verify(b"hello").is_ok());
        let err = d.verify(b"hellO").unwrap_err();
        assert_eq!(err.expected, d);
        assert_eq!(d.short(), "2cf24dba5fb0");
    }

    #[test]
    fn refuses_other_algorithms_and_malformed_hex() {
        assert!(matches!("sha512:00".parse::<Digest>(), Err(DigestParseError::Algorithm(_))));
        assert!(matches!("2cf24dba".parse::<Digest>(), Err(DigestParseError::Algorithm(_))));
        for bad in [
            "sha256:",
            "sha256:2cf24dba",
            // Uppercase is refused: the text is the identity (and a file name).
            "sha256:2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824",
            "sha256:../../../../etc/passwd00000000000000000000000000000000000000000",
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b98244",
        ] {
            assert!(matches!(bad.parse::<Digest>(), Err(DigestParseError::Hex(_))), "{bad}");
        }
    }
}
