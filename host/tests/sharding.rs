//! Sharding end to end: `wasmctrl` processes (the real binary, `[cluster] mode =
//! "kubeconfig"`) share the keys of a witness plugin on one ring while ConfigMaps are
//! created, updated and deleted at a steady rate, through everything that moves keys:
//!
//! 1. three replicas start and split the keys;
//! 2. one is killed with SIGKILL (its keys are taken over once its Lease runs out);
//! 3. a fourth joins;
//! 4. every replica is restarted, one after the other (SIGTERM: it drains and releases its
//!    Lease; the same name starts again);
//! 5. one replica is partitioned from the API server: it talks to it through a TCP proxy
//!    written here, which stops forwarding (connections are held open, nothing passes); the
//!    replica must stop working before its Lease could run out, and exits.
//!
//! The witness (`guests/test-plugins/witness-a`) logs `reconcile-start` / `reconcile-end`
//! with the key and the resourceVersion it saw; each replica logs as JSON, and the test
//! follows every process's lines with their timestamps. Asserted, over the merged logs:
//! - no key is reconciled by two replicas at overlapping times (a reconcile cut short by a
//!   kill or a fence ends, at the latest, when its process is seen gone);
//! - every key whose final state is deleted was reconciled after its delete and saw it gone;
//! - every key's last reconcile saw its final state (the server's, read after the churn).
//!
//! Both modes run: `label` (the assignment role labels the ConfigMaps; each replica caches
//! only its own) and `no-write`. On either backend (`WASMCTRL_TEST_BACKEND=dev|real`).
//!
//! Sizes: CI runs 1,000 objects at 200 changes/s. The issue's size — 10,000 objects at
//! 1,000 changes/s — is `SHARDING_FULL=1` (best in release):
//!
//! ```sh
//! cargo xtask build-guests
//! SHARDING_FULL=1 cargo test --release -p wasmctrl --test sharding -- --nocapture
//! ```
//!
//! `SHARDING_OBJECTS` and `SHARDING_RATE` set either size directly. Each run prints one line
//! of figures per mode (takeover after the kill, keys each replica owned, reconciles).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use wasmctrl_testkit::TestCluster;

/// The label every test object carries (the witness watches only those).
const TEST_LABEL: &str = "sharding-test";
const PLUGIN: &str = "witness";
/// Lease timings of the replicas: short, so the scenario moves quickly, yet with room for a
/// loaded machine (the defaults are 15 s / 10 s / 2 s).
const LEASE: (&str, &str, &str) = ("6s", "4s", "1s");
/// How long the slowest step may take.
const PATIENCE: Duration = Duration::from_secs(180);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn full() -> bool {
    std::env::var("SHARDING_FULL").is_ok_and(|v| v == "1")
}

/// Microseconds since the Unix epoch: the clock the replicas' log timestamps use too.
fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// What the replicas logged.

#[derive(Clone, Debug)]
enum What {
    Start {
        key: String,
        rv: String,
    },
    End {
        key: String,
    },
    Completed {
        epoch: u64,
        members: BTreeSet<String>,
    },
    /// The process is gone (seen by the test): `at` bounds its unfinished reconciles.
    Gone,
    /// The host dropped some of the witness's lines (its log rate limit): the record is
    /// incomplete, and a reconcile whose end was dropped would look unfinished.
    LinesDropped,
}

#[derive(Clone, Debug)]
struct Entry {
    replica: String,
    /// Which start of the replica (a restart is a new process).
    run: u32,
    at: i64,
    what: What,
}

#[derive(Default)]
struct Log {
    entries: Mutex<Vec<Entry>>,
    changed: Notify,
}

impl Log {
    fn push(&self, e: Entry) {
        self.entries.lock().push(e);
        self.changed.notify_waiters();
    }

    /// Waits until `ready` holds over the entries (checked at every new line); `false` if it
    /// did not within [`PATIENCE`].
    async fn wait_for(&self, mut ready: impl FnMut(&[Entry]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(&self.entries.lock()) {
                return true;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => return false,
            }
        }
    }

