//! TraceQL metrics: `GET /api/metrics/query_range?q=&start=&end=&step=&exemplars=` (or
//! `since=1h` for the range ending now; times in Unix seconds or nanoseconds) →
//! `tempopb.QueryRangeResponse` and `GET /api/metrics/query?q=&start=&end=` →
//! `tempopb.QueryInstantResponse`, in proto3 JSON (64-bit integers as strings).

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};
use weft_query::analytics::exec::Run;
use weft_query::traceql::{self, eval::Val, metrics::RangeOptions};

use super::search::key_values;
use super::{TempoError, range};
use crate::state::{SharedState, Tenant};
use crate::traces::search::Form;

struct Params {
    q: traceql::Query,
    start: u64,
    end: u64,
    step: Option<u64>,
    exemplars: usize,
}

fn params(raw: Option<&str>) -> Result<Params, TempoError> {
    let form = Form::parse(raw).map_err(TempoError::bad)?;
    let get = |k: &str| form.get(k);
    let q = get("q")
        .or(get("query"))
        .ok_or_else(|| TempoError::bad("missing q (a TraceQL metrics query)"))?;
    let q = traceql::parse(q)?;
    let (start, end) = range(get("start"), get("end"), false)?;
    let end = end.unwrap_or_else(crate::time::now);
    // `since=1h`: the range ending now (or at `end`), as Tempo takes it
    let since = get("since")
        .map(|v| {
            traceql::parse::parse_duration(v).ok_or_else(|| {
                TempoError::bad(format!(
                    "invalid since {v:?}: expected a duration such as 1h"
                ))
            })
        })
        .transpose()?;
    let start = start.unwrap_or(end.saturating_sub(since.unwrap_or(3_600_000_000_000)));
    let step = get("step")
        .map(|s| {
            // Tempo takes a duration (`60s`) or seconds
            let ns = match s.parse::<f64>() {
                Ok(secs) => Some((secs * 1e9) as u64),
                Err(_) => traceql::parse::parse_duration(s),
            };
            ns.filter(|n| *n > 0).ok_or_else(|| {
                TempoError::bad(format!(
                    "invalid step {s:?}: expected a duration such as 60s"
                ))
            })
        })
        .transpose()?;
    let exemplars = match get("exemplars") {
        None => 100,
        Some(v) => v
            .parse()
            .map_err(|_| TempoError::bad(format!("invalid exemplars {v:?}: expected a count")))?,
    };
    Ok(Params {
        q,
        start,
        end,
        step,
        exemplars,
    })
}

pub async fn query_range(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let p = params(raw.as_deref())?;
    // Tempo's default step: the range in about 100 steps, at least a second
    let step = p
        .step
        .unwrap_or_else(|| (p.end.saturating_sub(p.start) / 100).max(1_000_000_000));
    let opts = RangeOptions {
        start: p.start - p.start % step,
        end: p.end,
        step,
        exemplars: p.exemplars,
    };
    let mut run = Run::plain(&state.sql, &tenant);
    let answer = traceql::metrics::query_range(&mut run, &p.q, &opts).await?;
    let series: Vec<Value> = answer
        .series
        .iter()
        .map(|s| {
            json!({
                "labels": key_values(&s.labels),
                "samples": s.samples.iter().map(|(t, v)| json!({"timestampMs": t.to_string(), "value": v})).collect::<Vec<_>>(),
                "exemplars": s.exemplars.iter().map(|e| json!({
                    "labels": key_values(&[("trace:id".to_owned(), Val::Str(e.trace_id.clone()))]),
                    "value": e.value,
                    "timestampMs": e.timestamp_ms.to_string(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut body = json!({
        "series": series,
        "metrics": super::one_job(),
    });
    if answer.partial {
        body["status"] = json!("PARTIAL");
        body["message"] = json!("more spans matched than one query reads; the series are partial");
    }
    Ok(Json(body))
}

pub async fn query_instant(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let p = params(raw.as_deref())?;
    let mut run = Run::plain(&state.sql, &tenant);
    let (series, partial) = traceql::metrics::query_instant(&mut run, &p.q, p.start, p.end).await?;
    let mut body = json!({
        "series": series
            .iter()
            .map(|(labels, v)| json!({"labels": key_values(labels), "value": v}))
            .collect::<Vec<_>>(),
        "metrics": super::one_job(),
    });
    if partial {
        body["status"] = json!("PARTIAL");
    }
    Ok(Json(body))
}
