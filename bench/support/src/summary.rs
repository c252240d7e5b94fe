//! Key figures of a benchmark run, one JSON line each, for the table `cargo xtask bench`
//! prints at the end (`xtask/src/bench.rs` reads them back).
//!
//! Invariants:
//! - Without `WASMCTRL_BENCH_SUMMARY` in the environment, [`Figure::record`] does nothing:
//!   a benchmark run on its own prints its own tables and nothing else changes.
//! - With it, each figure is appended to that file as one line written with a single
//!   `write` on a file opened for appending, so figures of benchmark processes running one
//!   after another (or a parent and its children) never interleave within a line.
//! - Writing never fails a benchmark: a figure that cannot be written is reported on
//!   stderr and the run goes on.
//!
//! The fields (`bench`, `measure`, `value`, `unit`, `better`, `against` — a list of
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
        let Some(path) = std::env::var_os(SUMMARY_ENV) else { return };
        if !self.value.is_finite() {
            return;
        }
        let mut line = self.to_json().to_string();
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
}
