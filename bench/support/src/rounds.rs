//! A figure measured over several rounds: its median and spread, and how the tables print it.
//!
//! Invariants: the median of an even count is the mean of the two middle values; a figure
//! prints as "median (min–max)" with the same number format as `cargo xtask bench`'s summary,
//! and as the median alone when there was one round; non-finite values (a round that did
//! not measure) are left out.

/// What an environment variable says about how many rounds to run: `BENCH_ROUNDS`, 3 unless
/// set, never fewer than 1.
pub fn rounds_from_env() -> usize {
    std::env::var("BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1)
}

/// Whether `BENCH_QUICK` asks for a reduced-size smoke run (`cargo xtask bench --quick`).
pub fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A figure's values, one per round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rounds(Vec<f64>);

impl Rounds {
    pub fn new(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        Rounds(v)
    }

    pub fn push(&mut self, value: f64) {
        if value.is_finite() {
            let at = self.0.partition_point(|x| *x < value);
            self.0.insert(at, value);
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values, sorted.
    pub fn values(&self) -> &[f64] {
        &self.0
    }

    /// NaN when empty.
    pub fn median(&self) -> f64 {
        let n = self.0.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => self.0[n / 2],
            _ => (self.0[n / 2 - 1] + self.0[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.0.first().copied().unwrap_or(f64::NAN)
    }

    pub fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(f64::NAN)
    }

    /// "median (min–max)", or the value alone for one round, or "–" for none.
    pub fn display(&self) -> String {
        match self.0.len() {
            0 => "–".into(),
            1 => number(self.0[0]),
            _ => format!("{} ({}–{})", number(self.median()), number(self.min()), number(self.max())),
        }
    }
}

/// A number as every table prints it: no decimals from 1000, one from 10, else two (three
/// significant digits below 0.1).
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let r = Rounds::new([3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!((r.len(), r.median(), r.min(), r.max()), (3, 2.0, 1.0, 3.0));
        assert_eq!(r.display(), "2.00 (1.00–3.00)");
        let mut even = Rounds::new([10.0, 40.0]);
        assert_eq!(even.median(), 25.0);
        even.push(20.0);
        assert_eq!(even.values(), &[10.0, 20.0, 40.0]);
        assert_eq!(Rounds::new([336286.4]).display(), "336286");
        assert_eq!(Rounds::default().display(), "–");
        assert!(Rounds::default().median().is_nan());
        assert_eq!(number(0.0123), "0.012");
        assert_eq!(number(12.34), "12.3");
    }
}
