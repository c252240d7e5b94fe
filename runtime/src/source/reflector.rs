//! The reflector (client-go `tools/cache/reflector.go`): list, then watch, one resource into
//! a [`DeltaFifo`], over raw HTTP through `kube::Client` so each object's JSON bytes are kept
//! as received (no re-serialisation).
//!
//! What to do next is decided by the state machine in [`super::machine`] (its doc has the
//! state diagram); [`Reflector::run`] only performs the effects it asks for — list, push into
//! the FIFO, watch, sleep — and feeds their outcomes back. The requests are built by
//! [`super::requests`] with kube's request builders.
//!
//! Behaviour:
//! - the first list uses `resourceVersion=0` (watch cache), pages of `limit` (500) with
//!   `continue`; a continue token that expires (410) restarts the list with `resourceVersion=""`;
//!   a relist from a specific resourceVersion is not paged; the whole list is `replace`d into
//!   the FIFO;
//! - then a watch from the list's resourceVersion with `allowWatchBookmarks=true` and a random
//!   5–10 min `timeoutSeconds`; ADDED/MODIFIED/DELETED feed add/update/delete, BOOKMARK only
//!   advances the resourceVersion; every event advances it;
//! - a watch that ends normally is re-opened from the last resourceVersion without relisting
//!   (after a backoff when it closed within a second without any event);
//! - 410 Gone / Expired (on open or as an ERROR event) → relist with `resourceVersion=""`;
//! - connection errors, 5xx and 429 (honouring Retry-After) → jittered backoff, then re-watch
//!   from the last resourceVersion; other errors → backoff, then relist;
//! - a watch event that cannot be decoded (envelope or object) ends the watch, and after a
//!   backoff the reflector relists (client-go: the stream decoder's error ends the watch
//!   with an internal error, and the reflector lists again), so the cache never silently
//!   misses a change; a truncated last line when the stream ends is a normal close;
//! - a watch event, list item or list envelope longer than `max_object_size` is refused as
//!   soon as it grows past it ([`ReflectorError::TooLarge`]): a watch ends and is followed by
//!   a backoff and a relist, a list fails and is retried after a backoff. The reflector never
//!   holds more than that of one event or item, nor more than [`MAX_STATUS_BODY`] of a
//!   failure response, whatever the server sends (a list's items are handed on one by one as
//!   they arrive, so a list as a whole is bounded only by the objects it holds);
//! - objects are decoded as leniently as the API server allows (missing or `null` optional
//!   fields read as empty) and transformed ([`Transform`]: managedFields dropped by default)
//!   before they are queued.
//!
//! Invariants kept where the FIFO gets its data: a list goes in with `replace` followed by
//! `note_progress(rv, true)`; each watch frame's changes go in with one `push_all`, followed by
//! `note_progress(rv, changed)` for the resourceVersion they (or a bookmark) reached;
//! `note_streaming(true)` once a watch is open and `note_streaming(false)` whenever it ends.
//!
//! Nothing from the server can make it panic. A list item that cannot be decoded is logged
//! and left out of the list (failing the whole list would keep the informer from ever
//! syncing), so an object that turns undecodable is dropped from the cache on the relist.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use rand::Rng;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, BackoffConfig};
use super::discovery::ApiResource;
use super::error::{ReflectorError, StatusBody, status_error};
use super::list_body::{ListBodyError, ListBodySplitter};
use super::machine::{self, Effect, ListFrom, Outcome, State, Wait};
use super::metrics::ReflectorMetrics;
use super::requests::Requests;
use super::watch_lines::{WatchLines, WatchLinesError};
use crate::fifo::{Delta, DeltaFifo};
use crate::object::{DeletedObject, FromMap, Object, ObjectError, Transform};

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
    /// The longest watch event line, list item or list envelope accepted, in bytes.
    pub max_object_size: usize,
    /// Where watch events and relists are counted (`None`: nowhere).
    pub metrics: Option<ReflectorMetrics>,
}

/// Default of [`ReflectorConfig::max_object_size`]: well above the largest object an API
/// server stores (etcd's default request limit is 1.5 MiB; an object's JSON, with base64
/// data and managedFields, may be about twice its stored size).
pub const DEFAULT_MAX_OBJECT_SIZE: usize = 16 << 20;

