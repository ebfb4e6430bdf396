//! Percentiles of a signal over time, by any dimensions: `GET /api/v1/percentiles?signal=ttft&
//! by=llm.model_version&step=60s&q=0.5,0.99` and `percentiles(signal => 'ttft', …)`.
//!
//! By default from sketches ([`super::sketch`]): SQL counts the values of each (step, group)
//! in their sketch bins, so only bins leave the scan, and every quantile is within the stated
//! relative error. `exact=true` asks SQL for the exact `percentile_cont` instead. The request
//! signals grouped and filtered by request dimensions read the blocks' request tables instead
//! of SQL, binned (or, exact, interpolated) as SQL would.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde_json::{Value, json};

use super::exec::{Run, steps};
use super::params::{Groups, Params, Result, dim_exprs, groups, invalid};
use super::signals::span_signal;
use super::sketch::{RELATIVE_ERROR, Sketch, bin_sql, quantile_of_sorted, sketch_order};
use crate::sql::percentile::of_sorted;

pub const PARAMS: &[&str] = &["signal", "by", "step", "q", "exact"];

/// One labelled series of quantiles.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    /// (step start ns, the value of each asked quantile, in the order asked).
    pub points: Vec<(i64, Vec<f64>)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Percentiles {
    pub signal: String,
    pub unit: &'static str,
    pub quantiles: Vec<f64>,
    /// `None` when exact.
    pub relative_error: Option<f64>,
    pub series: Vec<Series>,
    pub partial: bool,
}

fn quantiles(p: &Params) -> Result<Vec<f64>> {
    let Some(list) = p.list("q") else {
        return Ok(vec![0.5, 0.9, 0.95, 0.99]);
    };
    let qs = list
        .iter()
        .map(|q| {
            q.parse::<f64>()
                .ok()
                .filter(|q| (0.0..=1.0).contains(q))
                .ok_or_else(|| invalid(format!("q: {q:?} is not a quantile between 0 and 1")))
        })
        .collect::<Result<Vec<_>>>()?;
    if qs.is_empty() {
        return Err(invalid("q: no quantile given"));
    }
    Ok(qs)
}

/// The step: `step`, else the range in about 60 steps, else a minute.
pub fn step_of(p: &Params) -> Result<std::time::Duration> {
    Ok(match p.duration("step")? {
        Some(s) => s,
        None => match (p.start, p.end) {
            (Some(s), Some(e)) => {
                std::time::Duration::from_millis(((e - s) / 60 / 1_000_000).max(1000))
            }
            _ => std::time::Duration::from_secs(60),
        },
    })
}

pub async fn percentiles(run: &mut Run<'_>, p: Params) -> Result<Percentiles> {
    percentiles_from(run, p, true).await
}

/// The SQL answer's series and the request tables' (`None` when they cannot answer), for
/// tests.
#[cfg(test)]
pub async fn both_answers(
    run: &mut Run<'_>,
    p: Params,
) -> Result<(Vec<Series>, Option<Vec<Series>>)> {
    let sql = percentiles_from(run, p.clone(), false).await?;
    let signal = span_signal(p.get("signal").unwrap_or("e2e"))?;
    let ask = (quantiles(&p)?, p.flag("exact")?);
    let dims = p.list_or("by", &[]);
    let step = step_of(&p)?;
    let tables = of_requests(run, &p, &signal.name, (&ask.0, ask.1), &dims, step).await?;
    Ok((sql.series, tables))
}

