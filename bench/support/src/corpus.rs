//! The generated ConfigMaps every benchmark consumer reads: `objects` objects of ~2 KB in
//! the initial list, then `updates` watch updates that cycle through them.
//!
//! Invariants:
//! - Deterministic: every byte depends only on the object's index and the update's index,
//!   except the [`SENT_ANNOTATION`] stamp, which is the moment the server wrote the object.
//! - Object `i` is `ns-{i % 10}/cm-{i}`. Listed, it has resourceVersion `FIRST_RV + i` and
//!   [`SEQ_ANNOTATION`] `list`; the list's own resourceVersion is [`Corpus::list_rv`].
//! - Update `u` (0-based) rewrites object `u % objects` with resourceVersion
//!   `list_rv + 1 + u`, [`SEQ_ANNOTATION`] `u` and `data.revision` `u / objects + 1`, so
//!   resourceVersions rise strictly along the stream and no update repeats its object's state.
//! - The JSON is what an API server sends: no whitespace, keys in a fixed order.
//! - The protobuf encoding (`crate::protobuf`) of an object or update holds exactly what its
//!   JSON holds: its message is built from the object's own JSON, parsed once.
//!
//! Objects are kept as byte templates split around the changing values, so writing one
//! event is a few copies and three integer formats (the server must outrun every consumer).
//! Their protobuf messages are built on the first protobuf request only (a JSON-only run
//! of a million objects does not pay for them), then cloned and edited per event.

use std::io::Write;
use std::sync::OnceLock;

use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;

use crate::protobuf;

/// Unix time in nanoseconds at which the server wrote the object (decimal string).
pub const SENT_ANNOTATION: &str = "bench.wasmctrl.dev/sent-unix-nanos";
/// The update's index in the watch stream (decimal), or `list` for the initial list.
pub const SEQ_ANNOTATION: &str = "bench.wasmctrl.dev/seq";

/// resourceVersion of the first listed object.
const FIRST_RV: u64 = 1000;
/// Characters of the one large data value (makes an object ~2 KB).
const PAYLOAD_CHARS: usize = 1500;

/// One object's bytes around its changing values:
/// `head` rv `mid` sent `SEQ_PREFIX` seq `tail` revision `END`.
struct Template {
    head: Vec<u8>,
    mid: Vec<u8>,
    tail: Vec<u8>,
}

/// Closes the stamp's value and opens the seq annotation's (checked by a test).
const SEQ_PREFIX: &[u8] = br#"","bench.wasmctrl.dev/seq":""#;
const END: &[u8] = br#""}}"#;

/// The generated objects.
pub struct Corpus {
    templates: Vec<Template>,
    protobuf: OnceLock<Vec<pb_core::ConfigMap>>,
}

impl Corpus {
    /// Generates `objects` ConfigMaps.
    pub fn new(objects: usize) -> Self {
        Corpus { templates: (0..objects).map(template).collect(), protobuf: OnceLock::new() }
    }

    /// How many objects the list holds.
    pub fn objects(&self) -> usize {
        self.templates.len()
    }

    /// The list's resourceVersion; the watch starts after it.
    pub fn list_rv(&self) -> u64 {
        FIRST_RV + self.templates.len() as u64
    }

    /// Appends listed object `i`.
    ///
    /// # Panics
    /// If `i` is not below [`Corpus::objects`].
    pub fn write_listed(&self, out: &mut Vec<u8>, i: usize, sent_unix_nanos: u64) {
        self.write(out, i, FIRST_RV + i as u64, sent_unix_nanos, None, 0);
    }

    /// Appends update `u` as a watch event line (`{"type":"MODIFIED","object":...}\n`).
    ///
    /// # Panics
    /// If the corpus has no objects.
    pub fn write_update_event(&self, out: &mut Vec<u8>, u: u64, sent_unix_nanos: u64) {
        let n = self.templates.len() as u64;
        out.extend_from_slice(br#"{"type":"MODIFIED","object":"#);
        self.write(out, (u % n) as usize, self.list_rv() + 1 + u, sent_unix_nanos, Some(u), u / n + 1);
        out.extend_from_slice(b"}\n");
    }

    /// The whole list response (`ConfigMapList`), every object stamped `sent_unix_nanos`.
    pub fn list_body(&self, sent_unix_nanos: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.templates.len() * 2200 + 128);
        let _ = write!(
            out,
            r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{}"}},"items":["#,
            self.list_rv()
        );
        for i in 0..self.templates.len() {
            if i > 0 {
                out.push(b',');
            }
            self.write_listed(&mut out, i, sent_unix_nanos);
        }
        out.extend_from_slice(b"]}");
        out
    }

