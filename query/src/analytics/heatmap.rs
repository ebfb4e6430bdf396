//! Heatmaps: counts by (x bucket × value bucket), one exemplar trace per cell.
//! `GET /api/v1/heatmap?x=time&step=10s&y=duration&buckets=log2` and `heatmap(…)`.
//!
//! - `x=time` (default): steps of `step` (default: the range in about 60 steps) over the
//!   range, every step present; `x=token_index`: decode token spans by `llm.token.index`,
//!   `step` tokens wide (default 1), which shows whether latency grows with the sequence;
//! - `y`: a signal of [`super::signals`] (`duration` by default; `ttft`, `itl`, a column);
//! - `buckets=log2` (default; powers of two of the value, in its unit) or ascending bounds
//!   `10,50,100,500` (a last, open bucket takes the rest; its bound is `null`);
//! - `by=DIM` adds `groups`: the same grid per value of the dimension(s).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::exec::{Run, steps};
use super::params::{Groups, Params, Result, dim_exprs, groups, invalid};
use super::percentiles::step_of;
use super::signals::{TOKEN_SPANS, span_signal};

pub const PARAMS: &[&str] = &["x", "step", "y", "buckets", "by"];

#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    pub labels: BTreeMap<String, String>,
    /// `counts[i][j]`: x bucket `i`, value bucket `j`.
    pub counts: Vec<Vec<u64>>,
    pub exemplars: Vec<Vec<Option<String>>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Heatmap {
    pub x_axis: &'static str,
    pub y: String,
    pub unit: &'static str,
    pub x: Vec<i64>,
    /// Upper bound of each value bucket; `None` for the open last one.
    pub y_upper_bounds: Vec<Option<f64>>,
    pub total: Grid,
    pub groups: Vec<Grid>,
    pub partial: bool,
}

enum Buckets {
    Log2,
    Bounds(Vec<f64>),
}