/// [`percentiles`], from the request tables where they can answer when `tables`.
async fn percentiles_from(run: &mut Run<'_>, mut p: Params, tables: bool) -> Result<Percentiles> {
    let signal = span_signal(p.get("signal").unwrap_or("e2e"))?;
    let qs = quantiles(&p)?;
    let exact = p.flag("exact")?;
    let dims = p.list_or("by", &[]);
    let step = step_of(&p)?;
    if let (Some(s), Some(e)) = (p.start, p.end) {
        steps(s, e, step, "step")?;
    }
    run.fit_rows(&mut p).await?;
    let ask = (qs.as_slice(), exact);
    if tables && let Some(series) = of_requests(run, &p, &signal.name, ask, &dims, step).await? {
        return Ok(Percentiles {
            signal: signal.name,
            unit: signal.unit,
            quantiles: qs,
            relative_error: (!exact).then_some(RELATIVE_ERROR),
            series,
            partial: run.partial,
        });
    }
    let filter = p.where_clause(&[format!("({})", signal.condition)])?;
    let Groups {
        select: groups,
        keys,
    } = groups(&dim_exprs(&dims));
    let inner = format!(
        "SELECT CAST(date_bin(INTERVAL '{} milliseconds', start_time) AS BIGINT) AS t{groups}, {} AS v FROM spans {filter}",
        step.as_millis(),
        signal.value
    );
    let query = if exact {
        let pcts: String = qs
            .iter()
            .map(|q| format!(", percentile_cont(v, {q:?})"))
            .collect();
        format!(
            "SELECT t{keys}{pcts} FROM ({inner}) WHERE v IS NOT NULL GROUP BY t{keys} ORDER BY t"
        )
    } else {
        format!(
            "SELECT t{keys}, {} AS k, count(*) FROM ({inner}) WHERE v IS NOT NULL GROUP BY t{keys}, k",
            bin_sql("v")
        )
    };
    let rows = match run.sql_or_partial(&query).await? {
        Some(r) => r,
        None => {
            return Ok(Percentiles {
                signal: signal.name,
                unit: signal.unit,
                quantiles: qs,
                relative_error: (!exact).then_some(RELATIVE_ERROR),
                series: Vec::new(),
                partial: true,
            });
        }
    };
    let t = rows.i64(0);
    let mut by_labels: BTreeMap<BTreeMap<String, String>, BTreeMap<i64, Vec<f64>>> =
        BTreeMap::new();
    if exact {
        let labels = rows.labels(1, &dims);
        let values: Vec<Vec<Option<f64>>> = (0..qs.len())
            .map(|i| rows.f64(1 + dims.len() + i))
            .collect();
        for row in 0..rows.len() {
            let vals = values.iter().map(|c| c[row].unwrap_or(f64::NAN)).collect();
            by_labels
                .entry(labels[row].clone())
                .or_default()
                .insert(t[row].unwrap_or(0), vals);
        }
    } else {
        let (k, n) = (rows.i64(1 + dims.len()), rows.i64(2 + dims.len()));
        let (sets, ids) = rows.label_ids(1, &dims);
        let mut sketches: Vec<BTreeMap<i64, Sketch>> = vec![BTreeMap::new(); sets.len()];
        for row in 0..rows.len() {
            sketches[ids[row]]
                .entry(t[row].unwrap_or(0))
                .or_default()
                .add(k[row].unwrap_or(0), n[row].unwrap_or(0) as u64);
        }
        for (labels, points) in sets.into_iter().zip(sketches) {
            let series = by_labels.entry(labels).or_default();
            for (t, s) in points {
                let vals = qs
                    .iter()
                    .map(|q| s.quantile(*q).unwrap_or(f64::NAN))
                    .collect();
                series.insert(t, vals);
            }
        }
    }
    Ok(Percentiles {
        signal: signal.name,
        unit: signal.unit,
        quantiles: qs,
        relative_error: (!exact).then_some(RELATIVE_ERROR),
        series: by_labels
            .into_iter()
            .map(|(labels, points)| Series {
                labels,
                points: points.into_iter().collect(),
            })
            .collect(),
        partial: run.partial,
    })
}

