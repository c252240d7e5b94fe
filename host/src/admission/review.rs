//! `AdmissionReview` (`admission.k8s.io/v1`) in and out, with kube's types: the request as
//! a plugin receives it ([`to_input`]) and every response the host sends ([`Answer`]).
//!
//! Invariants:
//! - Only `admission.k8s.io/v1` reviews with a request are accepted (the webhook
//!   configurations the host writes ask for v1 only); anything else is answered as invalid.
//! - Every response carries the request's `uid` and the review's `apiVersion`/`kind`.
//! - A denial's code is an HTTP error code (400–599; a plugin's other codes become 400, as
//!   the API server would make them) with the reason Kubernetes names it by.
//! - A patch goes out only as a JSON patch that parsed and applied to the request's object
//!   (checked by [`check_patch`] before a response is built), base64-encoded.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::Status;

use crate::plugin::{AdmissionInput, AdmissionOperation, AdmissionUser, Gvk};

/// The review version the host serves.
pub const REVIEW_API_VERSION: &str = "admission.k8s.io/v1";

/// Why a request body is not an admission request the host can answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("AdmissionReview {0} is not served (only {REVIEW_API_VERSION})")]
    Version(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("encoding the request's {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Parses a request body.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(ReviewError::Decode)?;
    if review.types.api_version != REVIEW_API_VERSION {
        return Err(ReviewError::Version(review.types.api_version));
    }
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// The apiVersion (`group/version`, or `version` for the core group) of a request's kind.
pub fn request_gvk(request: &AdmissionRequest<DynamicObject>) -> Gvk {
    let k = &request.kind;
    let api_version =
        if k.group.is_empty() { k.version.clone() } else { format!("{}/{}", k.group, k.version) };
    Gvk::new(api_version, k.kind.clone())
}

/// The request as a plugin receives it (its objects as JSON).
pub fn to_input(request: &AdmissionRequest<DynamicObject>) -> Result<AdmissionInput, ReviewError> {
    let json = |what: &'static str, value: Option<Result<Vec<u8>, serde_json::Error>>| {
        value.transpose().map_err(|source| ReviewError::Encode { what, source })
    };
    let user = &request.user_info;
    Ok(AdmissionInput {
        uid: request.uid.clone(),
        kind: request_gvk(request),
        resource: request.resource.resource.clone(),
        sub_resource: request.sub_resource.clone().filter(|s| !s.is_empty()),
        name: request.name.clone(),
        namespace: request.namespace.clone().filter(|s| !s.is_empty()),
        operation: match request.operation {
            Operation::Create => AdmissionOperation::Create,
            Operation::Update => AdmissionOperation::Update,
            Operation::Delete => AdmissionOperation::Delete,
            Operation::Connect => AdmissionOperation::Connect,
        },
        user: AdmissionUser {
            username: user.username.clone().unwrap_or_default(),
            uid: user.uid.clone().unwrap_or_default(),
            groups: user.groups.clone().unwrap_or_default(),
            extra: user.extra.clone().unwrap_or_default().into_iter().collect(),
        },
        object: json("object", request.object.as_ref().map(serde_json::to_vec))?,
        old_object: json("old object", request.old_object.as_ref().map(serde_json::to_vec))?,
        dry_run: request.dry_run,
        options: json("options", request.options.as_ref().map(|o| serde_json::to_vec(&o.0)))?,
    })
}

/// The reason Kubernetes gives an HTTP error code (`metav1.StatusReason`).
pub fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// The code a denial goes out with: 403 by default; an HTTP error code as given; anything
/// else 400 (the API server turns a denial's code below 400 into 400 too).
pub fn denial_code(code: Option<u16>) -> u16 {
    match code {
        None => 403,
        Some(c) if (400..600).contains(&c) => c,
        Some(_) => 400,
    }
}

/// A response to one request, built up from the request.
pub struct Answer(AdmissionResponse);

impl Answer {
    /// Admits the request.
    pub fn allow(request: &AdmissionRequest<DynamicObject>) -> Self {
        Answer(AdmissionResponse::from(request))
    }

    /// Refuses the request with `message` and the HTTP `code`.
    pub fn deny(request: &AdmissionRequest<DynamicObject>, code: u16, message: &str) -> Self {
        let mut r = AdmissionResponse::from(request);
        r.allowed = false;
        r.result = Status::failure(message, reason_of(code)).with_code(code);
        Answer(r)
    }

    /// Refuses a body that is not a request the host can answer (no uid to copy).
    pub fn invalid(why: &str) -> Self {
        Answer(AdmissionResponse::invalid(why))
    }

    /// Adds warnings for the client.
    pub fn warn(mut self, warnings: Vec<String>) -> Self {
        if !warnings.is_empty() {
            self.0.warnings.get_or_insert_with(Vec::new).extend(warnings);
        }
        self
    }

    /// Adds a checked JSON patch (an admitted mutation).
    pub fn patch(self, patch: json_patch::Patch) -> Result<Self, kube::core::admission::SerializePatchError> {
        self.0.with_patch(patch).map(Answer)
    }

    /// Whether the request is admitted.
    pub fn allowed(&self) -> bool {
        self.0.allowed
    }

    /// The response review as JSON.
    ///
    /// The patch goes out base64-encoded, as the API server reads `[]byte` fields: kube's
    /// `AdmissionResponse` serialises it as an array of numbers instead (kube-rs issue
    /// #1781), which only decodes because Go's JSON decoder happens to accept arrays for
    /// byte slices; the documented encoding is base64, which is what other webhooks send.
    pub fn to_json(self) -> Vec<u8> {
        use base64::Engine as _;
        let patch = self.0.patch.clone();
        // A review of strings, numbers and bytes: encoding it cannot fail.
        let mut review = serde_json::to_value(self.0.into_review()).unwrap_or_default();
        if let Some(patch) = patch
            && let Some(response) = review.get_mut("response").and_then(serde_json::Value::as_object_mut)
        {
            response.insert(
                "patch".into(),
                serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(patch)),
            );
        }
        serde_json::to_vec(&review).unwrap_or_default()
    }

    /// The response, for tests and the fixture runner.
    pub fn response(&self) -> &AdmissionResponse {
        &self.0
    }
}

