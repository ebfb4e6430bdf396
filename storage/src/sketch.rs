//! A DDSketch-style quantile sketch: a value `v > 0` falls in bin `ceil(ln v / ln γ)` with
//! `γ = (1 + α) / (1 − α)`; any quantile read back from the bins is within relative error `α`
//! of the exact one. Bins add up, so sketches of steps, blocks or groups merge by adding: a
//! span block keeps sketches of its spans' durations (see [`crate::rollup`]), and the
//! analytics count bins in SQL (`GROUP BY` the bin expression) so that only bins travel.

use std::collections::BTreeMap;

use crate::codec::{Reader, Writer};
use crate::error::Result;

/// The relative error of every sketch answer.
pub const RELATIVE_ERROR: f64 = 0.01;

/// Bin of values that are zero or negative.
pub const ZERO_BIN: i64 = i64::MIN;

pub fn gamma() -> f64 {
    (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
}

/// The bin of a value.
pub fn bin_of(value: f64) -> i64 {
    if value > 0.0 {
        (value.ln() / gamma().ln()).ceil() as i64
    } else {
        ZERO_BIN
    }
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
#[derive(Clone, Debug, Default, PartialEq)]
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

    /// Adds one value.
    pub fn insert(&mut self, value: f64) {
        self.add(bin_of(value), 1);
    }

    /// Bins ascending, each with its count: a varint bin count, then each bin as a zigzag
    /// delta from the previous one and its count.
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u64(self.bins.len() as u64);
        let mut last = 0i64;
        for (b, n) in &self.bins {
            w.i64(b.wrapping_sub(last));
            w.u64(*n);
            last = *b;
        }
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<Self> {
        let mut s = Sketch::default();
        let mut last = 0i64;
        for _ in 0..r.u64()? {
            last = last.wrapping_add(r.i64()?);
            s.add(last, r.u64()?);
        }
        Ok(s)
    }

    /// What the sketch takes in memory, about.
    pub fn weight(&self) -> usize {
        48 + self.bins.len() * 40
    }

    /// The `q` quantile (0 ≤ q ≤ 1) as `percentile_cont` defines it: at rank `q · (n − 1)`,
    /// interpolated between the values of the ranks either side. Each of those is read from
    /// its bin (within α), so the interpolation is within α of the exact one.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let (rank, lo, hi) = ranks(self.count - 1, q);
        let (mut at_lo, mut at_hi) = (None, None);
        let mut seen = 0;
        for (b, n) in &self.bins {
            seen += n;
            if at_lo.is_none() && seen > lo {
                at_lo = Some(bin_value(*b));
            }
            if seen > hi {
                at_hi = Some(bin_value(*b));
                break;
            }
        }
        let last = self.bins.keys().last().map(|b| bin_value(*b));
        let (a, b) = (at_lo.or(last)?, at_hi.or(last)?);
        Some(a + (rank - lo as f64) * (b - a))
    }
}

/// What [`Sketch::quantile`] answers for the values `sorted` (ascending by
/// [`sketch_order`]) had they been inserted, to the bit, without the bins: the values at the
/// ranks either side stand for their bins.
pub fn quantile_of_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let (rank, lo, hi) = ranks(last as u64, q);
    let (a, b) = (
        bin_value(bin_of(sorted[lo as usize])),
        bin_value(bin_of(sorted[hi as usize])),
    );
    Some(a + (rank - lo as f64) * (b - a))
}

/// The rank of quantile `q` among values ranked 0 to `last`, and the ranks either side (what
/// both readings of a sketch interpolate between).
fn ranks(last: u64, q: f64) -> (f64, u64, u64) {
    let rank = q.clamp(0.0, 1.0) * last as f64;
    (rank, rank.floor() as u64, rank.ceil() as u64)
}

/// A value as it orders among a sketch's bins: zero, negative and NaN values all fall in
/// [`ZERO_BIN`], below every other, as zero.
pub fn sketch_order(value: f64) -> f64 {
    if value > 0.0 { value } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_sorted_values_are_the_sketch_answers() {
        let mut values: Vec<f64> = (0..2_000)
            .map(|i| match i % 97 {
                0 => 0.0,
                1 => -3.0,
                2 => f64::NAN,
                _ => ((i * 7919) % 1_000) as f64 / 7.0 + 0.01,
            })
            .collect();
        for n in [1, 2, 3, 10, 500, values.len()] {
            let mut s = Sketch::default();
            let mut sorted: Vec<f64> = values[..n].iter().map(|v| sketch_order(*v)).collect();
            for v in &values[..n] {
                s.insert(*v);
            }
            sorted.sort_unstable_by(f64::total_cmp);
            for q in [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(quantile_of_sorted(&sorted, q), s.quantile(q), "{n} {q}");
            }
        }
        values.clear();
        assert_eq!(quantile_of_sorted(&values, 0.5), None);
    }

    #[test]
    fn quantiles_are_within_the_relative_error() {
        let values: Vec<f64> = (1..=10_000).map(|i| (i as f64).powf(1.7) / 13.0).collect();
        let mut s = Sketch::default();
        for v in &values {
            s.insert(*v);
        }
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            // percentile_cont: interpolated between the ranks either side
            let rank = q * (values.len() - 1) as f64;
            let (lo, hi) = (values[rank.floor() as usize], values[rank.ceil() as usize]);
            let exact = lo + (rank - rank.floor()) * (hi - lo);
            let got = s.quantile(q).unwrap();
            assert!(
                (got - exact).abs() <= RELATIVE_ERROR * exact + 1e-12,
                "q {q}: {got} vs {exact}"
            );
        }
        // two values far apart: the median is halfway, not either value
        let mut two = Sketch::default();
        for v in [10.0f64, 1000.0] {
            two.add((v.ln() / gamma().ln()).ceil() as i64, 1);
        }
        let m = two.quantile(0.5).unwrap();
        assert!((m - 505.0).abs() <= RELATIVE_ERROR * 505.0, "{m}");
        assert_eq!(Sketch::default().quantile(0.5), None);
    }

    #[test]
    fn sketches_read_back_as_written() {
        let mut s = Sketch::default();
        for v in [0.0, 1.0, 3.5, 1e9, 1e9, 2e-3] {
            s.insert(v);
        }
        let mut w = Writer::default();
        s.encode(&mut w);
        let back = Sketch::decode(&mut Reader::new(&w.buf)).unwrap();
        assert_eq!(back.bins, s.bins);
        assert_eq!(back.count(), 6);
    }
}
