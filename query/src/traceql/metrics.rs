//! TraceQL metrics (`{ … } | rate() by (…)`, `count_over_time()`, `avg/min/max/sum_over_time()`,
//! `quantile_over_time()`, `histogram_over_time()`): series over time steps, as Tempo's
//! `/api/metrics/query_range` answers them.
//!
//! A single spanset filter is aggregated in SQL (per step, per `by` value and, for quantiles
//! and histograms, per power-of-two bucket of the value, as Tempo buckets it); any other
//! pipeline selects its spans as search does and is aggregated here. Durations are in
//! seconds, as Tempo gives them.

use std::collections::BTreeMap;

use super::TraceQlError;
use super::ast::*;
use super::compile::{self, column, predicate};
use super::eval::{self, SearchOptions, Val};
use crate::analytics::exec::Run;
use crate::analytics::params::ts;

#[derive(Clone, Debug)]
pub struct RangeOptions {
    /// Unix ns, inclusive.
    pub start: u64,
    /// Unix ns, exclusive.
    pub end: u64,
    /// Step in ns.
    pub step: u64,
    /// Exemplars per series at most.
    pub exemplars: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    pub trace_id: String,
    pub value: f64,
    pub timestamp_ms: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: Vec<(String, Val)>,
    /// `(timestamp ms, value)`, oldest first.
    pub samples: Vec<(i64, f64)>,
    pub exemplars: Vec<Exemplar>,
}

#[derive(Clone, Debug, Default)]
pub struct MetricsAnswer {
    pub series: Vec<Series>,
    pub partial: bool,
}

/// What one (series, step) accumulates.
#[derive(Clone, Debug, Default)]
struct Acc {
    count: f64,
    sum: f64,
    min: Option<f64>,
    max: Option<f64>,
    /// Power-of-two bucket (upper bound exponent of the value in its base unit) → count.
    log2: BTreeMap<i64, f64>,
    exemplar: Option<(String, f64)>,
}

impl Acc {
    fn add(&mut self, count: f64, sum: f64, min: f64, max: f64) {
        self.count += count;
        self.sum += sum;
        self.min = Some(self.min.map_or(min, |m| m.min(min)));
        self.max = Some(self.max.map_or(max, |m| m.max(max)));
    }
}

type Cells = BTreeMap<Vec<(String, ValKey)>, BTreeMap<i64, Acc>>;

/// A label value that orders and compares (floats by their bits).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ValKey {
    Str(String),
    Int(i64),
    Float(u64),
    Bool(bool),
}

impl From<&Val> for ValKey {
    fn from(v: &Val) -> Self {
        match v {
            Val::Str(s) => ValKey::Str(s.clone()),
            Val::Int(i) => ValKey::Int(*i),
            Val::Float(f) => ValKey::Float(f.to_bits()),
            Val::Bool(b) => ValKey::Bool(*b),
        }
    }
}

impl ValKey {
    fn val(&self) -> Val {
        match self {
            ValKey::Str(s) => Val::Str(s.clone()),
            ValKey::Int(i) => Val::Int(*i),
            ValKey::Float(f) => Val::Float(f64::from_bits(*f)),
            ValKey::Bool(b) => Val::Bool(*b),
        }
    }
}

fn function_field(f: &MetricsFn) -> Option<&Field> {
    match f {
        MetricsFn::Rate | MetricsFn::CountOverTime => None,
        MetricsFn::AvgOverTime(x)
        | MetricsFn::MinOverTime(x)
        | MetricsFn::MaxOverTime(x)
        | MetricsFn::SumOverTime(x)
        | MetricsFn::QuantileOverTime(x, _)
        | MetricsFn::HistogramOverTime(x) => Some(x),
    }
}

fn function_name(f: &MetricsFn) -> &'static str {
    match f {
        MetricsFn::Rate => "rate",
        MetricsFn::CountOverTime => "count_over_time",
        MetricsFn::AvgOverTime(_) => "avg_over_time",
        MetricsFn::MinOverTime(_) => "min_over_time",
        MetricsFn::MaxOverTime(_) => "max_over_time",
        MetricsFn::SumOverTime(_) => "sum_over_time",
        MetricsFn::QuantileOverTime(..) => "quantile_over_time",
        MetricsFn::HistogramOverTime(_) => "histogram_over_time",
    }
}

/// Durations are answered in seconds.
fn is_duration(f: &Field) -> bool {
    matches!(
        f,
        Field::Intrinsic(Intrinsic::Duration | Intrinsic::TraceDuration)
    )
}