/// The quantiles of a request signal grouped by request dimensions, from the blocks' request
/// tables (`weft_storage::requests`): the same values SQL computes, binned the same way, or
/// (`exact`) interpolated as `percentile_cont` does. `None` when the tables cannot answer
/// (another signal or group, a `service` or `name` filter, an `attr.` filter on anything but
/// a request dimension).
async fn of_requests(
    run: &mut Run<'_>,
    p: &Params,
    signal: &str,
    (qs, exact): (&[f64], bool),
    dims: &[String],
    step: std::time::Duration,
) -> Result<Option<Vec<Series>>> {
    use super::requests::table;
    use weft_storage::requests::RequestRow;
    let of: fn(&RequestRow) -> Option<f64> = match signal {
        "ttft" => |q| Some(q.ttft? * 1000.0),
        "e2e" | "e2e_latency" => |q| Some(q.e2e.map_or(q.duration_ns as f64 / 1e6, |s| s * 1000.0)),
        "tpot" => |q| {
            let out = q.output_tokens.filter(|n| *n != 0)?;
            Some(q.decode? * 1000.0 / out as f64)
        },
        "tokens_per_s" => |q| {
            let decode = q.decode.filter(|d| *d != 0.0)?;
            Some(q.output_tokens? as f64 / decode)
        },
        _ => return Ok(None),
    };
    let Some(t) = table(run, p, false, dims, move |q| of(q).is_some()).await? else {
        return Ok(None);
    };
    let step = step.as_nanos() as u64;
    // per tuple its group (the tuple's values of the dims; `None`: filtered out), looked up
    // once; per (group, step) its values or their sketch
    let mut group_of: Vec<Option<Option<usize>>> = vec![None; t.rollup.tuples.len()];
    let mut keys: Vec<Vec<Option<&str>>> = Vec::new();
    let mut key_index: BTreeMap<Vec<Option<&str>>, usize> = BTreeMap::new();
    let mut values: FxHashMap<(usize, i64), Vec<f64>> = FxHashMap::default();
    for q in &t.rollup.requests {
        let Some(v) = of(q) else { continue };
        let group = *group_of[q.tuple as usize].get_or_insert_with(|| {
            t.passes(q.tuple).then(|| {
                let key = t.key(q.tuple);
                *key_index.entry(key.clone()).or_insert_with(|| {
                    keys.push(key);
                    keys.len() - 1
                })
            })
        });
        let Some(group) = group else { continue };
        let at = (q.start_ns / step * step) as i64;
        // sketched quantiles from the values ordered as their bins are (the same answers as
        // the bins': no bins built)
        let v = if exact { v } else { sketch_order(v) };
        values.entry((group, at)).or_default().push(v);
    }
    type Points = Vec<(i64, Vec<f64>)>;
    let mut series: BTreeMap<BTreeMap<String, String>, Points> = BTreeMap::new();
    for ((group, at), values) in values {
        let labels: BTreeMap<String, String> = dims
            .iter()
            .zip(&keys[group])
            .filter_map(|(d, v)| Some((d.clone(), (*v)?.to_owned())))
            .collect();
        let mut placed = values;
        place_ranks(&mut placed, qs);
        let quantiles = qs
            .iter()
            .map(|&q| match exact {
                true => of_sorted(&placed, q),
                false => quantile_of_sorted(&placed, q).unwrap_or(f64::NAN),
            })
            .collect();
        series.entry(labels).or_default().push((at, quantiles));
    }
    Ok(Some(
        series
            .into_iter()
            .map(|(labels, mut points)| {
                points.sort_by_key(|p| p.0);
                Series { labels, points }
            })
            .collect(),
    ))
}

/// Puts at each rank that a quantile of `qs` reads (those either side of `q × (n − 1)`) the
/// value a sort would put there, selecting instead of sorting: the quantiles of the values
/// are then read as of sorted ones.
fn place_ranks(values: &mut [f64], qs: &[f64]) {
    let Some(last) = values.len().checked_sub(1) else {
        return;
    };
    let mut ranks: Vec<usize> = qs
        .iter()
        .flat_map(|q| {
            let rank = q.clamp(0.0, 1.0) * last as f64;
            [rank.floor() as usize, rank.ceil() as usize]
        })
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    // each selection leaves what is above its rank to its right: the next rank is there
    let mut from = 0;
    for rank in ranks {
        values[from..].select_nth_unstable_by(rank - from, f64::total_cmp);
        from = rank + 1;
    }
}

/// A quantile as the answers name it (`0.5`, `0.99`).
pub fn quantile_name(q: f64) -> String {
    let s = format!("{q}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

impl Percentiles {
    pub fn to_json(&self) -> Value {
        let series: Vec<Value> = self
            .series
            .iter()
            .map(|s| {
                let points: Vec<Value> = s
                    .points
                    .iter()
                    .map(|(t, vals)| {
                        let m: serde_json::Map<String, Value> = self
                            .quantiles
                            .iter()
                            .zip(vals)
                            .map(|(q, v)| (quantile_name(*q), json_number(*v)))
                            .collect();
                        json!([t, m])
                    })
                    .collect();
                json!({"labels": s.labels, "points": points})
            })
            .collect();
        json!({
            "signal": self.signal,
            "unit": self.unit,
            "relative_error": self.relative_error.unwrap_or(0.0),
            "exact": self.relative_error.is_none(),
            "series": series,
            "partial": self.partial,
        })
    }
}

/// A float as JSON (NaN and infinities as null).
pub fn json_number(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_ranks_hold_what_a_sort_puts_there() {
        let qs = [0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0];
        for n in [1, 2, 3, 7, 100, 1001] {
            let values: Vec<f64> = (0..n).map(|i| ((i * 7919) % 613) as f64 / 3.0).collect();
            let mut sorted = values.clone();
            sorted.sort_unstable_by(f64::total_cmp);
            let mut placed = values;
            place_ranks(&mut placed, &qs);
            for q in qs {
                assert_eq!(of_sorted(&placed, q), of_sorted(&sorted, q), "{n} {q}");
                assert_eq!(
                    quantile_of_sorted(&placed, q),
                    quantile_of_sorted(&sorted, q),
                    "{n} {q}"
                );
            }
        }
    }
}
