//! Who may read the endpoint, decided by the API server as controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` (and kube-rbac-proxy) decide it: the request's
//! bearer token is authenticated with a `TokenReview`, and the user it names is authorized for
//! the request's verb on its path with a `SubjectAccessReview` (a non-resource URL, e.g.
//! `nonResourceURLs: ["/metrics"]`, `verbs: ["get"]` in a ClusterRole).
//!
//! Invariants:
//! - No token, or one the API server does not authenticate: 401. Authenticated but not
//!   allowed: 403 naming the user. A review that fails (the API server unreachable): 500,
//!   and nothing is cached, so the next request asks again.
//! - Answers are cached as controller-runtime caches them: an authentication 1 minute, an
//!   allow 5 minutes, a deny 30 seconds. Tokens are kept only as their SHA-256. Each cache
//!   holds at most [`MAX_CACHED`] answers (expired ones go first, then those expiring
//!   soonest), so unauthenticated clients sending ever new tokens cannot grow it.
//! - At most [`MAX_REVIEWS_IN_FLIGHT`] reviews run at once; each is bounded by
//!   [`REVIEW_TIMEOUT`].

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// How long an authenticated (or refused) token is remembered.
pub const AUTHENTICATION_TTL: Duration = Duration::from_secs(60);
/// How long an allowed request is remembered.
pub const ALLOW_TTL: Duration = Duration::from_secs(300);
/// How long a denied request is remembered.
pub const DENY_TTL: Duration = Duration::from_secs(30);
/// Answers each cache holds at most.
pub const MAX_CACHED: usize = 4096;
/// Reviews sent to the API server at once, at most.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 8;
/// The longest a review may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The user a token belongs to, as the API server's TokenReview reported it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the endpoint answers a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: no token, or one the API server does not authenticate.
    Unauthenticated,
    /// 403: the user may not.
    Forbidden {
        user: String,
    },
}

/// A review could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{review} failed: {reason}")]
pub struct ReviewError {
    review: &'static str,
    reason: String,
}

/// Answers with an expiry, at most [`MAX_CACHED`] of them.
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Eq + Hash + Clone, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache { entries: HashMap::new() }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries.get(key).filter(|(_, until)| *until > now).map(|(v, _)| v.clone())
    }

    fn insert(&mut self, key: K, value: V, until: Instant, now: Instant) {
        if self.entries.len() >= MAX_CACHED && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, t)| *t > now);
            if self.entries.len() >= MAX_CACHED
                && let Some(soonest) =
                    self.entries.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, (value, until));
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Authenticates and authorizes endpoint requests through the API server behind `client`.
pub struct KubernetesAuth {
    client: kube::Client,
    tokens: Mutex<Cache<[u8; 32], Option<User>>>,
    decisions: Mutex<Cache<(User, String, String), bool>>,
    in_flight: tokio::sync::Semaphore,
}

impl std::fmt::Debug for KubernetesAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesAuth").finish_non_exhaustive()
    }
}

