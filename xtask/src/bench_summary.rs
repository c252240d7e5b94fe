//! The table `cargo xtask bench` closes with: every benchmark's key figures, what they were
//! compared with in the same run (ratio = how many times better wasmctrl is, > 1 better),
//! and issue 12's target for each.
//!
//! The benchmarks append one JSON line per figure to the file named by
//! `WASMCTRL_BENCH_SUMMARY` (`bench/support/src/summary.rs` writes them); this reads the
//! figure lines back in order (`bench.rs` leaves tables and plots to `bench_report.rs`). A line that does not parse is reported in the table's place, never
//! dropped silently.

use std::fmt::Write as _;

use serde_json::Value;

/// One figure as a benchmark recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub bench: String,
    pub measure: String,
    pub value: f64,
    pub unit: String,
    pub higher_is_better: bool,
    pub against: Vec<(String, f64)>,
    pub target: Option<f64>,
}

impl Figure {
    fn parse(line: &str) -> Result<Figure, String> {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
        let text = |k: &str| v[k].as_str().map(str::to_owned).ok_or_else(|| format!("no `{k}` in {line}"));
        let higher_is_better = match v["better"].as_str() {
            Some("higher") => true,
            Some("lower") => false,
            _ => return Err(format!("`better` is neither \"higher\" nor \"lower\" in {line}")),
        };
        let against = v["against"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| Some((o["name"].as_str()?.to_owned(), o["value"].as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Figure {
            bench: text("bench")?,
            measure: text("measure")?,
            value: v["value"].as_f64().ok_or_else(|| format!("no `value` in {line}"))?,
            unit: text("unit")?,
            higher_is_better,
            against,
            target: v["target"].as_f64(),
        })
    }

    /// How many times better this figure is than `other` (> 1: better).
    fn ratio(&self, other: f64) -> Option<f64> {
        let r = if self.higher_is_better { self.value / other } else { other / self.value };
        r.is_finite().then_some(r)
    }

    fn meets(&self, target: f64) -> bool {
        if self.higher_is_better { self.value >= target } else { self.value <= target }
    }
}

fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn times(r: f64) -> String {
    // Two significant digits below 0.1, so a large loss does not read as 0.00×.
    if r < 0.1 { format!("{r:.2e}×") } else { format!("{r:.2}×") }
}

/// The Markdown table of the figures in `text` (one JSON line each), with a closing count of
/// targets met.
pub fn render(text: &str) -> String {
    let mut rows: Vec<[String; 6]> = Vec::new();
    let (mut targets, mut met) = (0, 0);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f = match Figure::parse(line) {
            Ok(f) => f,
            Err(e) => {
                rows.push([
                    "?".into(),
                    format!("unreadable figure: {e}"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
                continue;
            }
        };
        let compared: Vec<String> = f
            .against
            .iter()
            .map(|(name, v)| match f.ratio(*v) {
                Some(r) => format!("{name} {} ({})", number(*v), times(r)),
                None => format!("{name} {}", number(*v)),
            })
            .collect();
        let (target, verdict) = match f.target {
            Some(t) => {
                targets += 1;
                let ok = f.meets(t);
                met += usize::from(ok);
                (
                    format!("{} {}", if f.higher_is_better { "≥" } else { "≤" }, number(t)),
                    if ok { "met" } else { "missed" },
                )
            }
            None => (String::new(), ""),
        };
        rows.push([
            f.bench.clone(),
            f.measure.clone(),
            format!("{} {}", number(f.value), f.unit),
            compared.join("; "),
            target,
            verdict.into(),
        ]);
    }
    let header =
        ["benchmark", "measure", "wasmctrl", "compared with, same run (× = times better)", "target", ""];
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}|", ["---", "---", "---:", "---", "---:", "---"].join("|"));
    for r in &rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{met} of {targets} targets met");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_read_as_times_better_in_both_directions() {
        let text = concat!(
            r#"{"bench":"anchors","measure":"events/s","value":150000,"unit":"events/s","better":"higher","against":[{"name":"kube-rs","value":50000}],"target":200000}"#,
            "\n",
            r#"{"bench":"plugin","measure":"reconcile","value":10,"unit":"µs","better":"lower","against":[{"name":"native","value":5}],"target":7.5}"#,
            "\n",
            r#"{"bench":"scale","measure":"p99","value":1,"unit":"ms","better":"lower","against":[],"target":5}"#,
            "\n",
        );
        let table = render(text);
        assert!(table.contains("kube-rs 50000 (3.00×)"), "{table}");
        assert!(table.contains("native 5.00 (0.50×)"), "{table}");
        assert!(table.contains("≥ 200000 | missed"), "{table}");
        assert!(table.contains("≤ 5.00 | met"), "{table}");
        assert!(table.ends_with("1 of 3 targets met\n"), "{table}");
    }

    #[test]
    fn an_unreadable_line_is_shown_not_dropped() {
        let table = render("{\"bench\":\"x\"}\nnot json\n");
        assert_eq!(table.matches("unreadable figure").count(), 2, "{table}");
    }
}
