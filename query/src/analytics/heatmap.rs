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
use super::signals::{SpanSignal, TOKEN_SPANS, span_signal};

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
    if let Some(cells) = of_rollups(run, &p, &signal.name, &buckets, &dims, by_token, step).await? {
        return Ok(assemble(
            run, &p, signal, &buckets, &dims, by_token, step, cells,
        ));
    }
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
    let Some(rows) = run.sql_or_partial(&query).await? else {
        return Ok(empty(signal, by_token, true));
    };
    let cells = Cells {
        xs: rows.i64(0),
        labels: rows.labels(1, &dims),
        buckets: rows.i64(1 + dims.len()),
        counts: rows.i64(2 + dims.len()),
        exemplars: rows.strings(3 + dims.len()),
    };
    Ok(assemble(
        run, &p, signal, &buckets, &dims, by_token, step, cells,
    ))
}

/// The non-empty cells of a heatmap, column by column: x, group labels, value bucket (a
/// power of two or an index into the bounds), count, exemplar.
struct Cells {
    xs: Vec<Option<i64>>,
    labels: Vec<BTreeMap<String, String>>,
    buckets: Vec<Option<i64>>,
    counts: Vec<Option<i64>>,
    exemplars: Vec<Option<String>>,
}

fn empty(signal: SpanSignal, by_token: bool, partial: bool) -> Heatmap {
    Heatmap {
        x_axis: if by_token { "token_index" } else { "time" },
        y: signal.name,
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
    }
}

/// A heatmap over time of span durations or inter-token latency in log2 buckets, without
/// groups or attribute filters, from the blocks' heat rollups (`weft_storage::heat`): exact,
/// when the step and the range's ends are whole seconds. `None` when it cannot answer.
async fn of_rollups(
    run: &mut Run<'_>,
    p: &Params,
    y: &str,
    buckets: &Buckets,
    dims: &[String],
    by_token: bool,
    step: u64,
) -> Result<Option<Cells>> {
    use weft_storage::heat::{TOKEN_SPAN, Track};
    const SECOND: u64 = 1_000_000_000;
    let (track, only) = match y {
        "itl" | "decode_latency" => (Track::Itl, Some(TOKEN_SPAN.to_owned())),
        "duration" => (Track::Duration, None),
        n if n.starts_with("span:") => (Track::Duration, Some(n[5..].to_owned())),
        _ => return Ok(None),
    };
    if by_token
        || !matches!(buckets, Buckets::Log2)
        || !dims.is_empty()
        || !p.attrs.is_empty()
        || !step.is_multiple_of(SECOND)
    {
        return Ok(None);
    }
    let store = run.engine.store().clone();
    let tenant = run.tenant.clone();
    let (start, end) = (p.start, p.end);
    let (service, name) = (p.service.clone(), p.name.clone());
    let work = move || {
        let keep = |s: &str, n: &str| {
            service.as_deref().is_none_or(|x| x == s)
                && name.as_deref().is_none_or(|x| x == n)
                && only.as_deref().is_none_or(|x| x == n)
        };
        let mut cells: rustc_hash::FxHashMap<(i64, i16), (u64, weft_storage::model::TraceId)> =
            Default::default();
        let answered = store.heat_cells(
            &tenant,
            start,
            end,
            track,
            &keep,
            &mut |second, b, n, ex| {
                let x = (second * SECOND / step * step) as i64;
                let cell = cells.entry((x, b)).or_insert((0, *ex));
                cell.0 += n;
                if *ex > cell.1 {
                    cell.1 = *ex;
                }
            },
        )?;
        Ok::<_, weft_storage::StorageError>(answered.then_some(cells))
    };
    let cells = match run.blocking("heat rollup", work).await? {
        None => Default::default(),
        Some(Some(cells)) => cells,
        Some(None) => return Ok(None),
    };
    let mut out = Cells {
        xs: Vec::with_capacity(cells.len()),
        labels: Vec::new(),
        buckets: Vec::with_capacity(cells.len()),
        counts: Vec::with_capacity(cells.len()),
        exemplars: Vec::with_capacity(cells.len()),
    };
    for ((x, b), (n, ex)) in cells {
        out.xs.push(Some(x));
        out.buckets.push(Some(b.into()));
        out.counts.push(Some(n as i64));
        out.exemplars.push(Some(ex.to_hex()));
    }
    Ok(Some(out))
}

/// The grid of the cells: the x axis (every step of the range for time), the value buckets,
/// counts and exemplars, in total and per group.
#[allow(clippy::too_many_arguments)]
fn assemble(
    run: &Run<'_>,
    p: &Params,
    signal: SpanSignal,
    buckets: &Buckets,
    dims: &[String],
    by_token: bool,
    step: u64,
    cells: Cells,
) -> Heatmap {
    let Cells {
        xs,
        labels,
        buckets: b,
        counts: n,
        exemplars: ex,
    } = cells;
    if xs.is_empty() {
        return empty(signal, by_token, run.partial);
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
    let (b_lo, y_upper_bounds): (i64, Vec<Option<f64>>) = match buckets {
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
    for row in 0..xs.len() {
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
    Heatmap {
        x_axis: if by_token { "token_index" } else { "time" },
        y: signal.name,
        unit: signal.unit,
        x,
        y_upper_bounds,
        total,
        groups: groups.into_values().collect(),
        partial: run.partial,
    }
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
