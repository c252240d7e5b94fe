//! `docs/benchmarks.md`, written by `cargo xtask bench` from one run, so that no figure in it
//! is typed by hand: when and on what it ran (date, tree and whether it was dirty, CPU,
//! cores, memory, kernel, Rust and Go), the summary of key figures against their targets
//! (`bench_summary.rs`), then each benchmark's section in the order they ran: the tables it
//! recorded, its plots as SVG files in `docs/benchmarks/`, or, for a benchmark that records no
//! table, its standard output as printed.
//!
//! Invariants:
//! - The records are read back as the benchmarks wrote them (`bench/support/src/summary.rs`):
//!   a line with `"record": "table"` or `"plot"` belongs to its `bench`; every other line is a
//!   key figure. A line that does not parse is shown, never dropped.
//! - Every SVG the previous run wrote is removed first, so no stale plot stays linked.
//! - Plots are drawn with `plotters`' SVG backend alone: text is written as SVG text, sized
//!   without font files, so a machine without fontconfig draws them.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

use super::bench_summary;

/// One benchmark as it ran.
pub struct BenchOutput {
    pub name: String,
    pub package: String,
    pub stdout: String,
    /// Why it failed, if it did.
    pub failure: Option<String>,
}

/// What the report says about the run itself.
pub struct RunInfo {
    pub quick: bool,
    /// Unix seconds at the start of the run.
    pub started: u64,
    pub seconds: f64,
    /// The tree measured, as [`tree_state`] saw it when the run started (the report's own
    /// files, written at the end, would make any tree look dirty).
    pub tree: String,
}

/// The commit checked out and whether the tree differs from it (tracked files only).
pub fn tree_state(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let tree = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => "clean",
        Some(_) => "dirty (uncommitted changes)",
        None => "unknown",
    };
    format!("`{tree}`, {dirty}")
}

/// A plot as recorded.
struct PlotRecord {
    title: String,
    x_label: String,
    y_label: String,
    log_y: bool,
    lines: Vec<(String, Vec<(f64, f64)>)>,
}

impl PlotRecord {
    fn parse(v: &Value) -> Option<Self> {
        let lines = v["lines"]
            .as_array()?
            .iter()
            .filter_map(|l| {
                let points = l["points"]
                    .as_array()?
                    .iter()
                    .filter_map(|p| Some((p[0].as_f64()?, p[1].as_f64()?)))
                    .collect::<Vec<_>>();
                Some((l["name"].as_str()?.to_owned(), points))
            })
            .filter(|(_, p)| !p.is_empty())
            .collect::<Vec<_>>();
        Some(PlotRecord {
            title: v["title"].as_str()?.to_owned(),
            x_label: v["x_label"].as_str().unwrap_or_default().to_owned(),
            y_label: v["y_label"].as_str().unwrap_or_default().to_owned(),
            log_y: v["log_y"].as_bool().unwrap_or(false),
            lines,
        })
    }
}

/// A table as recorded, as Markdown.
fn table_markdown(v: &Value) -> Option<String> {
    let cells = |row: &Value| -> Option<Vec<String>> {
        row.as_array()?.iter().map(|c| c.as_str().map(|s| s.replace('|', "\\|"))).collect()
    };
    let columns = cells(&v["columns"])?;
    let rows = v["rows"].as_array()?.iter().map(cells).collect::<Option<Vec<_>>>()?;
    let mut out = format!("{}\n\n| {} |\n", v["title"].as_str()?, columns.join(" | "));
    // Figures right-aligned: a column most of whose cells start with a digit.
    let numeric = |i: usize| {
        let digits = rows
            .iter()
            .filter(|r| r.get(i).is_some_and(|c| c.starts_with(|ch: char| ch.is_ascii_digit())))
            .count();
        i > 0 && digits * 2 > rows.len()
    };
    let rule: Vec<&str> = (0..columns.len()).map(|i| if numeric(i) { "---:" } else { "---" }).collect();
    let _ = writeln!(out, "|{}|", rule.join("|"));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    for note in v["notes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let _ = write!(out, "\n{note}\n");
    }
    Some(out)
}

