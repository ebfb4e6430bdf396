//! Drift: how the distribution of a signal moved between two windows
//! (`a_start`, `a_end`, `b_start`, `b_end`) or two cohorts (`cohort=DIM&a=V1&b=V2`), as
//! Jensen–Shannon divergence (base 2, 0 to 1) and Kullback–Leibler divergence of B from A
//! (bits; each bucket counted half a value more, so that an empty bucket stays finite), with the
//! buckets whose share moved most. Buckets are quarter octaves of the value.
//! `GET /api/v1/drift?signal=itl&cohort=llm.model_version&a=v1&b=v2` and `drift(…)`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::exec::Run;
use super::params::{Params, Result, dim_expr, invalid, lit, ts};
use super::percentiles::json_number;
use super::signals::span_signal;

pub const PARAMS: &[&str] = &[
    "signal", "a_start", "a_end", "b_start", "b_end", "cohort", "a", "b",
];

#[derive(Clone, Debug, PartialEq)]
pub struct Moved {
    pub upper_bound: f64,
    pub a_share: f64,
    pub b_share: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Drift {
    pub signal: String,
    pub a_count: u64,
    pub b_count: u64,
    pub js_divergence: f64,
    pub kl_divergence: f64,
    pub buckets_moved: Vec<Moved>,
}

fn time(p: &Params, key: &str) -> Result<Option<u64>> {
    p.get(key)
        .map(|v| crate::time::parse_time(v).map_err(|e| invalid(format!("{key}: {e}"))))
        .transpose()
}

pub async fn drift(run: &mut Run<'_>, p: Params) -> Result<Drift> {
    let signal = span_signal(p.get("signal").unwrap_or("e2e"))?;
    let (a, b) = match (p.get("cohort"), p.get("a"), p.get("b")) {
        (Some(dim), Some(a), Some(b)) => {
            let e = dim_expr(dim);
            (format!("{e} = {}", lit(a)), format!("{e} = {}", lit(b)))
        }
        (None, None, None) => {
            let window = |s: &str, e: &str| -> Result<String> {
                let (Some(s_), Some(e_)) = (time(&p, s)?, time(&p, e)?) else {
                    return Err(invalid(format!(
                        "name two windows ({s}, {e}, …) or a cohort (cohort, a, b)"
                    )));
                };
                Ok(format!(
                    "start_time >= {} AND start_time < {}",
                    ts(s_),
                    ts(e_)
                ))
            };
            (window("a_start", "a_end")?, window("b_start", "b_end")?)
        }
        _ => return Err(invalid("cohort, a and b go together")),
    };
    let filter = p.where_clause(&[format!("({})", signal.condition)])?;
    let query = format!(
        "SELECT ga, gb, CASE WHEN v > 0 THEN CAST(ceil(log2(v) * 4) AS BIGINT) ELSE -4300 END AS k, \
         count(*) FROM (SELECT COALESCE({a}, FALSE) AS ga, COALESCE({b}, FALSE) AS gb, {} AS v \
         FROM spans {filter}) WHERE v IS NOT NULL AND (ga OR gb) GROUP BY ga, gb, k",
        signal.value
    );
    let rows = run.sql(&query).await?;
    let (ga, gb, k, n) = (rows.strings(0), rows.strings(1), rows.i64(2), rows.i64(3));
    let mut bins: BTreeMap<i64, [f64; 2]> = BTreeMap::new();
    let mut totals = [0.0f64; 2];
    for i in 0..rows.len() {
        let c = n[i].unwrap_or(0) as f64;
        for (side, flag) in [&ga[i], &gb[i]].into_iter().enumerate() {
            if flag.as_deref() == Some("true") {
                bins.entry(k[i].unwrap_or(0)).or_default()[side] += c;
                totals[side] += c;
            }
        }
    }
    if totals[0] == 0.0 || totals[1] == 0.0 {
        return Err(invalid(format!(
            "no values of {} in {} (a: {}, b: {})",
            signal.name,
            if totals[0] == 0.0 { "a" } else { "b" },
            totals[0],
            totals[1]
        )));
    }
    let (mut js, mut kl) = (0.0, 0.0);
    let m = bins.len() as f64;
    let mut moved = Vec::new();
    for (k, [ca, cb]) in &bins {
        let (pa, pb) = (ca / totals[0], cb / totals[1]);
        let mid = (pa + pb) / 2.0;
        if pa > 0.0 {
            js += 0.5 * pa * (pa / mid).log2();
        }
        if pb > 0.0 {
            js += 0.5 * pb * (pb / mid).log2();
        }
        let (sa, sb) = (
            (ca + 0.5) / (totals[0] + 0.5 * m),
            (cb + 0.5) / (totals[1] + 0.5 * m),
        );
        kl += sb * (sb / sa).log2();
        moved.push(Moved {
            upper_bound: if *k == -4300 {
                0.0
            } else {
                2f64.powf(*k as f64 / 4.0)
            },
            a_share: pa,
            b_share: pb,
        });
    }
    moved.sort_by(|x, y| {
        (y.b_share - y.a_share)
            .abs()
            .total_cmp(&(x.b_share - x.a_share).abs())
    });
    moved.truncate(10);
    Ok(Drift {
        signal: signal.name,
        a_count: totals[0] as u64,
        b_count: totals[1] as u64,
        js_divergence: js.clamp(0.0, 1.0),
        kl_divergence: kl.max(0.0),
        buckets_moved: moved,
    })
}

impl Drift {
    pub fn to_json(&self) -> Value {
        json!({
            "signal": self.signal,
            "a_count": self.a_count,
            "b_count": self.b_count,
            "js_divergence": json_number(self.js_divergence),
            "kl_divergence": json_number(self.kl_divergence),
            "buckets_moved": self.buckets_moved.iter().map(|m| json!({
                "upper_bound": m.upper_bound,
                "a_share": m.a_share,
                "b_share": m.b_share,
            })).collect::<Vec<_>>(),
        })
    }
}