impl KubernetesAuth {
    /// Reviews go to the API server behind `client`, as its user (which needs `create` on
    /// `tokenreviews.authentication.k8s.io` and `subjectaccessreviews.authorization.k8s.io`).
    pub fn new(client: kube::Client) -> Self {
        KubernetesAuth {
            client,
            tokens: Mutex::new(Cache::new()),
            decisions: Mutex::new(Cache::new()),
            in_flight: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    /// Whether a request with this `Authorization` header may `verb` (lower case) `path`.
    pub async fn decide(
        &self,
        authorization: Option<&[u8]>,
        verb: &str,
        path: &str,
    ) -> Result<Decision, ReviewError> {
        let Some(token) = authorization.and_then(bearer_token) else { return Ok(Decision::Unauthenticated) };
        let Some(user) = self.authenticate(token).await? else { return Ok(Decision::Unauthenticated) };
        if self.authorize(&user, verb, path).await? {
            Ok(Decision::Allow)
        } else {
            Ok(Decision::Forbidden { user: user.name })
        }
    }

    /// Answers cached now: (tokens, decisions).
    pub fn cached(&self) -> (usize, usize) {
        (self.tokens.lock().len(), self.decisions.lock().len())
    }

    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.tokens.lock().get(&key, Instant::now()) {
            return Ok(known);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let reviewed = self.create(review, "TokenReview").await?;
        let user =
            reviewed.status.filter(|s| s.authenticated == Some(true) && s.error.is_none()).and_then(|s| {
                let u = s.user?;
                Some(User {
                    name: u.username.unwrap_or_default(),
                    uid: u.uid,
                    groups: u.groups.unwrap_or_default(),
                    extra: u.extra.unwrap_or_default(),
                })
            });
        let now = Instant::now();
        self.tokens.lock().insert(key, user.clone(), now + AUTHENTICATION_TTL, now);
        Ok(user)
    }

    async fn authorize(&self, user: &User, verb: &str, path: &str) -> Result<bool, ReviewError> {
        let key = (user.clone(), verb.to_owned(), path.to_owned());
        if let Some(allowed) = self.decisions.lock().get(&key, Instant::now()) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = self.create(review, "SubjectAccessReview").await?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed && s.denied != Some(true));
        let now = Instant::now();
        let ttl = if allowed { ALLOW_TTL } else { DENY_TTL };
        self.decisions.lock().insert(key, allowed, now + ttl, now);
        Ok(allowed)
    }

    async fn create<K>(&self, review: K, what: &'static str) -> Result<K, ReviewError>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let error = |reason: String| ReviewError { review: what, reason };
        let _permit = self.in_flight.acquire().await.map_err(|e| error(e.to_string()))?;
        let api: Api<K> = Api::all(self.client.clone());
        match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review)).await {
            Ok(Ok(reviewed)) => Ok(reviewed),
            Ok(Err(e)) => Err(error(e.to_string())),
            Err(_) => Err(error(format!("no answer within {}s", REVIEW_TIMEOUT.as_secs()))),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header, read as the API server reads it
/// (surrounding spaces trimmed, the scheme in any case, nothing after a second space).
pub fn bearer_token(header: &[u8]) -> Option<&str> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let mut parts = header.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_as_the_api_server_reads_them() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"  bearer abc  "), Some("abc"));
        assert_eq!(bearer_token(b"BEARER abc def"), Some("abc"));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer  abc"), None, "an empty token between two spaces");
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"abc"), None);
        assert_eq!(bearer_token(b"Bearer \xff"), None);
    }

    #[test]
    fn the_cache_never_holds_more_than_its_bound_and_forgets_expired_answers_first() {
        let mut cache: Cache<u32, bool> = Cache::new();
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        for i in 0..MAX_CACHED as u32 {
            // The first half expires at once.
            let until = if i < MAX_CACHED as u32 / 2 { now } else { later + Duration::from_millis(i.into()) };
            cache.insert(i, true, until, now);
        }
        assert_eq!(cache.len(), MAX_CACHED);
        cache.insert(1_000_000, true, later, now + Duration::from_millis(1));
        assert_eq!(cache.len(), MAX_CACHED / 2 + 1, "expired answers went");
        // Filling it up, then two more: the two answers expiring soonest go.
        for i in 0..(MAX_CACHED as u32 / 2 + 1) {
            cache.insert(2_000_000 + i, false, later + Duration::from_secs(10), now);
        }
        assert_eq!(cache.len(), MAX_CACHED);
        assert_eq!(cache.get(&1_000_000, now), None);
        assert_eq!(cache.get(&(MAX_CACHED as u32 / 2), now), None);
        assert_eq!(cache.get(&(MAX_CACHED as u32 / 2 + 1), now), Some(true));
        assert_eq!(cache.get(&2_000_000, now), Some(false));
        cache.insert(1_000_000, true, later, now);
        assert_eq!(cache.get(&1_000_000, later), None, "an expired answer is not used");
    }
}