    /// Waits until every replica in `members` has completed, after `since`, one epoch whose
    /// members are exactly `members` (the latest it completed).
    async fn wait_stable(&self, members: &[&str], since: i64) {
        let want: BTreeSet<String> = members.iter().map(|m| (*m).to_owned()).collect();
        let stable = self
            .wait_for(|entries| {
                let mut latest: HashMap<&str, (u64, &BTreeSet<String>)> = HashMap::new();
                for e in entries.iter().filter(|e| e.at >= since) {
                    if let What::Completed { epoch, members } = &e.what
                        && latest.get(e.replica.as_str()).is_none_or(|(n, _)| epoch > n)
                    {
                        latest.insert(&e.replica, (*epoch, members));
                    }
                }
                let epochs: BTreeSet<u64> =
                    want.iter().filter_map(|r| latest.get(r.as_str())).map(|(e, _)| *e).collect();
                epochs.len() == 1
                    && want.iter().all(|r| latest.get(r.as_str()).is_some_and(|(_, m)| **m == want))
            })
            .await;
        assert!(stable, "timed out waiting for a ring of {want:?}");
    }
}

/// One JSON log line of a replica as an entry, if it is one the test follows.
fn parse_line(line: &str) -> Option<(i64, What)> {
    let v: Value = serde_json::from_str(line).ok()?;
    let at = v["timestamp"].as_str()?.parse::<k8s_openapi::jiff::Timestamp>().ok()?.as_microsecond();
    let fields = &v["fields"];
    let message = fields["message"].as_str()?;
    let what = match message {
        "reconcile-start" => {
            What::Start { key: fields["key"].as_str()?.to_owned(), rv: fields["rv"].as_str()?.to_owned() }
        }
        "reconcile-end" => What::End { key: fields["key"].as_str()?.to_owned() },
        m if m.starts_with("guest log lines dropped") => What::LinesDropped,
        m if m.starts_with("ring epoch completed") => {
            let members =
                fields["members"].as_str()?.split('"').skip(1).step_by(2).map(str::to_owned).collect();
            What::Completed { epoch: fields["epoch"].as_u64()?, members }
        }
        _ => return None,
    };
    Some((at, what))
}

// ---------------------------------------------------------------------------------------
// Replicas: `wasmctrl run` processes.

struct Setup {
    dir: PathBuf,
    ns: String,
    ring: String,
    mode: &'static str,
    direct: PathBuf,
    proxied: PathBuf,
}

impl Setup {
    fn host_toml(&self, replica: &str, proxied: bool) -> PathBuf {
        let kubeconfig = if proxied { &self.proxied } else { &self.direct };
        let (lease, renew, retry) = LEASE;
        let text = format!(
            "plugins-dir = \"plugins\"\ncache-dir = \"cache-{replica}\"\n\n[cluster]\nmode = \"kubeconfig\"\nkubeconfig = \"{}\"\n\n\
             [server]\naddress = \"127.0.0.1:0\"\n\n[sharding]\nenabled = true\nring = \"{}\"\nnamespace = \"{}\"\n\
             mode = \"{}\"\nlease-duration = \"{lease}\"\nrenew-deadline = \"{renew}\"\nretry-period = \"{retry}\"\n",
            kubeconfig.display(),
            self.ring,
            self.ns,
            self.mode,
        );
        let path = self.dir.join(format!("{replica}.toml"));
        std::fs::write(&path, text).expect("host TOML written");
        path
    }
}

struct Replica {
    name: String,
    run: u32,
    proxied: bool,
    child: tokio::process::Child,
    exited: Option<std::process::ExitStatus>,
}

impl Replica {
    fn spawn(setup: &Setup, log: &Arc<Log>, name: &str, run: u32, proxied: bool) -> Replica {
        let toml = setup.host_toml(name, proxied);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmctrl"))
            .args(["run", "--log-format", "json", "--config"])
            .arg(&toml)
            .env("WASMCTRL_SHARD_NAME", name)
            .env("RUST_LOG", std::env::var("SHARDING_RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("wasmctrl starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let (log, replica) = (log.clone(), name.to_owned());
        let echo = std::env::var("SHARDING_ECHO").is_ok_and(|v| v == "1");
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if echo {
                    eprintln!("[{replica}#{run}] {line}");
                }
                if let Some((at, what)) = parse_line(&line) {
                    log.push(Entry { replica: replica.clone(), run, at, what });
                } else if line.contains("\"level\":\"ERROR\"") || line.contains("panicked") {
                    eprintln!("[{replica}#{run}] {line}");
                }
            }
        });
        Replica { name: name.to_owned(), run, proxied, child, exited: None }
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Waits for the process to end and records when it was seen gone.
    async fn wait_gone(&mut self, log: &Log) -> std::process::ExitStatus {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit", self.name))
            .expect("wait for the process");
        log.push(Entry { replica: self.name.clone(), run: self.run, at: now_us(), what: What::Gone });
        self.exited = Some(status);
        status
    }
}

