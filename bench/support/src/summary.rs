//! What a benchmark run hands `cargo xtask bench` for `docs/benchmarks.md`, one JSON line per
//! record (`xtask/src/bench_report.rs` and `bench_summary.rs` read them back):
//! - a key figure ([`Figure`], `"record": "figure"`, the default when `record` is absent):
//!   one measure of wasmctrl's, what it was compared with in the same run, and its target,
//!   for the closing summary table;
//! - a whole table ([`Table`], `"record": "table"`): a title, column names, rows of cells
//!   already formatted (a figure over rounds reads "median (min–max)"), and notes;
//! - a plot ([`Plot`], `"record": "plot"`): named lines of (x, y) points and the axes' labels,
//!   drawn as SVG by the reader.
//!
//! Invariants:
//! - Without `WASMCTRL_BENCH_SUMMARY` in the environment, `record` does nothing: a benchmark
//!   run on its own prints its own tables and nothing else changes.
//! - With it, each record is appended to that file as one line written with a single
//!   `write` on a file opened for appending, so records of benchmark processes running one
//!   after another (or a parent and its children) never interleave within a line.
//! - Writing never fails a benchmark: a record that cannot be written is reported on
//!   stderr and the run goes on.
//!
//! A figure's fields (`bench`, `measure`, `value`, `unit`, `better`, `against` — a list of
//! `{name, value}` — and `target`) are the contract with the reader; a ratio is computed by
//! the reader as "how many times better wasmctrl is", from `better`.

use std::io::Write;

use serde_json::{Value, json};

/// The environment variable naming the file figures are appended to.
pub const SUMMARY_ENV: &str = "WASMCTRL_BENCH_SUMMARY";

/// Which direction of a figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One figure of wasmctrl's, optionally next to another implementation's and a target.
#[derive(Clone, Debug)]
pub struct Figure {
    bench: String,
    measure: String,
    value: f64,
    unit: String,
    better: Better,
    against: Vec<(String, f64)>,
    target: Option<f64>,
}

impl Figure {
    /// A figure where a higher value is better (throughput).
    pub fn higher(bench: &str, measure: impl Into<String>, value: f64, unit: &str) -> Self {
        Self::new(bench, measure.into(), value, unit, Better::Higher)
    }

    /// A figure where a lower value is better (latency, memory, time).
    pub fn lower(bench: &str, measure: impl Into<String>, value: f64, unit: &str) -> Self {
        Self::new(bench, measure.into(), value, unit, Better::Lower)
    }

    fn new(bench: &str, measure: String, value: f64, unit: &str, better: Better) -> Self {
        Figure {
            bench: bench.into(),
            measure,
            value,
            unit: unit.into(),
            better,
            against: Vec::new(),
            target: None,
        }
    }

    /// The same measure of another implementation (or configuration) in the same run;
    /// several may be added. A non-finite value (not measured) is left out.
    pub fn against(mut self, name: &str, value: f64) -> Self {
        if value.is_finite() {
            self.against.push((name.into(), value));
        }
        self
    }

    /// The value wasmctrl aims for, in the figure's unit (met when the value is at least
    /// as good).
    pub fn target(mut self, target: f64) -> Self {
        self.target = Some(target);
        self
    }

    /// The figure as the JSON line's value.
    pub fn to_json(&self) -> Value {
        json!({
            "record": "figure",
            "bench": self.bench,
            "measure": self.measure,
            "value": self.value,
            "unit": self.unit,
            "better": match self.better { Better::Higher => "higher", Better::Lower => "lower" },
            "against": self.against.iter().map(|(n, v)| json!({ "name": n, "value": v })).collect::<Vec<_>>(),
            "target": self.target,
        })
    }

    /// Appends the figure to the summary file, if one is named. Non-finite values (a
    /// measurement that did not happen) are skipped.
    pub fn record(self) {
        if self.value.is_finite() {
            append(&self.to_json());
        }
    }
}

/// Appends one record to the summary file, if one is named.
fn append(record: &Value) {
    let Some(path) = std::env::var_os(SUMMARY_ENV) else { return };
    let mut line = record.to_string();
    line.push('\n');
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("bench summary: cannot append to {}: {e}", std::path::Path::new(&path).display());
    }
}

