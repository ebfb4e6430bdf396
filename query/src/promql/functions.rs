//! PromQL functions: those over range vectors (`rate`, `*_over_time`, …), those over instant
//! vectors (math, labels, `histogram_quantile`, …) and the scalar ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use promql_parser::parser::{Call, Expr};

use super::eval::{
    Evaluator, Sample, Value, Window, drop_name, mean, offset_ms, quantile, variance,
};
use super::source::{get, insert};
use super::{Labels, Loaded, PromError};

/// The range vector of a call's argument at `ts` (a range selector or a subquery), with the
/// range and the selector's range end (for extrapolation).
fn matrix_arg(ev: &Evaluator<'_>, e: &Expr, ts: i64) -> Result<(Vec<Loaded>, i64, i64), PromError> {
    match e {
        Expr::Paren(p) => matrix_arg(ev, &p.expr, ts),
        Expr::MatrixSelector(m) => {
            let range = m.range.as_millis() as i64;
            let Value::Matrix(v) = ev.eval(e, ts)? else {
                unreachable!("a range selector evaluates to a matrix")
            };
            let end = ev.at_time(&m.vs.at).unwrap_or(ts) - offset_ms(&m.vs.offset);
            Ok((v, range, end))
        }
        Expr::Subquery(sq) => {
            let range = sq.range.as_millis() as i64;
            let end = ev.at_time(&sq.at).unwrap_or(ts) - offset_ms(&sq.offset);
            let Value::Matrix(v) = ev.eval(e, ts)? else {
                unreachable!("a subquery evaluates to a matrix")
            };
            Ok((v, range, end))
        }
        _ => Err(PromError::bad_data("expected a range vector")),
    }
}

fn arg(c: &Call, i: usize) -> Result<&Expr, PromError> {
    c.args.args.get(i).map(|b| b.as_ref()).ok_or_else(|| {
        PromError::bad_data(format!("{} is missing argument {}", c.func.name, i + 1))
    })
}