// ---------------------------------------------------------------------------------------
// The partition: a TCP proxy that can stop forwarding.

struct Proxy {
    address: std::net::SocketAddr,
    partitioned: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let address = listener.local_addr().expect("proxy address");
        let (partitioned, rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let mut rx = rx.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if !*rx.borrow() {
                        if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                                _ = rx.wait_for(|p| *p) => {}
                            }
                            // Partitioned: hold both ends open, pass nothing.
                            let _held = outbound;
                            std::future::pending::<()>().await;
                        }
                        return;
                    }
                    let _held = inbound;
                    std::future::pending::<()>().await;
                });
            }
        });
        Proxy { address, partitioned }
    }

    fn partition(&self) {
        self.partitioned.send_replace(true);
    }
}

/// A copy of `kubeconfig` whose server is `through` (same scheme and host).
fn rewrite_kubeconfig(kubeconfig: &Path, through: std::net::SocketAddr, out: &Path) {
    let mut config = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig readable");
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut()
            && let Some(server) = cluster.server.as_mut()
        {
            let mut url: http::Uri = server.parse().expect("server URL");
            let scheme = url.scheme_str().unwrap_or("https").to_owned();
            url = format!("{scheme}://{through}").parse().expect("proxied URL");
            *server = url.to_string().trim_end_matches('/').to_owned();
        }
    }
    std::fs::write(out, serde_norway::to_string(&config).expect("kubeconfig serialises"))
        .expect("kubeconfig written");
}

// ---------------------------------------------------------------------------------------
// The churn.

#[derive(Default)]
struct Churn {
    stop: AtomicBool,
    changes: AtomicU64,
    /// Key → when its last (successful) delete was sent.
    deleted_at: Mutex<HashMap<String, i64>>,
}

fn config_map(ns: &str, name: &str, n: u64) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {TEST_LABEL: "yes"}},
        "data": {"n": n.to_string()},
    }))
    .expect("a ConfigMap")
}

/// Creates `objects` ConfigMaps, `writers` at a time.
async fn seed(api: &Api<ConfigMap>, ns: &str, objects: usize) {
    let names: Vec<String> = (0..objects).map(|i| format!("cm-{i}")).collect();
    futures::future::join_all(names.chunks(objects.div_ceil(32).max(1)).map(|chunk| async move {
        for name in chunk {
            api.create(&PostParams::default(), &config_map(ns, name, 0)).await.expect("seed object created");
        }
    }))
    .await;
}

