//! client-go reads the stream server's protobuf as it reads the API server's: the Go program
//! `bench/anchors/decode -mode check` lists and watches through client-go's typed clients in
//! protobuf and JSON, and re-encodes what it read with apimachinery's serializers, which must
//! give the server's bytes back (see that program's header).
//!
//! Needs Go (as the real-API-server tests do); without it the test says so and passes, as
//! `cargo xtask test` skips the real-API-server half without Go.

use std::path::PathBuf;
use std::process::Command;

use wasmctrl_bench_support::{Pace, StreamConfig, StreamServer};

fn anchors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anchors")
}

#[tokio::test]
async fn client_go_decodes_the_protobuf_list_and_watch_byte_for_byte() {
    if !Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: go is not installed");
        return;
    }
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("anchors-go");
    let built = Command::new("go")
        .current_dir(anchors_dir())
        .args(["build", "-trimpath", "-o"])
        .arg(out_dir.join("decode"))
        .arg("./decode")
        .output()
        .expect("go build");
    assert!(built.status.success(), "go build: {}", String::from_utf8_lossy(&built.stderr));

    let (objects, updates) = (25, 60);
    let config = StreamConfig { objects, updates, pace: Pace::Flat, expire_first_watch: None };
    let typed = StreamServer::start(config).await.expect("server");
    let raw = StreamServer::start(config).await.expect("server");
    let program = out_dir.join("decode");
    let (typed_url, raw_url) = (typed.url().to_owned(), raw.url().to_owned());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(program)
            .args(["-mode", "check", "-url", &typed_url, "-raw-url", &raw_url, "-timeout", "60s"])
            .args(["-objects", &objects.to_string(), "-updates", &updates.to_string()])
            .output()
            .expect("run decode")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no result line: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["listed"], objects, "{result}");
    assert_eq!(result["watched"], updates, "{result}");
    // The typed client asked for protobuf and got it, for the list and the watch.
    assert_eq!(
        result["wire"],
        serde_json::json!([
            "application/vnd.kubernetes.protobuf",
            "application/vnd.kubernetes.protobuf;stream=watch"
        ]),
        "{result}"
    );
}
