//! A Kubernetes list response decoded as it arrives: each item is handed on as soon as its
//! last byte is in, and only the list's envelope (`kind`, `apiVersion`, `metadata`) is kept.
//!
//! Why: an API server answers a list from its watch cache (`resourceVersion=0`, what a
//! reflector's first list asks for) in one response, whatever the page size. Collected whole,
//! that body is as large as every object's JSON together and lives beside the decoded objects
//! until the last one is decoded, so a large sync would peak at the objects' JSON twice over.
//! Split on the fly, the body costs one item's bytes at a time (`cargo bench -p wasmctrl
//! --bench scale` measures the heap of a large sync against its JSON).
//!
//! Invariants:
//! - Every byte of the body goes either into exactly one item (an object of the top-level
//!   `items` array, bytes unchanged) or into the envelope; the envelope is the body with each
//!   item and the commas between them left out (`"items":[]`), so it parses as the list did.
//! - The splitter finds only structure (strings, nesting, the `items` member); it does not
//!   validate. Each item is parsed by its consumer and the envelope by serde, so malformed
//!   JSON is still refused, and nothing here can panic on any input.
//! - No item and no envelope longer than the cap is handed on or kept: one that grows past it
//!   is refused as soon as it does, so what the splitter holds is bounded by the cap however
//!   the server shapes the body (the list itself is bounded only by how many items it has;
//!   each goes to the consumer as it completes).
//!
//! No well-kept crate splits a JSON array's elements out of a body that arrives in pieces
//! without building them (serde_json's `StreamDeserializer` reads a sequence of top-level
//! values, not the elements of a nested array), so this is written here; strings are skipped
//! with `memchr`, which keeps it well under the cost of parsing the items.

/// Why a list body could not be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListBodyError {
    #[error("list body: unexpected byte {0:?} between the items of `items`")]
    BetweenItems(char),
    #[error("list body: more `]` or `}}` than `[` or `{{`")]
    Unbalanced,
    #[error("list body ended inside {0}")]
    Truncated(&'static str),
    #[error("list body: {what} of at least {len} bytes is over the limit of {limit} bytes")]
    TooLarge { what: &'static str, len: usize, limit: usize },
}

/// Where the splitter is in the body's structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the envelope.
    Envelope,
    /// Directly inside the `items` array, between items.
    BetweenItems,
    /// Inside an item (its bytes from earlier pieces are in `buf`).
    Item,
}

/// Splits a list body fed in pieces ([`push`](Self::push)) into items and envelope.
#[derive(Debug)]
pub struct ListBodySplitter {
    /// The bytes of an item begun in an earlier piece, from its `{`.
    buf: Vec<u8>,
    /// Envelope bytes so far.
    envelope: Vec<u8>,
    place: Place,
    /// Nesting depth of `[`/`{` outside strings, counting the body's own object as 1.
    depth: usize,
    in_string: bool,
    /// The previous byte (in a string) was a backslash.
    escaped: bool,
    /// The longest item, and the longest envelope, accepted.
    max: usize,
}

