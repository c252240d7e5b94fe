//! The reflector (client-go `tools/cache/reflector.go`): list, then watch, one resource into
//! a [`DeltaFifo`], over raw HTTP through `kube::Client` so each object's JSON bytes are kept
//! as received (no re-serialisation).
//!
//! Behaviour:
//! - the first list uses `resourceVersion=0` (watch cache), pages of `limit` (500) with
//!   `continue`; a continue token that expires (410) restarts the list with `resourceVersion=""`;
//!   the whole list is `replace`d into the FIFO;
//! - then a watch from the list's resourceVersion with `allowWatchBookmarks=true` and a random
//!   5–10 min `timeoutSeconds`; ADDED/MODIFIED/DELETED feed add/update/delete, BOOKMARK only
//!   advances the resourceVersion; every event advances it;
//! - a watch that ends normally is re-opened from the last resourceVersion without relisting;
//! - 410 Gone / Expired (on open or as an ERROR event) → relist with `resourceVersion=""`;
//! - connection errors, 5xx and 429 (honouring Retry-After) → jittered backoff, then re-watch
//!   from the last resourceVersion; other errors → backoff, then relist;
//! - a watch event that cannot be decoded (envelope or object) ends the watch, and after a
//!   backoff the reflector relists (client-go: the stream decoder's error ends the watch
//!   with an internal error, and the reflector lists again), so the cache never silently
//!   misses a change; a truncated last line when the stream ends is a normal close;
//! - objects are decoded as leniently as the API server allows (missing or `null` optional
//!   fields read as empty) and transformed ([`Transform`]: managedFields dropped by default)
//!   before they are queued.
//!
//! Nothing from the server can make it panic. A list item that cannot be decoded is logged
//! and left out of the list (failing the whole list would keep the informer from ever
//! syncing), so an object that turns undecodable is dropped from the cache on the relist.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use rand::Rng;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, BackoffConfig};
use super::discovery::ApiResource;
use crate::fifo::{Delta, DeltaFifo};
use crate::object::{DeletedObject, Object, Transform};

