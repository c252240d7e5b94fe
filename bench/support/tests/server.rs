//! The stream server over real HTTP: discovery, the list, exactly one watch stream, pacing.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmctrl_bench_support::{Pace, SEQ_ANNOTATION, StreamConfig, StreamServer, protobuf};

async fn get(url: &str, path: &str) -> tokio::net::TcpStream {
    get_accepting(url, path, None).await
}

async fn get_accepting(url: &str, path: &str, accept: Option<&str>) -> tokio::net::TcpStream {
    let addr = url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("request");
    tcp
}

/// The status line, the headers (lower-cased names) and the body of a complete response.
async fn response(url: &str, path: &str, accept: Option<&str>) -> (String, Vec<(String, String)>, Vec<u8>) {
    let mut tcp = get_accepting(url, path, accept).await;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.expect("response");
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("headers end");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v == "chunked");
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).expect("size"), 16).expect("hex");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The body of a complete (non-streaming) response.
async fn get_body(url: &str, path: &str) -> serde_json::Value {
    let mut tcp = get(url, path).await;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.expect("response");
    let text = String::from_utf8(raw).expect("utf-8");
    assert!(text.starts_with("HTTP/1.1 200"), "{}", &text[..text.len().min(200)]);
    let (_, body) = text.split_once("\r\n\r\n").expect("headers end");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Reads a streaming response until `count` watch events arrived (or `limit` passed).
async fn read_events(tcp: &mut tokio::net::TcpStream, count: usize, limit: Duration) -> Vec<u8> {
    let mut raw = Vec::new();
    let deadline = Instant::now() + limit;
    let events = |raw: &[u8]| raw.windows(10).filter(|w| w == b"\"MODIFIED\"").count();
    let mut buf = [0u8; 65536];
    while events(&raw) < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("{e}"),
        }
    }
    raw
}