/// A table as a benchmark prints it, with the notes that go under it.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    bench: String,
    title: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    /// An empty table of `bench` with these columns (the first is left-aligned, the others
    /// right-aligned).
    pub fn new(bench: &str, title: impl Into<String>, columns: &[&str]) -> Self {
        Table {
            bench: bench.into(),
            title: title.into(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row; missing cells are left empty, extra ones dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// Adds a note printed under the table.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// The table as Markdown, columns padded to their widths, then its notes.
    pub fn markdown(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.columns[i].chars().count(), 3])
                .max()
                .unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.columns.len()).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pad = " ".repeat(widths[i] - c.chars().count());
                    if i == 0 { format!("{c}{pad}") } else { format!("{pad}{c}") }
                })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut out = format!("{}\n\n", self.title);
        out.push_str(&line(&self.columns));
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(i, w)| if i == 0 { "-".repeat(w + 2) } else { format!("{}:", "-".repeat(w + 1)) })
            .collect();
        out.push_str(&format!("|{}|\n", rule.join("|")));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        for n in &self.notes {
            out.push_str(&format!("\n{n}\n"));
        }
        out
    }

    /// Prints the table on stdout.
    pub fn print(&self) {
        println!();
        print!("{}", self.markdown());
    }

    pub fn to_json(&self) -> Value {
        json!({
            "record": "table",
            "bench": self.bench,
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
        })
    }

    /// Prints the table and appends it to the summary file, if one is named.
    pub fn print_and_record(&self) {
        self.print();
        append(&self.to_json());
    }
}

/// A plot: named lines of (x, y) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    bench: String,
    title: String,
    x_label: String,
    y_label: String,
    log_y: bool,
    lines: Vec<(String, Vec<(f64, f64)>)>,
}

impl Plot {
    pub fn new(bench: &str, title: impl Into<String>, x_label: &str, y_label: &str) -> Self {
        Plot {
            bench: bench.into(),
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_y: false,
            lines: Vec::new(),
        }
    }

    /// Draws the y axis on a logarithmic scale.
    pub fn log_y(mut self) -> Self {
        self.log_y = true;
        self
    }

    /// Adds a line; points with a non-finite coordinate are left out, and so is a line left
    /// without points.
    pub fn line(&mut self, name: impl Into<String>, points: impl IntoIterator<Item = (f64, f64)>) {
        let points: Vec<(f64, f64)> =
            points.into_iter().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        if !points.is_empty() {
            self.lines.push((name.into(), points));
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "record": "plot",
            "bench": self.bench,
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "log_y": self.log_y,
            "lines": self.lines.iter().map(|(name, points)| json!({
                "name": name,
                "points": points.iter().map(|(x, y)| json!([x, y])).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    /// Appends the plot to the summary file, if one is named (and it has a line).
    pub fn record(&self) {
        if !self.lines.is_empty() {
            append(&self.to_json());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_carries_its_comparison_and_target() {
        let v = Figure::lower("plugin", "reconcile", 12.5, "µs")
            .against("native", 5.0)
            .against("not measured", f64::NAN)
            .target(7.5)
            .to_json();
        assert_eq!(v["bench"], "plugin");
        assert_eq!(v["better"], "lower");
        assert_eq!(v["against"], json!([{ "name": "native", "value": 5.0 }]));
        assert_eq!(v["target"], 7.5);
        let bare = Figure::higher("informer", "events/s", 1.0, "1/s").to_json();
        assert_eq!(bare["against"], json!([]));
        assert!(bare["target"].is_null());
    }

    #[test]
    fn a_table_pads_its_cells_and_keeps_its_notes() {
        let mut t = Table::new("anchors", "Informers", &["consumer", "events/s"]);
        t.row(vec!["wasmctrl".into(), "336286".into()]);
        t.row(vec!["client-go (JSON)".into()]);
        t.note("Go: go1.26, GOMAXPROCS=2, GOGC=100");
        let md = t.markdown();
        assert!(md.starts_with("Informers\n\n| consumer         | events/s |\n"), "{md}");
        assert!(md.contains("|------------------|---------:|\n"), "{md}");
        assert!(md.contains("| client-go (JSON) |          |\n"), "{md}");
        assert!(md.ends_with("\nGo: go1.26, GOMAXPROCS=2, GOGC=100\n"), "{md}");
        let v = t.to_json();
        assert_eq!(v["record"], "table");
        assert_eq!(v["rows"][1], json!(["client-go (JSON)", ""]));
    }

    #[test]
    fn a_plot_drops_points_it_cannot_draw() {
        let mut p = Plot::new("anchors", "p99", "updates/s", "ms").log_y();
        p.line("wasmctrl", [(5000.0, 0.2), (20000.0, f64::NAN)]);
        p.line("nothing", [(1.0, f64::INFINITY)]);
        let v = p.to_json();
        assert_eq!(v["log_y"], true);
        assert_eq!(v["lines"], json!([{ "name": "wasmctrl", "points": [[5000.0, 0.2]] }]));
    }
}
