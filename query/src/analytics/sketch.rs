//! A DDSketch-style quantile sketch: a value `v > 0` falls in bin `ceil(ln v / ln γ)` with
//! `γ = (1 + α) / (1 − α)`; any quantile read back from the bins is within relative error `α`
//! of the exact one. Bins add up, so sketches of steps, blocks or groups merge by adding.
//! The bins are counted in SQL (`GROUP BY` the bin expression), so only bins travel.

use std::collections::BTreeMap;

/// The relative error of every sketch answer.
pub const RELATIVE_ERROR: f64 = 0.01;

/// Bin of values that are zero or negative.
pub const ZERO_BIN: i64 = i64::MIN;

pub fn gamma() -> f64 {
    (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
}

/// SQL for the bin of `value` (a DOUBLE expression).
pub fn bin_sql(value: &str) -> String {
    format!(
        "CASE WHEN ({value}) > 0 THEN CAST(ceil(ln({value}) / {}) AS BIGINT) ELSE {ZERO_BIN} END",
        gamma().ln()
    )
}

/// The value a bin stands for (within α of every value in it).
pub fn bin_value(bin: i64) -> f64 {
    if bin == ZERO_BIN {
        return 0.0;
    }
    let g = gamma();
    2.0 * g.powi(bin as i32) / (g + 1.0)
}

/// Bin counts of one group.
#[derive(Clone, Debug, Default)]
pub struct Sketch {
    bins: BTreeMap<i64, u64>,
    count: u64,
}

impl Sketch {
    pub fn add(&mut self, bin: i64, n: u64) {
        *self.bins.entry(bin).or_default() += n;
        self.count += n;
    }

    pub fn merge(&mut self, other: &Sketch) {
        for (b, n) in &other.bins {
            self.add(*b, *n);
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile (0 ≤ q ≤ 1), by the lower rank `q · (n − 1)`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * (self.count - 1) as f64).floor() as u64;
        let mut seen = 0;
        for (b, n) in &self.bins {
            seen += n;
            if seen > rank {
                return Some(bin_value(*b));
            }
        }
        self.bins.keys().last().map(|b| bin_value(*b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_relative_error() {
        let values: Vec<f64> = (1..=10_000).map(|i| (i as f64).powf(1.7) / 13.0).collect();
        let mut s = Sketch::default();
        for v in &values {
            s.add((v.ln() / gamma().ln()).ceil() as i64, 1);
        }
        for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
            let exact = values[(q * (values.len() - 1) as f64).floor() as usize];
            let got = s.quantile(q).unwrap();
            assert!(
                (got - exact).abs() <= RELATIVE_ERROR * exact + 1e-12,
                "q {q}: {got} vs {exact}"
            );
        }
        assert_eq!(Sketch::default().quantile(0.5), None);
    }
}
