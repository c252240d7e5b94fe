//! Watch: a chunked stream of newline-delimited watch events.
//!
//! Invariants:
//! - The initial events (current state or history replay) go out before any live change, and
//!   the `initial-events-end` bookmark (with `sendInitialEvents`) right after them.
//! - A BOOKMARK never claims an RV whose events are still queued for this watcher: the queue is
//!   drained into the same chunk first.
//! - A watch from a compacted RV answers 200 with one ERROR event carrying the 410 Status.
//! - The stream ends at `timeoutSeconds` (default 30 minutes) or when the store drops the
//!   watcher; clients re-watch.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, header};
use serde_json::{Value, json};

use super::request::{Ctx, Format, ResReq};
use super::table::{convert, table};
use crate::error::ApiError;
#[cfg(feature = "faults")]
use crate::faults::Faults;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Event, Store, WatchFilter, WatchItem, WatchStart};

/// Default watch duration when the client sets no `timeoutSeconds`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// A watch's end: `timeout` after `now`, or, for a `timeoutSeconds` past what the clock can
/// represent (`Instant + Duration` panics there), a year from now: the watch has no end a
/// client could wait for either way.
fn watch_deadline(now: tokio::time::Instant, timeout: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(timeout).unwrap_or(now + FAR)
}

/// How often watches with `allowWatchBookmarks` get a BOOKMARK.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// Upper bound on bytes batched into one watch chunk.
const WATCH_BATCH_BYTES: usize = 256 << 10;

pub(super) fn watch_handler(ctx: &Ctx<'_>, req: &ResReq) -> Result<Response, ApiError> {
    let filter = WatchFilter {
        namespace: req.namespace.clone(),
        labels: LabelSelector::parse(ctx.q("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(ctx.q("fieldSelector").unwrap_or(""))?,
    };
    let send_initial = ctx.flag("sendInitialEvents");
    let bookmarks = ctx.flag("allowWatchBookmarks");
    if send_initial && (!bookmarks || ctx.q("resourceVersionMatch") != Some("NotOlderThan")) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is NotOlderThan and allowWatchBookmarks is true",
        ));
    }
    let rv = ctx.q("resourceVersion");
    let start = match rv {
        _ if send_initial => WatchStart::Current,
        None | Some("0") => WatchStart::Current,
        Some(rv) => WatchStart::After(
            rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        ),
    };
    let timeout = ctx
        .q("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let format = ctx.format();
    let watch = WatchCtx { req: req.clone_shallow(), format, filter: filter.clone(), headers_sent: false };
    let mut resp = Response::new(Body::empty());
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let stream = match ctx.st.store.watch(&req.info.gr, filter, start) {
        Ok(s) => s,
        Err(e) if e.code == 410 => {
            // Like the API server: 200 and an ERROR event carrying the 410 Status.
            let mut line = b"{\"type\":\"ERROR\",\"object\":".to_vec();
            line.extend_from_slice(&e.status_bytes());
            line.extend_from_slice(b"}\n");
            *resp.body_mut() = Body::from(line);
            return Ok(resp);
        }
        Err(e) => return Err(e),
    };
    let initial_end_rv = send_initial.then_some(stream.start_rv);
    let state = WatchLoop {
        ctx: watch,
        initial: stream.initial.into_iter(),
        initial_end_rv,
        rx: stream.rx,
        deadline: watch_deadline(tokio::time::Instant::now(), timeout),
        bookmarks,
        last_rv: stream.start_rv,
        store: ctx.st.store.clone(),
        #[cfg(feature = "faults")]
        faults: ctx.st.faults.clone(),
        done: false,
    };
    let body = futures::stream::unfold(state, |mut s| async move {
        let chunk = s.next_chunk().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), s))
    });
    *resp.body_mut() = Body::from_stream(body);
    Ok(resp)
}

struct WatchCtx {
    req: ResReq,
    format: Format,
    filter: WatchFilter,
    headers_sent: bool,
}

