//! Sharding figures (`docs/sharding.md`): `cargo bench -p wasmctrl --bench sharding`.
//!
//! 1. **Ring**: keys moved when a fourth replica joins three and when one of three leaves
//!    (fraction of 100,000 keys, against the ideal 1/4 and 1/3), and the balance at three
//!    replicas (largest / smallest share of the ring, and of the keys).
//! 2. **Label**: the time the assignment role needs to label `SHARDING_BENCH_OBJECTS`
//!    (default 100,000) unlabelled ConfigMaps of ~2 KB: one replica in label mode, from its
//!    start until every object carries its label.
//! 3. **RSS**: the resident memory of each replica at 1, 2 and 3 replicas over the same
//!    objects, in label mode (each caches its share) and in no-write mode (each caches
//!    everything), once every replica's plugin has reconciled every key it owns.
//! 4. **Takeover**: three replicas with the default Lease timings (15 s / 10 s / 2 s); one
//!    is killed with SIGKILL; the time until the survivors complete the epoch that hands its
//!    keys over.
//!
//! Replicas are `wasmctrl run` processes (release build) with a no-op plugin, against the
//! API server of `wasmctrl-testkit` (the embedded dev cluster in this process by default,
//! `WASMCTRL_TEST_BACKEND=real` for `realcluster/`). `SHARDING_BENCH_ONLY=ring,label,rss,takeover`
//! runs a subset. The machine is whatever it is: run it alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;
use wasmctrl::config::DEFAULT_VIRTUAL_NODES;
use wasmctrl::shard::ring::Ring;
use wasmctrl_testkit::TestCluster;

const LABEL: &str = "sharding-bench";

fn only(part: &str) -> bool {
    std::env::var("SHARDING_BENCH_ONLY").map_or(true, |o| o.split(',').any(|p| p.trim() == part))
}

fn objects() -> usize {
    std::env::var("SHARDING_BENCH_OBJECTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

// ---------------------------------------------------------------------------------------
// 1. The ring.

fn ring_figures() {
    let keys: Vec<String> = (0..100_000).map(|i| format!("team-{}/object-{i}", i % 37)).collect();
    let names = ["wasmctrl-7d9f8b6c4-x2k8q", "wasmctrl-7d9f8b6c4-p9z4m", "wasmctrl-7d9f8b6c4-c7v5n"];
    let three = Ring::new(names, DEFAULT_VIRTUAL_NODES);
    let four = Ring::new(names.iter().copied().chain(["wasmctrl-7d9f8b6c4-h3b6t"]), DEFAULT_VIRTUAL_NODES);
    let two = Ring::new(names[1..].iter().copied(), DEFAULT_VIRTUAL_NODES);
    let moved = |a: &Ring, b: &Ring| {
        keys.iter().filter(|k| a.owner(k) != b.owner(k)).count() as f64 / keys.len() as f64
    };
    println!("ring: {} virtual nodes per replica, 100,000 keys", DEFAULT_VIRTUAL_NODES);
    println!("  join (3 -> 4): {:.1} % of keys moved (ideal 25.0 %)", 100.0 * moved(&three, &four));
    println!("  leave (3 -> 2): {:.1} % of keys moved (ideal 33.3 %)", 100.0 * moved(&three, &two));
    let shares: Vec<f64> = three.shares().into_iter().map(|(_, s)| s).collect();
    let ratio =
        |v: &[f64]| v.iter().cloned().fold(0.0, f64::max) / v.iter().cloned().fold(f64::MAX, f64::min);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for k in &keys {
        *counts.entry(three.owner(k).unwrap_or("")).or_default() += 1;
    }
    let counts: Vec<f64> = counts.values().map(|c| *c as f64).collect();
    println!(
        "  balance at 3 replicas: ring shares {:?} (largest/smallest {:.3}); keys {:?} ({:.3})",
        shares.iter().map(|s| format!("{:.1} %", 100.0 * s)).collect::<Vec<_>>(),
        ratio(&shares),
        counts,
        ratio(&counts),
    );
}

// ---------------------------------------------------------------------------------------
// Replicas.

#[derive(Default)]
struct Seen {
    /// Replica → its latest completed epoch and members.
    completed: Mutex<HashMap<String, (u64, BTreeSet<String>)>>,
    /// Replica → its metrics address.
    address: Mutex<HashMap<String, String>>,
    changed: Notify,
}

impl Seen {
    async fn wait(&self, what: &str, patience: Duration, mut ready: impl FnMut(&Seen) -> bool) {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(self) {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => panic!("timed out waiting for {what}"),
            }
        }
    }

    fn stable(&self, members: &[&str]) -> bool {
        let want: BTreeSet<String> = members.iter().map(|m| (*m).to_owned()).collect();
        let completed = self.completed.lock();
        let epochs: BTreeSet<u64> = want.iter().filter_map(|r| completed.get(r)).map(|(e, _)| *e).collect();
        epochs.len() == 1 && want.iter().all(|r| completed.get(r).is_some_and(|(_, m)| *m == want))
    }
}

struct Replica {
    name: String,
    child: tokio::process::Child,
}

impl Replica {
    fn spawn(
        dir: &Path,
        kubeconfig: &Path,
        ring: &str,
        ns: &str,
        mode: &str,
        name: &str,
        seen: &Arc<Seen>,
    ) -> Replica {
        let toml = dir.join(format!("{name}.toml"));
        std::fs::write(
            &toml,
            format!(
                "plugins-dir = \"plugins\"\ncache-dir = \"cache\"\n\n[cluster]\nmode = \"kubeconfig\"\nkubeconfig = \"{}\"\n\n\
                 [server]\naddress = \"127.0.0.1:0\"\n\n[sharding]\nenabled = true\nring = \"{ring}\"\nnamespace = \"{ns}\"\nmode = \"{mode}\"\n",
                kubeconfig.display()
            ),
        )
        .expect("host TOML");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmctrl"))
            .args(["run", "--log-format", "json", "--config"])
            .arg(&toml)
            .env("WASMCTRL_SHARD_NAME", name)
            .env("RUST_LOG", "info,wasmctrl::plugin::guest=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("wasmctrl starts");
        let stderr = child.stderr.take().expect("stderr");
        let (seen, replica) = (seen.clone(), name.to_owned());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
                let fields = &v["fields"];
                let message = fields["message"].as_str().unwrap_or("");
                if message.starts_with("ring epoch completed") {
                    let members = fields["members"]
                        .as_str()
                        .unwrap_or("")
                        .split('"')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect();
                    let epoch = fields["epoch"].as_u64().unwrap_or(0);
                    seen.completed.lock().insert(replica.clone(), (epoch, members));
                } else if message.starts_with("serving /metrics") {
                    if let Some(a) = fields["address"].as_str() {
                        seen.address.lock().insert(replica.clone(), a.to_owned());
                    }
                } else if v["level"] == "ERROR" {
                    eprintln!("[{replica}] {line}");
                }
                seen.changed.notify_waiters();
            }
        });
        Replica { name: name.to_owned(), child }
    }

    fn rss_mib(&self) -> f64 {
        let Some(pid) = self.child.id() else { return 0.0 };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}

