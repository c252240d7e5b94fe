//! Errors: [`Error`] mirrors the WIT `error` variant a host call can fail with (plus the
//! guest-side JSON failures), [`ReconcileError`] is how a reconcile fails.
//!
//! Invariant: every host error case maps to exactly one [`Error`] case, so `is_*` checks
//! never depend on message text.

use std::fmt;

/// Why a call into the host (or the JSON conversion around it) failed.
///
/// The first seven cases are the WIT `error` variant one to one; [`Error::Json`] is raised
/// in the guest when an object does not (de)serialise into the requested Rust type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The object does not exist (HTTP 404).
    NotFound(String),
    /// `create` of an object that exists (HTTP 409, AlreadyExists).
    AlreadyExists(String),
    /// The object changed since it was read: resourceVersion or precondition mismatch (HTTP 409).
    Conflict(String),
    /// The plugin did not declare this kind/verb in its TOML, or the API server refused (HTTP 403).
    Forbidden(String),
    /// The object or patch was rejected as invalid (HTTP 422 / 400), or an argument the
    /// SDK was given is unusable (e.g. an owner without a UID).
    Invalid(String),
    /// The API server is overloaded or unreachable, or the call ran out of time.
    Unavailable(String),
    /// Anything else, with the HTTP status code when there was one (0 when there was none).
    Other {
        /// HTTP status code, 0 when the failure was not an HTTP response.
        status: u16,
        /// What went wrong.
        message: String,
    },
    /// JSON from the host did not parse into the requested type, or a value did not
    /// serialise. Raised by the SDK, never by the host.
    Json(String),
}

impl Error {
    /// The object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_))
    }
    /// `create` found the object already there.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::AlreadyExists(_))
    }
    /// Optimistic-concurrency failure: re-read and retry.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict(_))
    }
    /// Not permitted by the plugin's TOML or by the API server.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Error::Forbidden(_))
    }
    /// Rejected as invalid.
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid(_))
    }
    /// Transient: the API server is overloaded, unreachable or timed out.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
    /// A guest-side JSON (de)serialisation failure.
    pub fn is_json(&self) -> bool {
        matches!(self, Error::Json(_))
    }

    /// The HTTP status code this error corresponds to, when there is one.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Error::NotFound(_) => Some(404),
            Error::AlreadyExists(_) | Error::Conflict(_) => Some(409),
            Error::Forbidden(_) => Some(403),
            Error::Invalid(_) => Some(422),
            Error::Unavailable(_) => Some(503),
            Error::Other { status, .. } if *status != 0 => Some(*status),
            Error::Other { .. } | Error::Json(_) => None,
        }
    }

    /// The human-readable message, without the case name.
    pub fn message(&self) -> &str {
        match self {
            Error::NotFound(m)
            | Error::AlreadyExists(m)
            | Error::Conflict(m)
            | Error::Forbidden(m)
            | Error::Invalid(m)
            | Error::Unavailable(m)
            | Error::Json(m) => m,
            Error::Other { message, .. } => message,
        }
    }

    /// Whether retrying the same call later may succeed without anything else changing.
    /// Invalid input and JSON failures are deterministic; everything else may be transient
    /// (a conflict resolves on re-read, a 403 once RBAC is fixed, a 404 once the object exists).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Error::Invalid(_) | Error::Json(_))
    }

    pub(crate) fn json(what: &str, err: serde_json::Error) -> Self {
        Error::Json(format!("{what}: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let case = match self {
            Error::NotFound(_) => "not found",
            Error::AlreadyExists(_) => "already exists",
            Error::Conflict(_) => "conflict",
            Error::Forbidden(_) => "forbidden",
            Error::Invalid(_) => "invalid",
            Error::Unavailable(_) => "unavailable",
            Error::Other { status: 0, .. } => "error",
            Error::Other { status, message } => return write!(f, "HTTP {status}: {message}"),
            Error::Json(_) => "json",
        };
        write!(f, "{case}: {}", self.message())
    }
}

impl std::error::Error for Error {}

impl From<serde_json::Error> for Error {
    fn from(err: serde_json::Error) -> Self {
        Error::Json(err.to_string())
    }
}

/// How a reconcile failed; the WIT `reconcile-error`.
///
/// `?` converts an [`Error`] into this: invalid input and JSON failures become
/// [`ReconcileError::Terminal`] (retrying the same input cannot help; the next change to
/// the object enqueues it again), every other host error [`ReconcileError::Retryable`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReconcileError {
    /// Retried with per-key exponential backoff.
    Retryable(String),
    /// Logged and counted, not retried until the object changes again.
    Terminal(String),
}

