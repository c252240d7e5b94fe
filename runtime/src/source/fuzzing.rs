//! What the fuzz targets (`fuzz/`) drive of the reflector's body handling: the watch line
//! splitter, the watch event decoder and the list body splitter. Not part of the API (hidden
//! from the docs); re-exported by `wasmctrl::fuzzing`.

use std::sync::Arc;

pub use super::list_body::{ListBodyError, ListBodySplitter};
use super::reflector::EventDecoder;
pub use super::watch_lines::{WatchLines, WatchLinesError};
use crate::fifo::Delta;
use crate::object::{Object, Transform};

/// What one watch event line came to.
#[derive(Debug)]
pub enum DecodedEvent {
    /// An ADDED / MODIFIED / DELETED change of this object.
    Change(Arc<Object>),
    /// A bookmark, an unknown event type or a blank line: only the resourceVersion may move.
    Nothing,
}

/// Decodes one watch event line as the reflector of `api_version` / `kind` does; `rv` follows
/// it. `Err`: the reflector's error (the watch would end).
pub fn decode_watch_event(
    line: &[u8],
    api_version: &str,
    kind: &str,
    transform: Transform,
    rv: &mut String,
) -> Result<DecodedEvent, String> {
    let decoder = EventDecoder { type_meta: (api_version, kind), transform, metrics: None };
    let mut changes = Vec::new();
    decoder.decode(line, &mut changes, rv).map_err(|e| e.to_string())?;
    Ok(match changes.pop() {
        Some(Delta::Added(o) | Delta::Updated(o) | Delta::Replaced(o) | Delta::Sync(o)) => {
            DecodedEvent::Change(o)
        }
        Some(Delta::Deleted(d)) => DecodedEvent::Change(d.object().clone()),
        None => DecodedEvent::Nothing,
    })
}