/// The power-of-two bucket of a value: the exponent of its upper bound (values of a duration
/// in ns; others as they are).
fn log2_bucket(v: f64) -> i64 {
    if v <= 1.0 { 0 } else { v.log2().ceil() as i64 }
}

/// Series of a metrics query over `[start, end)` in steps.
pub async fn query_range(
    run: &mut Run<'_>,
    query: &Query,
    opts: &RangeOptions,
) -> Result<MetricsAnswer, TraceQlError> {
    let Some(m) = &query.metrics else {
        return Err(TraceQlError::Invalid(
            "not a metrics query: end it with a metrics function such as `| rate()`".into(),
        ));
    };
    if opts.step == 0 || opts.end <= opts.start {
        return Err(TraceQlError::Invalid(
            "the range needs end after start and a positive step".into(),
        ));
    }
    let steps = (opts.end - opts.start).div_ceil(opts.step);
    if steps > 11_000 {
        return Err(TraceQlError::Invalid(format!(
            "step: {steps} steps in the range; at most 11000 (make the step longer)"
        )));
    }
    let field = function_field(&m.function);
    if let Some(f) = field
        && column(f).is_none()
    {
        return Err(TraceQlError::Invalid(format!(
            "{}: {f} has no value to aggregate",
            function_name(&m.function)
        )));
    }
    let single = match &query.pipeline {
        Pipeline {
            source: Spanset::Filter(e),
            stages,
        } if stages.is_empty() => Some(e.as_ref()),
        _ => None,
    };
    let mut partial = false;
    let cells = match single {
        Some(e) => sql_cells(run, e, m, opts).await?,
        None => {
            let search = SearchOptions {
                start: Some(opts.start),
                end: Some(opts.end),
                ..Default::default()
            };
            let mut fields: Vec<Field> = m.by.clone();
            if let Some(f) = field {
                fields.push(f.clone());
            }
            let (spans, cut) = eval::matched_spans(run, &query.pipeline, &search, &fields).await?;
            partial = cut;
            let mut cells = Cells::new();
            for s in spans {
                let key: Vec<(String, ValKey)> =
                    m.by.iter()
                        .zip(&s.values)
                        .filter_map(|(f, v)| v.as_ref().map(|v| (label_of(f), ValKey::from(v))))
                        .collect();
                let step = (s.start - opts.start as i64).div_euclid(opts.step as i64);
                let value = match field {
                    None => s.duration as f64,
                    Some(f) => match s.values.last().cloned().flatten() {
                        Some(Val::Int(i)) => i as f64,
                        Some(Val::Float(x)) => x,
                        Some(Val::Str(t)) => match t.parse() {
                            Ok(x) => x,
                            Err(_) => continue,
                        },
                        _ if is_duration(f) => s.duration as f64,
                        _ => continue,
                    },
                };
                let acc = cells.entry(key).or_default().entry(step).or_default();
                acc.add(1.0, value, value, value);
                *acc.log2.entry(log2_bucket(value)).or_default() += 1.0;
                if acc.exemplar.as_ref().is_none_or(|(_, v)| value > *v) {
                    acc.exemplar = Some((s.trace, value));
                }
            }
            cells
        }
    };
    Ok(MetricsAnswer {
        series: render(m, field, cells, opts, steps),
        partial,
    })
}

/// How Tempo names a `by` label: the field as written, scoped (`resource.service.name`).
fn label_of(f: &Field) -> String {
    match f {
        Field::Intrinsic(i) => i.name().to_owned(),
        other => other.to_string(),
    }
}