fn buckets(p: &Params) -> Result<Buckets> {
    match p.get("buckets").map(str::trim) {
        None | Some("log2") => Ok(Buckets::Log2),
        Some(list) => {
            let bounds = list
                .split(',')
                .map(|b| {
                    b.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .ok_or_else(|| {
                            invalid(format!("buckets: {b:?} is not a number (use log2 or ascending bounds like 10,50,100)"))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            if bounds.windows(2).any(|w| w[0] >= w[1]) {
                return Err(invalid("buckets: bounds must ascend"));
            }
            Ok(Buckets::Bounds(bounds))
        }
    }
}

pub async fn heatmap(run: &mut Run<'_>, mut p: Params) -> Result<Heatmap> {
    let by_token = match p.get("x").unwrap_or("time") {
        "time" => false,
        "token_index" => true,
        x => {
            return Err(invalid(format!(
                "x: {x:?} is not an axis (use time or token_index)"
            )));
        }
    };
    let y = p
        .get("y")
        .unwrap_or(if by_token { "itl" } else { "duration" });
    let signal = span_signal(y)?;
    let buckets = buckets(&p)?;
    let dims = p.list_or("by", &[]);
    run.fit_rows(&mut p).await?;
    let (x_sql, step) = if by_token {
        let step = match p.get("step") {
            None => 1,
            Some(s) => s
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| {
                    invalid(format!("step: {s:?} is not a token count (x=token_index)"))
                })?,
        };
        (
            format!("CAST(\"llm.token.index\" AS BIGINT) / {step} * {step}"),
            step as u64,
        )
    } else {
        let step = step_of(&p)?;
        if let (Some(s), Some(e)) = (p.start, p.end) {
            steps(s, e, step, "step")?;
        }
        (
            format!(
                "CAST(date_bin(INTERVAL '{} milliseconds', start_time) AS BIGINT)",
                step.as_millis()
            ),
            step.as_nanos() as u64,
        )
    };
    let mut conditions = vec![format!("({})", signal.condition)];
    if by_token {
        conditions.push(TOKEN_SPANS.into());
    }
    let filter = p.where_clause(&conditions)?;
    let bucket_sql = match &buckets {
        Buckets::Log2 => {
            "CASE WHEN v > 0 THEN CAST(ceil(log2(v)) AS BIGINT) ELSE -1075 END".to_owned()
        }
        Buckets::Bounds(b) => {
            let arms: String = b
                .iter()
                .enumerate()
                .map(|(i, x)| format!(" WHEN v <= {x:?} THEN {i}"))
                .collect();
            format!("CASE{arms} ELSE {} END", b.len())
        }
    };
    let Groups {
        select: groups,
        keys,
    } = groups(&dim_exprs(&dims));
    let query = format!(
        "SELECT x{keys}, {bucket_sql} AS b, count(*), max(trace_id) FROM \
         (SELECT {x_sql} AS x{groups}, {} AS v, trace_id FROM spans {filter}) \
         WHERE v IS NOT NULL AND x IS NOT NULL GROUP BY x{keys}, b",
        signal.value
    );
    let empty = |partial| Heatmap {
        x_axis: if by_token { "token_index" } else { "time" },
        y: signal.name.clone(),
        unit: signal.unit,
        x: Vec::new(),
        y_upper_bounds: Vec::new(),
        total: Grid {
            labels: BTreeMap::new(),
            counts: Vec::new(),
            exemplars: Vec::new(),
        },
        groups: Vec::new(),
        partial,
    };
    let Some(rows) = run.sql_or_partial(&query).await? else {
        return Ok(empty(true));
    };
    let xs = rows.i64(0);
    let labels = rows.labels(1, &dims);
    let (b, n, ex) = (
        rows.i64(1 + dims.len()),
        rows.i64(2 + dims.len()),
        rows.strings(3 + dims.len()),
    );
    if rows.is_empty() {
        return Ok(empty(run.partial));
    }
    // the x axis: every step of the range (time), or from the first to the last seen
    let seen_lo = xs.iter().flatten().min().copied().unwrap_or(0);
    let seen_hi = xs.iter().flatten().max().copied().unwrap_or(0);
    let (lo, hi) = if by_token {
        (seen_lo, seen_hi)
    } else {
        let align = |t: u64| (t / step * step) as i64;
        (
            p.start.map_or(seen_lo, align).min(seen_lo),
            p.end
                .map_or(seen_hi, |e| align(e.saturating_sub(1)))
                .max(seen_hi),
        )
    };
    let x: Vec<i64> = (0..)
        .map(|i| lo + i * step as i64)
        .take_while(|v| *v <= hi)
        .collect();
    // value buckets: every power of two from the least to the greatest seen, or the bounds
    let (b_lo, y_upper_bounds): (i64, Vec<Option<f64>>) = match &buckets {
        Buckets::Log2 => {
            let lo = b.iter().flatten().min().copied().unwrap_or(0);
            let hi = b.iter().flatten().max().copied().unwrap_or(0);
            (
                lo,
                (lo..=hi)
                    .map(|j| Some(if j == -1075 { 0.0 } else { 2f64.powi(j as i32) }))
                    .collect(),
            )
        }
        Buckets::Bounds(bounds) => {
            let mut ub: Vec<Option<f64>> = bounds.iter().map(|x| Some(*x)).collect();
            ub.push(None);
            (0, ub)
        }
    };
    let grid = || Grid {
        labels: BTreeMap::new(),
        counts: vec![vec![0; y_upper_bounds.len()]; x.len()],
        exemplars: vec![vec![None; y_upper_bounds.len()]; x.len()],
    };
    let mut total = grid();
    let mut groups: BTreeMap<BTreeMap<String, String>, Grid> = BTreeMap::new();
    for row in 0..rows.len() {
        let (Some(xv), Some(bv)) = (xs[row], b[row]) else {
            continue;
        };
        let i = ((xv - lo) / step as i64) as usize;
        let j = (bv - b_lo) as usize;
        if i >= x.len() || j >= y_upper_bounds.len() {
            continue;
        }
        let count = n[row].unwrap_or(0) as u64;
        let add = |g: &mut Grid| {
            g.counts[i][j] += count;
            if g.exemplars[i][j].is_none() {
                g.exemplars[i][j] = ex[row].clone();
            }
        };
        add(&mut total);
        if !dims.is_empty() {
            let g = groups.entry(labels[row].clone()).or_insert_with(|| {
                let mut g = grid();
                g.labels = labels[row].clone();
                g
            });
            add(g);
        }
    }
    Ok(Heatmap {
        x_axis: if by_token { "token_index" } else { "time" },
        y: signal.name,
        unit: signal.unit,
        x,
        y_upper_bounds,
        total,
        groups: groups.into_values().collect(),
        partial: run.partial,
    })
}

impl Heatmap {
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "x_axis": self.x_axis,
            "y": self.y,
            "unit": self.unit,
            "x": self.x,
            "y_upper_bounds": self.y_upper_bounds,
            "counts": self.total.counts,
            "exemplars": self.total.exemplars,
            "partial": self.partial,
        });
        if !self.groups.is_empty() {
            out["groups"] = self
                .groups
                .iter()
                .map(|g| json!({"labels": g.labels, "counts": g.counts, "exemplars": g.exemplars}))
                .collect();
        }
        out
    }
}