#[tokio::test]
async fn serves_discovery_the_list_and_one_watch() {
    let server = StreamServer::start(StreamConfig {
        objects: 3,
        updates: 5,
        pace: Pace::Flat,
        expire_first_watch: None,
    })
    .await
    .expect("server");
    let url = server.url().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let resources = get_body(&url, "/api/v1").await;
    assert_eq!(resources["resources"][0]["kind"], "ConfigMap");
    assert_eq!(get_body(&url, "/api").await["versions"][0], "v1");

    let list = get_body(&url, "/api/v1/configmaps?limit=500&resourceVersion=0").await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3));
    assert!(list["metadata"].get("continue").is_none());
    assert_eq!(list["metadata"]["resourceVersion"], "1003");

    let mut watch = get(&url, "/api/v1/configmaps?watch=true&resourceVersion=1003").await;
    let raw = read_events(&mut watch, 5, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&raw);
    for u in 0..5 {
        assert!(text.contains(&format!(r#""{SEQ_ANNOTATION}":"{u}""#)), "update {u} missing");
    }

    // A second watch from the same resourceVersion gets nothing (no update twice).
    let mut again = get(&url, "/api/v1/configmaps?watch=true&resourceVersion=1003").await;
    let raw = read_events(&mut again, 1, Duration::from_millis(300)).await;
    assert!(!String::from_utf8_lossy(&raw).contains("MODIFIED"));
}

#[tokio::test]
async fn a_paced_watch_sends_no_update_before_it_is_due() {
    let pace = Pace::PerSecond { rate: 1000, warmup: Duration::ZERO };
    let server =
        StreamServer::start(StreamConfig { objects: 10, updates: 50, pace, expire_first_watch: None })
            .await
            .expect("server");
    let started = Instant::now();
    let mut watch = get(server.url(), "/api/v1/configmaps?watch=true&resourceVersion=1010").await;
    let raw = read_events(&mut watch, 50, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&raw).contains(&format!(r#""{SEQ_ANNOTATION}":"49""#)));
    // Update 49 is due 49 ms after the watch started.
    assert!(started.elapsed() >= Duration::from_millis(49), "{:?}", started.elapsed());
}

#[tokio::test]
async fn an_expiring_first_watch_ends_with_410_and_the_next_one_streams() {
    let config = StreamConfig {
        objects: 3,
        updates: 2,
        pace: Pace::Flat,
        expire_first_watch: Some(Duration::from_millis(50)),
    };
    let server = StreamServer::start(config).await.expect("server");
    let url = server.url().to_owned();

    let mut first = get(&url, "/api/v1/configmaps?watch=true&resourceVersion=1003").await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), first.read_to_end(&mut raw))
        .await
        .expect("the expired watch ends")
        .expect("read");
    let text = String::from_utf8_lossy(&raw);
    let (_, body) = text.split_once("\r\n\r\n").expect("headers end");
    assert!(body.contains(r#""type":"ERROR""#) && body.contains(r#""code":410"#), "{body}");
    assert!(!body.contains("MODIFIED"), "{body}");

    // The relist's watch, from the same resourceVersion, gets the updates.
    let mut second = get(&url, "/api/v1/configmaps?watch=true&resourceVersion=1003").await;
    let raw = read_events(&mut second, 2, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&raw).contains(&format!(r#""{SEQ_ANNOTATION}":"1""#)));
}

#[tokio::test]
async fn accept_chooses_json_or_protobuf_as_the_api_server_does() {
    let config = StreamConfig { objects: 4, updates: 3, pace: Pace::Flat, expire_first_watch: None };
    let server = StreamServer::start(config).await.expect("server");
    let url = server.url().to_owned();
    let list = "/api/v1/configmaps?resourceVersion=0";

    // client-go's typed clients: protobuf first.
    let (status, headers, body) =
        response(&url, list, Some("application/vnd.kubernetes.protobuf,application/json")).await;
    assert!(status.contains("200"), "{status}");
    assert_eq!(header(&headers, "content-type"), Some("application/vnd.kubernetes.protobuf"));
    let unknown = protobuf::read_body(&body).expect("a protobuf body");
    assert_eq!(unknown.type_meta.and_then(|t| t.kind).as_deref(), Some("ConfigMapList"));

    // kubectl's Table first, which the server does not serve: the JSON after it.
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let (_, headers, body) = response(&url, list, Some(table)).await;
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(json["kind"], "ConfigMapList");

    // Nothing the server can serve: 406 with a Status.
    let (status, _, body) = response(&url, list, Some("application/yaml")).await;
    assert!(status.contains("406"), "{status}");
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(json["reason"], "NotAcceptable");
    // Discovery is JSON only.
    let (status, _, _) = response(&url, "/api/v1", Some("application/vnd.kubernetes.protobuf")).await;
    assert!(status.contains("406"), "{status}");
    let (status, _, _) =
        response(&url, "/api/v1", Some("application/vnd.kubernetes.protobuf,application/json")).await;
    assert!(status.contains("200"), "{status}");

    // The watch in protobuf: length-delimited WatchEvent frames.
    let mut watch = get_accepting(
        &url,
        "/api/v1/configmaps?watch=true&resourceVersion=1004",
        Some("application/vnd.kubernetes.protobuf"),
    )
    .await;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(10);
    let frames = loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            assert!(text.contains("application/vnd.kubernetes.protobuf;stream=watch"), "{text}");
            let (events, _) = protobuf::read_watch_frames(&dechunk(&raw[end + 4..])).expect("frames");
            if events.len() == 3 {
                break events;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, watch.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => raw.extend_from_slice(&buf[..n]),
            other => panic!("watch ended early: {other:?}"),
        }
    };
    for (u, event) in frames.iter().enumerate() {
        assert_eq!(event.r#type.as_deref(), Some("MODIFIED"));
        let cm = protobuf::configmap_of_event(event).expect("ConfigMap");
        let seq = cm.metadata.and_then(|m| m.annotations.get(SEQ_ANNOTATION).cloned());
        assert_eq!(seq, Some(u.to_string()));
    }
}

#[tokio::test]
async fn an_expiring_protobuf_watch_ends_with_a_410_status_frame() {
    let config = StreamConfig {
        objects: 2,
        updates: 1,
        pace: Pace::Flat,
        expire_first_watch: Some(Duration::from_millis(20)),
    };
    let server = StreamServer::start(config).await.expect("server");
    let (_, headers, body) = response(
        server.url(),
        "/api/v1/configmaps?watch=true&resourceVersion=1002",
        Some("application/vnd.kubernetes.protobuf"),
    )
    .await;
    assert_eq!(header(&headers, "content-type"), Some("application/vnd.kubernetes.protobuf;stream=watch"));
    let (events, used) = protobuf::read_watch_frames(&body).expect("frames");
    assert_eq!((events.len(), used), (1, body.len()));
    assert_eq!(events[0].r#type.as_deref(), Some("ERROR"));
    let raw = events[0].object.as_ref().and_then(|o| o.raw.as_deref()).expect("object");
    let unknown = protobuf::read_body(raw).expect("Status body");
    let status = <k8s_pb::apimachinery::pkg::apis::meta::v1::Status as prost::Message>::decode(
        unknown.raw.as_deref().unwrap_or_default(),
    )
    .expect("Status");
    assert_eq!((status.code, status.reason.as_deref()), (Some(410), Some("Expired")));
}
