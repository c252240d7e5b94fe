//! The stream server over real HTTP: discovery, the list, exactly one watch stream, pacing.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmctrl_bench_support::{Pace, SEQ_ANNOTATION, StreamConfig, StreamServer};

async fn get(url: &str, path: &str) -> tokio::net::TcpStream {
    let addr = url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.expect("request");
    tcp
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