pub(super) fn call(ev: &Evaluator<'_>, c: &Call, ts: i64) -> Result<Value, PromError> {
    let name = c.func.name;
    match name {
        "rate" | "increase" | "delta" => {
            let counter = name != "delta";
            over_time(ev, arg(c, 0)?, ts, |w| {
                extrapolated(w, counter, name == "rate")
            })
        }
        "irate" | "idelta" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            Ok(per_series(m, ts, |l| instant_delta(l, name == "irate")))
        }
        "resets" | "changes" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            Ok(per_series(m, ts, |l| {
                let n = l.vs.windows(2).filter(|w| match name {
                    "resets" => w[1] < w[0],
                    _ => !(w[1] == w[0] || (w[1].is_nan() && w[0].is_nan())),
                });
                Some(n.count() as f64)
            }))
        }
        "deriv" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            Ok(per_series(m, ts, |l| {
                (l.ts.len() >= 2).then(|| linear_regression(l, l.ts[0]).0)
            }))
        }
        "predict_linear" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            let seconds = ev.scalar(arg(c, 1)?, ts)?;
            Ok(per_series(m, ts, |l| {
                (l.ts.len() >= 2).then(|| {
                    let (slope, intercept) = linear_regression(l, ts);
                    slope * seconds + intercept
                })
            }))
        }
        "avg_over_time" | "min_over_time" | "max_over_time" | "sum_over_time"
        | "count_over_time" | "stddev_over_time" | "stdvar_over_time" | "present_over_time" => {
            let f = |v: &[f64]| {
                Some(match name {
                    "avg_over_time" => mean(v),
                    "min_over_time" => v
                        .iter()
                        .copied()
                        .fold(f64::NAN, |a, b| if a.is_nan() || b < a { b } else { a }),
                    "max_over_time" => v
                        .iter()
                        .copied()
                        .fold(f64::NAN, |a, b| if a.is_nan() || b > a { b } else { a }),
                    "sum_over_time" => v.iter().sum(),
                    "count_over_time" => v.len() as f64,
                    "stddev_over_time" => variance(v).sqrt(),
                    "stdvar_over_time" => variance(v),
                    _ => 1.0,
                })
            };
            over_time(ev, arg(c, 0)?, ts, |w| f(w.vs))
        }
        "last_over_time" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            Ok(Value::Vector(
                m.into_iter()
                    .filter_map(|l| {
                        let v = *l.vs.last()?;
                        Some(Sample {
                            labels: l.labels,
                            v,
                            t: ts,
                        })
                    })
                    .collect(),
            ))
        }
        "quantile_over_time" => {
            let q = ev.scalar(arg(c, 0)?, ts)?;
            over_time(ev, arg(c, 1)?, ts, |w| Some(quantile(q, w.vs.to_vec())))
        }
        "absent_over_time" => {
            let (m, _, _) = matrix_arg(ev, arg(c, 0)?, ts)?;
            Ok(absent(arg(c, 0)?, m.is_empty(), ts))
        }
        "absent" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            Ok(absent(arg(c, 0)?, v.is_empty(), ts))
        }
        "abs" | "ceil" | "floor" | "exp" | "ln" | "log2" | "log10" | "sqrt" | "sgn" | "sin"
        | "cos" | "tan" | "asin" | "acos" | "atan" | "sinh" | "cosh" | "tanh" | "deg" | "rad" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            let f: fn(f64) -> f64 = match name {
                "abs" => f64::abs,
                "ceil" => f64::ceil,
                "floor" => f64::floor,
                "exp" => f64::exp,
                "ln" => f64::ln,
                "log2" => f64::log2,
                "log10" => f64::log10,
                "sqrt" => f64::sqrt,
                "sgn" => |x: f64| {
                    if x > 0.0 {
                        1.0
                    } else if x < 0.0 {
                        -1.0
                    } else {
                        x
                    }
                },
                "sin" => f64::sin,
                "cos" => f64::cos,
                "tan" => f64::tan,
                "asin" => f64::asin,
                "acos" => f64::acos,
                "atan" => f64::atan,
                "sinh" => f64::sinh,
                "cosh" => f64::cosh,
                "tanh" => f64::tanh,
                "deg" => f64::to_degrees,
                _ => f64::to_radians,
            };
            Ok(map(v, ts, f))
        }
        "round" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            let to = match c.args.args.get(1) {
                Some(e) => ev.scalar(e, ts)?,
                None => 1.0,
            };
            let inverse = 1.0 / to;
            Ok(map(v, ts, move |x| (x * inverse + 0.5).floor() / inverse))
        }
        "clamp" | "clamp_min" | "clamp_max" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            let (lo, hi) = match name {
                "clamp" => (ev.scalar(arg(c, 1)?, ts)?, ev.scalar(arg(c, 2)?, ts)?),
                "clamp_min" => (ev.scalar(arg(c, 1)?, ts)?, f64::INFINITY),
                _ => (f64::NEG_INFINITY, ev.scalar(arg(c, 1)?, ts)?),
            };
            if name == "clamp" && hi < lo {
                return Ok(Value::Vector(Vec::new()));
            }
            Ok(map(v, ts, move |x| x.max(lo).min(hi)))
        }
        "timestamp" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            Ok(Value::Vector(
                v.into_iter()
                    .map(|mut s| {
                        drop_name(&mut s.labels);
                        s.v = s.t as f64 / 1000.0;
                        s.t = ts;
                        s
                    })
                    .collect(),
            ))
        }
        "time" => Ok(Value::Scalar(ts as f64 / 1000.0)),
        "pi" => Ok(Value::Scalar(std::f64::consts::PI)),
        "vector" => Ok(Value::Vector(vec![Sample {
            labels: Default::default(),
            v: ev.scalar(arg(c, 0)?, ts)?,
            t: ts,
        }])),
        "scalar" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            Ok(Value::Scalar(match v.as_slice() {
                [one] => one.v,
                _ => f64::NAN,
            }))
        }
        "sort" | "sort_desc" => {
            let mut v = ev.vector(arg(c, 0)?, ts)?;
            v.sort_by(|a, b| match name {
                "sort" => a.v.total_cmp(&b.v),
                _ => b.v.total_cmp(&a.v),
            });
            Ok(Value::Vector(v))
        }
        "label_replace" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            let text = |i| match ev.eval(arg(c, i)?, ts)? {
                Value::Str(s) => Ok(s),
                _ => Err(PromError::bad_data("label_replace takes string arguments")),
            };
            let (dst, replacement, src, pattern) = (text(1)?, text(2)?, text(3)?, text(4)?);
            let re = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
                PromError::bad_data(format!(
                    "invalid regular expression in label_replace(): {e}"
                ))
            })?;
            if !valid_label_name(&dst) {
                return Err(PromError::bad_data(format!(
                    "invalid destination label name in label_replace(): {dst}"
                )));
            }
            Ok(Value::Vector(
                v.into_iter()
                    .map(|mut s| {
                        let value = get(&s.labels, &src).unwrap_or("").to_owned();
                        if let Some(caps) = re.captures(&value) {
                            let mut out = String::new();
                            caps.expand(&replacement, &mut out);
                            if out.is_empty() {
                                Arc::make_mut(&mut s.labels).retain(|(k, _)| *k != dst);
                            } else {
                                insert(Arc::make_mut(&mut s.labels), dst.clone(), out);
                            }
                        }
                        s.t = ts;
                        s
                    })
                    .collect(),
            ))
        }
        "label_join" => {
            let v = ev.vector(arg(c, 0)?, ts)?;
            let text = |e: &Expr| match ev.eval(e, ts)? {
                Value::Str(s) => Ok(s),
                _ => Err(PromError::bad_data("label_join takes string arguments")),
            };
            let dst = text(arg(c, 1)?)?;
            let sep = text(arg(c, 2)?)?;
            let srcs: Vec<String> = c.args.args[3..]
                .iter()
                .map(|e| text(e))
                .collect::<Result<_, _>>()?;
            Ok(Value::Vector(
                v.into_iter()
                    .map(|mut s| {
                        let joined: Vec<&str> = srcs
                            .iter()
                            .map(|k| get(&s.labels, k).unwrap_or(""))
                            .collect();
                        let joined = joined.join(&sep);
                        if joined.is_empty() {
                            Arc::make_mut(&mut s.labels).retain(|(k, _)| *k != dst);
                        } else {
                            insert(Arc::make_mut(&mut s.labels), dst.clone(), joined);
                        }
                        s.t = ts;
                        s
                    })
                    .collect(),
            ))
        }
        "histogram_quantile" => {
            let q = ev.scalar(arg(c, 0)?, ts)?;
            let v = ev.vector(arg(c, 1)?, ts)?;
            Ok(histogram_quantile(q, v, ts))
        }
        "minute" | "hour" | "day_of_month" | "day_of_week" | "day_of_year" | "month" | "year"
        | "days_in_month" => {
            let v = match c.args.args.first() {
                Some(e) => ev.vector(e, ts)?,
                None => vec![Sample {
                    labels: Default::default(),
                    v: ts as f64 / 1000.0,
                    t: ts,
                }],
            };
            Ok(map(v, ts, move |x| date_part(name, x)))
        }
        other => Err(PromError::bad_data(format!(
            "function {other}() is not supported by this server"
        ))),
    }
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A function of each series' values over a range vector at `ts`; a range selector's windows
/// are read in place (see [`Evaluator::windows`]), anything else evaluated to a matrix first.
fn over_time(
    ev: &Evaluator<'_>,
    e: &Expr,
    ts: i64,
    f: impl Fn(&Window) -> Option<f64>,
) -> Result<Value, PromError> {
    match e {
        Expr::Paren(p) => over_time(ev, &p.expr, ts, f),
        Expr::MatrixSelector(m) => {
            let mut out = Vec::new();
            ev.windows(m, ts, |labels, w| {
                if let Some(v) = f(w) {
                    let mut labels = labels.clone();
                    drop_name(&mut labels);
                    out.push(Sample { labels, v, t: ts });
                }
            });
            Ok(Value::Vector(out))
        }
        _ => {
            let (m, range, end) = matrix_arg(ev, e, ts)?;
            Ok(per_series(m, ts, |l| {
                f(&Window {
                    ts: &l.ts,
                    vs: &l.vs,
                    start: end - range,
                    end,
                })
            }))
        }
    }
}

