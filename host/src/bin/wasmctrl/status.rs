//! `wasmctrl status`: what a running host is doing, read from its HTTP endpoint (`/plugins`
//! for each plugin's version, state and last error; `/metrics` for queue depths, workers,
//! instances and the reconcile and error counters), shown as a table or as JSON.
//!
//! Rates are differences between two scrapes: a single `status` scrapes twice, `--interval`
//! apart; `--watch` scrapes every `--interval` and shows the rates since the previous one.
//! With `--watch` on a terminal the table is redrawn in place; otherwise each refresh is
//! printed after the last (JSON: one document per line).

#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Empty};
use serde::{Deserialize, Serialize};

/// `wasmctrl status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The host's HTTP endpoint (its `[server] address`).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub address: String,
    /// Refresh every `--interval` until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Time between the two scrapes rates are computed from (and between refreshes).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// How `status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// An aligned table for people.
    Table,
    /// JSON for scripts (one document per refresh).
    Json,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = s.parse::<wasmctrl::config::DurationValue>().map_err(|e| e.to_string())?.get();
    if d < Duration::from_millis(100) {
        return Err(format!("`{s}` is too short (at least 100ms)"));
    }
    Ok(d)
}

/// One plugin as `/plugins` reports it (the fields `status` shows).
#[derive(Clone, Debug, Deserialize)]
struct PluginEntry {
    name: String,
    version: Option<String>,
    state: String,
    ready: bool,
    last_error: Option<String>,
    note: Option<String>,
    reloads: u64,
    rejected: u64,
}

/// One plugin's row.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PluginRow {
    pub name: String,
    pub version: Option<String>,
    pub state: String,
    pub ready: bool,
    /// Keys waiting in its queue (`workqueue_depth`).
    pub queue_depth: Option<u64>,
    /// Workers reconciling now, of the configured maximum.
    pub active_workers: Option<u64>,
    pub max_workers: Option<u64>,
    /// Reconciles per second between the two scrapes (every result).
    pub reconciles_per_second: Option<f64>,
    /// Reconcile errors per second between the two scrapes.
    pub errors_per_second: Option<f64>,
    /// Instances alive.
    pub instances: Option<u64>,
    pub reloads: u64,
    pub rejected_reloads: u64,
    /// The last load error, or the controller's (`/plugins`).
    pub last_error: Option<String>,
    pub note: Option<String>,
}

/// The series `status` reads, per plugin (its controller and queue are named after it).
#[derive(Clone, Debug, Default)]
struct Counters {
    depth: HashMap<String, f64>,
    active: HashMap<String, f64>,
    max_workers: HashMap<String, f64>,
    reconciles: HashMap<String, f64>,
    errors: HashMap<String, f64>,
    instances: HashMap<String, f64>,
}

/// A sample's labels: name and value, in their order on the line.
type Labels = Vec<(String, String)>;

/// One sample line of the Prometheus / OpenMetrics text format: name, labels, value.
///
/// Written here rather than taken from a crate: `status` needs the name, labels and value
/// of a few series; the text-format crate available (`prometheus-parse`) brings regex and
/// chrono for that and files OpenMetrics counters (`x_total` samples of family `x`) as
/// untyped.
fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '}' => {
                    end = Some(i);
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    // The value: a quoted string with \\, \" and \n escapes.
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        }
        rest = &inner[end? + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

impl Counters {
    fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for (name, labels, value) in text.lines().filter_map(parse_sample) {
            let (map, key) = match name {
                "workqueue_depth" => (&mut c.depth, "name"),
                "controller_runtime_active_workers" => (&mut c.active, "controller"),
                "controller_runtime_max_concurrent_reconciles" => (&mut c.max_workers, "controller"),
                "controller_runtime_reconcile_total" => (&mut c.reconciles, "controller"),
                "controller_runtime_reconcile_errors_total" => (&mut c.errors, "controller"),
                "wasmctrl_plugin_instances" => (&mut c.instances, "plugin"),
                _ => continue,
            };
            if let Some(plugin) = label(&labels, key) {
                *map.entry(plugin.to_owned()).or_default() += value;
            }
        }
        c
    }
}

