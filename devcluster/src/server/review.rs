//! Token and access reviews (`authentication.k8s.io/v1` TokenReview and
//! `authorization.k8s.io/v1` SubjectAccessReview), for servers that let the API server decide
//! who may read them (the wasmctrl host's endpoint with `[server] auth = "kubernetes"`).
//!
//! Invariants:
//! - The dev cluster knows one user, the holder of its token: [`USER`] in the groups
//!   `system:masters` and `system:authenticated`. Any other token is not authenticated. The
//!   token is compared in constant time.
//! - There is no RBAC: an access review allows exactly the requests of a user in
//!   `system:masters` (a real API server's superuser group) and denies every other, with a
//!   reason saying so.
//! - Both are create-only and answer `201 Created` with the review and its `status`, as a real
//!   API server does; a body that is not a review of the right kind is `400 BadRequest`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::{AppState, value_response};
use crate::error::ApiError;

/// The one user of the dev cluster.
pub const USER: &str = "wasmctrl-dev-admin";

/// Largest review body accepted.
const MAX_REVIEW: usize = 1 << 20;

async fn read_review(request: Request<Body>, api_version: &str, kind: &str) -> Result<Value, ApiError> {
    let body = axum::body::to_bytes(request.into_body(), MAX_REVIEW)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading body: {e}")))?;
    let review: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("decoding {kind}: {e}")))?;
    if review.get("apiVersion").and_then(Value::as_str) != Some(api_version)
        || review.get("kind").and_then(Value::as_str) != Some(kind)
    {
        return Err(ApiError::bad_request(format!("the body is not a {api_version} {kind}")));
    }
    Ok(review)
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
pub(super) async fn token_review(
    State(st): State<Arc<AppState>>,
    request: Request<Body>,
) -> Result<Response, ApiError> {
    let mut review = read_review(request, "authentication.k8s.io/v1", "TokenReview").await?;
    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
    let status = if token_matches(token, &st.token) {
        json!({
            "authenticated": true,
            "user": { "username": USER, "uid": USER, "groups": ["system:masters", "system:authenticated"] },
        })
    } else {
        json!({ "authenticated": false, "error": "invalid bearer token" })
    };
    review["status"] = status;
    Ok(value_response(StatusCode::CREATED, &review))
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
pub(super) async fn subject_access_review(request: Request<Body>) -> Result<Response, ApiError> {
    let mut review = read_review(request, "authorization.k8s.io/v1", "SubjectAccessReview").await?;
    let superuser = review
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .is_some_and(|groups| groups.iter().any(|g| g == "system:masters"));
    review["status"] = if superuser {
        json!({ "allowed": true, "reason": "the user is in system:masters" })
    } else {
        json!({ "allowed": false, "reason": "the dev cluster has no RBAC: only system:masters is allowed" })
    };
    Ok(value_response(StatusCode::CREATED, &review))
}

/// Whether `presented` is the cluster's token, in time independent of where they differ.
pub(super) fn token_matches(presented: &str, token: &str) -> bool {
    !presented.is_empty() && bool::from(presented.as_bytes().ct_eq(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_matches() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cre", "s3cret"), "a prefix");
        assert!(!token_matches("s3cret ", "s3cret"));
        assert!(!token_matches("S3cret", "s3cret"));
        assert!(!token_matches("", ""), "no empty token");
    }
}