/// The plot as an SVG document.
fn svg(plot: &PlotRecord) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (760, 420)).into_drawing_area();
        let draw = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e:?}", plot.title);
        root.fill(&WHITE).map_err(draw)?;
        let points = plot.lines.iter().flat_map(|(_, p)| p.iter().copied());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in points {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.1, 1.0);
        }
        let pad = ((x1 - x0) * 0.05).max(x1.abs() * 0.05).max(1e-9);
        let (x0, x1) = (x0 - pad, x1 + pad);
        let mut chart = ChartBuilder::on(&root);
        chart.caption(&plot.title, ("sans-serif", 16)).margin(12).x_label_area_size(40).y_label_area_size(64);
        // Distinguishable on white, in order.
        const COLOURS: [RGBColor; 6] = [
            RGBColor(31, 119, 180),
            RGBColor(214, 39, 40),
            RGBColor(44, 160, 44),
            RGBColor(148, 103, 189),
            RGBColor(255, 127, 14),
            RGBColor(23, 190, 207),
        ];
        let colour = |i: usize| COLOURS[i % COLOURS.len()].to_rgba();
        let label = |v: &f64| {
            let a = v.abs();
            if a >= 100.0 || a == 0.0 {
                format!("{v:.0}")
            } else if a >= 1.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            }
        };
        macro_rules! draw_lines {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(plot.x_label.as_str())
                    .y_desc(plot.y_label.as_str())
                    .x_label_formatter(&label)
                    .y_label_formatter(&label)
                    .light_line_style(WHITE)
                    .draw()
                    .map_err(draw)?;
                for (i, (name, points)) in plot.lines.iter().enumerate() {
                    let style = colour(i).stroke_width(2);
                    chart
                        .draw_series(LineSeries::new(points.iter().copied(), style))
                        .map_err(draw)?
                        .label(name.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], colour(i).stroke_width(2))
                        });
                    chart
                        .draw_series(points.iter().map(|p| Circle::new(*p, 3, colour(i).filled())))
                        .map_err(draw)?;
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(draw)?;
            }};
        }
        if plot.log_y {
            let (lo, hi) = (y0.max(1e-6) / 1.5, y1.max(1e-6) * 1.5);
            draw_lines!(chart.build_cartesian_2d(x0..x1, (lo..hi).log_scale().base(10.0)).map_err(draw)?);
        } else {
            let pad = ((y1 - y0) * 0.1).max(y1.abs() * 0.05).max(1e-9);
            let lo = if y0 >= 0.0 { 0.0 } else { y0 - pad };
            draw_lines!(chart.build_cartesian_2d(x0..x1, lo..y1 + pad).map_err(draw)?);
        }
        root.present().map_err(draw)?;
    }
    Ok(out)
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| format!("`{cmd}` not available"))
}