/// The most of a failure response's body read (an API server's `Status` is a few hundred
/// bytes; the rest of a longer body is dropped unread).
pub const MAX_STATUS_BODY: usize = 64 << 10;

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
            max_object_size: DEFAULT_MAX_OBJECT_SIZE,
            metrics: None,
        }
    }
}

/// A list response's envelope: the body without its items (they are decoded one by one as
/// they arrive, see [`ListBodySplitter`]).
#[derive(Deserialize)]
struct ListEnvelope {
    #[serde(default)]
    metadata: ListMeta,
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

/// How one watch connection ended (before it is told to the state machine).
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
/// use wasmctrl_runtime::source::{ApiResource, Reflector, ReflectorConfig};
/// let fifo = Arc::new(wasmctrl_runtime::fifo::DeltaFifo::new(None));
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
    requests: Requests,
}

impl std::fmt::Debug for Reflector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflector").field("resource", &self.resource).field("config", &self.config).finish()
    }
}

impl Reflector {
    /// A reflector for `resource`.
    pub fn new(client: kube::Client, resource: ApiResource, config: ReflectorConfig) -> Self {
        let requests = Requests::new(
            resource.collection_path(config.namespace.as_deref()),
            config.label_selector.as_deref(),
            config.field_selector.as_deref(),
        );
        Self { client, resource, config, requests }
    }

    /// The resource as logs name it, with its namespace scope.
    fn name(&self) -> String {
        match &self.config.namespace {
            Some(ns) => format!("{}/{} in {ns}", self.resource.api_version, self.resource.kind),
            None => format!("{}/{}", self.resource.api_version, self.resource.kind),
        }
    }

    /// Runs until `cancel`: performs the state machine's effects and feeds their outcomes
    /// back ([`super::machine::transition`]).
    pub async fn run(self, fifo: Arc<DeltaFifo>, cancel: CancellationToken) {
        let name = self.name();
        let mut backoff = Backoff::new(self.config.backoff);
        let (mut state, mut effect) = machine::start();
        let mut listed_before = false;
        loop {
            let outcome = match effect {
                Effect::Stop => return,
                Effect::List(from) => {
                    if std::mem::replace(&mut listed_before, true)
                        && let Some(m) = &self.config.metrics
                    {
                        m.relist();
                    }
                    let listed = tokio::select! {
                        _ = cancel.cancelled() => Err(None),
                        r = self.list(&fifo, &from) => r.map_err(Some),
                    };
                    match listed {
                        Ok((objects, rv)) => {
                            tracing::debug!(resource = %name, objects = objects.len(), %rv, "listed");
                            Outcome::Listed { objects, rv }
                        }
                        Err(None) => Outcome::Cancelled,
                        Err(Some(error)) => {
                            tracing::warn!(resource = %name, %error, list_rv = from.resource_version(), "list failed");
                            Outcome::ListFailed(error)
                        }
                    }
                }
                Effect::Replace { objects, rv } => {
                    fifo.replace(objects);
                    fifo.note_progress(&rv, true);
                    Outcome::Replaced
                }
                Effect::Watch { mut rv } => {
                    let started = tokio::time::Instant::now();
                    let end = self.watch_once(&fifo, &cancel, &mut rv).await;
                    fifo.note_streaming(false);
                    match end {
                        WatchEnd::Cancelled => Outcome::Cancelled,
                        WatchEnd::Closed { events } => {
                            tracing::debug!(resource = %name, events, "watch closed; re-watching");
                            Outcome::WatchClosed { rv, events, elapsed: started.elapsed() }
                        }
                        WatchEnd::Failed(error) => {
                            if error.is_gone() {
                                tracing::info!(resource = %name, %error, "watch expired; relisting");
                            } else {
                                tracing::warn!(resource = %name, %error, transient = error.is_transient(),
                                    "watch failed");
                            }
                            Outcome::WatchFailed { rv, error }
                        }
                    }
                }
                Effect::Sleep(wait) => {
                    let delay = match wait {
                        Wait::Backoff => backoff.next_delay(),
                        Wait::RetryAfter(d) => d,
                    };
                    tracing::debug!(resource = %name, ?delay, "backing off");
                    if sleep_or_cancel(delay, &cancel).await { Outcome::Slept } else { Outcome::Cancelled }
                }
            };
            (state, effect) = machine::transition(std::mem::replace(&mut state, State::Stopped), outcome);
        }
    }

