//! The request spans of one anomaly scan, read once for every request signal it scans
//! (`ttft`, `e2e_latency`, `tpot`, `tokens_per_s`, `error_rate`, `throughput`): their start,
//! each signal's value and their values of the attribution's dimensions. Each signal's series
//! and attribution are then counted in memory, exactly as the SQL of one signal would count
//! them (same values, same sketch bins), instead of three scans per signal.

use rustc_hash::FxHashMap;
use weft_storage::sketch::{Sketch, bin_of};

use super::anomalies::{Candidates, Tallies};
use super::exec::Run;
use super::params::{Params, Result, dim_expr, ident, inherited};
use super::signals::{REQUEST_SPANS, SpanSignal};

/// No value, in a tuple of term ids.
const NONE: u32 = u32::MAX;

/// The request spans in range with the values of some signals and dimensions.
pub struct Frame {
    starts: Vec<u64>,
    /// (signal, value of each row).
    values: Vec<(String, Vec<Option<f64>>)>,
    /// Each row's dimension values as term ids, row-major.
    tuples: Vec<u32>,
    terms: Vec<String>,
    dims: usize,
}

/// A step of a series counted from the frame: its sketch (latency signals), its rows and the
/// sum of their values.
#[derive(Default)]
pub struct StepTally {
    pub sketch: Sketch,
    pub n: f64,
    pub sum: f64,
}

impl Frame {
    /// Reads the request spans of the call's range: the values of `signals` (name and
    /// specification) and of `dims` (a request attribute by its own column, an inherited
    /// dimension as [`dim_expr`] reads it). `None` when the time budget ran out.
    pub async fn load(
        run: &mut Run<'_>,
        p: &Params,
        signals: &[SpanSignal],
        dims: &[String],
    ) -> Result<Option<Self>> {
        // named apart: two signals may share an expression (error rate and throughput)
        let mut cols = vec!["CAST(start_time AS BIGINT) AS t".to_owned()];
        cols.extend(
            signals
                .iter()
                .enumerate()
                .map(|(i, s)| format!("CAST({} AS DOUBLE) AS v{i}", s.value)),
        );
        cols.extend(dims.iter().enumerate().map(|(i, d)| {
            let e = if inherited(d) { dim_expr(d) } else { ident(d) };
            format!("CAST({e} AS VARCHAR) AS d{i}")
        }));
        let query = format!(
            "SELECT {} FROM spans {}",
            cols.join(", "),
            p.where_clause(&[format!("({REQUEST_SPANS})")])?
        );
        let Some(rows) = run.sql_or_partial(&query).await? else {
            return Ok(None);
        };
        let starts = rows
            .i64(0)
            .into_iter()
            .map(|t| t.unwrap_or(0) as u64)
            .collect::<Vec<_>>();
        let values = signals
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), rows.f64(1 + i)))
            .collect();
        let mut terms: Vec<String> = Vec::new();
        let mut ids: FxHashMap<String, u32> = FxHashMap::default();
        let mut tuples = vec![NONE; starts.len() * dims.len()];
        for d in 0..dims.len() {
            for (row, v) in rows.strings(1 + signals.len() + d).into_iter().enumerate() {
                let Some(v) = v else { continue };
                let id = match ids.get(&v) {
                    Some(&id) => id,
                    None => {
                        let id = terms.len() as u32;
                        terms.push(v.clone());
                        ids.insert(v, id);
                        id
                    }
                };
                tuples[row * dims.len() + d] = id;
            }
        }
        Ok(Some(Self {
            starts,
            values,
            tuples,
            terms,
            dims: dims.len(),
        }))
    }

    /// How many distinct values dimension `d` holds.
    pub fn distinct(&self, d: usize) -> usize {
        let mut seen = rustc_hash::FxHashSet::default();
        for row in self.tuples.chunks(self.dims.max(1)) {
            if let Some(&v) = row.get(d)
                && v != NONE
            {
                seen.insert(v);
            }
        }
        seen.len()
    }

    /// The frame with dimensions `keep` alone, in that order.
    pub fn project(self, keep: &[usize]) -> Self {
        let tuples = if self.dims == 0 {
            Vec::new()
        } else {
            self.tuples
                .chunks(self.dims)
                .flat_map(|row| keep.iter().map(move |&d| row[d]))
                .collect()
        };
        Self {
            tuples,
            dims: keep.len(),
            ..self
        }
    }

    fn values(&self, signal: &str) -> &[Option<f64>] {
        self.values
            .iter()
            .find(|(s, _)| s == signal)
            .map_or(&[], |(_, v)| v.as_slice())
    }

    /// A signal's steps (by `date_bin` start): a latency signal's values sketched (rows with
    /// a value), any signal's rows and summed values (every row: rates and counts).
    pub fn series(&self, signal: &str, step: u64, latency: bool) -> FxHashMap<u64, StepTally> {
        let mut out: FxHashMap<u64, StepTally> = FxHashMap::default();
        for (t, v) in self.starts.iter().zip(self.values(signal)) {
            if latency && v.is_none() {
                continue;
            }
            let s = out.entry(t / step * step).or_default();
            s.n += 1.0;
            if let Some(v) = v {
                s.sum += v;
                if latency {
                    s.sketch.add(bin_of(*v), 1);
                }
            }
        }
        out
    }

    /// The attribution tallies of a signal: rows in a window that `hit` are its anomalous
    /// units (with `excess` each), rows outside every window the baseline; rows without a
    /// value count for neither.
    pub fn tallies(
        &self,
        signal: &str,
        windows: &[(u64, u64)],
        hit: impl Fn(f64) -> bool,
        excess: impl Fn(f64) -> f64,
    ) -> Tallies {
        let mut t = Tallies::new(self.dims, windows.len());
        let window = |start: u64| windows.iter().position(|(s, e)| (*s..*e).contains(&start));
        // anomalous units by window and tuple, then the baseline of the candidates they make
        let mut groups: Vec<FxHashMap<&[u32], (f64, f64)>> =
            vec![FxHashMap::default(); windows.len()];
        let mut baseline: FxHashMap<&[u32], f64> = FxHashMap::default();
        for (row, (start, v)) in self.starts.iter().zip(self.values(signal)).enumerate() {
            let Some(v) = v else { continue };
            let tuple = &self.tuples[row * self.dims..(row + 1) * self.dims];
            match window(*start) {
                Some(w) if hit(*v) => {
                    let g = groups[w].entry(tuple).or_default();
                    g.0 += 1.0;
                    g.1 += excess(*v);
                }
                Some(_) => {}
                None => *baseline.entry(tuple).or_default() += 1.0,
            }
        }
        let text = |ids: &[u32]| -> Vec<Option<String>> {
            ids.iter()
                .map(|&i| (i != NONE).then(|| self.terms[i as usize].clone()))
                .collect()
        };
        for (w, groups) in groups.into_iter().enumerate() {
            for (tuple, (units, ex)) in groups {
                t.anomalous_of(w, &text(tuple), units, ex);
            }
        }
        let candidates: Vec<Candidates> = t.candidates();
        for (tuple, units) in baseline {
            t.baseline_of(&candidates, &text(tuple), units);
        }
        t
    }
}