impl ReconcileError {
    /// A failure worth retrying with backoff.
    pub fn retryable(message: impl Into<String>) -> Self {
        ReconcileError::Retryable(message.into())
    }
    /// A failure retrying cannot fix.
    pub fn terminal(message: impl Into<String>) -> Self {
        ReconcileError::Terminal(message.into())
    }
    /// Whether the host will retry with backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ReconcileError::Retryable(_))
    }
    /// The message.
    pub fn message(&self) -> &str {
        match self {
            ReconcileError::Retryable(m) | ReconcileError::Terminal(m) => m,
        }
    }
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileError::Retryable(m) => f.write_str(m),
            ReconcileError::Terminal(m) => write!(f, "terminal: {m}"),
        }
    }
}

impl std::error::Error for ReconcileError {}

impl From<Error> for ReconcileError {
    fn from(err: Error) -> Self {
        if err.is_retryable() {
            ReconcileError::Retryable(err.to_string())
        } else {
            ReconcileError::Terminal(err.to_string())
        }
    }
}

impl From<serde_json::Error> for ReconcileError {
    fn from(err: serde_json::Error) -> Self {
        Error::from(err).into()
    }
}

/// Extension methods on `Result<T, Error>`.
pub trait ResultExt<T> {
    /// `Ok(None)` instead of a not-found error: for deletes and reads where absence is fine.
    fn ignore_not_found(self) -> Result<Option<T>, Error>;
    /// Converts into a [`ReconcileError`] whose message starts with `what`
    /// (e.g. `"creating Service team-a/web"`), keeping retryable vs terminal.
    fn context(self, what: impl fmt::Display) -> Result<T, ReconcileError>;
}

impl<T> ResultExt<T> for Result<T, Error> {
    fn ignore_not_found(self) -> Result<Option<T>, Error> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn context(self, what: impl fmt::Display) -> Result<T, ReconcileError> {
        self.map_err(|err| {
            let message = format!("{what}: {err}");
            if err.is_retryable() {
                ReconcileError::Retryable(message)
            } else {
                ReconcileError::Terminal(message)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicates_match_exactly_one_case() {
        let all = [
            Error::NotFound("x".into()),
            Error::AlreadyExists("x".into()),
            Error::Conflict("x".into()),
            Error::Forbidden("x".into()),
            Error::Invalid("x".into()),
            Error::Unavailable("x".into()),
            Error::Json("x".into()),
        ];
        for err in &all {
            let hits = [
                err.is_not_found(),
                err.is_already_exists(),
                err.is_conflict(),
                err.is_forbidden(),
                err.is_invalid(),
                err.is_unavailable(),
                err.is_json(),
            ];
            assert_eq!(hits.iter().filter(|h| **h).count(), 1, "{err:?}");
        }
    }

    #[test]
    fn status_codes_follow_http() {
        assert_eq!(Error::NotFound(String::new()).status_code(), Some(404));
        assert_eq!(Error::Conflict(String::new()).status_code(), Some(409));
        assert_eq!(Error::Forbidden(String::new()).status_code(), Some(403));
        assert_eq!(Error::Other { status: 418, message: String::new() }.status_code(), Some(418));
        assert_eq!(Error::Other { status: 0, message: String::new() }.status_code(), None);
        assert_eq!(Error::Json(String::new()).status_code(), None);
    }

    #[test]
    fn question_mark_keeps_retryability() {
        fn fails(err: Error) -> Result<(), ReconcileError> {
            Err(err)?;
            Ok(())
        }
        assert!(fails(Error::Conflict("rv".into())).unwrap_err().is_retryable());
        assert!(fails(Error::Unavailable("down".into())).unwrap_err().is_retryable());
        assert!(fails(Error::Forbidden("rbac".into())).unwrap_err().is_retryable());
        assert!(!fails(Error::Invalid("bad".into())).unwrap_err().is_retryable());
        assert!(!fails(Error::Json("bad".into())).unwrap_err().is_retryable());
    }

    #[test]
    fn context_prefixes_message_and_keeps_kind() {
        let err = Err::<(), _>(Error::Conflict("rv 3".into())).context("updating web").unwrap_err();
        assert_eq!(err, ReconcileError::Retryable("updating web: conflict: rv 3".into()));
        let err = Err::<(), _>(Error::Invalid("spec".into())).context("creating web").unwrap_err();
        assert_eq!(err, ReconcileError::Terminal("creating web: invalid: spec".into()));
    }

    #[test]
    fn ignore_not_found_only_swallows_404() {
        assert_eq!(Err::<u8, _>(Error::NotFound("x".into())).ignore_not_found(), Ok(None));
        assert_eq!(Ok::<u8, Error>(1).ignore_not_found(), Ok(Some(1)));
        assert!(Err::<u8, _>(Error::Conflict("x".into())).ignore_not_found().is_err());
    }
}