    async fn get(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<kube::client::Body>, ReflectorError> {
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(ReflectorError::Transport)?;
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
        let body = read_capped(response.into_body(), MAX_STATUS_BODY).await;
        Err(status_error(status.as_u16(), &body, retry_after))
    }

    /// A full list (paged when `from` is): the objects and the list's resourceVersion.
    async fn list(
        &self,
        fifo: &DeltaFifo,
        from: &ListFrom,
    ) -> Result<(Vec<Arc<Object>>, String), ReflectorError> {
        let type_meta = Some((self.resource.api_version.as_str(), self.resource.kind.as_str()));
        let mut rv = from.resource_version().to_owned();
        let mut objects = Vec::new();
        let mut continue_token: Option<String> = None;
        // As client-go's reflector: a relist from a specific resourceVersion is not paged. With
        // `limit` the API server serves exactly that version (resourceVersionMatch=Exact): the
        // same stale snapshot on every relist until it is compacted; without, anything at
        // least as new, from its watch cache.
        let page_size = (self.config.page_size > 0 && from.paged()).then_some(self.config.page_size);
        loop {
            let request = self.requests.list(&rv, page_size, continue_token.as_deref())?;
            let response = match self.get(request).await {
                Ok(response) => response,
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
            // Items are decoded as their bytes arrive: the page's body is never held whole.
            let mut splitter = ListBodySplitter::new(self.config.max_object_size);
            let mut body = response.into_body();
            // An item that is not even JSON means a broken body: the whole list fails (and is
            // retried), as when the body was parsed whole. A JSON item that is no object we
            // can decode is skipped, as before.
            let mut broken: Option<String> = None;
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame.map_err(ReflectorError::Transport)?.into_data() else { continue };
                splitter
                    .push(&data, |item| match Object::from_api_json(item, type_meta, self.config.transform) {
                        // An unchanged object (a relist) is the one already cached: the copy is
                        // dropped at once instead of living beside the cache until the replace.
                        Ok(obj) => objects.push(fifo.stored_unchanged(&obj).unwrap_or_else(|| Arc::new(obj))),
                        Err(ObjectError::Json(e)) if e.is_syntax() || e.is_eof() => {
                            broken.get_or_insert_with(|| format!("list item: {e}"));
                        }
                        Err(error) => {
                            tracing::warn!(resource = %self.name(), %error, "skipping malformed list item")
                        }
                    })
                    .map_err(list_body_error)?;
                if let Some(error) = broken.take() {
                    return Err(ReflectorError::Decode(error));
                }
            }
            let envelope = splitter.finish().map_err(list_body_error)?;
            let parsed: ListEnvelope = serde_json::from_slice(&envelope)
                .map_err(|e| ReflectorError::Decode(format!("list page: {e}")))?;
            let list_rv = parsed.metadata.resource_version.unwrap_or_default();
            match parsed.metadata.continue_token.filter(|c| !c.is_empty()) {
                Some(c) => continue_token = Some(c),
                None => return Ok((objects, list_rv)),
            }
        }
    }

    /// One watch connection, from `rv` until it ends; `rv` follows every event and bookmark.
    async fn watch_once(&self, fifo: &DeltaFifo, cancel: &CancellationToken, rv: &mut String) -> WatchEnd {
        let (lo, hi) = self.config.watch_timeout;
        let timeout = if hi > lo { rand::rng().random_range(lo..=hi) } else { lo };
        let timeout_s = u32::try_from(timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        let request = match self.requests.watch(rv, timeout_s) {
            Ok(r) => r,
            Err(e) => return WatchEnd::Failed(e),
        };
        let response = tokio::select! {
            _ = cancel.cancelled() => return WatchEnd::Cancelled,
            r = self.get(request) => r,
        };
        let mut body = match response {
            Ok(r) => r.into_body(),
            Err(e) => return WatchEnd::Failed(e),
        };
        fifo.note_streaming(true);
        // Each push is followed by the resourceVersion it brings the FIFO's source to
        // (bookmarks included), for consumers that wait for a given point of the stream.
        let push = |changes: Vec<Delta>, rv: &str| {
            let changed = !changes.is_empty();
            fifo.push_all(changes);
            if !rv.is_empty() {
                fifo.note_progress(rv, changed);
            }
        };
        let decoder = self.decoder();
        let mut lines = WatchLines::new(self.config.max_object_size);
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
            let mut completed = false;
            let split = lines.push(&data, |line| {
                completed = true;
                decoder.decode(line, &mut changes, rv)?;
                events += 1;
                Ok(())
            });
            // What the frame completed goes in, even when a later line ended the watch; a
            // frame that only continued a line changed nothing.
            if completed {
                push(std::mem::take(&mut changes), rv);
            }
            match split {
                Ok(()) => {}
                Err(WatchLinesError::Line(error)) => return WatchEnd::Failed(error),
                Err(WatchLinesError::TooLong { len, limit }) => {
                    return WatchEnd::Failed(ReflectorError::TooLarge { what: "a watch event", len, limit });
                }
            }
        }
        let rest = lines.rest();
        if rest.iter().any(|b| !b.is_ascii_whitespace()) {
            // The stream ended inside an event (client-go: an unexpected EOF closes the
            // watch quietly); a complete event the server sent without a newline is kept.
            match decoder.decode(rest, &mut changes, rv) {
                Ok(()) => events += 1,
                Err(_) => tracing::debug!(resource = %self.name(), bytes = rest.len(),
                    "watch stream ended inside an event; re-watching"),
            }
            push(changes, rv);
        }
        WatchEnd::Closed { events }
    }

    fn decoder(&self) -> EventDecoder<'_> {
        EventDecoder {
            type_meta: (self.resource.api_version.as_str(), self.resource.kind.as_str()),
            transform: self.config.transform,
            metrics: self.config.metrics.as_ref(),
        }
    }
}

