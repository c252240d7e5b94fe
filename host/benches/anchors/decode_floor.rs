//! Rust's decode floor on the benchmark's watch stream (`anchors consume floor`): the same
//! update events the stream server sends, generated in memory from the same corpus, decoded
//! `rounds` times along each path below on one thread, with no informer, store or HTTP. Every
//! path reads each object's sequence annotation, as the informers' handlers do.
//!
//! - JSON lines: `serde_json::Value` (untyped, every field built); `serde_json` into
//!   `k8s-openapi`'s `WatchEvent<ConfigMap>` (full typed decode, what kube-rs does);
//!   wasmctrl's `Object::from_api_json` on the event's object (lazy: the envelope split as the
//!   reflector splits it, metadata decoded, the object's bytes kept, `data` validated only).
//! - Protobuf frames: prost into `k8s-pb`'s `WatchEvent`, `runtime.Unknown` and `ConfigMap`
//!   (full typed decode); and the same followed by a JSON re-encode of the ConfigMap
//!   (`k8s-openapi`'s type, `serde_json`): the least a reflector reading protobuf would do to
//!   hand a plugin JSON, the prototype the table's protobuf decision rests on.

use serde_json::{Value, json};
use wasmctrl::object::{Object, Transform};
use wasmctrl_bench_support::{Corpus, SEQ_ANNOTATION, protobuf, unix_nanos};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The paths, in the order the table shows them: (name, wire, work per event).
pub const PATHS: [(&str, &str, &str); 5] = [
    ("serde_json::Value", "JSON", "untyped: every field built as a Value"),
    ("serde_json → k8s-openapi ConfigMap", "JSON", "full typed decode"),
    ("wasmctrl Object::from_api_json", "JSON", "lazy: metadata decoded, object bytes kept"),
    ("prost → k8s-pb ConfigMap", "protobuf", "full typed decode"),
    ("prost → k8s-pb → JSON re-encode", "protobuf", "full typed decode, then JSON for the plugin"),
];

fn seq_of_value(v: &Value) -> usize {
    v["object"]["metadata"]["annotations"][SEQ_ANNOTATION].as_str().map_or(0, str::len)
}

fn seq_of_typed(cm: &k8s_openapi::api::core::v1::ConfigMap) -> usize {
    cm.metadata.annotations.as_ref().and_then(|a| a.get(SEQ_ANNOTATION)).map_or(0, String::len)
}

/// One pass of path `index` over the stream; the number of events decoded.
fn pass(index: usize, lines: &[&[u8]], frames: &[u8]) -> Result<usize, Error> {
    let mut sink = 0usize;
    let mut count = 0usize;
    match index {
        0 => {
            for line in lines {
                sink += seq_of_value(&serde_json::from_slice::<Value>(line)?);
                count += 1;
            }
        }
        1 => {
            use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
            for line in lines {
                match serde_json::from_slice::<WatchEvent<k8s_openapi::api::core::v1::ConfigMap>>(line)? {
                    WatchEvent::Modified(cm) => sink += seq_of_typed(&cm),
                    _ => return Err("not a MODIFIED event".into()),
                }
                count += 1;
            }
        }
        2 => {
            for line in lines {
                // The reflector's fast path: the API server's own envelope, split in place.
                let object = line
                    .strip_prefix(br#"{"type":"MODIFIED","object":"#)
                    .and_then(|r| r.strip_suffix(b"}"))
                    .ok_or("not a MODIFIED event line")?;
                let obj = Object::from_api_json(object, None, Transform::default())?;
                sink += obj.annotation(SEQ_ANNOTATION).map_or(0, str::len);
                count += 1;
            }
        }
        3 | 4 => {
            let mut at = 0;
            while at < frames.len() {
                let (events, used) = protobuf::read_watch_frames(&frames[at..])?;
                if used == 0 {
                    return Err("a partial frame".into());
                }
                at += used;
                for event in &events {
                    let cm = protobuf::configmap_of_event(event)?;
                    if index == 3 {
                        sink += cm
                            .metadata
                            .as_ref()
                            .and_then(|m| m.annotations.get(SEQ_ANNOTATION))
                            .map_or(0, String::len);
                    } else {
                        let json = serde_json::to_vec(&protobuf::configmap_from_pb(cm)?)?;
                        sink += json.len();
                    }
                    count += 1;
                }
            }
        }
        _ => return Err(format!("no decode path {index}").into()),
    }
    std::hint::black_box(sink);
    Ok(count)
}

/// Events/s of each path, one figure per round, and the bytes per event of each encoding.
pub fn run(objects: usize, updates: u64, rounds: usize) -> Result<Value, Error> {
    let corpus = Corpus::new(objects.max(1));
    let (mut json_stream, mut frames) = (Vec::new(), Vec::new());
    for u in 0..updates {
        corpus.write_update_event(&mut json_stream, u, unix_nanos());
        corpus.write_update_frame(&mut frames, u, unix_nanos());
    }
    let lines: Vec<&[u8]> = json_stream.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
    let mut figures = vec![Vec::new(); PATHS.len()];
    for _ in 0..rounds {
        for (i, figure) in figures.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            let count = pass(i, &lines, &frames)?;
            if count as u64 != updates {
                return Err(format!("{}: decoded {count} of {updates} events", PATHS[i].0).into());
            }
            figure.push(count as f64 / start.elapsed().as_secs_f64());
        }
    }
    let per_sec: serde_json::Map<String, Value> =
        PATHS.iter().zip(figures).map(|((name, ..), f)| (name.to_string(), json!(f))).collect();
    Ok(json!({
        "impl": "rust-decode",
        "events_per_sec": per_sec,
        "json_bytes_per_event": json_stream.len() as f64 / updates as f64,
        "protobuf_bytes_per_event": frames.len() as f64 / updates as f64,
    }))
}
