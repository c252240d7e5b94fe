//! Errors: [`ApiError`] is what a request fails with, rendered as a Kubernetes `Status`
//! object with the HTTP code and `reason` a real API server would use; [`Error`] is what
//! starting or stopping the server fails with.

use bytes::Bytes;
use serde_json::{Value, json};

/// Errors from starting, seeding or persisting the dev cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding or serving the listener failed.
    #[error("dev cluster I/O on {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Generating the self-signed certificate or configuring TLS failed.
    #[error("dev cluster TLS setup: {0}")]
    Tls(String),
    /// A seed document or state file could not be parsed or stored.
    #[error("dev cluster seed/state: {0}")]
    Seed(String),
    /// A seed object was rejected by the API (e.g. invalid, unknown kind).
    #[error("dev cluster rejected object {object}: {error}")]
    Rejected {
        /// `kind/namespace/name` of the object.
        object: String,
        /// The API error.
        error: ApiError,
    },
    /// The kubeconfig could not be serialised.
    #[error("dev cluster kubeconfig: {0}")]
    Kubeconfig(#[source] serde_norway::Error),
    /// The kube client could not be built (feature `kube`).
    #[error("dev cluster kube client: {0}")]
    Client(String),
}

/// A Kubernetes API error: HTTP status code, `Status.reason` and message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `Status.details`, if any.
    pub details: Option<Value>,
    /// `Retry-After` seconds (429 / 5xx injection).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None, retry_after: None }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        let mut d = serde_json::Map::new();
        if !name.is_empty() {
            d.insert("name".into(), Value::String(name.into()));
        }
        // The API server leaves empty fields out (`omitempty`).
        if !group.is_empty() {
            d.insert("group".into(), Value::String(group.into()));
        }
        if !kind.is_empty() {
            d.insert("kind".into(), Value::String(kind.into()));
        }
        self.details = Some(Value::Object(d));
        self
    }

    /// 404 NotFound for `resource` (plural, with group suffix if any) `name`.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualify(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(group, resource, name)
    }

    /// 404 NotFound for a path that serves nothing.
    pub fn path_not_found() -> Self {
        let mut err = Self::new(404, "NotFound", "the server could not find the requested resource");
        err.details = Some(json!({}));
        err
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualify(group, resource);
        Self::new(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists"))
            .with_details(group, resource, name)
    }

    /// 409 Conflict (stale resourceVersion, failed precondition, apply conflict).
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualify(group, resource);
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"))
            .with_details(group, resource, name)
    }

    /// 422 Invalid.
    pub fn invalid(group: &str, kind: &str, name: &str, why: impl Into<String>) -> Self {
        let why = why.into();
        // `field: Invalid value: ...` / `field: Required value: ...` as one cause, as the API
        // server reports each field error.
        let cause = why.split_once(": ").filter(|(field, _)| !field.contains(' ')).map(|(field, message)| {
            let reason = if message.starts_with("Required value") {
                "FieldValueRequired"
            } else if message.starts_with("Forbidden") {
                "FieldValueForbidden"
            } else {
                "FieldValueInvalid"
            };
            json!({"reason": reason, "message": message, "field": field})
        });
        let mut err = Self::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {why}"))
            .with_details(group, kind, name);
        if let (Some(cause), Some(Value::Object(details))) = (cause, err.details.as_mut()) {
            details.insert("causes".into(), json!([cause]));
        }
        err
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410 Expired (too old resourceVersion / continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"
            ),
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// An injected error with the given status code (fault injection).
    pub fn injected(code: u16, retry_after: Option<u64>) -> Self {
        let reason = match code {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        let mut e = Self::new(code, reason, format!("injected fault ({code})"));
        e.retry_after = retry_after;
        if let Some(secs) = retry_after {
            e.details = Some(json!({ "retryAfterSeconds": secs }));
        }
        e
    }

    /// The `Status` object for this error.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }

    /// The `Status` object, JSON-encoded.
    pub fn status_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(&self.status()).unwrap_or_default())
    }
}

/// `resource.group`, or `resource` for the core group, as Kubernetes messages spell it.
fn qualify(group: &str, resource: &str) -> String {
    if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") }
}
