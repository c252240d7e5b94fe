//! Operating a host: the monitoring files of `deploy/monitoring/` against what a running
//! host exports, `wasmctrl status` against a running host, and the traces of a reconcile of
//! a real plugin and of a retried one as an OTLP collector receives them.
//!
//! Each test runs the real `wasmctrl run` binary with the `configmap-mirror` example plugin
//! (leader election on, the endpoint on a free loopback port) against a cluster of either
//! test backend (see `wasmctrl-testkit`), through the cluster's kubeconfig; the retry test
//! adds `test-plugin-panic`.
//!
//! Needs the example and test plugins built: `cargo xtask build-guests`. The
//! rules are also checked with `promtool` (built from Prometheus' Go module in
//! `deploy/monitoring/promtool`) when Go is installed; without Go that part says it is
//! skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use wasmctrl_testkit::TestCluster;

#[allow(dead_code)]
#[path = "common/process.rs"]
mod process;

use process::{HostProcess, WASMCTRL};

/// Bound on every wait for the host to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(90);
const PLUGIN: &str = "configmap-mirror";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A `wasmctrl run` child process (killed when the test ends) and what it logged.
struct Host {
    _process: HostProcess,
    address: String,
    /// The test's source namespace (ConfigMaps labelled mirror=true here are mirrored).
    namespace: String,
    /// Every line the host logged so far (for failure messages).
    log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Host {
    /// Starts the host on `cluster` with `configmap-mirror` (mirroring into two namespaces of
    /// the test) and `extra` appended to its host TOML; returns once it serves its endpoint.
    async fn start(cluster: &TestCluster, extra: &str) -> Host {
        Host::start_with(cluster, extra, &[]).await
    }

    /// [`Host::start`], with more plugins: each a name and the test-plugin crate it runs,
    /// reconciling every ConfigMap.
    async fn start_with(cluster: &TestCluster, extra: &str, plugins_too: &[(&str, &str)]) -> Host {
        let namespace = cluster.namespace().await.expect("namespace");
        let targets =
            [cluster.namespace().await.expect("namespace"), cluster.namespace().await.expect("namespace")];
        let dir = tempfile::tempdir().expect("tempdir");
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).expect("plugins dir");
        let examples = root().join("examples/plugins");
        let toml = std::fs::read_to_string(examples.join(format!("{PLUGIN}.toml"))).expect("plugin TOML");
        let toml = toml.replace(
            "namespaces = [\"team-a\", \"team-b\"]",
            &format!("namespaces = [\"{}\", \"{}\"]", targets[0], targets[1]),
        );
        std::fs::write(plugins.join(format!("{PLUGIN}.toml")), toml).expect("write TOML");
        let wasm = examples.join(format!("{PLUGIN}.wasm"));
        std::fs::copy(&wasm, plugins.join(format!("{PLUGIN}.wasm"))).unwrap_or_else(|e| {
            panic!("{}: {e}; run `cargo xtask build-guests` to build the example plugins", wasm.display())
        });
        for (name, crate_name) in plugins_too {
            let toml = format!("name = \"{name}\"\n\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n");
            std::fs::write(plugins.join(format!("{name}.toml")), toml).expect("write TOML");
            std::fs::write(plugins.join(format!("{name}.wasm")), wasmctrl_testkit::guests::wasm(crate_name))
                .expect("write .wasm");
        }
        let host_toml = format!(
            r#"plugins-dir = "plugins"
cache-dir = "cache"

[cluster]
mode = "kubeconfig"
kubeconfig = "{kubeconfig}"

[server]
address = "127.0.0.1:0"

[leader-election]
enabled = true
namespace = "{namespace}"
name = "{lease}"
{extra}
"#,
            kubeconfig = cluster.kubeconfig_path().display(),
            lease = cluster.unique("wasmctrl"),
        );
        let config = dir.path().join("wasmctrl.toml");
        std::fs::write(&config, host_toml).expect("write host TOML");
        let mut process = HostProcess::spawn(
            Command::new(WASMCTRL)
                .args(["--log-format", "json", "run", "--config"])
                .arg(&config)
                .env("RUST_LOG", "info")
                // The cluster may hold thousands of ConfigMaps of other tests, each reconciled at
                // start-up with several spans: a queue that holds them all (the default 2,048
                // drops the rest, possibly the spans a test waits for), exported often.
                .env("OTEL_BSP_MAX_QUEUE_SIZE", "1000000")
                .env("OTEL_BSP_SCHEDULE_DELAY", "100")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
            "wasmctrl run",
        );
        let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = process.0.stderr.take().expect("stderr");
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().push(line.clone());
                let _ = tx.send(line);
            }
        });
        // The endpoint's address is in the line saying it serves.
        let address = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + PATIENCE;
            while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
                if v["fields"]["message"].as_str().is_some_and(|m| m.starts_with("serving /metrics")) {
                    return v["fields"]["address"].as_str().map(str::to_owned);
                }
            }
            None
        })
        .await
        .expect("log reader");
        let Some(address) = address else {
            panic!("the host did not serve its endpoint; its log:\n{}", log.lock().join("\n"));
        };
        Host { _process: process, address, namespace, log, _dir: dir }
    }

    async fn get(&self, path: &str) -> String {
        let (head, body) = self.request(path).await;
        assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
        body
    }

    /// Waits until `/readyz` says ready: every plugin's informers synced (their handlers
    /// heard the initial lists) and its workers run.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (head, body) = self.request("/readyz").await;
            if head.starts_with("HTTP/1.1 200") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the host did not get ready: {body}; its log:\n{}",
                self.log.lock().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A GET of `path`: the response's head and body.
    async fn request(&self, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.address).await.expect("connect to the host");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("response");
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        (head.to_owned(), if chunked { unchunk(body) } else { body.to_owned() })
    }

    /// Waits until `/metrics` has a sample starting with `series` (name and labels as printed,
    /// or a prefix of them) of at least `at_least`.
    async fn wait_for_sample(&self, series: &str, at_least: f64) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.get("/metrics").await;
            let value = text
                .lines()
                .filter(|l| l.starts_with(series))
                .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()));
            if value.is_some_and(|v| v >= at_least) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no {series} >= {at_least} on /metrics; the host's log:\n{}\n/metrics:\n{text}",
                self.log.lock().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a ConfigMap the plugin mirrors; returns its resourceVersion.
    async fn create_source(&self, client: &kube::Client, name: &str) -> String {
        self.create_config_map(client, name, serde_json::json!({ "mirror": "true" })).await
    }

    /// Creates a ConfigMap with `labels` in the test's source namespace; returns its
    /// resourceVersion.
    async fn create_config_map(
        &self,
        client: &kube::Client,
        name: &str,
        labels: serde_json::Value,
    ) -> String {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": labels },
            "data": { "k": "v" },
        }))
        .expect("ConfigMap");
        let created = Api::<ConfigMap>::namespaced(client.clone(), &self.namespace)
            .create(&PostParams::default(), &cm)
            .await
            .expect("create ConfigMap");
        created.metadata.resource_version.expect("resourceVersion")
    }
}