/// Runs `writers` writers, each on its own keys, for a total of `rate` changes/s, until
/// stopped: an update, a delete or a create, depending on the key's state.
fn churn(
    api: Api<ConfigMap>,
    ns: String,
    objects: usize,
    rate: usize,
    churn: Arc<Churn>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let writers = 32.min(objects).max(1);
        let per_writer = Duration::from_secs_f64(writers as f64 / rate.max(1) as f64);
        let tasks = (0..writers).map(|w| {
            let (api, ns, churn) = (api.clone(), ns.clone(), churn.clone());
            async move {
                let keys: Vec<usize> = (w..objects).step_by(writers).collect();
                let mut present: Vec<bool> = vec![true; keys.len()];
                let mut tick = tokio::time::interval(per_writer);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 0u64;
                while !churn.stop.load(Ordering::Acquire) {
                    tick.tick().await;
                    n += 1;
                    let i = (rand::random::<u64>() as usize) % keys.len();
                    let name = format!("cm-{}", keys[i]);
                    let roll = rand::random::<u32>() % 10;
                    if !present[i] {
                        if api.create(&PostParams::default(), &config_map(&ns, &name, n)).await.is_ok() {
                            present[i] = true;
                        }
                    } else if roll < 2 {
                        // The object exists until the delete is applied, which is after this:
                        // a reconcile that starts later and finds it gone saw the delete.
                        let sent = now_us();
                        if api.delete(&name, &DeleteParams::default()).await.is_ok() {
                            present[i] = false;
                            churn.deleted_at.lock().insert(format!("{ns}/{name}"), sent);
                        }
                    } else {
                        let patch = serde_json::json!({"data": {"n": n.to_string()}});
                        let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    }
                    churn.changes.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        futures::future::join_all(tasks).await;
    })
}

// ---------------------------------------------------------------------------------------
// The checks.

/// Per key, reconciles as (replica, run, start, end, rv seen).
type Reconciles = HashMap<String, Vec<(String, u32, i64, i64, String)>>;

fn reconciles(entries: &[Entry]) -> Reconciles {
    let gone: HashMap<(String, u32), i64> = entries
        .iter()
        .filter(|e| matches!(e.what, What::Gone))
        .map(|e| ((e.replica.clone(), e.run), e.at))
        .collect();
    let mut open: HashMap<(String, u32, String), Vec<(i64, String)>> = HashMap::new();
    let mut out: Reconciles = HashMap::new();
    for e in entries {
        match &e.what {
            What::Start { key, rv } => {
                open.entry((e.replica.clone(), e.run, key.clone())).or_default().push((e.at, rv.clone()))
            }
            What::End { key } => {
                if let Some(starts) = open.get_mut(&(e.replica.clone(), e.run, key.clone()))
                    && !starts.is_empty()
                {
                    let (start, rv) = starts.remove(0);
                    out.entry(key.clone()).or_default().push((e.replica.clone(), e.run, start, e.at, rv));
                }
            }
            _ => {}
        }
    }
    // Cut short by a kill or a fence: they ended, at the latest, when the process was seen gone.
    for ((replica, run, key), starts) in open {
        for (start, rv) in starts {
            let end = gone.get(&(replica.clone(), run)).copied().unwrap_or(i64::MAX);
            out.entry(key.clone()).or_default().push((replica.clone(), run, start, end, rv));
        }
    }
    for list in out.values_mut() {
        list.sort_by_key(|r| r.2);
    }
    out
}

/// Pairs of reconciles of one key by different replicas (or runs) that overlap in time.
fn overlaps(reconciles: &Reconciles) -> Vec<String> {
    let mut found = Vec::new();
    for (key, list) in reconciles {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.2 > a.3 {
                    break;
                }
                if (a.0.as_str(), a.1) != (b.0.as_str(), b.1) {
                    found.push(format!(
                        "{key}: {}#{} [{}, {}] and {}#{} [{}, {}]",
                        a.0, a.1, a.2, a.3, b.0, b.1, b.2, b.3
                    ));
                }
            }
        }
    }
    found
}

/// Waits (following a watch) until every test object is labelled with one of `owners`.
async fn wait_labelled(api: &Api<ConfigMap>, label_key: &str, owners: &[&str]) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let config = watcher::Config::default().labels(&format!("{TEST_LABEL}=yes"));
    let stream = watcher::watcher(api.clone(), config);
    tokio::pin!(stream);
    let label = |cm: &ConfigMap| {
        let key = format!(
            "{}/{}",
            cm.metadata.namespace.as_deref().unwrap_or(""),
            cm.metadata.name.as_deref().unwrap_or("")
        );
        (key, cm.metadata.labels.as_ref().and_then(|l| l.get(label_key)).cloned())
    };
    let mut labels: HashMap<String, Option<String>> = HashMap::new();
    let mut listing: Option<HashMap<String, Option<String>>> = None;
    let mut synced = false;
    let waited = tokio::time::timeout(PATIENCE, async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => listing = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(cm)) => {
                    if let Some(l) = listing.as_mut() {
                        let (k, v) = label(&cm);
                        l.insert(k, v);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    labels = listing.take().unwrap_or_default();
                    synced = true;
                }
                Ok(watcher::Event::Apply(cm)) => {
                    let (k, v) = label(&cm);
                    labels.insert(k, v);
                }
                Ok(watcher::Event::Delete(cm)) => {
                    labels.remove(&label(&cm).0);
                }
                Err(_) => {}
            }
            if synced && labels.values().all(|l| l.as_deref().is_some_and(|s| owners.contains(&s))) {
                return;
            }
        }
    })
    .await;
    let mut wrong: BTreeMap<Option<String>, Vec<&String>> = BTreeMap::new();
    for (key, label) in &labels {
        if !label.as_deref().is_some_and(|s| owners.contains(&s)) {
            wrong.entry(label.clone()).or_default().push(key);
        }
    }
    assert!(waited.is_ok(), "objects never labelled with one of {owners:?}, by label: {wrong:?}");
}