impl WatchCtx {
    fn encode_event(&mut self, buf: &mut BytesMut, ty: &str, object: &Bytes) {
        buf.put_slice(b"{\"type\":\"");
        buf.put_slice(ty.as_bytes());
        buf.put_slice(b"\",\"object\":");
        if self.format == Format::Full && self.req.version == self.req.info.storage_version() {
            buf.put_slice(object);
        } else if self.format == Format::Table {
            let v: Value = serde_json::from_slice(object).unwrap_or_default();
            let t = table(&self.req, std::slice::from_ref(&v), !self.headers_sent, None);
            self.headers_sent = true;
            buf.put_slice(&serde_json::to_vec(&t).unwrap_or_default());
        } else {
            match convert(&self.req, self.format, object) {
                Ok(b) => buf.put_slice(&b),
                Err(_) => buf.put_slice(object),
            }
        }
        buf.put_slice(b"}\n");
    }

    fn encode_bookmark(&self, buf: &mut BytesMut, rv: u64, initial_end: bool) {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.req.info.kind, "apiVersion": self.req.info.api_version(&self.req.version), "metadata": meta});
        let ev = json!({"type": "BOOKMARK", "object": obj});
        buf.put_slice(&serde_json::to_vec(&ev).unwrap_or_default());
        buf.put_u8(b'\n');
    }

    fn encode(&mut self, buf: &mut BytesMut, ev: &Event) -> bool {
        match self.filter.view(ev) {
            Some(ty) => {
                self.encode_event(buf, ty.as_str(), &ev.object);
                true
            }
            None => false,
        }
    }
}

struct WatchLoop {
    ctx: WatchCtx,
    initial: std::vec::IntoIter<Arc<Event>>,
    initial_end_rv: Option<u64>,
    rx: tokio::sync::mpsc::Receiver<WatchItem>,
    deadline: tokio::time::Instant,
    bookmarks: bool,
    last_rv: u64,
    store: Arc<Store>,
    #[cfg(feature = "faults")]
    faults: Faults,
    done: bool,
}

impl WatchLoop {
    /// The next chunk of newline-delimited watch events; None ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut buf = BytesMut::new();
        // Initial state / replay first, in batches.
        for ev in self.initial.by_ref() {
            self.ctx.encode(&mut buf, &ev);
            self.last_rv = self.last_rv.max(ev.rv);
            if buf.len() >= WATCH_BATCH_BYTES {
                return Some(buf.freeze());
            }
        }
        if let Some(rv) = self.initial_end_rv.take() {
            self.ctx.encode_bookmark(&mut buf, rv, true);
        }
        if !buf.is_empty() {
            return Some(buf.freeze());
        }
        loop {
            #[cfg(feature = "faults")]
            self.faults.wait_unpaused().await;
            let bookmark_at = tokio::time::Instant::now() + BOOKMARK_INTERVAL;
            let item = tokio::select! {
                item = self.rx.recv() => item,
                _ = tokio::time::sleep_until(self.deadline) => { self.done = true; return None; }
                _ = tokio::time::sleep_until(bookmark_at), if self.bookmarks => {
                    // Everything up to `dispatched` is already in the channel: drain it first.
                    let dispatched = self.store.current_rv();
                    while let Ok(WatchItem::Event(ev)) = self.rx.try_recv() {
                        self.ctx.encode(&mut buf, &ev);
                        self.last_rv = self.last_rv.max(ev.rv);
                    }
                    self.last_rv = self.last_rv.max(dispatched);
                    let rv = self.last_rv;
                    self.ctx.encode_bookmark(&mut buf, rv, false);
                    return Some(buf.freeze());
                }
            };
            let Some(WatchItem::Event(ev)) = item else {
                self.done = true;
                return if buf.is_empty() { None } else { Some(buf.freeze()) };
            };
            self.ctx.encode(&mut buf, &ev);
            self.last_rv = self.last_rv.max(ev.rv);
            while buf.len() < WATCH_BATCH_BYTES {
                match self.rx.try_recv() {
                    Ok(WatchItem::Event(ev)) => {
                        self.ctx.encode(&mut buf, &ev);
                        self.last_rv = self.last_rv.max(ev.rv);
                    }
                    Err(_) => break,
                }
            }
            if !buf.is_empty() {
                return Some(buf.freeze());
            }
        }
    }
}