/// The body of a chunked HTTP/1.1 response.
fn unchunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Dashboard and alert rules

/// Every metric name a host's exposition text makes queryable: each sample's name, and for
/// families without samples yet the names their type gives them (`x_total` for a counter,
/// `x_bucket`, `x_sum`, `x_count` for a histogram).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            match kind {
                "counter" => names.insert(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                    true
                }
                _ => names.insert(name.to_owned()),
            };
        } else if !line.starts_with('#')
            && let Some(end) = line.find(['{', ' '])
        {
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Grafana's variables, replaced by what they stand for so the query is plain PromQL.
fn plain_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$plugin", ".*")
}

/// The metric names a PromQL expression selects.
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    use promql_parser::parser::Expr;
    use promql_parser::util::{ExprVisitor, walk_expr};
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(vs) = selector {
                let name = vs.name.clone().or_else(|| {
                    vs.matchers.matchers.iter().find(|m| m.name == "__name__").map(|m| m.value.clone())
                });
                self.0.insert(name.ok_or_else(|| format!("a selector without a metric name: {vs}"))?);
            }
            Ok(true)
        }
    }
    let parsed = promql_parser::parser::parse(&plain_promql(expr))?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &parsed)?;
    Ok(names.0)
}

/// Every query of the dashboard: panel targets' `expr`, and template variables' queries
/// (`label_values(metric, label)` names `metric`).
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(map) => {
                let here =
                    map.get("title").and_then(|t| t.as_str()).map_or(at.to_owned(), |t| format!("{at}/{t}"));
                for (k, v) in map {
                    match (k.as_str(), v.as_str()) {
                        ("expr", Some(e)) => out.push((here.clone(), e.to_owned())),
                        ("definition", Some(d)) => {
                            let inner = d
                                .strip_prefix("label_values(")
                                .and_then(|r| r.rsplit_once(','))
                                .map_or(d.to_owned(), |(metric, _)| metric.trim().to_owned());
                            out.push((format!("{here}/variable"), inner));
                        }
                        _ => walk(v, &here, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, at, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "dashboard", &mut out);
    out
}

#[derive(serde::Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(serde::Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

#[derive(serde::Deserialize)]
struct Rule {
    alert: String,
    expr: String,
}

fn monitoring() -> PathBuf {
    root().join("deploy/monitoring")
}

/// `promtool`, built from `deploy/monitoring/promtool`'s Go module into the target directory
/// (again only when its go.mod or go.sum is newer); `None` without Go.
fn promtool() -> Option<PathBuf> {
    if !wasmctrl_testkit::realserver::go_available() {
        return None;
    }
    let src = monitoring().join("promtool");
    let out = wasmctrl_testkit::realserver::cache_dir().with_file_name("promtool");
    let binary = out.join("promtool");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest_source = ["go.mod", "go.sum"].iter().filter_map(|f| modified(&src.join(f))).max();
    if modified(&binary).is_some_and(|b| newest_source.is_some_and(|s| b >= s)) {
        return Some(binary);
    }
    std::fs::create_dir_all(&out).expect("promtool dir");
    let tmp = out.join(format!(".promtool.{}.tmp", std::process::id()));
    eprintln!("operations: building promtool ({} → {})", src.display(), binary.display());
    let status = Command::new("go")
        .current_dir(&src)
        // Without service discovery (Prometheus' `remove_all_sd` build tag): rules need none,
        // and it leaves most of the cloud SDKs out of the build.
        .args(["build", "-trimpath", "-tags", "remove_all_sd", "-o"])
        .arg(&tmp)
        .arg("github.com/prometheus/prometheus/cmd/promtool")
        .stdin(Stdio::null())
        .status()
        .expect("run go build");
    assert!(status.success(), "go build of promtool failed: {status}");
    std::fs::rename(&tmp, &binary).expect("install promtool");
    Some(binary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_rules_query_only_what_the_host_exports() {
    let cluster = TestCluster::start().await.expect("test cluster");
    // A plugin that traps on `misbehave`, so that the trap and error series exist too.
    let host = Host::start_with(&cluster, "", &[("panicker", "test-plugin-panic")]).await;
    host.create_source(&cluster.client(), "source").await;
    host.create_config_map(&cluster.client(), "misbehave", serde_json::json!({})).await;
    let series = format!("controller_runtime_reconcile_total{{controller=\"{PLUGIN}\",result=\"success\"}}");
    host.wait_for_sample(&series, 1.0).await;
    host.wait_for_sample("wasmctrl_plugin_traps_total{plugin=\"panicker\"", 1.0).await;
    host.wait_for_sample("leader_election_master_status{", 1.0).await;
    let text = host.get("/metrics").await;
    let exported = exported_names(&text);
    // The families added for operating the host are there with series.
    for series in [
        format!("wasmctrl_plugin_running{{plugin=\"{PLUGIN}\"}} 1"),
        format!("wasmctrl_plugin_instances{{plugin=\"{PLUGIN}\"}}"),
        "wasmctrl_informer_events_total{resource=\"v1/ConfigMap\",event=\"added\"}".to_owned(),
        "wasmctrl_informer_relists_total{resource=\"v1/ConfigMap\"} 0".to_owned(),
        "process_resident_memory_bytes ".to_owned(),
    ] {
        assert!(text.contains(&series), "{series} not on /metrics:\n{text}");
    }

    let dashboard_path = monitoring().join("grafana/dashboards/wasmctrl.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard_path).expect("dashboard"))
            .expect("dashboard JSON");
    let mut queries = dashboard_queries(&dashboard);
    assert!(queries.len() > 20, "{queries:?}");
    let rules_path = monitoring().join("prometheus/wasmctrl-alerts.yaml");
    let rules: RuleFile =
        serde_norway::from_str(&std::fs::read_to_string(&rules_path).expect("rules")).expect("rules YAML");
    let alerts: BTreeSet<String> =
        rules.groups.iter().flat_map(|g| g.rules.iter().map(|r| r.alert.clone())).collect();
    for alert in [
        "WasmctrlPluginNotRunning",
        "WasmctrlPluginReloadRejected",
        "WasmctrlQueueGrowing",
        "WasmctrlReconcileErrors",
        "WasmctrlInformerRelistLoop",
        "WasmctrlNoLeader",
    ] {
        assert!(alerts.contains(alert), "{alert} missing from {}", rules_path.display());
    }
    queries.extend(
        rules.groups.into_iter().flat_map(|g| g.rules).map(|r| (format!("rule {}", r.alert), r.expr)),
    );

    let mut unknown = BTreeMap::new();
    for (at, expr) in &queries {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("{at}: `{expr}` does not parse: {e}"));
        assert!(!names.is_empty(), "{at}: `{expr}` selects no metric");
        for name in names.into_iter().filter(|n| !exported.contains(n)) {
            unknown.entry(name).or_insert_with(Vec::new).push(at.clone());
        }
    }
    assert!(
        unknown.is_empty(),
        "queried but not exported by the host: {unknown:#?}\nexported: {exported:#?}"
    );

    match promtool() {
        None => eprintln!(
            "operations: Go is not installed: `promtool check rules` and `promtool test rules` are skipped"
        ),
        Some(promtool) => {
            for args in
                [["check", "rules", "wasmctrl-alerts.yaml"], ["test", "rules", "wasmctrl-alerts.test.yaml"]]
            {
                let out = Command::new(&promtool)
                    .current_dir(monitoring().join("prometheus"))
                    .args(args)
                    .output()
                    .expect("run promtool");
                assert!(
                    out.status.success(),
                    "promtool {}: {}\n{}{}",
                    args.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn a_query_naming_an_unknown_metric_is_caught() {
    let exported = exported_names(
        "# TYPE workqueue_depth gauge\nworkqueue_depth{name=\"a\"} 1\n# TYPE x_seconds histogram\n# TYPE y counter\n",
    );
    let names =
        metric_names("sum by (name) (rate(workqueue_retries_total{name=~\"$plugin\"}[$__rate_interval]))")
            .expect("parses");
    assert!(names.iter().any(|n| !exported.contains(n)), "{names:?}");
    for known in ["workqueue_depth", "x_seconds_bucket", "y_total"] {
        assert!(exported.contains(known), "{exported:?}");
    }
    assert!(metric_names("rate(").is_err());
}

// ---------------------------------------------------------------------------------------
// wasmctrl status

fn status(address: &str, args: &[&str]) -> String {
    let out = Command::new(WASMCTRL)
        .args(["status", "--address", address, "--interval", "200ms"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run wasmctrl status");
    assert!(
        out.status.success(),
        "wasmctrl status {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_each_plugin_of_a_running_host() {
    let cluster = TestCluster::start().await.expect("test cluster");
    let host = Host::start(&cluster, "").await;
    host.create_source(&cluster.client(), "source").await;
    let series = format!("controller_runtime_reconcile_total{{controller=\"{PLUGIN}\",result=\"success\"}}");
    host.wait_for_sample(&series, 1.0).await;
    let plugins: serde_json::Value =
        serde_json::from_str(&host.get("/plugins").await).expect("/plugins JSON");
    let version = plugins[0]["version"].as_str().expect("a running version").to_owned();

    let address = host.address.clone();
    let table = tokio::task::spawn_blocking(move || status(&address, &[])).await.expect("status");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("PLUGIN") && lines[0].contains("QUEUE") && lines[0].contains("RECONCILES/S"),
        "{table}"
    );
    let row =
        lines.iter().find(|l| l.starts_with(PLUGIN)).unwrap_or_else(|| panic!("no {PLUGIN} row:\n{table}"));
    for cell in [version.as_str(), "running", "yes"] {
        assert!(row.contains(cell), "{cell} missing:\n{table}");
    }

    let address = host.address.clone();
    let json =
        tokio::task::spawn_blocking(move || status(&address, &["--output", "json"])).await.expect("status");
    let rows: serde_json::Value = serde_json::from_str(json.trim()).expect("status JSON");
    let row = &rows[0];
    assert_eq!(row["name"], PLUGIN, "{json}");
    assert_eq!(row["version"], version.as_str(), "{json}");
    assert_eq!(row["state"], "running", "{json}");
    assert!(row["queue_depth"].is_u64() && row["max_workers"] == 2, "{json}");
    assert!(row["reconciles_per_second"].is_f64() && row["instances"].is_u64(), "{json}");

    // --watch refreshes until stopped: two tables arrive one after the other.
    let mut watch = Command::new(WASMCTRL)
        .args(["status", "--watch", "--address", &host.address, "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run wasmctrl status --watch");
    let stdout = watch.stdout.take().expect("stdout");
    let headers = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.starts_with("PLUGIN"))
            .take(2)
            .count()
    })
    .await
    .expect("read --watch");
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(headers, 2, "--watch printed fewer than two refreshes");
}

#[test]
fn status_names_the_address_it_cannot_reach() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let out = Command::new(WASMCTRL)
        .args(["status", "--address", &format!("127.0.0.1:{port}"), "--interval", "100ms"])
        .output()
        .expect("run wasmctrl status");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("http://127.0.0.1:{port}/plugins")), "{err}");
}

// ---------------------------------------------------------------------------------------
// Traces

mod collector {
    //! An OTLP/gRPC trace receiver (the collector's trace service, from `opentelemetry-proto`)
    //! handing every span it receives to the test.

    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::Span;
    use tokio::sync::mpsc;

    struct Receiver(mpsc::UnboundedSender<Span>);

    #[tonic::async_trait]
    impl TraceService for Receiver {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            for resource in request.into_inner().resource_spans {
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        let _ = self.0.send(span);
                    }
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
        }
    }

    /// Starts the receiver on a free loopback port: its endpoint and the spans it receives.
    pub async fn start() -> (String, mpsc::UnboundedReceiver<Span>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        let (tx, rx) = mpsc::unbounded_channel();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Receiver(tx)))
                .serve_with_incoming(incoming),
        );
        (endpoint, rx)
    }

    /// A span's attribute as text.
    pub fn attribute(span: &Span, key: &str) -> Option<String> {
        let value = span.attributes.iter().find(|a| a.key == key)?.value.as_ref()?.value.as_ref()?;
        Some(match value {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            Value::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_is_one_trace_from_the_watch_event_to_the_plugins_writes() {
    use collector::attribute;
    let cluster = TestCluster::start().await.expect("test cluster");
    let (endpoint, mut spans) = collector::start().await;
    let host = Host::start(
        &cluster,
        &format!("\n[telemetry]\nendpoint = \"{endpoint}\"\nservice-name = \"wasmctrl-test\"\n"),
    )
    .await;
    // Ready first: the start-up lists' Namespace events go through the plugin's `map` before
    // the ConfigMap exists, so that the ConfigMap's own event is what queues its key.
    host.wait_ready().await;
    let object = format!("{}/traced", host.namespace);
    let rv = host.create_source(&cluster.client(), "traced").await;

    // Spans arrive in batches as they end, in any order. Only the spans a reconcile's tree is
    // made of are kept, grouped by trace (a host on a busy cluster exports thousands of other
    // reconciles' spans: looking through them all at each arrival would make this loop
    // quadratic); once the root is in, only its trace is looked through. A `map` hook call
    // is only noted.
    type Span = opentelemetry_proto::tonic::trace::v1::Span;
    let mut traces: std::collections::HashMap<Vec<u8>, Vec<Span>> = std::collections::HashMap::new();
    let mut root_trace: Option<Vec<u8>> = None;
    let mut received = 0usize;
    let deadline = Instant::now() + PATIENCE;
    let is_root = |s: &Span| {
        s.name == "reconcile"
            && s.parent_span_id.is_empty()
            && attribute(s, "event.object").as_deref() == Some(object.as_str())
            && attribute(s, "event.resource_version").as_deref() == Some(rv.as_str())
    };
    let find = |trace: &[Span]| {
        let root = trace.iter().find(|s| is_root(s))?;
        let child =
            |parent: &[u8], name: &str| trace.iter().find(|s| s.parent_span_id == parent && s.name == name);
        let wait = child(&root.span_id, "queue.wait")?;
        let worker = child(&root.span_id, "reconcile")?;
        let call = child(&worker.span_id, "plugin_reconcile")?;
        let cache_read = child(&call.span_id, "cache.get")?;
        let write =
            trace.iter().find(|s| s.parent_span_id == call.span_id && s.name.starts_with("client."))?;
        let request = child(&write.span_id, "api.request")?;
        Some((root.clone(), wait.clone(), cache_read.clone(), write.clone(), request.clone()))
    };
    let in_tree = |s: &Span| {
        ["reconcile", "queue.wait", "plugin_reconcile", "cache.get", "api.request"].contains(&s.name.as_str())
            || s.name.starts_with("client.")
    };
    let is_map_hook = |s: &Span| s.name == "hook" && attribute(s, "event").as_deref() == Some("map");
    let mut saw_map_hook = false;
    let (root, wait, cache_read, write, request) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, spans.recv()).await {
            Ok(Some(span)) if in_tree(&span) => {
                received += 1;
                if root_trace.is_none() && is_root(&span) {
                    root_trace = Some(span.trace_id.clone());
                }
                let trace_id = span.trace_id.clone();
                traces.entry(trace_id.clone()).or_default().push(span);
                if root_trace.as_ref() == Some(&trace_id)
                    && let Some(tree) = find(&traces[&trace_id])
                {
                    break tree;
                }
            }
            Ok(Some(span)) => saw_map_hook |= is_map_hook(&span),
            _ => {
                let ours: Vec<String> = root_trace
                    .iter()
                    .flat_map(|t| &traces[t])
                    .map(|s| format!("{} {:?}", s.name, s.attributes))
                    .collect();
                panic!(
                    "no complete reconcile trace of {object} (rv {rv}) among {received} spans of {} traces; \
                     the root {}; its trace's spans:\n{}\nthe host's log:\n{}",
                    traces.len(),
                    if root_trace.is_some() { "arrived" } else { "never arrived" },
                    ours.join("\n"),
                    host.log.lock().join("\n")
                );
            }
        }
    };
    assert_eq!(attribute(&root, "controller").as_deref(), Some(PLUGIN));
    assert_eq!(attribute(&root, "event.type").as_deref(), Some("add"));
    assert_eq!(attribute(&root, "cause").as_deref(), Some("event"));
    assert!(attribute(&root, "event.delay_ms").is_some() && attribute(&root, "queue.wait_ms").is_some());
    assert!(root.events.iter().any(|e| e.name == "watch event"), "{root:?}");
    assert!(
        root.start_time_unix_nano <= wait.start_time_unix_nano
            && wait.end_time_unix_nano <= root.end_time_unix_nano
    );
    assert_eq!(attribute(&cache_read, "kind").as_deref(), Some("ConfigMap"));
    let method = attribute(&request, "http.request.method").unwrap_or_default();
    assert!(
        ["POST", "PUT", "PATCH", "DELETE"].contains(&method.as_str()),
        "{request:?} under {}",
        write.name
    );
    assert!(attribute(&request, "url.path").is_some_and(|p| p.contains("/configmaps")), "{request:?}");
    assert!(attribute(&request, "http.response.status_code").is_some(), "{request:?}");
    assert!(
        saw_map_hook || {
            // The Namespace map calls of the start-up list may have been exported before the
            // ConfigMap's trace; wait for one.
            let deadline = Instant::now() + PATIENCE;
            loop {
                match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), spans.recv())
                    .await
                {
                    Ok(Some(s)) if is_map_hook(&s) => {
                        break true;
                    }
                    Ok(Some(_)) => {}
                    _ => break false,
                }
            }
        },
        "no trace of a map hook call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_reconcile_links_to_the_trace_of_the_one_that_failed() {
    use collector::attribute;
    // `test-plugin-panic` traps on a request named `misbehave`: every reconcile of it fails
    // and is retried with backoff.
    let cluster = TestCluster::start().await.expect("test cluster");
    let (endpoint, mut spans) = collector::start().await;
    let host = Host::start_with(
        &cluster,
        &format!("\n[telemetry]\nendpoint = \"{endpoint}\"\n"),
        &[("panicker", "test-plugin-panic")],
    )
    .await;
    // Ready first: an object created before the informers synced is queued by the start-up
    // list, not by its own watch event, and the first reconcile looked for below is the
    // event's.
    host.wait_ready().await;
    let rv = host.create_config_map(&cluster.client(), "misbehave", serde_json::json!({})).await;
    let request = format!("{}/misbehave", host.namespace);
    let is_root_of = |s: &opentelemetry_proto::tonic::trace::v1::Span| {
        s.name == "reconcile"
            && s.parent_span_id.is_empty()
            && attribute(s, "controller").as_deref() == Some("panicker")
            && attribute(s, "request").as_deref() == Some(request.as_str())
    };

    // The first reconcile (caused by the watch event) fails; a retry links to a failed one.
    let mut roots = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    let (first, retry) = loop {
        let first = roots.iter().find(|s| {
            attribute(s, "cause").as_deref() == Some("event")
                && attribute(s, "event.resource_version").as_deref() == Some(rv.as_str())
        });
        let linked = |retry: &&opentelemetry_proto::tonic::trace::v1::Span| {
            attribute(retry, "cause").as_deref() == Some("error")
                && retry.links.iter().any(|l| {
                    roots.iter().any(|r| {
                        r.trace_id == l.trace_id && r.span_id == l.span_id && r.trace_id != retry.trace_id
                    })
                })
        };
        if let (Some(first), Some(retry)) = (first, roots.iter().find(linked)) {
            break (first.clone(), retry.clone());
        }
        match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), spans.recv()).await {
            Ok(Some(span)) if is_root_of(&span) => roots.push(span),
            Ok(Some(_)) => {}
            _ => panic!(
                "no failed reconcile of {request} and a retry linked to it; roots received:\n{roots:#?}\nthe host's log:\n{}",
                host.log.lock().join("\n")
            ),
        }
    };
    assert_eq!(attribute(&first, "result").as_deref(), Some("error"), "{first:?}");
    assert!(first.status.as_ref().is_some_and(|s| s.message.contains("boom")), "{first:?}");
    assert_eq!(retry.links.len(), 1, "{retry:?}");
}