/// The server's final state: key → resourceVersion (deleted keys are absent).
async fn final_state(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    let list = api.list(&ListParams::default().labels(&format!("{TEST_LABEL}=yes"))).await.expect("list");
    list.items
        .into_iter()
        .map(|cm| {
            let ns = cm.metadata.namespace.unwrap_or_default();
            (
                format!("{ns}/{}", cm.metadata.name.unwrap_or_default()),
                cm.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect()
}

/// Keys whose last reconcile did not see the final state, and (final) deletes not
/// reconciled after they happened.
fn stale(
    reconciles: &Reconciles,
    all_keys: &BTreeSet<String>,
    finals: &BTreeMap<String, String>,
    deleted_at: &HashMap<String, i64>,
) -> (Vec<String>, Vec<String>) {
    let mut stale = Vec::new();
    let mut lost_deletes = Vec::new();
    for key in all_keys {
        let want = finals.get(key).map_or("not-found", String::as_str);
        let list = reconciles.get(key).map(Vec::as_slice).unwrap_or_default();
        match list.iter().max_by_key(|r| r.2) {
            Some(last) if last.4 == want => {}
            Some(last) => stale
                .push(format!("{key}: last reconcile ({}#{}) saw {}, final {want}", last.0, last.1, last.4)),
            None => stale.push(format!("{key}: never reconciled (final {want})")),
        }
        if !finals.contains_key(key)
            && let Some(at) = deleted_at.get(key)
            && !list.iter().any(|r| r.2 >= *at && r.4 == "not-found")
        {
            lost_deletes.push(format!("{key}: deleted at {at}, not reconciled after"));
        }
    }
    (stale, lost_deletes)
}

// ---------------------------------------------------------------------------------------
// The scenario.

async fn scenario(mode: &'static str) {
    let objects = env_or("SHARDING_OBJECTS", if full() { 10_000 } else { 1_000 });
    let rate = env_or("SHARDING_RATE", if full() { 1_000 } else { 200 });
    let cluster = TestCluster::start().await.expect("test cluster");
    let ns = cluster.namespace().await.expect("namespace");
    let ring = cluster.unique(if mode == "label" { "label" } else { "nowrite" });
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("plugins")).expect("plugins dir");
    std::fs::write(
        dir.path().join("plugins/witness.toml"),
        format!(
            "name = \"{PLUGIN}\"\nconcurrency = 2\nlog-lines-per-second = 1000000\n\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n\
             namespace = \"{ns}\"\nlabel-selector = \"{TEST_LABEL}=yes\"\n"
        ),
    )
    .expect("plugin TOML");
    std::fs::write(dir.path().join("plugins/witness.wasm"), wasmctrl_testkit::guests::wasm("witness-a"))
        .expect("plugin wasm");
    let upstream = cluster.kube_config().cluster_url;
    let upstream =
        format!("{}:{}", upstream.host().unwrap_or("127.0.0.1"), upstream.port_u16().unwrap_or(443));
    let proxy = Proxy::start(upstream).await;
    let proxied = dir.path().join("proxied.kubeconfig");
    rewrite_kubeconfig(cluster.kubeconfig_path(), proxy.address, &proxied);
    let setup = Setup {
        dir: dir.path().to_owned(),
        ns: ns.clone(),
        ring,
        mode,
        direct: cluster.kubeconfig_path().to_owned(),
        proxied,
    };
    let log = Arc::new(Log::default());
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
    let started = std::time::Instant::now();

    seed(&api, &ns, objects).await;

    // 1. Three replicas; r1 reaches the API server through the proxy. The churn starts once
    //    they share the ring (a delete before any replica watched would reach none, as
    //    with one host that was not running).
    let mut replicas: BTreeMap<String, Replica> = BTreeMap::new();
    for (name, proxied) in [("r1", true), ("r2", false), ("r3", false)] {
        replicas.insert(name.into(), Replica::spawn(&setup, &log, name, 0, proxied));
    }
    log.wait_stable(&["r1", "r2", "r3"], 0).await;
    eprintln!("sharding[{mode}]: three replicas share the ring ({:.1}s)", started.elapsed().as_secs_f64());
    let changes = Arc::new(Churn::default());
    let writer = churn(api.clone(), ns.clone(), objects, rate, changes.clone());

    // 2. kill -9 r2.
    let r2 = replicas.get_mut("r2").expect("r2");
    r2.signal(libc::SIGKILL);
    r2.wait_gone(&log).await;
    let killed_at = now_us();
    log.wait_stable(&["r1", "r3"], killed_at).await;
    let takeover = (now_us() - killed_at) as f64 / 1e6;
    eprintln!("sharding[{mode}]: r2 killed, its keys taken over in {takeover:.1}s");

    // 3. A fourth replica joins.
    let since = now_us();
    replicas.insert("r4".into(), Replica::spawn(&setup, &log, "r4", 0, false));
    log.wait_stable(&["r1", "r3", "r4"], since).await;
    eprintln!("sharding[{mode}]: r4 joined ({:.1}s)", started.elapsed().as_secs_f64());

    // 4. Rolling restart.
    for name in ["r1", "r3", "r4"] {
        let since = now_us();
        let r = replicas.get_mut(name).expect("replica");
        r.signal(libc::SIGTERM);
        let status = r.wait_gone(&log).await;
        assert!(status.success(), "{name} stopped gracefully: {status}");
        let (run, proxied) = (r.run + 1, r.proxied);
        replicas.insert(name.into(), Replica::spawn(&setup, &log, name, run, proxied));
        log.wait_stable(&["r1", "r3", "r4"], since).await;
        eprintln!("sharding[{mode}]: {name} restarted ({:.1}s)", started.elapsed().as_secs_f64());
    }

    // 5. Partition r1 from the API server.
    let since = now_us();
    proxy.partition();
    let r1 = replicas.get_mut("r1").expect("r1");
    let status = r1.wait_gone(&log).await;
    assert!(!status.success(), "a partitioned replica exits with an error: {status}");
    log.wait_stable(&["r3", "r4"], since).await;
    eprintln!("sharding[{mode}]: r1 partitioned, fenced and gone ({:.1}s)", started.elapsed().as_secs_f64());

    // The end state: churn stops, and once the server settles (label mode: every object
    // labelled), every key's last reconcile must see it.
    changes.stop.store(true, Ordering::Release);
    writer.await.expect("churn ends");
    let label_key = format!("shard.wasmctrl.dev/{}", setup.ring);
    if mode == "label" {
        wait_labelled(&api, &label_key, &["r3", "r4"]).await;
    }
    let finals = final_state(&api).await;
    let all_keys: BTreeSet<String> = (0..objects).map(|i| format!("{ns}/cm-{i}")).collect();
    let deleted_at = changes.deleted_at.lock().clone();
    let settled = log
        .wait_for(|entries| {
            let (stale, lost) = stale(&reconciles(entries), &all_keys, &finals, &deleted_at);
            stale.is_empty() && lost.is_empty()
        })
        .await;
    if !settled {
        eprintln!("sharding[{mode}]: the replicas did not settle on the final state in time");
    }
    for r in replicas.values_mut() {
        if r.exited.is_none() {
            r.signal(libc::SIGTERM);
            r.wait_gone(&log).await;
        }
    }
    let entries = log.entries.lock().clone();
    let dropped: Vec<String> = entries
        .iter()
        .filter(|e| matches!(e.what, What::LinesDropped))
        .map(|e| format!("{}#{}", e.replica, e.run))
        .collect();
    assert!(dropped.is_empty(), "the witness's lines were dropped on {dropped:?}: the record is incomplete");
    let all = reconciles(&entries);
    let overlapping = overlaps(&all);
    let (stale_keys, lost) = stale(&all, &all_keys, &finals, &deleted_at);
    let count: usize = all.values().map(Vec::len).sum();
    let mut by_replica: BTreeMap<String, usize> = BTreeMap::new();
    for list in all.values() {
        for r in list {
            *by_replica.entry(r.0.clone()).or_default() += 1;
        }
    }
    println!(
        "sharding[{mode}]: {objects} objects, {} changes at ~{rate}/s; {count} reconciles {by_replica:?}; \
         takeover after kill -9 {takeover:.1}s; overlaps {}; stale final states {}; lost deletes {}; {:.1}s",
        changes.changes.load(Ordering::Relaxed),
        overlapping.len(),
        stale_keys.len(),
        lost.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        overlapping.is_empty(),
        "keys reconciled by two replicas at once: {:?}",
        &overlapping[..overlapping.len().min(10)]
    );
    assert!(stale_keys.is_empty(), "{:?}", &stale_keys[..stale_keys.len().min(10)]);
    assert!(lost.is_empty(), "{:?}", &lost[..lost.len().min(10)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn label_mode_survives_kill_join_restart_and_partition() {
    scenario("label").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_write_mode_survives_kill_join_restart_and_partition() {
    scenario("no-write").await;
}