/// Options of a [`Reflector`].
#[derive(Debug, Clone)]
pub struct ReflectorConfig {
    /// Namespace scope (`None`: all namespaces / cluster-scoped).
    pub namespace: Option<String>,
    /// Label selector applied to list and watch.
    pub label_selector: Option<String>,
    /// Field selector applied to list and watch.
    pub field_selector: Option<String>,
    /// List page size (`limit`); 0 disables paging.
    pub page_size: u32,
    /// Range of the random server-side watch timeout.
    pub watch_timeout: (Duration, Duration),
    /// Backoff between failed attempts.
    pub backoff: BackoffConfig,
    /// What to strip before caching.
    pub transform: Transform,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            namespace: None,
            label_selector: None,
            field_selector: None,
            page_size: 500,
            watch_timeout: (Duration::from_secs(300), Duration::from_secs(600)),
            backoff: BackoffConfig::default(),
            transform: Transform::default(),
        }
    }
}

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
    fn is_transient(&self) -> bool {
        match self {
            ReflectorError::Transport(_) | ReflectorError::Decode(_) => true,
            ReflectorError::Status { code, .. } => *code == 429 || *code >= 500,
            ReflectorError::UndecodableEvent(_) => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ReflectorError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct StatusBody {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

fn status_error(code: u16, body: &[u8], retry_after: Option<Duration>) -> ReflectorError {
    let parsed: Option<StatusBody> = serde_json::from_slice(body).ok();
    let (reason, message) = match parsed {
        Some(s) => (s.reason.unwrap_or_default(), s.message.unwrap_or_default()),
        None => (String::new(), String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned()),
    };
    ReflectorError::Status { code, reason, message, retry_after }
}

#[derive(Deserialize)]
struct ListPage<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct RvOnly {
    #[serde(default)]
    metadata: RvMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RvMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// How one watch connection ended.
enum WatchEnd {
    Cancelled,
    /// The server closed the stream normally after `events` events.
    Closed {
        events: usize,
    },
    Failed(ReflectorError),
}

/// Lists and watches one resource into a DeltaFIFO.
///
/// ```no_run
/// # async fn demo(client: kube::Client) {
/// use std::sync::Arc;
/// use wasmctrl::source::{ApiResource, Reflector, ReflectorConfig};
/// let fifo = Arc::new(wasmctrl::fifo::DeltaFifo::new(None));
/// let cm = ApiResource::new("v1", "ConfigMap", "configmaps", true);
/// let reflector = Reflector::new(client, cm, ReflectorConfig::default());
/// let stop = tokio_util::sync::CancellationToken::new();
/// tokio::spawn(reflector.run(fifo, stop.clone()));
/// # }
/// ```
pub struct Reflector {
    client: kube::Client,
    resource: ApiResource,
    config: ReflectorConfig,
    last_rv: Arc<Mutex<String>>,
}

impl std::fmt::Debug for Reflector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflector").field("resource", &self.resource).field("config", &self.config).finish()
    }
}

impl Reflector {
    /// A reflector for `resource`.
    pub fn new(client: kube::Client, resource: ApiResource, config: ReflectorConfig) -> Self {
        Self { client, resource, config, last_rv: Arc::default() }
    }

    /// A handle on the last resourceVersion seen (list, event or bookmark).
    pub fn last_resource_version(&self) -> Arc<Mutex<String>> {
        self.last_rv.clone()
    }

    fn name(&self) -> String {
        format!("{}/{}", self.resource.api_version, self.resource.kind)
    }

    /// Runs until `cancel`: list, watch, relist as needed.
    pub async fn run(self, fifo: Arc<DeltaFifo>, cancel: CancellationToken) {
        let name = self.name();
        let mut backoff = Backoff::new(self.config.backoff);
        // First list from the watch cache; "" (a consistent read) after a 410.
        let mut list_rv = String::from("0");
        'relist: loop {
            let listed = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.list(&list_rv) => r,
            };
            match listed {
                Ok((objects, rv)) => {
                    tracing::debug!(resource = %name, objects = objects.len(), %rv, "listed");
                    fifo.replace(objects);
                    fifo.note_progress(&rv, true);
                    *self.last_rv.lock() = rv;
                }
                Err(error) => {
                    let gone = error.is_gone();
                    tracing::warn!(resource = %name, %error, list_rv, "list failed");
                    if gone && !list_rv.is_empty() {
                        list_rv.clear();
                        continue 'relist;
                    }
                    if !sleep_or_cancel(error.retry_after().unwrap_or_else(|| backoff.next_delay()), &cancel)
                        .await
                    {
                        return;
                    }
                    continue 'relist;
                }
            }
            loop {
                let started = tokio::time::Instant::now();
                let end = self.watch_once(&fifo, &cancel).await;
                fifo.note_streaming(false);
                match end {
                    WatchEnd::Cancelled => return,
                    WatchEnd::Closed { events } => {
                        tracing::debug!(resource = %name, events, "watch closed; re-watching");
                        // A watch closed at once with nothing in it: do not spin.
                        if events == 0
                            && started.elapsed() < Duration::from_secs(1)
                            && !sleep_or_cancel(backoff.next_delay(), &cancel).await
                        {
                            return;
                        }
                    }
                    WatchEnd::Failed(error) if error.is_gone() => {
                        tracing::info!(resource = %name, %error, "watch expired; relisting");
                        list_rv.clear();
                        continue 'relist;
                    }
                    WatchEnd::Failed(error) => {
                        let delay = error.retry_after().unwrap_or_else(|| backoff.next_delay());
                        tracing::warn!(resource = %name, %error, ?delay, "watch failed");
                        if !sleep_or_cancel(delay, &cancel).await {
                            return;
                        }
                        if !error.is_transient() {
                            let rv = self.last_rv.lock().clone();
                            list_rv = if rv.is_empty() { "0".into() } else { rv };
                            continue 'relist;
                        }
                    }
                }
            }
        }
    }

    fn query(&self, extra: &[(&str, &str)]) -> String {
        let mut q = String::new();
        let mut push = |k: &str, v: &str| {
            q.push(if q.is_empty() { '?' } else { '&' });
            q.push_str(k);
            q.push('=');
            encode_into(&mut q, v);
        };
        for (k, v) in extra {
            push(k, v);
        }
        if let Some(s) = self.config.label_selector.as_deref().filter(|s| !s.is_empty()) {
            push("labelSelector", s);
        }
        if let Some(s) = self.config.field_selector.as_deref().filter(|s| !s.is_empty()) {
            push("fieldSelector", s);
        }
        q
    }

    async fn get(&self, url: String) -> Result<http::Response<kube::client::Body>, ReflectorError> {
        let request = http::Request::get(url)
            .header(http::header::ACCEPT, "application/json")
            .body(kube::client::Body::from(Vec::new()))
            .map_err(|e| ReflectorError::Decode(e.to_string()))?;
        let response = self.client.send(request).await.map_err(ReflectorError::Transport)?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
            .or((status.as_u16() == 429).then_some(Duration::from_secs(1)));
        let body = collect(response.into_body()).await.unwrap_or_default();
        Err(status_error(status.as_u16(), &body, retry_after))
    }

    /// A full, paginated list: the objects and the list's resourceVersion.
    async fn list(&self, resource_version: &str) -> Result<(Vec<Arc<Object>>, String), ReflectorError> {
        let path = self.resource.collection_path(self.config.namespace.as_deref());
        let type_meta = Some((self.resource.api_version.as_str(), self.resource.kind.as_str()));
        let mut rv = resource_version.to_owned();
        let mut objects = Vec::new();
        let mut continue_token: Option<String> = None;
        let limit = self.config.page_size.to_string();
        // As client-go's reflector: a relist from a specific resourceVersion is not paged. With
        // `limit` the API server serves exactly that version (resourceVersionMatch=Exact): the
        // same stale snapshot on every relist until it is compacted; without, anything at
        // least as new, from its watch cache.
        let paged = self.config.page_size > 0 && (rv.is_empty() || rv == "0");
        loop {
            let mut params: Vec<(&str, &str)> = Vec::new();
            if paged {
                params.push(("limit", &limit));
            }
            match &continue_token {
                Some(c) => params.push(("continue", c)),
                None if !rv.is_empty() => params.push(("resourceVersion", &rv)),
                None => {}
            }
            let url = format!("{path}{}", self.query(&params));
            let page = match self.get(url).await {
                Ok(response) => collect(response.into_body()).await?,
                Err(e) if e.is_gone() && continue_token.is_some() => {
                    // The continue token expired mid-list: start over, consistently.
                    tracing::info!(resource = %self.name(), "list continue token expired; restarting list");
                    objects.clear();
                    continue_token = None;
                    rv.clear();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let parsed: ListPage<'_> = serde_json::from_slice(&page)
                .map_err(|e| ReflectorError::Decode(format!("list page: {e}")))?;
            for item in parsed.items.unwrap_or_default() {
                match Object::from_api_json(item.get().as_bytes(), type_meta, self.config.transform) {
                    Ok(obj) => objects.push(Arc::new(obj)),
                    Err(error) => {
                        tracing::warn!(resource = %self.name(), %error, "skipping malformed list item")
                    }
                }
            }
            let list_rv = parsed.metadata.resource_version.unwrap_or_default();
            match parsed.metadata.continue_token.filter(|c| !c.is_empty()) {
                Some(c) => continue_token = Some(c),
                None => return Ok((objects, list_rv)),
            }
        }
    }

    /// One watch connection, from the last resourceVersion until it ends.
    async fn watch_once(&self, fifo: &DeltaFifo, cancel: &CancellationToken) -> WatchEnd {
        let path = self.resource.collection_path(self.config.namespace.as_deref());
        let (lo, hi) = self.config.watch_timeout;
        let timeout = if hi > lo { rand::rng().random_range(lo..=hi) } else { lo };
        let rv = self.last_rv.lock().clone();
        let timeout_s = timeout.as_secs().max(1).to_string();
        let mut params =
            vec![("watch", "true"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_s.as_str())];
        if !rv.is_empty() {
            params.push(("resourceVersion", &rv));
        }
        let url = format!("{path}{}", self.query(&params));
        let response = tokio::select! {
            _ = cancel.cancelled() => return WatchEnd::Cancelled,
            r = self.get(url) => r,
        };
        let mut body = match response {
            Ok(r) => r.into_body(),
            Err(e) => return WatchEnd::Failed(e),
        };
        fifo.note_streaming(true);
        // Each push is followed by the resourceVersion it brings the FIFO's source to
        // (bookmarks included), for consumers that wait for a given point of the stream.
        let push = |changes: Vec<Delta>| {
            let changed = !changes.is_empty();
            fifo.push_all(changes);
            let rv = self.last_rv.lock().clone();
            if !rv.is_empty() {
                fifo.note_progress(&rv, changed);
            }
        };
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut events = 0usize;
        // The changes of one network frame go to the FIFO together (one lock, one wake-up).
        let mut changes: Vec<Delta> = Vec::new();
        loop {
            let frame = tokio::select! {
                _ = cancel.cancelled() => return WatchEnd::Cancelled,
                f = body.frame() => f,
            };
            let data = match frame {
                None => break,
                Some(Err(e)) => return WatchEnd::Failed(ReflectorError::Transport(e)),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(d) => d,
                    Err(_) => continue, // trailers
                },
            };
            buf.extend_from_slice(&data);
            let mut consumed = 0;
            while let Some(nl) = memchr::memchr(b'\n', &buf[consumed..]) {
                let line = &buf[consumed..consumed + nl];
                consumed += nl + 1;
                if let Err(end) = self.handle_event(line, &mut changes) {
                    push(changes);
                    return end;
                }
                events += 1;
            }
            buf.drain(..consumed);
            push(std::mem::take(&mut changes));
        }
        if buf.iter().any(|b| !b.is_ascii_whitespace()) {
            // The stream ended inside an event (client-go: an unexpected EOF closes the
            // watch quietly); a complete event the server sent without a newline is kept.
            match self.handle_event(&buf, &mut changes) {
                Ok(()) => events += 1,
                Err(_) => tracing::debug!(resource = %self.name(), bytes = buf.len(),
                    "watch stream ended inside an event; re-watching"),
            }
            push(changes);
        }
        WatchEnd::Closed { events }
    }

    /// Decodes one watch event line into `changes`. `Err` ends the watch.
    fn handle_event(&self, line: &[u8], changes: &mut Vec<Delta>) -> Result<(), WatchEnd> {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(());
        }
        // Fast path for the API server's own encoding, `{"type":"X","object":{...}}`: the
        // object is validated when it is parsed, so the envelope need not be scanned twice.
        // (If the split was wrong, e.g. extra envelope fields, parsing fails: decode generally.)
        if let Some((kind, object)) = split_event(line)
            && let Ok(obj) = self.build(object)
        {
            self.push_change(kind, obj, changes);
            return Ok(());
        }
        let event: WatchEvent<'_> = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => return Err(WatchEnd::Failed(ReflectorError::UndecodableEvent(e.to_string()))),
        };
        match &*event.kind {
            "ADDED" | "MODIFIED" | "DELETED" => match self.build(event.object.get().as_bytes()) {
                Ok(obj) => self.push_change(&event.kind, obj, changes),
                Err(error) => {
                    // Skipping it would leave the cache stale until the object changes again.
                    return Err(WatchEnd::Failed(ReflectorError::UndecodableEvent(format!(
                        "{} object: {error}",
                        event.kind
                    ))));
                }
            },
            "BOOKMARK" => {
                if let Ok(RvOnly { metadata: RvMeta { resource_version: Some(rv) } }) =
                    serde_json::from_str::<RvOnly>(event.object.get())
                {
                    *self.last_rv.lock() = rv;
                }
            }
            "ERROR" => {
                let status: Option<StatusBody> = serde_json::from_str(event.object.get()).ok();
                let code = status.as_ref().and_then(|s| s.code).unwrap_or(500);
                return Err(WatchEnd::Failed(status_error(code, event.object.get().as_bytes(), None)));
            }
            other => {
                tracing::warn!(resource = %self.name(), event = other, "unknown watch event type; ignored");
            }
        }
        Ok(())
    }

    fn build(&self, object: &[u8]) -> Result<Arc<Object>, crate::object::ObjectError> {
        let type_meta = Some((self.resource.api_version.as_str(), self.resource.kind.as_str()));
        Object::from_api_json(object, type_meta, self.config.transform).map(Arc::new)
    }

    fn push_change(&self, kind: &str, obj: Arc<Object>, changes: &mut Vec<Delta>) {
        *self.last_rv.lock() = obj.resource_version().to_owned();
        changes.push(match kind {
            "ADDED" => Delta::Added(obj),
            "MODIFIED" => Delta::Updated(obj),
            _ => Delta::Deleted(DeletedObject::Known(obj)),
        });
    }
}