impl ListBodySplitter {
    /// A splitter refusing items (and an envelope) longer than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            envelope: Vec::with_capacity(256),
            place: Place::Envelope,
            depth: 0,
            in_string: false,
            escaped: false,
            max,
        }
    }

    /// Feeds the next bytes of the body; calls `item` with each item completed by them.
    pub fn push(&mut self, data: &[u8], mut item: impl FnMut(&[u8])) -> Result<(), ListBodyError> {
        // Scanning goes over `data`; only an item cut by the end of a piece is copied (into
        // `buf`, so that its bytes are contiguous when it completes).
        let mut i = 0;
        while i < data.len() {
            match self.place {
                Place::Item => {
                    let start = i;
                    let (end, done) = self.scan_item(data, i);
                    i = end;
                    let len = self.buf.len().saturating_add(end - start);
                    if len > self.max {
                        self.buf = Vec::new();
                        return Err(ListBodyError::TooLarge { what: "an item", len, limit: self.max });
                    }
                    if done && self.buf.is_empty() {
                        // The whole item is in this piece: no copy.
                        item(&data[start..end]);
                    } else {
                        self.buf.extend_from_slice(&data[start..end]);
                        if done {
                            item(&self.buf);
                            self.buf.clear();
                        }
                    }
                    if done {
                        self.place = Place::BetweenItems;
                    }
                }
                Place::BetweenItems => {
                    let b = data[i];
                    match b {
                        b' ' | b'\t' | b'\n' | b'\r' | b',' => i += 1,
                        b'{' => {
                            // The item's `{` is scanned as part of it.
                            self.place = Place::Item;
                        }
                        b']' => {
                            self.depth -= 1;
                            if self.envelope.len() >= self.max {
                                let len = self.envelope.len() + 1;
                                return Err(ListBodyError::TooLarge {
                                    what: "the envelope",
                                    len,
                                    limit: self.max,
                                });
                            }
                            self.envelope.push(b']');
                            self.place = Place::Envelope;
                            i += 1;
                        }
                        other => return Err(ListBodyError::BetweenItems(other as char)),
                    }
                }
                Place::Envelope => {
                    let start = i;
                    let end = self.scan_envelope(data, i)?;
                    let len = self.envelope.len().saturating_add(end - start);
                    if len > self.max {
                        return Err(ListBodyError::TooLarge { what: "the envelope", len, limit: self.max });
                    }
                    self.envelope.extend_from_slice(&data[start..end]);
                    i = end;
                }
            }
        }
        Ok(())
    }

    /// The envelope (the body without its items), once the whole body was pushed.
    pub fn finish(self) -> Result<Vec<u8>, ListBodyError> {
        match self.place {
            Place::Item => Err(ListBodyError::Truncated("an item")),
            Place::BetweenItems => Err(ListBodyError::Truncated("`items`")),
            Place::Envelope if self.in_string => Err(ListBodyError::Truncated("a string")),
            Place::Envelope if self.depth > 0 => Err(ListBodyError::Truncated("the list")),
            Place::Envelope => Ok(self.envelope),
        }
    }

    /// Skips a string's bytes from `i` (inside it); returns where scanning goes on.
    fn skip_string(&mut self, data: &[u8], mut i: usize) -> usize {
        if self.escaped {
            self.escaped = false;
            i += 1;
        }
        while i < data.len() {
            match memchr::memchr2(b'"', b'\\', &data[i..]) {
                None => return data.len(),
                Some(off) if data[i + off] == b'"' => {
                    self.in_string = false;
                    return i + off + 1;
                }
                Some(off) => {
                    if i + off + 1 < data.len() {
                        i += off + 2;
                    } else {
                        self.escaped = true;
                        return data.len();
                    }
                }
            }
        }
        i
    }

    /// Scans item bytes from `i`; returns the end of what was scanned and whether the item
    /// closed there (its last byte is the one before the returned index).
    fn scan_item(&mut self, data: &[u8], mut i: usize) -> (usize, bool) {
        while i < data.len() {
            if self.in_string {
                i = self.skip_string(data, i);
                continue;
            }
            match data[i] {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 2 {
                        return (i + 1, true);
                    }
                }
                _ => {}
            }
            i += 1;
        }
        (i, false)
    }

    /// Scans envelope bytes from `i` until the end of `data` or the opening of `items`;
    /// returns the end of the envelope bytes scanned.
    fn scan_envelope(&mut self, data: &[u8], mut i: usize) -> Result<usize, ListBodyError> {
        let start = i;
        while i < data.len() {
            if self.in_string {
                i = self.skip_string(data, i);
                continue;
            }
            match data[i] {
                b'"' => self.in_string = true,
                b'{' => self.depth += 1,
                b'[' => {
                    self.depth += 1;
                    if self.depth == 2 && self.opens_items(&data[start..i]) {
                        self.place = Place::BetweenItems;
                        return Ok(i + 1);
                    }
                }
                b'}' | b']' => self.depth = self.depth.checked_sub(1).ok_or(ListBodyError::Unbalanced)?,
                _ => {}
            }
            i += 1;
        }
        Ok(i)
    }

    /// Whether the envelope so far, then `pending` (not yet copied into it), ends with a
    /// member name `"items"` (after `{` or `,`) and its colon: the `[` that follows opens
    /// the items.
    fn opens_items(&self, pending: &[u8]) -> bool {
        let ws = |b: &&u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        let mut tail = self.envelope.iter().chain(pending.iter()).rev().skip_while(ws);
        if tail.next() != Some(&b':') {
            return false;
        }
        let mut tail = tail.skip_while(ws);
        if !b"\"smeti\"".iter().all(|want| tail.next() == Some(want)) {
            return false;
        }
        matches!(tail.find(|b| !ws(b)), Some(b'{' | b','))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Splits `body` fed in pieces of `chunk` bytes: (items, envelope).
    fn split(body: &[u8], chunk: usize) -> Result<(Vec<String>, String), ListBodyError> {
        split_capped(body, chunk, usize::MAX)
    }

    fn split_capped(body: &[u8], chunk: usize, max: usize) -> Result<(Vec<String>, String), ListBodyError> {
        let mut s = ListBodySplitter::new(max);
        let mut items = Vec::new();
        for piece in body.chunks(chunk.max(1)) {
            s.push(piece, |i| items.push(String::from_utf8_lossy(i).into_owned()))?;
        }
        Ok((items, String::from_utf8_lossy(&s.finish()?).into_owned()))
    }

    #[test]
    fn items_and_envelope_come_apart_at_any_chunk_size() {
        let body = r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c"},"items":[{"metadata":{"name":"a"},"data":{"k":"{[\"}]\\"}} , {"metadata":{"name":"b","labels":{"items":"[x"}}}]}"#;
        for chunk in 1..=body.len() {
            let (items, envelope) = split(body.as_bytes(), chunk).unwrap();
            assert_eq!(
                items,
                [
                    r#"{"metadata":{"name":"a"},"data":{"k":"{[\"}]\\"}}"#,
                    r#"{"metadata":{"name":"b","labels":{"items":"[x"}}}"#
                ],
                "chunk {chunk}"
            );
            assert_eq!(
                envelope,
                r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"c"},"items":[]}"#
            );
        }
    }

    #[test]
    fn items_before_metadata_and_nested_items_members_are_found() {
        let body = r#"{ "items" : [ ], "metadata": {"items": [1, 2], "resourceVersion": "7"}, "x": [{"items": [3]}] }"#;
        let (items, envelope) = split(body.as_bytes(), 3).unwrap();
        assert!(items.is_empty());
        assert_eq!(
            envelope,
            r#"{ "items" : [], "metadata": {"items": [1, 2], "resourceVersion": "7"}, "x": [{"items": [3]}] }"#
        );
        let (items, _) = split(br#"{"items":[{"a":1},{"b":[{"c":2}]}]}"#, 5).unwrap();
        assert_eq!(items, [r#"{"a":1}"#, r#"{"b":[{"c":2}]}"#]);
    }

    #[test]
    fn only_a_member_named_items_opens_the_items() {
        let body = br#"{"\"items":[{"a":1}],"xitems":[{"b":2}],"items":[{"c":3}]}"#;
        let (items, envelope) = split(body, 7).unwrap();
        assert_eq!(items, [r#"{"c":3}"#]);
        assert_eq!(envelope, r#"{"\"items":[{"a":1}],"xitems":[{"b":2}],"items":[]}"#);
    }

    #[test]
    fn malformed_and_truncated_bodies_are_errors() {
        assert_eq!(split(br#"{"items":[1,2]}"#, 4), Err(ListBodyError::BetweenItems('1')));
        assert_eq!(split(br#"{"items":[{"a":1}"#, 4), Err(ListBodyError::Truncated("`items`")));
        assert_eq!(split(br#"{"items":[{"a":"#, 4), Err(ListBodyError::Truncated("an item")));
        assert_eq!(split(br#"{"metadata":{"#, 4), Err(ListBodyError::Truncated("the list")));
        assert_eq!(split(br#"{"kind":"x"#, 4), Err(ListBodyError::Truncated("a string")));
        assert_eq!(split(b"}", 1), Err(ListBodyError::Unbalanced));
    }

    #[test]
    fn items_and_envelope_at_the_cap_pass_and_longer_ones_are_refused() {
        let body = br#"{"metadata":{},"items":[{"a":"0123456789"},{"b":1}]}"#;
        // The first item is 18 bytes, the envelope `{"metadata":{},"items":[]}` 26.
        for chunk in 1..=body.len() {
            let (items, envelope) = split_capped(body, chunk, 26).unwrap();
            assert_eq!(items, [r#"{"a":"0123456789"}"#, r#"{"b":1}"#]);
            assert_eq!(envelope, r#"{"metadata":{},"items":[]}"#);
            let error = split_capped(body, chunk, 25).unwrap_err();
            assert!(
                matches!(error, ListBodyError::TooLarge { what: "the envelope", len: 26, limit: 25 }),
                "chunk {chunk}: {error:?}"
            );
            // `{"items":[]}` is 12 bytes: the item is what is too long.
            let error = split_capped(br#"{"items":[{"a":"0123456789"}]}"#, chunk, 17).unwrap_err();
            assert!(
                matches!(error, ListBodyError::TooLarge { what: "an item", len, limit: 17 } if len > 17),
                "chunk {chunk}: {error:?}"
            );
        }
    }

    #[test]
    fn an_item_or_envelope_that_never_ends_is_refused_once_past_the_cap() {
        let piece = [b'x'; 300];
        let mut s = ListBodySplitter::new(1000);
        s.push(br#"{"items":[{"a":""#, |_| panic!("no item completes")).unwrap();
        let mut pushes = 0;
        let error = loop {
            pushes += 1;
            if let Err(e) = s.push(&piece, |_| panic!("no item completes")) {
                break e;
            }
            assert!(s.buf.len() <= 1000, "kept bytes stay under the cap");
        };
        assert_eq!(pushes, 4);
        assert_eq!(error, ListBodyError::TooLarge { what: "an item", len: 1206, limit: 1000 });
        assert!(s.buf.is_empty(), "nothing of the refused item is kept");

        let mut s = ListBodySplitter::new(1000);
        s.push(br#"{"x":""#, |_| {}).unwrap();
        let error = loop {
            if let Err(e) = s.push(&piece, |_| {}) {
                break e;
            }
            assert!(s.envelope.len() <= 1000, "kept bytes stay under the cap");
        };
        assert_eq!(error, ListBodyError::TooLarge { what: "the envelope", len: 1206, limit: 1000 });
    }

    fn json_string() -> impl Strategy<Value = String> {
        // Characters JSON structure is made of, escapes and non-ASCII among plain ones.
        proptest::collection::vec(
            prop_oneof![
                Just('{'),
                Just('}'),
                Just('['),
                Just(']'),
                Just('"'),
                Just('\\'),
                Just(','),
                Just(':'),
                Just('é'),
                Just('\n'),
                proptest::char::range('a', 'e')
            ],
            0..12,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            json_string().prop_map(serde_json::Value::from),
            any::<i32>().prop_map(serde_json::Value::from),
            Just(serde_json::Value::Null),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![json_string(), Just("items".to_owned())],
                    inner,
                    0..4
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the items hold and however the body is cut, the splitter returns what a
        /// full parse of the body finds: the same items, byte for byte, and the envelope.
        #[test]
        fn splitting_matches_a_full_parse(
            items in proptest::collection::vec(
                proptest::collection::btree_map(json_string(), value(), 0..4), 0..5),
            meta in value(),
            pretty in any::<bool>(),
            chunk in 1usize..64,
        ) {
            let list = serde_json::json!({ "kind": "List", "metadata": meta, "items": items });
            let body = if pretty { serde_json::to_vec_pretty(&list) } else { serde_json::to_vec(&list) }.unwrap();
            let (got, envelope) = split(&body, chunk).unwrap();
            let want: Vec<serde_json::Value> = items.iter().map(|m| serde_json::to_value(m).unwrap()).collect();
            let got_values: Vec<serde_json::Value> = got.iter().map(|i| serde_json::from_str(i).unwrap()).collect();
            prop_assert_eq!(got_values, want);
            let envelope: serde_json::Value = serde_json::from_str(&envelope).unwrap();
            prop_assert_eq!(&envelope["metadata"], &list["metadata"]);
            prop_assert_eq!(&envelope["items"], &serde_json::json!([]));
        }

        /// Any bytes at all: an error or a result, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256), chunk in 1usize..16) {
            let _ = split(&body, chunk);
        }
    }
}
