//! Hot-reload swap latency: from the manager noticing a changed `.wasm` to the new version
//! serving (its reconciler swapped in, its handlers wired, every key re-enqueued), with a
//! warm compile cache (the build was compiled before) and cold (a build never seen).
//!
//! The change is noticed through `PluginManager::rescan` (what SIGHUP does), so the file
//! watcher's debounce period (200 ms by default) is not part of the figure.
//!
//! `cargo bench -p wasmctrl --bench reload [-- --samples N --objects M]`. Needs the test
//! plugins built (`cargo xtask build-guests`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use wasmctrl::informer::{FactoryOptions, InformerFactory};
use wasmctrl::metrics::Metrics;
use wasmctrl::plugin::{EngineConfig, KubeServices, PluginEngine};
use wasmctrl::reload::{FactoryLeases, ManagerDeps, ManagerOptions, PluginManager, version_of};
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

fn build(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
}

/// `wasm` with a custom section appended: the same program, a content hash never seen (so
/// the compile cache misses).
fn unique(wasm: &[u8], n: usize) -> Vec<u8> {
    let name = b"wasmctrl-bench";
    let payload = format!("cold-{n}-{}", std::process::id());
    let mut body = Vec::new();
    leb(&mut body, name.len());
    body.extend_from_slice(name);
    body.extend_from_slice(payload.as_bytes());
    let mut out = wasm.to_vec();
    out.push(0); // custom section
    leb(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

fn leb(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "{label:<28} n={:<4} median {:>8.2} ms   p90 {:>8.2} ms   max {:>8.2} ms",
        samples.len(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.9).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    );
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench`-less args: keep it quick.
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let samples = arg("--samples", 20);
    let objects = arg("--objects", 100);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let cluster = DevCluster::start(DevClusterConfig::plain_http()).await.expect("dev cluster");
        let mut yaml = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: bench\n".to_owned();
        for i in 0..objects {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: src-{i}\n  namespace: bench\n  labels:\n    role: src\ndata:\n  value: \"{i}\"\n"
            ));
        }
        cluster.apply_yaml(&yaml).expect("seed");
        let client = cluster.client().expect("client");
        let metrics = Metrics::new();
        let cache = tempfile::tempdir().expect("tempdir");
        let engine = PluginEngine::new(
            EngineConfig { cache_dir: Some(cache.path().to_owned()), ..EngineConfig::default() },
            Some(&metrics),
        )
        .expect("engine");
        let dir = tempfile::tempdir().expect("tempdir");
        let install = |file: &str, bytes: &[u8]| {
            let tmp = dir.path().join(format!(".{file}.tmp"));
            std::fs::write(&tmp, bytes).expect("write");
            std::fs::rename(&tmp, dir.path().join(file)).expect("rename");
        };
        install(
            "stamp.toml",
            b"concurrency = 2\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"bench\"\nlabel-selector = \"role=src\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n",
        );
        let (a, b) = (build("reload-stamp-a"), build("reload-stamp-b"));
        install("stamp.wasm", &a);
        let deps = ManagerDeps {
            engine,
            informers: Arc::new(FactoryLeases(InformerFactory::new(client.clone(), FactoryOptions::default()))),
            kube: Some(KubeServices::new(client, tokio::runtime::Handle::current(), "bench")),
            metrics,
        };
        let shutdown = CancellationToken::new();
        let manager = PluginManager::start(ManagerOptions { watch: false, ..ManagerOptions::new(dir.path()) }, deps, shutdown.clone())
            .await
            .expect("manager");
        let swap = |bytes: Vec<u8>| {
            install("stamp.wasm", &bytes);
            let manager = &manager;
            async move {
                let started = Instant::now();
                manager.rescan().await;
                let elapsed = started.elapsed();
                let status = manager.status().get("stamp").expect("status");
                assert_eq!(status.version, Some(version_of(&bytes)), "swap did not take: {status:?}");
                elapsed
            }
        };
        // Both builds compiled once: the cache is warm from here on.
        swap(b.clone()).await;
        swap(a.clone()).await;
        let mut warm = Vec::new();
        for i in 0..samples {
            warm.push(swap(if i % 2 == 0 { b.clone() } else { a.clone() }).await);
        }
        let mut cold = Vec::new();
        for i in 0..samples.min(10) {
            cold.push(swap(unique(if i % 2 == 0 { &b } else { &a }, i)).await);
        }
        println!("hot-reload swap latency ({objects} objects of the `for` kind re-enqueued per swap)");
        summary("warm compile cache", warm);
        summary("cold (compile)", cold);
        shutdown.cancel();
        manager.stopped().await;
        cluster.shutdown().await;
    });
}