/// Splits `{"type":"ADDED|MODIFIED|DELETED","object":{...}}` (exactly as API servers write
/// it) into type and object bytes; anything else is left to the general decoder.
fn split_event(line: &[u8]) -> Option<(&'static str, &[u8])> {
    let rest = line.strip_prefix(br#"{"type":""#)?;
    let (kind, rest) = if let Some(r) = rest.strip_prefix(br#"ADDED","object":"#) {
        ("ADDED", r)
    } else if let Some(r) = rest.strip_prefix(br#"MODIFIED","object":"#) {
        ("MODIFIED", r)
    } else if let Some(r) = rest.strip_prefix(br#"DELETED","object":"#) {
        ("DELETED", r)
    } else {
        return None;
    };
    let end = rest.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if rest[end] != b'}' {
        return None;
    }
    let object = &rest[..end];
    (object.first() == Some(&b'{') && object.last() == Some(&b'}')).then_some((kind, object))
}

async fn collect(body: kube::client::Body) -> Result<Bytes, ReflectorError> {
    body.collect().await.map(|c| c.to_bytes()).map_err(ReflectorError::Transport)
}

/// Sleeps unless cancelled first; returns false when cancelled.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn encode_into(out: &mut String, value: &str) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        let mut s = String::new();
        encode_into(&mut s, "app in (a,b),!x");
        assert_eq!(s, "app%20in%20%28a%2Cb%29%2C%21x");
    }

    #[test]
    fn split_event_fast_path() {
        let (k, o) = split_event(br#"{"type":"MODIFIED","object":{"a":{"b":1}}}"#).unwrap();
        assert_eq!((k, o), ("MODIFIED", &br#"{"a":{"b":1}}"#[..]));
        assert!(split_event(br#"{"type":"ADDED","object":{"a":1}}  "#).is_some());
        assert!(split_event(br#"{"type":"BOOKMARK","object":{"a":1}}"#).is_none());
        assert!(split_event(br#"{"object":{"a":1},"type":"ADDED"}"#).is_none());
        assert!(split_event(br#"{"type":"ADDED","object":null}"#).is_none());
        assert!(split_event(br#"{"type":"ADDED","object":{"a":1}"#).is_none());
    }

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
}