fn proc_field(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// `YYYY-MM-DD HH:MM UTC` of Unix seconds (the proleptic Gregorian calendar, Howard
/// Hinnant's days-from-civil inverse).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// The run's header: when, which tree, which machine and toolchains.
fn header(run: &RunInfo) -> String {
    let cores_online = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib: f64 = proc_field("/proc/meminfo", "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(f64::NAN);
    let rows = [
        ("date", format!("{} (took {:.0} min)", utc(run.started), run.seconds / 60.0)),
        ("tree", format!("{} at the start", run.tree)),
        ("CPU", proc_field("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into())),
        ("cores", cores_online.to_string()),
        ("memory", format!("{:.1} GiB", mem_kib / 1024.0 / 1024.0)),
        (
            "kernel",
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".into(), |s| s.trim().into()),
        ),
        ("Rust", command_line("rustc", &["--version"])),
        ("Go", command_line("go", &["version"])),
    ];
    let mut out = String::from("| | |\n|---|---|\n");
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    out
}

/// Writes `docs/benchmarks.md` and its plots from the run's records and outputs.
pub fn write(root: &Path, records: &str, outputs: &[BenchOutput], run: &RunInfo) -> Result<()> {
    let docs = root.join("docs");
    let plots_dir = docs.join("benchmarks");
    std::fs::create_dir_all(&plots_dir).with_context(|| format!("creating {}", plots_dir.display()))?;
    for entry in std::fs::read_dir(&plots_dir).with_context(|| format!("reading {}", plots_dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "svg") {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }

    let mut figures = String::new();
    let mut by_bench: Vec<(String, Vec<String>)> = Vec::new();
    let section = |bench: &str, block: String, by_bench: &mut Vec<(String, Vec<String>)>| match by_bench
        .iter_mut()
        .find(|(b, _)| b == bench)
    {
        Some((_, blocks)) => blocks.push(block),
        None => by_bench.push((bench.to_owned(), vec![block])),
    };
    let mut plots = 0;
    for line in records.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            figures.push_str(line);
            figures.push('\n');
            continue;
        };
        let bench = v["bench"].as_str().unwrap_or("?").to_owned();
        match v["record"].as_str() {
            Some("table") => {
                let block = table_markdown(&v).unwrap_or_else(|| format!("unreadable table: `{line}`\n"));
                section(&bench, block, &mut by_bench);
            }
            Some("plot") => {
                let block = match PlotRecord::parse(&v) {
                    Some(p) => {
                        plots += 1;
                        let file = format!("{bench}-{plots}.svg");
                        std::fs::write(plots_dir.join(&file), svg(&p)?)
                            .with_context(|| format!("writing {file}"))?;
                        format!("![{}](benchmarks/{file})\n", p.title)
                    }
                    None => format!("unreadable plot: `{line}`\n"),
                };
                section(&bench, block, &mut by_bench);
            }
            _ => {
                figures.push_str(line);
                figures.push('\n');
            }
        }
    }

    let mut out = String::from("# Benchmarks\n\n");
    out.push_str("<!-- Written by `cargo xtask bench` from one run; do not edit by hand, rerun it. -->\n\n");
    if run.quick {
        out.push_str(
            "**Smoke run (`cargo xtask bench --quick`): every benchmark at reduced sizes, built \
             with the dev profile (the workspace unoptimised). The figures show that the harness \
             works, not how fast anything is; a full `cargo xtask bench` (release) on a quiet \
             machine replaces this page.**\n\n",
        );
    }
    out.push_str(&header(run));
    out.push_str(
        "\nEach benchmark also runs alone, `cargo bench -p <package> --bench <name>`; sizes are \
         environment variables named in each file's header. Tables give the median of the rounds \
         with the spread (min–max) in brackets where a benchmark runs rounds.\n\n",
    );
    out.push_str("## Key figures against their targets\n\n");
    out.push_str(
        "wasmctrl's figure, what it was compared with in the same run (× = how many times better \
         wasmctrl is), and its target.\n\n",
    );
    out.push_str(&bench_summary::render(&figures));
    for o in outputs {
        let _ = write!(out, "\n## {}\n\n`cargo bench -p {} --bench {}`\n\n", o.name, o.package, o.name);
        if let Some(why) = &o.failure {
            let _ = writeln!(out, "**Failed:** {why}\n");
        }
        let blocks = match by_bench.iter().position(|(b, _)| *b == o.name) {
            Some(i) => by_bench.remove(i).1,
            None => Vec::new(),
        };
        // A benchmark that recorded no table is shown by its own output, beside any plot.
        if !blocks.iter().any(|b| !b.starts_with("![")) {
            let _ = writeln!(out, "Its output:\n\n```text\n{}\n```\n", o.stdout.trim_end());
        }
        out.push_str(&blocks.join("\n"));
    }
    for (bench, blocks) in by_bench {
        let _ = write!(out, "\n## {bench}\n\n{}", blocks.join("\n"));
    }
    let path = docs.join("benchmarks.md");
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask: wrote {} ({plots} plots)", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06 UTC");
    }

    #[test]
    fn a_recorded_table_becomes_markdown_with_its_notes() {
        let v: Value = serde_json::from_str(
            r#"{"record":"table","bench":"anchors","title":"T","columns":["a","b"],"rows":[["x","1 (0–2)"],["y|z",""]],"notes":["n1"]}"#,
        )
        .expect("json");
        let md = table_markdown(&v).expect("table");
        assert_eq!(md, "T\n\n| a | b |\n|---|---|\n| x | 1 (0–2) |\n| y\\|z |  |\n\nn1\n");
        let v: Value = serde_json::from_str(
            r#"{"title":"T","columns":["a","wire","n"],"rows":[["x","JSON","1"],["y","protobuf","2 (1–3)"]],"notes":[]}"#,
        )
        .expect("json");
        assert!(table_markdown(&v).expect("table").contains("|---|---|---:|"));
    }

    #[test]
    fn a_plot_renders_as_svg_with_its_text() {
        let v: Value = serde_json::from_str(
            r#"{"record":"plot","bench":"anchors","title":"p99 against rate","x_label":"updates/s","y_label":"ms","log_y":true,
                "lines":[{"name":"wasmctrl","points":[[5000,0.2],[20000,0.5]]},{"name":"kube-rs","points":[[5000,1.3]]}]}"#,
        )
        .expect("json");
        let svg = svg(&PlotRecord::parse(&v).expect("plot")).expect("svg");
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in ["p99 against rate", "updates/s", "wasmctrl", "kube-rs"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn the_report_has_every_section_and_no_stale_plot() {
        let root = std::env::temp_dir().join(format!("wasmctrl-bench-report-{}", std::process::id()));
        let plots = root.join("docs/benchmarks");
        std::fs::create_dir_all(&plots).expect("dirs");
        std::fs::write(plots.join("old-1.svg"), "stale").expect("stale plot");
        let records = concat!(
            r#"{"record":"figure","bench":"anchors","measure":"events/s","value":2,"unit":"events/s","better":"higher","against":[],"target":1}"#,
            "\n",
            r#"{"record":"table","bench":"anchors","title":"Informers","columns":["a"],"rows":[["1"]],"notes":[]}"#,
            "\n",
            r#"{"record":"plot","bench":"anchors","title":"P","x_label":"x","y_label":"y","log_y":false,"lines":[{"name":"l","points":[[1,2]]}]}"#,
            "\n",
            r#"{"record":"plot","bench":"scale","title":"RSS","x_label":"s","y_label":"MiB","log_y":false,"lines":[{"name":"l","points":[[1,2]]}]}"#,
            "\nnot json\n",
        );
        let outputs = [
            BenchOutput {
                name: "anchors".into(),
                package: "wasmctrl".into(),
                stdout: String::new(),
                failure: None,
            },
            BenchOutput {
                name: "scale".into(),
                package: "wasmctrl".into(),
                stdout: "scale output\n".into(),
                failure: None,
            },
            BenchOutput {
                name: "queue".into(),
                package: "wasmctrl".into(),
                stdout: "queue table\n".into(),
                failure: Some("exit 1".into()),
            },
        ];
        write(
            &root,
            records,
            &outputs,
            &RunInfo { quick: true, started: 0, seconds: 60.0, tree: "`0123456789ab`, clean".into() },
        )
        .expect("report");
        let md = std::fs::read_to_string(root.join("docs/benchmarks.md")).expect("report");
        let stale_left = plots.join("old-1.svg").exists();
        let _ = std::fs::remove_dir_all(&root);
        assert!(!stale_left, "the previous run's plot is still there");
        for part in [
            "Smoke run",
            "| date | 1970-01-01 00:00 UTC (took 1 min) |",
            "1 of 1 targets met",
            "unreadable figure",
            "## anchors",
            "Informers\n\n| a |",
            "![P](benchmarks/anchors-1.svg)",
            "## queue",
            "**Failed:** exit 1",
            "```text\nqueue table\n```",
            "```text\nscale output\n```\n\n![RSS](benchmarks/scale-2.svg)",
        ] {
            assert!(md.contains(part), "{part:?} missing from:\n{md}");
        }
    }
}