/// Rate of a counter between two scrapes `elapsed` apart (a reset counts from zero).
fn rate(before: Option<&f64>, after: Option<&f64>, elapsed: Duration) -> Option<f64> {
    let after = *after?;
    let before = before.copied().unwrap_or(0.0);
    let delta = if after >= before { after - before } else { after };
    let secs = elapsed.as_secs_f64();
    (secs > 0.0).then(|| delta / secs)
}

fn count(v: Option<&f64>) -> Option<u64> {
    v.map(|v| if v.is_finite() && *v > 0.0 { v.round() as u64 } else { 0 })
}

fn rows(plugins: Vec<PluginEntry>, before: &Counters, after: &Counters, elapsed: Duration) -> Vec<PluginRow> {
    plugins
        .into_iter()
        .map(|p| {
            let n = p.name.as_str();
            PluginRow {
                queue_depth: count(after.depth.get(n)),
                active_workers: count(after.active.get(n)),
                max_workers: count(after.max_workers.get(n)),
                reconciles_per_second: rate(before.reconciles.get(n), after.reconciles.get(n), elapsed),
                errors_per_second: rate(before.errors.get(n), after.errors.get(n), elapsed),
                instances: count(after.instances.get(n)),
                name: p.name,
                version: p.version,
                state: p.state,
                ready: p.ready,
                reloads: p.reloads,
                rejected_reloads: p.rejected,
                last_error: p.last_error,
                note: p.note,
            }
        })
        .collect()
}