    /// Appends update `u` as a protobuf watch frame (length, then a `WatchEvent` of type
    /// `MODIFIED`): the same object as [`Corpus::write_update_event`]'s.
    ///
    /// # Panics
    /// If the corpus has no objects.
    pub fn write_update_frame(&self, out: &mut Vec<u8>, u: u64, sent_unix_nanos: u64) {
        let n = self.templates.len() as u64;
        let cm = self.protobuf_object(
            (u % n) as usize,
            self.list_rv() + 1 + u,
            sent_unix_nanos,
            Some(u),
            u / n + 1,
        );
        let mut body = Vec::new();
        protobuf::write_body(&mut body, "v1", "ConfigMap", &cm);
        protobuf::write_watch_frame(out, "MODIFIED", body);
    }

    /// The whole list response in protobuf (`k8s\0` + `runtime.Unknown` of a
    /// `ConfigMapList`), every object stamped `sent_unix_nanos`.
    pub fn list_body_protobuf(&self, sent_unix_nanos: u64) -> Vec<u8> {
        let list = pb_core::ConfigMapList {
            metadata: Some(pb_meta::ListMeta {
                self_link: Some(String::new()),
                resource_version: Some(self.list_rv().to_string()),
                r#continue: Some(String::new()),
                remaining_item_count: None,
            }),
            items: (0..self.templates.len())
                .map(|i| self.protobuf_object(i, FIRST_RV + i as u64, sent_unix_nanos, None, 0))
                .collect(),
        };
        let mut out = Vec::new();
        protobuf::write_body(&mut out, "v1", "ConfigMapList", &list);
        out
    }

    /// Object `i` as a protobuf message with the given changing values.
    fn protobuf_object(
        &self,
        i: usize,
        rv: u64,
        sent: u64,
        seq: Option<u64>,
        revision: u64,
    ) -> pb_core::ConfigMap {
        let templates = self.protobuf.get_or_init(|| {
            (0..self.templates.len())
                .map(|i| {
                    let mut json = Vec::new();
                    self.write(&mut json, i, 0, 0, None, 0);
                    // The template's own bytes: a parse failure is a bug in `template`, caught
                    // by the tests.
                    let cm: k8s_openapi::api::core::v1::ConfigMap =
                        serde_json::from_slice(&json).expect("the corpus's JSON is a ConfigMap");
                    protobuf::configmap_to_pb(&cm)
                })
                .collect()
        });
        let mut cm = templates[i].clone();
        if let Some(meta) = cm.metadata.as_mut() {
            meta.resource_version = Some(rv.to_string());
            meta.annotations.insert(SENT_ANNOTATION.into(), sent.to_string());
            meta.annotations
                .insert(SEQ_ANNOTATION.into(), seq.map(|u| u.to_string()).unwrap_or_else(|| "list".into()));
        }
        cm.data.insert("revision".into(), revision.to_string());
        cm
    }

    /// Mean bytes of one object's JSON (as listed).
    pub fn json_bytes_per_object(&self) -> f64 {
        if self.templates.is_empty() {
            return 0.0;
        }
        let mut buf = Vec::new();
        let mut total = 0;
        for i in 0..self.templates.len() {
            buf.clear();
            self.write_listed(&mut buf, i, 1_700_000_000_000_000_000);
            total += buf.len();
        }
        total as f64 / self.templates.len() as f64
    }

    fn write(&self, out: &mut Vec<u8>, i: usize, rv: u64, sent: u64, seq: Option<u64>, revision: u64) {
        let t = &self.templates[i];
        out.extend_from_slice(&t.head);
        let _ = write!(out, "{rv}");
        out.extend_from_slice(&t.mid);
        let _ = write!(out, "{sent}");
        out.extend_from_slice(SEQ_PREFIX);
        match seq {
            Some(u) => {
                let _ = write!(out, "{u}");
            }
            None => out.extend_from_slice(b"list"),
        }
        out.extend_from_slice(&t.tail);
        let _ = write!(out, "{revision}");
        out.extend_from_slice(END);
    }
}