/// A function of each series' samples; `None` leaves the series out. The name is dropped.
fn per_series(m: Vec<Loaded>, ts: i64, f: impl Fn(&Loaded) -> Option<f64>) -> Value {
    Value::Vector(
        m.into_iter()
            .filter_map(|l| {
                let v = f(&l)?;
                let mut labels = l.labels;
                drop_name(&mut labels);
                Some(Sample { labels, v, t: ts })
            })
            .collect(),
    )
}

fn map(v: Vec<Sample>, ts: i64, f: impl Fn(f64) -> f64) -> Value {
    Value::Vector(
        v.into_iter()
            .map(|mut s| {
                drop_name(&mut s.labels);
                s.v = f(s.v);
                s.t = ts;
                s
            })
            .collect(),
    )
}

/// Prometheus's `extrapolatedRate`.
fn extrapolated(l: &Window, counter: bool, rate: bool) -> Option<f64> {
    let (range_start, range_end) = (l.start, l.end);
    if l.ts.len() < 2 {
        return None;
    }
    let (first, last) = (l.vs[0], l.vs[l.vs.len() - 1]);
    let mut result = last - first;
    if counter {
        let mut previous = 0.0;
        for v in l.vs {
            if *v < previous {
                result += previous;
            }
            previous = *v;
        }
    }
    let (t0, t1) = (l.ts[0], l.ts[l.ts.len() - 1]);
    let mut to_start = (t0 - range_start) as f64 / 1000.0;
    let to_end = (range_end - t1) as f64 / 1000.0;
    let sampled = (t1 - t0) as f64 / 1000.0;
    let average = sampled / (l.ts.len() - 1) as f64;
    if counter && result > 0.0 && first >= 0.0 {
        let to_zero = sampled * (first / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = average * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        average / 2.0
    };
    interval += if to_end < threshold {
        to_end
    } else {
        average / 2.0
    };
    result *= interval / sampled;
    if rate {
        result /= (range_end - range_start) as f64 / 1000.0;
    }
    Some(result)
}

/// `irate` / `idelta`: the last two samples.
fn instant_delta(l: &Loaded, rate: bool) -> Option<f64> {
    let n = l.ts.len();
    if n < 2 {
        return None;
    }
    let (v0, v1) = (l.vs[n - 2], l.vs[n - 1]);
    let mut result = if rate && v1 < v0 { v1 } else { v1 - v0 };
    if rate {
        let dt = (l.ts[n - 1] - l.ts[n - 2]) as f64 / 1000.0;
        if dt == 0.0 {
            return None;
        }
        result /= dt;
    }
    Some(result)
}

/// Least squares over the samples, times relative to `at` in seconds: (slope, intercept).
fn linear_regression(l: &Loaded, at: i64) -> (f64, f64) {
    let n = l.ts.len() as f64;
    let (mut sx, mut sy, mut sxy, mut sxx) = (0.0, 0.0, 0.0, 0.0);
    let const_y = l.vs.iter().all(|v| *v == l.vs[0]);
    for (t, v) in l.ts.iter().zip(&l.vs) {
        let x = (*t - at) as f64 / 1000.0;
        sx += x;
        sy += v;
        sxy += x * v;
        sxx += x * x;
    }
    if const_y {
        return (0.0, l.vs[0]);
    }
    let cov = sxy - sx * sy / n;
    let var = sxx - sx * sx / n;
    let slope = cov / var;
    (slope, sy / n - slope * sx / n)
}

/// `absent`: one sample with the selector's equality labels when nothing matched.
fn absent(e: &Expr, empty: bool, ts: i64) -> Value {
    if !empty {
        return Value::Vector(Vec::new());
    }
    let mut labels = Labels::new();
    let selector = match e {
        Expr::VectorSelector(vs) => Some(vs),
        Expr::MatrixSelector(m) => Some(&m.vs),
        _ => None,
    };
    if let Some(vs) = selector {
        let mut repeated = std::collections::HashSet::new();
        for m in &vs.matchers.matchers {
            if m.name == "__name__" {
                continue;
            }
            if matches!(m.op, promql_parser::label::MatchOp::Equal) {
                if get(&labels, &m.name).is_some() {
                    repeated.insert(m.name.clone());
                }
                insert(&mut labels, m.name.clone(), m.value.clone());
            }
        }
        labels.retain(|(k, _)| !repeated.contains(k));
    }
    Value::Vector(vec![Sample {
        labels: Arc::new(labels),
        v: 1.0,
        t: ts,
    }])
}

/// Prometheus's `bucketQuantile` over each group of `le` buckets.
fn histogram_quantile(q: f64, v: Vec<Sample>, ts: i64) -> Value {
    let mut groups: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    for s in v {
        let Some(le) = get(&s.labels, "le") else {
            continue;
        };
        let upper = match le {
            "+Inf" | "Inf" | "+inf" | "inf" => Ok(f64::INFINITY),
            other => other.parse::<f64>(),
        };
        let Ok(upper) = upper else {
            continue;
        };
        let mut labels = Arc::unwrap_or_clone(s.labels);
        labels.retain(|(k, _)| k != "le" && k != "__name__");
        groups.entry(labels).or_default().push((upper, s.v));
    }
    Value::Vector(
        groups
            .into_iter()
            .map(|(labels, buckets)| Sample {
                labels: Arc::new(labels),
                v: bucket_quantile(q, buckets),
                t: ts,
            })
            .collect(),
    )
}

fn bucket_quantile(q: f64, mut buckets: Vec<(f64, f64)>) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if buckets.last().is_none_or(|b| b.0 != f64::INFINITY) {
        return f64::NAN;
    }
    // equal upper bounds coalesce
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
    for b in buckets {
        match merged.last_mut() {
            Some(last) if last.0 == b.0 => last.1 += b.1,
            _ => merged.push(b),
        }
    }
    let mut buckets = merged;
    if buckets.len() < 2 {
        return f64::NAN;
    }
    // counts must not fall
    let mut max = f64::NEG_INFINITY;
    for b in &mut buckets {
        if b.1 > max {
            max = b.1;
        } else if b.1 < max {
            b.1 = max;
        }
    }
    let observations = buckets[buckets.len() - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let b = buckets.partition_point(|x| x.1 < rank);
    if b == buckets.len() - 1 {
        return buckets[buckets.len() - 2].0;
    }
    if b == 0 && buckets[0].0 <= 0.0 {
        return buckets[0].0;
    }
    let (mut start, end) = (0.0, buckets[b].0);
    let mut count = buckets[b].1;
    if b > 0 {
        start = buckets[b - 1].0;
        count -= buckets[b - 1].1;
        rank -= buckets[b - 1].1;
    }
    start + (end - start) * (rank / count)
}

fn date_part(name: &str, secs: f64) -> f64 {
    use chrono_free::civil;
    if secs.is_nan() {
        return f64::NAN;
    }
    let t = secs.floor() as i64;
    let days = t.div_euclid(86_400);
    let in_day = t.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    match name {
        "minute" => ((in_day / 60) % 60) as f64,
        "hour" => (in_day / 3600) as f64,
        "day_of_month" => d as f64,
        "day_of_week" => (days + 4).rem_euclid(7) as f64,
        "day_of_year" => (month_days[..(m - 1) as usize].iter().sum::<i64>() + d) as f64,
        "month" => m as f64,
        "year" => y as f64,
        _ => month_days[(m - 1) as usize] as f64,
    }
}

/// Civil dates without a date library.
mod chrono_free {
    /// (year, month 1–12, day 1–31) of a count of days since 1970-01-01.
    pub fn civil(days: i64) -> (i64, i64, i64) {
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let y = yoe + era * 400;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        (if m <= 2 { y + 1 } else { y }, m, d)
    }
}
