//! Why a list or watch failed, and how the reflector's state machine classifies it: gone
//! (the resourceVersion was compacted: relist consistently), transient (re-watch from the
//! last resourceVersion after a backoff) or neither (relist after a backoff).
//!
//! Invariants: the classification depends only on the error's value (HTTP status, Status
//! `reason` and `message`), never on when or where it happened, so the transitions that use
//! it stay pure; a server-sent `Retry-After` (or 1 s for a bare 429) is kept with the error.

use std::time::Duration;

use serde::Deserialize;

/// A failed list or watch request.
#[derive(Debug, thiserror::Error)]
pub enum ReflectorError {
    /// The request never got a response (connection refused, reset, TLS, ...).
    #[error("request failed: {0}")]
    Transport(#[source] kube::Error),
    /// The server answered with a failure status (or an ERROR watch event).
    #[error("API server returned {code} {reason}: {message}")]
    Status { code: u16, reason: String, message: String, retry_after: Option<Duration> },
    /// The response could not be read or decoded.
    #[error("bad response: {0}")]
    Decode(String),
    /// A watch event (or its object) could not be decoded: the watch ends and the
    /// reflector relists.
    #[error("undecodable watch event: {0}")]
    UndecodableEvent(String),
    /// The list or watch request could not be built (e.g. a selector kube refuses).
    #[error("cannot build the request: {0}")]
    Request(String),
    /// A watch event, list item or list envelope is longer than the reflector accepts
    /// (`max_object_size`): the watch ends and the reflector relists, or the list fails and
    /// is retried, after a backoff.
    #[error(
        "{what} of at least {len} bytes is over the limit of {limit} bytes (`max-object-size` in the host TOML's [cluster] table)"
    )]
    TooLarge { what: &'static str, len: usize, limit: usize },
}

impl ReflectorError {
    /// 410 Gone / Expired / "too old resource version": the resourceVersion is compacted.
    pub fn is_gone(&self) -> bool {
        match self {
            ReflectorError::Status { code, reason, message, .. } => {
                *code == 410
                    || reason == "Expired"
                    || reason == "Gone"
                    || message.contains("too old resource version")
            }
            _ => false,
        }
    }

    /// Worth retrying the watch without a relist (network, 5xx, 429).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            ReflectorError::Transport(_) | ReflectorError::Decode(_) => true,
            ReflectorError::Status { code, .. } => *code == 429 || *code >= 500,
            ReflectorError::UndecodableEvent(_)
            | ReflectorError::Request(_)
            | ReflectorError::TooLarge { .. } => false,
        }
    }

    /// How long the server asked us to wait (`Retry-After`), if it did.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ReflectorError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// The fields of a `meta/v1 Status` the reflector reads.
#[derive(Deserialize)]
pub(crate) struct StatusBody {
    #[serde(default)]
    pub(crate) code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// A failure status from its code and (Status JSON, else text) body.
pub(crate) fn status_error(code: u16, body: &[u8], retry_after: Option<Duration>) -> ReflectorError {
    let parsed: Option<StatusBody> = serde_json::from_slice(body).ok();
    let (reason, message) = match parsed {
        Some(s) => (s.reason.unwrap_or_default(), s.message.unwrap_or_default()),
        None => (String::new(), String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned()),
    };
    ReflectorError::Status { code, reason, message, retry_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_detection() {
        let e = |code, reason: &str, message: &str| ReflectorError::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
        };
        assert!(e(410, "", "").is_gone());
        assert!(e(500, "Expired", "").is_gone());
        assert!(e(500, "", "too old resource version: 1 (5)").is_gone());
        assert!(!e(500, "InternalError", "boom").is_gone());
        assert!(e(429, "", "").is_transient());
        assert!(e(503, "", "").is_transient());
        assert!(!e(403, "Forbidden", "").is_transient());
    }

    #[test]
    fn status_bodies_are_read_as_status_or_text() {
        let e = status_error(
            410,
            br#"{"kind":"Status","code":410,"reason":"Expired","message":"too old"}"#,
            None,
        );
        assert!(
            matches!(&e, ReflectorError::Status { reason, message, .. } if reason == "Expired" && message == "too old")
        );
        let e = status_error(502, b"bad gateway", Some(Duration::from_secs(3)));
        assert!(matches!(&e, ReflectorError::Status { message, .. } if message == "bad gateway"));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    }
}