/// Parses `patch` (as a plugin returned it) and checks that it applies to `object`: the
/// JSON patch the API server will apply, or why it is not one.
pub fn check_patch(patch: &[u8], object: Option<&DynamicObject>) -> Result<json_patch::Patch, String> {
    let parsed: json_patch::Patch =
        serde_json::from_slice(patch).map_err(|e| format!("the patch is not an RFC 6902 JSON patch: {e}"))?;
    let Some(object) = object else {
        return Err("the request has no object to patch".to_owned());
    };
    let mut doc = serde_json::to_value(object).map_err(|e| format!("encoding the object: {e}"))?;
    json_patch::patch(&mut doc, &parsed)
        .map_err(|e| format!("the patch does not apply to the object: {e}"))?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(operation: &str, object: &str) -> Vec<u8> {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{
                "uid":"u-1","kind":{{"group":"example.com","version":"v1","kind":"Website"}},
                "resource":{{"group":"example.com","version":"v1","resource":"websites"}},
                "name":"web","namespace":"team-a","operation":"{operation}",
                "userInfo":{{"username":"alice","groups":["devs"],"extra":{{"scope":["a","b"]}}}},
                "object":{object},"oldObject":null,"dryRun":true,
                "options":{{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}}}}}}"#
        )
        .into_bytes()
    }

    const WEBSITE: &str = r#"{"apiVersion":"example.com/v1","kind":"Website","metadata":{"name":"web","namespace":"team-a"},"spec":{"replicas":2}}"#;

    #[test]
    fn a_request_reaches_the_plugin_with_every_field() {
        let request = parse(&body("CREATE", WEBSITE)).unwrap();
        let input = to_input(&request).unwrap();
        assert_eq!(input.uid, "u-1");
        assert_eq!(input.kind, Gvk::new("example.com/v1", "Website"));
        assert_eq!((input.resource.as_str(), input.name.as_str()), ("websites", "web"));
        assert_eq!(input.namespace.as_deref(), Some("team-a"));
        assert_eq!(input.operation, AdmissionOperation::Create);
        assert_eq!(input.user.username, "alice");
        assert_eq!(input.user.groups, ["devs"]);
        assert_eq!(input.user.extra, [("scope".to_owned(), vec!["a".to_owned(), "b".to_owned()])]);
        assert!(input.dry_run);
        assert!(input.old_object.is_none());
        let object: serde_json::Value = serde_json::from_slice(input.object.as_deref().unwrap()).unwrap();
        assert_eq!(object["spec"]["replicas"], 2);
        let options: serde_json::Value = serde_json::from_slice(input.options.as_deref().unwrap()).unwrap();
        assert_eq!(options["kind"], "CreateOptions");
    }

    #[test]
    fn other_versions_and_bodies_are_refused() {
        let v1beta1 = String::from_utf8(body("CREATE", WEBSITE))
            .unwrap()
            .replace("/v1\",\"kind\":\"AdmissionReview", "/v1beta1\",\"kind\":\"AdmissionReview");
        assert!(
            matches!(parse(v1beta1.as_bytes()), Err(ReviewError::Version(v)) if v == "admission.k8s.io/v1beta1")
        );
        assert!(matches!(
            parse(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
            Err(ReviewError::NoRequest)
        ));
        assert!(matches!(parse(b"[1,2]"), Err(ReviewError::Decode(_))));
    }

    #[test]
    fn answers_carry_the_uid_code_reason_warnings_and_patch() {
        let request = parse(&body("CREATE", WEBSITE)).unwrap();
        let denied: serde_json::Value = serde_json::from_slice(
            &Answer::deny(&request, 422, "spec.replicas must be at most 10").warn(vec!["w".into()]).to_json(),
        )
        .unwrap();
        assert_eq!(denied["apiVersion"], REVIEW_API_VERSION);
        assert_eq!(denied["kind"], "AdmissionReview");
        let r = &denied["response"];
        assert_eq!((r["uid"].as_str(), r["allowed"].as_bool()), (Some("u-1"), Some(false)));
        assert_eq!(
            (r["status"]["code"].as_u64(), r["status"]["reason"].as_str()),
            (Some(422), Some("Invalid"))
        );
        assert_eq!(r["status"]["message"], "spec.replicas must be at most 10");
        assert_eq!(r["warnings"], serde_json::json!(["w"]));

        let patch =
            check_patch(br#"[{"op":"add","path":"/spec/tier","value":"gold"}]"#, request.object.as_ref())
                .unwrap();
        let allowed: serde_json::Value =
            serde_json::from_slice(&Answer::allow(&request).patch(patch).unwrap().to_json()).unwrap();
        let r = &allowed["response"];
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        use base64::Engine as _;
        let sent = base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent[0]["path"], "/spec/tier");
    }

    #[test]
    fn patches_that_are_not_json_patches_or_do_not_apply_are_refused() {
        let request = parse(&body("CREATE", WEBSITE)).unwrap();
        let object = request.object.as_ref();
        assert!(check_patch(br#"{"spec":{}}"#, object).unwrap_err().contains("not an RFC 6902"));
        let e = check_patch(br#"[{"op":"replace","path":"/spec/missing/x","value":1}]"#, object).unwrap_err();
        assert!(e.contains("does not apply"), "{e}");
        assert!(check_patch(b"[]", None).unwrap_err().contains("no object"));
    }

    #[test]
    fn denial_codes_are_http_error_codes() {
        assert_eq!(denial_code(None), 403);
        assert_eq!(denial_code(Some(422)), 422);
        assert_eq!(denial_code(Some(200)), 400);
        assert_eq!(denial_code(Some(700)), 400);
        assert_eq!(reason_of(403), "Forbidden");
    }
}