/// A metric's value from a replica's `/metrics`.
async fn metric(address: &str, name: &str) -> f64 {
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else { return 0.0 };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return 0.0;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A scratch directory with the no-op plugin (`bench` test plugin) for `ns`.
fn plugin_dir(ns: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("plugins")).expect("plugins dir");
    std::fs::write(
        dir.path().join("plugins/noop.toml"),
        format!(
            "name = \"noop\"\nconcurrency = 4\n\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n\
             label-selector = \"{LABEL}=yes\"\n"
        ),
    )
    .expect("plugin TOML");
    std::fs::write(dir.path().join("plugins/noop.wasm"), wasmctrl_testkit::guests::wasm("witness-a"))
        .expect("plugin");
    dir
}

/// Creates `n` ConfigMaps of ~2 KB in `ns` (through the dev cluster's store when there is
/// one, else through the API, 32 at a time).
async fn seed(cluster: &TestCluster, ns: &str, n: usize) {
    let filler = "x".repeat(1900);
    if let Some(dev) = cluster.dev() {
        for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
            let yaml: String = chunk
                .iter()
                .map(|i| {
                    format!(
                        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n  namespace: {ns}\n  labels:\n    {LABEL}: \"yes\"\ndata:\n  filler: {filler}\n"
                    )
                })
                .collect();
            dev.apply_yaml(&yaml).expect("seeded");
        }
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), ns);
    let names: Vec<usize> = (0..n).collect();
    futures::future::join_all(names.chunks(n.div_ceil(32).max(1)).map(|chunk| {
        let (api, filler) = (api.clone(), filler.clone());
        async move {
            for i in chunk {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("cm-{i}"), "namespace": ns, "labels": {LABEL: "yes"}},
                    "data": {"filler": filler},
                }))
                .expect("a ConfigMap");
                api.create(&PostParams::default(), &cm).await.expect("created");
            }
        }
    }))
    .await;
}

async fn labelled(api: &Api<ConfigMap>, key: &str) -> usize {
    let list = api.list_metadata(&ListParams::default().labels(key)).await.expect("list");
    list.items.len()
}

// ---------------------------------------------------------------------------------------
// 2-4.