/// Reads watch event lines of one kind into FIFO changes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventDecoder<'a> {
    /// `apiVersion` and `kind` of the watched resource (set on objects that lack them).
    pub type_meta: (&'a str, &'a str),
    pub transform: Transform,
    /// Where decoded watch events are counted (`None`: nowhere).
    pub metrics: Option<&'a ReflectorMetrics>,
}

impl EventDecoder<'_> {
    /// Decodes one watch event line into `changes`, advancing `rv`. `Err` ends the watch.
    pub(crate) fn decode(
        &self,
        line: &[u8],
        changes: &mut Vec<Delta>,
        rv: &mut String,
    ) -> Result<(), ReflectorError> {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(());
        }
        // Fast path for the API server's own encoding, `{"type":"X","object":{...}}`: the
        // object is validated when it is parsed, so the envelope need not be scanned twice.
        // (If the split was wrong, e.g. extra envelope fields, parsing fails: decode generally.)
        if let Some((kind, object)) = split_event(line)
            && let Ok(obj) = self.build(object)
        {
            self.count_event(kind);
            push_change(kind, obj, changes, rv);
            return Ok(());
        }
        // From a JSON object only: the derive alone would also take `["ADDED", {...}]`.
        let event: WatchEvent<'_> = match serde_json::from_slice::<FromMap<WatchEvent<'_>>>(line) {
            Ok(FromMap(e)) => e,
            Err(e) => return Err(ReflectorError::UndecodableEvent(e.to_string())),
        };
        match &*event.kind {
            "ADDED" | "MODIFIED" | "DELETED" => match self.build(event.object.get().as_bytes()) {
                Ok(obj) => {
                    self.count_event(&event.kind);
                    push_change(&event.kind, obj, changes, rv);
                }
                Err(error) => {
                    // Skipping it would leave the cache stale until the object changes again.
                    return Err(ReflectorError::UndecodableEvent(format!("{} object: {error}", event.kind)));
                }
            },
            "BOOKMARK" => {
                if let Ok(RvOnly { metadata: RvMeta { resource_version: Some(bookmark) } }) =
                    serde_json::from_str::<RvOnly>(event.object.get())
                {
                    *rv = bookmark;
                }
            }
            "ERROR" => {
                let status: Option<StatusBody> = serde_json::from_str(event.object.get()).ok();
                let code = status.as_ref().and_then(|s| s.code).unwrap_or(500);
                return Err(status_error(code, event.object.get().as_bytes(), None));
            }
            other => {
                tracing::warn!(kind = self.type_meta.1, event = other, "unknown watch event type; ignored");
            }
        }
        Ok(())
    }

    fn count_event(&self, kind: &str) {
        if let Some(m) = self.metrics {
            m.event(kind);
        }
    }

    fn build(&self, object: &[u8]) -> Result<Arc<Object>, crate::object::ObjectError> {
        Object::from_api_json(object, Some(self.type_meta), self.transform).map(Arc::new)
    }
}