fn template(i: usize) -> Template {
    let payload: String = (0..PAYLOAD_CHARS).map(|j| (b'a' + ((i + j) % 26) as u8) as char).collect();
    let (ns, tier) = (i % 10, i % 4);
    let head = format!(
        concat!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}","namespace":"ns-{ns}","#,
            r#""uid":"6f1d{i:08}-aaaa-bbbb-cccc-0123456789ab","resourceVersion":""#
        ),
        i = i,
        ns = ns
    );
    let mid = format!(
        concat!(
            r#"","creationTimestamp":"2026-11-22T18:30:00Z","labels":{{"app":"bench","tier":"t{t}"}},"#,
            r#""annotations":{{"{sent}":""#
        ),
        t = tier,
        sent = SENT_ANNOTATION
    );
    let tail = format!(
        concat!(
            r#"","example.com/owner":"team-{t}","example.com/note":"a short note about object {i}"}}}},"#,
            r#""data":{{"payload":"{payload}","small":"value-{i}","config.yaml":"key: value\nother: {i}\n","#,
            r#""revision":""#
        ),
        t = tier,
        i = i,
        payload = payload
    );
    Template { head: head.into_bytes(), mid: mid.into_bytes(), tail: tail.into_bytes() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
    }

    #[test]
    fn listed_objects_and_updates_are_valid_configmaps() {
        let corpus = Corpus::new(3);
        let list = parse(&corpus.list_body(42));
        assert_eq!(list["metadata"]["resourceVersion"], "1003");
        let items = list["items"].as_array().expect("items");
        assert_eq!(items.len(), 3);
        assert_eq!(items[2]["metadata"]["name"], "cm-2");
        assert_eq!(items[2]["metadata"]["namespace"], "ns-2");
        assert_eq!(items[2]["metadata"]["resourceVersion"], "1002");
        assert_eq!(items[2]["metadata"]["annotations"][SENT_ANNOTATION], "42");
        assert_eq!(items[2]["metadata"]["annotations"][SEQ_ANNOTATION], "list");

        let mut out = Vec::new();
        corpus.write_update_event(&mut out, 4, 7);
        assert_eq!(out.last(), Some(&b'\n'));
        let event = parse(&out);
        assert_eq!(event["type"], "MODIFIED");
        let obj = &event["object"];
        assert_eq!(obj["metadata"]["name"], "cm-1");
        assert_eq!(obj["metadata"]["resourceVersion"], "1008");
        assert_eq!(obj["metadata"]["annotations"][SEQ_ANNOTATION], "4");
        assert_eq!(obj["metadata"]["annotations"][SENT_ANNOTATION], "7");
        assert_eq!(obj["data"]["revision"], "2");
    }

    #[test]
    fn protobuf_holds_what_the_json_holds() {
        let corpus = Corpus::new(3);
        let as_json = |cm: k8s_openapi::api::core::v1::ConfigMap| {
            let mut v = serde_json::to_value(cm).expect("json");
            v["apiVersion"] = "v1".into();
            v["kind"] = "ConfigMap".into();
            v
        };

        let list = protobuf::read_body(&corpus.list_body_protobuf(42)).expect("list body");
        assert_eq!(list.type_meta.and_then(|t| t.kind).as_deref(), Some("ConfigMapList"));
        let list =
            <pb_core::ConfigMapList as prost::Message>::decode(list.raw.as_deref().unwrap_or_default())
                .expect("ConfigMapList");
        assert_eq!(list.metadata.and_then(|m| m.resource_version).as_deref(), Some("1003"));
        let json_list = parse(&corpus.list_body(42));
        assert_eq!(list.items.len(), 3);
        for (pb, json) in list.items.into_iter().zip(json_list["items"].as_array().expect("items")) {
            assert_eq!(&as_json(protobuf::configmap_from_pb(pb).expect("decodes")), json);
        }

        let mut frames = Vec::new();
        let mut lines = Vec::new();
        for u in 0..5 {
            corpus.write_update_frame(&mut frames, u, 7 + u);
            corpus.write_update_event(&mut lines, u, 7 + u);
        }
        let (events, used) = protobuf::read_watch_frames(&frames).expect("frames");
        assert_eq!(used, frames.len());
        let lines: Vec<serde_json::Value> =
            lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(parse).collect();
        assert_eq!(events.len(), lines.len());
        for (event, line) in events.iter().zip(&lines) {
            assert_eq!(event.r#type.as_deref(), Some("MODIFIED"));
            let cm = protobuf::configmap_of_event(event).expect("object");
            assert_eq!(as_json(protobuf::configmap_from_pb(cm).expect("decodes")), line["object"]);
        }
    }

    #[test]
    fn objects_are_about_two_kilobytes_and_deterministic() {
        let a = Corpus::new(50);
        let per = a.json_bytes_per_object();
        assert!((1900.0..2300.0).contains(&per), "{per}");
        assert_eq!(a.list_body(1), Corpus::new(50).list_body(1));
    }
}