async fn label_figure(cluster: &TestCluster, ns: &str, n: usize, kubeconfig: &Path) {
    let dir = plugin_dir(ns);
    let seen = Arc::new(Seen::default());
    let ring = cluster.unique("labelbench");
    let started = Instant::now();
    let r = Replica::spawn(dir.path(), kubeconfig, &ring, ns, "label", "a", &seen);
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), ns);
    let key = format!("shard.wasmctrl.dev/{ring}");
    seen.wait("the replica's metrics address", Duration::from_secs(120), |s| {
        s.address.lock().contains_key("a")
    })
    .await;
    let address = seen.address.lock()["a"].clone();
    // The role writes one label per object; its counter says how far it got.
    let deadline = Instant::now() + Duration::from_secs(3600);
    while metric(&address, "wasmctrl_shard_labels_written_total").await < n as f64 {
        assert!(Instant::now() < deadline, "labelling did not finish");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took = started.elapsed();
    let count = labelled(&api, &key).await;
    println!(
        "label: one replica labelled {count} of {n} objects in {:.1} s from its start ({:.0} labels/s)",
        took.as_secs_f64(),
        count as f64 / took.as_secs_f64()
    );
    r.stop().await;
}

async fn rss_figures(cluster: &TestCluster, ns: &str, n: usize, kubeconfig: &Path, mode: &str) {
    // One ring per mode, so each configuration moves only the keys it must.
    let ring = cluster.unique(if mode == "label" { "rssl" } else { "rssn" });
    for replicas in 1..=3usize {
        let dir = plugin_dir(ns);
        let seen = Arc::new(Seen::default());
        let names: Vec<String> = (0..replicas).map(|i| format!("r{i}")).collect();
        let procs: Vec<Replica> = names
            .iter()
            .map(|name| Replica::spawn(dir.path(), kubeconfig, &ring, ns, mode, name, &seen))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        seen.wait("a stable ring", Duration::from_secs(1800), |s| s.stable(&refs)).await;
        seen.wait("every replica's address", Duration::from_secs(120), |s| {
            names.iter().all(|r| s.address.lock().contains_key(r))
        })
        .await;
        let addresses: Vec<String> = names.iter().map(|r| seen.address.lock()[r].clone()).collect();
        // Settled: the replicas own every key between them, and each has reconciled at
        // least as many keys as it owns (its cache holds its share).
        let deadline = Instant::now() + Duration::from_secs(3600);
        loop {
            let mut owned_total = 0.0;
            let mut behind = false;
            for a in &addresses {
                let owned = metric(a, "wasmctrl_shard_keys{plugin=\"noop\"}").await;
                let done =
                    metric(a, "controller_runtime_reconcile_total{controller=\"noop\",result=\"success\"}")
                        .await;
                owned_total += owned;
                behind |= done < owned;
            }
            if owned_total >= n as f64 && !behind {
                break;
            }
            assert!(Instant::now() < deadline, "the replicas did not settle");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let rss: Vec<String> = procs.iter().map(|p| format!("{} {:.0} MiB", p.name, p.rss_mib())).collect();
        println!("rss ({mode}, {n} objects): {replicas} replica(s): {}", rss.join(", "));
        for p in procs {
            p.stop().await;
        }
    }
}

async fn takeover_figure(cluster: &TestCluster, ns: &str, kubeconfig: &Path) {
    let dir = plugin_dir(ns);
    let seen = Arc::new(Seen::default());
    let ring = cluster.unique("takeover");
    let mut procs: BTreeMap<String, Replica> = ["a", "b", "c"]
        .iter()
        .map(|n| ((*n).to_owned(), Replica::spawn(dir.path(), kubeconfig, &ring, ns, "no-write", n, &seen)))
        .collect();
    seen.wait("a stable ring", Duration::from_secs(600), |s| s.stable(&["a", "b", "c"])).await;
    let mut victim = procs.remove("b").expect("b");
    let killed = Instant::now();
    victim.child.start_kill().expect("kill -9");
    let _ = victim.child.wait().await;
    seen.wait("the takeover", Duration::from_secs(120), |s| s.stable(&["a", "c"])).await;
    println!(
        "takeover: survivors completed the epoch without the killed replica {:.1} s after kill -9 (lease 15 s, retry 2 s)",
        killed.elapsed().as_secs_f64()
    );
    for (_, p) in procs {
        p.stop().await;
    }
}

fn main() {
    if only("ring") {
        ring_figures();
    }
    if !(only("label") || only("rss") || only("takeover")) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let cluster = TestCluster::start().await.expect("API server");
        let n = objects();
        let kubeconfig: PathBuf = cluster.kubeconfig_path().to_owned();
        if only("label") || only("rss") {
            let ns = cluster.namespace().await.expect("namespace");
            let t = Instant::now();
            seed(&cluster, &ns, n).await;
            println!("seeded {n} ConfigMaps of ~2 KB in {:.1} s", t.elapsed().as_secs_f64());
            if only("label") {
                label_figure(&cluster, &ns, n, &kubeconfig).await;
            }
            if only("rss") {
                rss_figures(&cluster, &ns, n, &kubeconfig, "label").await;
                rss_figures(&cluster, &ns, n, &kubeconfig, "no-write").await;
            }
        }
        if only("takeover") {
            let ns = cluster.namespace().await.expect("namespace");
            seed(&cluster, &ns, 1000).await;
            takeover_figure(&cluster, &ns, &kubeconfig).await;
        }
    });
}