async fn sql_cells(
    run: &mut Run<'_>,
    e: Option<&FieldExpr>,
    m: &MetricsStage,
    opts: &RangeOptions,
) -> Result<Cells, TraceQlError> {
    let field = function_field(&m.function);
    let value = match field {
        None => "CAST(s.duration_ns AS DOUBLE)".to_owned(),
        Some(f) => {
            let c = column(f).expect("checked");
            format!("try_cast({} AS DOUBLE)", c.sql)
        }
    };
    let bucketed = matches!(
        m.function,
        MetricsFn::QuantileOverTime(..) | MetricsFn::HistogramOverTime(_)
    );
    let mut conds = vec![
        format!("s.start_time >= {}", ts(opts.start)),
        format!("s.start_time < {}", ts(opts.end)),
    ];
    if let Some(e) = e {
        conds.push(predicate(e));
    }
    if field.is_some() {
        conds.push(format!("{value} IS NOT NULL"));
    }
    let by_cols: Vec<String> =
        m.by.iter()
            .map(|f| {
                column(f)
                    .map(|c| format!("CAST({} AS VARCHAR)", c.sql))
                    .ok_or_else(|| TraceQlError::Invalid(format!("by({f}): no value to group by")))
            })
            .collect::<Result<_, _>>()?;
    let needs_traces = e.is_some_and(compile::needs_traces)
        || m.by
            .iter()
            .chain(field)
            .any(|f| matches!(f, Field::Intrinsic(i) if i.is_trace_level()));
    let join = if needs_traces {
        " JOIN traces t ON t.trace_id = s.trace_id"
    } else {
        ""
    };
    let lb = if bucketed {
        format!("CASE WHEN {value} <= 1 THEN 0 ELSE CAST(ceil(log2({value})) AS BIGINT) END")
    } else {
        "0".into()
    };
    let mut select = vec![format!(
        "CAST((CAST(s.start_time AS BIGINT) - {}) / {} AS BIGINT)",
        opts.start, opts.step
    )];
    select.extend(by_cols.iter().cloned());
    select.push(lb);
    let groups = select.len();
    select.push("count(*)".into());
    select.push(format!("sum({value})"));
    select.push(format!("min({value})"));
    select.push(format!("max({value})"));
    select.push(format!("first_value(s.trace_id ORDER BY {value} DESC)"));
    let sql = format!(
        "SELECT {} FROM spans s{join} WHERE {} GROUP BY {}",
        select.join(", "),
        conds.join(" AND "),
        (1..=groups)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows = run.sql(&sql).await?;
    let step = rows.i64(0);
    let by: Vec<Vec<Option<String>>> = (0..m.by.len()).map(|i| rows.strings(1 + i)).collect();
    let lbs = rows.i64(1 + m.by.len());
    let base = groups;
    let (count, sum, min, max) = (
        rows.i64(base),
        rows.f64(base + 1),
        rows.f64(base + 2),
        rows.f64(base + 3),
    );
    let ex = rows.strings(base + 4);
    let by_types: Vec<_> =
        m.by.iter()
            .map(|f| column(f).expect("checked").ty)
            .collect();
    let mut cells = Cells::new();
    for i in 0..step.len() {
        let key: Vec<(String, ValKey)> =
            m.by.iter()
                .zip(&by)
                .zip(&by_types)
                .filter_map(|((f, col), ty)| {
                    col[i]
                        .as_deref()
                        .map(|v| (label_of(f), ValKey::from(&eval::typed(f, *ty, v))))
                })
                .collect();
        if !m.by.is_empty() && key.is_empty() {
            continue;
        }
        let acc = cells
            .entry(key)
            .or_default()
            .entry(step[i].unwrap_or(0))
            .or_default();
        let c = count[i].unwrap_or(0) as f64;
        let mx = max[i].unwrap_or(0.0);
        acc.add(c, sum[i].unwrap_or(0.0), min[i].unwrap_or(0.0), mx);
        *acc.log2.entry(lbs[i].unwrap_or(0)).or_default() += c;
        if let Some(t) = &ex[i]
            && acc.exemplar.as_ref().is_none_or(|(_, v)| mx > *v)
        {
            acc.exemplar = Some((t.clone(), mx));
        }
    }
    Ok(cells)
}

/// A quantile from power-of-two buckets, interpolated inside the bucket it falls in (as
/// Tempo estimates it).
fn log2_quantile(q: f64, buckets: &BTreeMap<i64, f64>) -> f64 {
    let total: f64 = buckets.values().sum();
    if total == 0.0 {
        return 0.0;
    }
    let target = q * total;
    let mut seen = 0.0;
    for (&exp, &count) in buckets {
        if seen + count >= target {
            let hi = 2f64.powi(exp as i32);
            let lo = if exp == 0 { 0.0 } else { hi / 2.0 };
            let within = if count > 0.0 {
                (target - seen) / count
            } else {
                1.0
            };
            return lo + (hi - lo) * within;
        }
        seen += count;
    }
    2f64.powi(*buckets.keys().last().unwrap() as i32)
}

fn render(
    m: &MetricsStage,
    field: Option<&Field>,
    cells: Cells,
    opts: &RangeOptions,
    steps: u64,
) -> Vec<Series> {
    let scale = if field.is_none_or(is_duration) {
        1e-9
    } else {
        1.0
    };
    let step_s = opts.step as f64 / 1e9;
    let ms = |step: i64| ((opts.start + step as u64 * opts.step) / 1_000_000) as i64;
    let base_labels = |key: &[(String, ValKey)]| -> Vec<(String, Val)> {
        if key.is_empty() && m.by.is_empty() {
            vec![(
                "__name__".to_owned(),
                Val::Str(function_name(&m.function).to_owned()),
            )]
        } else {
            key.iter().map(|(k, v)| (k.clone(), v.val())).collect()
        }
    };
    let exemplars = |cells: &BTreeMap<i64, Acc>| -> Vec<Exemplar> {
        cells
            .iter()
            .filter_map(|(step, a)| {
                a.exemplar.as_ref().map(|(t, v)| Exemplar {
                    trace_id: t.clone(),
                    value: v * scale,
                    timestamp_ms: ms(*step),
                })
            })
            .take(opts.exemplars)
            .collect()
    };
    let dense = |cells: &BTreeMap<i64, Acc>, f: &dyn Fn(&Acc) -> f64| -> Vec<(i64, f64)> {
        (0..steps as i64)
            .map(|s| (ms(s), cells.get(&s).map_or(0.0, f)))
            .collect()
    };
    let sparse = |cells: &BTreeMap<i64, Acc>, f: &dyn Fn(&Acc) -> f64| -> Vec<(i64, f64)> {
        cells
            .iter()
            .filter(|(s, _)| **s >= 0 && (**s as u64) < steps)
            .map(|(s, a)| (ms(*s), f(a)))
            .collect()
    };
    let mut out = Vec::new();
    for (key, cells) in &cells {
        let labels = base_labels(key);
        let ex = exemplars(cells);
        match &m.function {
            MetricsFn::Rate => out.push(Series {
                labels,
                samples: dense(cells, &|a| a.count / step_s),
                exemplars: ex,
            }),
            MetricsFn::CountOverTime => out.push(Series {
                labels,
                samples: dense(cells, &|a| a.count),
                exemplars: ex,
            }),
            MetricsFn::AvgOverTime(_) => out.push(Series {
                labels,
                samples: sparse(cells, &|a| a.sum / a.count * scale),
                exemplars: ex,
            }),
            MetricsFn::SumOverTime(_) => out.push(Series {
                labels,
                samples: sparse(cells, &|a| a.sum * scale),
                exemplars: ex,
            }),
            MetricsFn::MinOverTime(_) => out.push(Series {
                labels,
                samples: sparse(cells, &|a| a.min.unwrap_or(0.0) * scale),
                exemplars: ex,
            }),
            MetricsFn::MaxOverTime(_) => out.push(Series {
                labels,
                samples: sparse(cells, &|a| a.max.unwrap_or(0.0) * scale),
                exemplars: ex,
            }),
            MetricsFn::QuantileOverTime(_, qs) => {
                let plain: Vec<(String, Val)> =
                    key.iter().map(|(k, v)| (k.clone(), v.val())).collect();
                for q in qs {
                    let mut labels = plain.clone();
                    labels.push(("p".into(), Val::Float(*q)));
                    out.push(Series {
                        labels,
                        samples: sparse(cells, &|a| log2_quantile(*q, &a.log2) * scale),
                        exemplars: ex.clone(),
                    });
                }
            }
            MetricsFn::HistogramOverTime(_) => {
                let plain: Vec<(String, Val)> =
                    key.iter().map(|(k, v)| (k.clone(), v.val())).collect();
                let exps: std::collections::BTreeSet<i64> = cells
                    .values()
                    .flat_map(|a| a.log2.keys().copied())
                    .collect();
                for exp in exps {
                    let mut labels = plain.clone();
                    labels.push(("__bucket".into(), Val::Float(2f64.powi(exp as i32) * scale)));
                    out.push(Series {
                        labels,
                        samples: dense(cells, &|a| a.log2.get(&exp).copied().unwrap_or(0.0)),
                        exemplars: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

/// `{ … } | rate()` at one instant: the whole range as one step.
pub async fn query_instant(
    run: &mut Run<'_>,
    query: &Query,
    start: u64,
    end: u64,
) -> Result<(Vec<(Vec<(String, Val)>, f64)>, bool), TraceQlError> {
    let opts = RangeOptions {
        start,
        end,
        step: end.saturating_sub(start).max(1),
        exemplars: 0,
    };
    let answer = query_range(run, query, &opts).await?;
    Ok((
        answer
            .series
            .into_iter()
            .map(|s| (s.labels, s.samples.first().map_or(0.0, |x| x.1)))
            .collect(),
        answer.partial,
    ))
}