/// A list body that could not be split, as the reflector reports it.
fn list_body_error(error: ListBodyError) -> ReflectorError {
    match error {
        ListBodyError::TooLarge { what, len, limit } => ReflectorError::TooLarge {
            what: if what == "an item" { "a list item" } else { "a list envelope" },
            len,
            limit,
        },
        other => ReflectorError::Decode(other.to_string()),
    }
}

/// Queues one ADDED/MODIFIED/DELETED change and advances `rv` to the object's version.
fn push_change(kind: &str, obj: Arc<Object>, changes: &mut Vec<Delta>, rv: &mut String) {
    obj.resource_version().clone_into(rv);
    changes.push(match kind {
        "ADDED" => Delta::Added(obj),
        "MODIFIED" => Delta::Updated(obj),
        _ => Delta::Deleted(DeletedObject::Known(obj)),
    });
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

/// At most `limit` bytes of `body` (a failure response's, read for its `Status`); the rest
/// is left unread, and a body that fails midway gives what came before.
async fn read_capped<B>(mut body: B, limit: usize) -> Bytes
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut buf = bytes::BytesMut::new();
    while buf.len() < limit {
        let Some(Ok(frame)) = body.frame().await else { break };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data[..data.len().min(limit - buf.len())]);
        }
    }
    buf.freeze()
}

/// Sleeps unless cancelled first; returns false when cancelled.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_body_is_read_up_to_the_cap_and_no_further() {
        // A body that never ends: reading stops at the cap.
        let endless = http_body_util::StreamBody::new(futures::stream::repeat_with(|| {
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(&[b'x'; 1000])))
        }));
        let read = read_capped(endless, 2500).await;
        assert_eq!(read.len(), 2500);
        let short = http_body_util::Full::new(Bytes::from_static(br#"{"code":500}"#));
        assert_eq!(&read_capped(short, 2500).await[..], br#"{"code":500}"#);
    }

    #[test]
    fn events_decode_into_changes_and_bookmarks_advance_the_version() {
        let decoder =
            EventDecoder { type_meta: ("v1", "ConfigMap"), transform: Transform::default(), metrics: None };
        let (mut changes, mut rv) = (Vec::new(), String::new());
        decoder
            .decode(
                br#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}"#,
                &mut changes,
                &mut rv,
            )
            .unwrap();
        assert_eq!((changes.len(), rv.as_str()), (1, "5"));
        decoder
            .decode(
                br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#,
                &mut changes,
                &mut rv,
            )
            .unwrap();
        assert_eq!((changes.len(), rv.as_str()), (1, "9"));
        assert!(matches!(
            decoder.decode(br#"{"type":"ADDED","object":{"metadata":{}}}"#, &mut changes, &mut rv),
            Err(ReflectorError::UndecodableEvent(_))
        ));
        assert!(decoder.decode(b"  ", &mut changes, &mut rv).is_ok());
        // An event is a JSON object, as the API server sends it and Go's decoder requires.
        assert!(matches!(
            decoder.decode(
                br#"["ADDED",{"metadata":{"name":"a","resourceVersion":"6"}}]"#,
                &mut changes,
                &mut rv
            ),
            Err(ReflectorError::UndecodableEvent(_))
        ));
        assert_eq!((changes.len(), rv.as_str()), (1, "9"));
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
}