/// The rows as an aligned table (a header line, then one line per plugin).
pub fn render_table(rows: &[PluginRow]) -> String {
    let dash = || "-".to_owned();
    let num = |v: Option<u64>| v.map_or_else(dash, |v| v.to_string());
    let per_s = |v: Option<f64>| v.map_or_else(dash, |v| format!("{v:.2}"));
    let header = [
        "PLUGIN",
        "VERSION",
        "STATE",
        "READY",
        "QUEUE",
        "WORKERS",
        "RECONCILES/S",
        "ERRORS/S",
        "INSTANCES",
        "RELOADS",
        "LAST ERROR",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for r in rows {
        let workers = match (r.active_workers, r.max_workers) {
            (Some(a), Some(m)) => format!("{a}/{m}"),
            _ => dash(),
        };
        let mut error = r.last_error.clone().or_else(|| r.note.clone()).unwrap_or_else(dash);
        // One line per plugin: the first line of the error, cut at a readable length.
        error = error.lines().next().unwrap_or_default().to_owned();
        if error.chars().count() > 80 {
            error = error.chars().take(79).chain(['…']).collect();
        }
        table.push(vec![
            r.name.clone(),
            r.version.clone().unwrap_or_else(dash),
            r.state.clone(),
            if r.ready { "yes" } else { "no" }.to_owned(),
            num(r.queue_depth),
            workers,
            per_s(r.reconciles_per_second),
            per_s(r.errors_per_second),
            num(r.instances),
            format!("{}/{}", r.reloads, r.rejected_reloads),
            error,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| table.iter().map(|row| row[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(
                |(i, cell)| {
                    if i + 1 == row.len() { cell.clone() } else { format!("{cell:<w$}", w = widths[i]) }
                },
            )
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str("(no plugins)\n");
    }
    out
}

/// An HTTP GET of `path` on `address`; the body, or an error naming the URL.
async fn get(address: &str, path: &str) -> Result<String> {
    let url = format!("http://{address}{path}");
    let uri: http::Uri = url.parse().with_context(|| format!("`{address}` is not a host:port"))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .with_context(|| format!("GET {url}: no answer within 10s"))?
        .with_context(|| format!("GET {url} (is `wasmctrl run` serving on {address}?)"))?;
    let status = response.status();
    let body = response.into_body().collect().await.with_context(|| format!("reading {url}"))?.to_bytes();
    if !status.is_success() {
        bail!("GET {url}: {status}");
    }
    String::from_utf8(body.to_vec()).with_context(|| format!("{url} answered with text that is not UTF-8"))
}

async fn scrape(address: &str) -> Result<(Vec<PluginEntry>, Counters, Instant)> {
    let plugins = get(address, "/plugins").await?;
    let plugins: Vec<PluginEntry> = serde_json::from_str(&plugins)
        .with_context(|| format!("reading http://{address}/plugins (is this a wasmctrl host?)"))?;
    let metrics = get(address, "/metrics").await?;
    Ok((plugins, Counters::parse(&metrics), Instant::now()))
}

fn print(rows: &[PluginRow], output: Output, redraw: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Output::Json => writeln!(out, "{}", serde_json::to_string(rows)?)?,
        Output::Table => {
            if redraw {
                // Clear the screen and go home: the table is redrawn in place.
                write!(out, "\x1b[2J\x1b[H")?;
            }
            write!(out, "{}", render_table(rows))?;
            if !redraw {
                writeln!(out)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

pub fn status(args: StatusArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let redraw = args.watch && args.output == Output::Table && std::io::stdout().is_terminal();
        let (_, mut before, mut at) = scrape(&args.address).await?;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(args.interval) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
            let (plugins, after, now) = scrape(&args.address).await?;
            let rows = rows(plugins, &before, &after, now - at);
            print(&rows, args.output, redraw)?;
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
            (before, at) = (after, now);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(rows: &[PluginRow]) -> BTreeMap<&str, &PluginRow> {
        rows.iter().map(|r| (r.name.as_str(), r)).collect()
    }

    const METRICS: &str = r#"# HELP workqueue_depth Current depth of workqueue.
# TYPE workqueue_depth gauge
workqueue_depth{name="mirror"} 3
# TYPE controller_runtime_reconcile counter
controller_runtime_reconcile_total{controller="mirror",result="success"} 10
controller_runtime_reconcile_total{controller="mirror",result="error"} 2
controller_runtime_reconcile_errors_total{controller="mirror"} 2
controller_runtime_active_workers{controller="mirror"} 1
controller_runtime_max_concurrent_reconciles{controller="mirror"} 2
wasmctrl_plugin_instances{plugin="mirror"} 2
wasmctrl_plugin_info{plugin="odd \"name\\",version="x"} 1
# EOF
"#;

    #[test]
    fn samples_are_read_with_their_labels() {
        let (name, labels, value) = parse_sample(r#"a_total{x="1",y="q\"uo\\te"} 4.5"#).unwrap();
        assert_eq!((name, value), ("a_total", 4.5));
        assert_eq!(labels, vec![("x".into(), "1".into()), ("y".into(), "q\"uo\\te".into())]);
        assert_eq!(parse_sample("plain 7").map(|s| s.2), Some(7.0));
        assert!(parse_sample("# TYPE x counter").is_none());
        assert!(parse_sample("broken{x=1} 2").is_none());
        assert!(parse_sample("").is_none());
    }

    #[test]
    fn rows_join_plugins_and_rates() {
        let after = Counters::parse(METRICS);
        let before = Counters::parse(
            &METRICS
                .replace("} 10", "} 4")
                .replace("errors_total{controller=\"mirror\"} 2", "errors_total{controller=\"mirror\"} 0"),
        );
        let plugins = vec![PluginEntry {
            name: "mirror".into(),
            version: Some("abc123".into()),
            state: "running".into(),
            ready: true,
            last_error: Some("reload rejected: bad wasm\nmore".into()),
            note: None,
            reloads: 1,
            rejected: 1,
        }];
        let rows = rows(plugins, &before, &after, Duration::from_secs(2));
        let r = by_name(&rows)["mirror"];
        assert_eq!(
            (r.queue_depth, r.active_workers, r.max_workers, r.instances),
            (Some(3), Some(1), Some(2), Some(2))
        );
        // (10 + 2) - (4 + 2) reconciles over 2 s; 2 - 0 errors over 2 s.
        assert_eq!((r.reconciles_per_second, r.errors_per_second), (Some(3.0), Some(1.0)));
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PLUGIN") && lines[0].ends_with("LAST ERROR"), "{table}");
        assert!(lines[1].starts_with("mirror"), "{table}");
        for cell in ["abc123", "running", "yes", "1/2", "3.00", "1.00", "reload rejected: bad wasm"] {
            assert!(lines[1].contains(cell), "{cell} in {table}");
        }
        assert!(!table.contains("more"), "{table}");
    }

    #[test]
    fn a_counter_reset_counts_from_zero() {
        assert_eq!(rate(Some(&10.0), Some(&4.0), Duration::from_secs(2)), Some(2.0));
        assert_eq!(rate(None, Some(&4.0), Duration::from_secs(4)), Some(1.0));
        assert_eq!(rate(Some(&1.0), None, Duration::from_secs(1)), None);
    }
}
