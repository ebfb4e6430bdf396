//! `GET /api/v1/traces/{trace_id}/gpu?margin=60s`: the GPU and KV-cache series of every worker
//! and GPU that served a trace, over the trace's time plus a margin (60 s by default):
//! `{"series": [{"metric", "labels", "points": [[t_ns, v], …]}]}`, metrics under the canonical
//! names (`gpu.utilization`, `gpu.memory.used`, `llm.kv_cache.usage`, …) whichever exporter
//! wrote them. A worker is matched by `worker.id`, a GPU by `gpu.id` with its worker or host
//! (`host.name`), as the spans carry them.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;
use serde_json::{Value, json};
use weft_query::promql::Source;
use weft_query::promql::eval::selector_matchers;
use weft_query::promql::names::metric_name;
use weft_query::promql::source::get as label;
use weft_query::promql::vocabulary::CANONICAL;
use weft_storage::model::{MetricKind, SpanRecord, TraceId};

use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};
use crate::traces::search::{bad, form_pairs};

/// What served a trace: workers, hosts and (worker or host, GPU) pairs.
#[derive(Default)]
struct Served {
    workers: BTreeSet<String>,
    hosts: BTreeSet<String>,
    gpus: BTreeSet<(String, String)>,
}

fn text(s: &SpanRecord, key: &str) -> Option<String> {
    s.attribute(key).and_then(|v| v.text()).or_else(|| {
        s.resource
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.text())
    })
}

fn served(spans: &[SpanRecord]) -> Served {
    let mut out = Served::default();
    for s in spans {
        let worker = text(s, "worker.id");
        let host = text(s, "host.name");
        if let Some(w) = &worker {
            out.workers.insert(w.clone());
        }
        if let Some(h) = &host {
            out.hosts.insert(h.clone());
        }
        if let Some(gpu) = text(s, "gpu.id") {
            for owner in worker.iter().chain(host.iter()) {
                out.gpus.insert((owner.clone(), gpu.clone()));
            }
        }
    }
    out
}

/// Whether a series (canonical labels, shown) belongs to what served the trace.
fn belongs(served: &Served, labels: &weft_query::promql::Labels) -> bool {
    let worker = label(labels, "worker_id");
    let host = label(labels, "host_name");
    let owner_matches = worker.is_some_and(|w| served.workers.contains(w))
        || host.is_some_and(|h| served.hosts.contains(h));
    if !owner_matches {
        return false;
    }
    match label(labels, "gpu_id") {
        // a GPU series: the trace's GPU on that worker or host, or any GPU of it when the
        // spans name none
        Some(gpu) => {
            let named: Vec<&(String, String)> = served
                .gpus
                .iter()
                .filter(|(o, _)| Some(o.as_str()) == worker || Some(o.as_str()) == host)
                .collect();
            named.is_empty() || named.iter().any(|(_, g)| g == gpu)
        }
        None => true,
    }
}

pub async fn trace_gpu(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    if id.len() != 32 {
        return Err(ApiError::BadRequest(format!(
            "trace id {id:?} must be 32 hex characters"
        )));
    }
    let trace = TraceId::from_hex(&id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut margin_ms = 60_000i64;
    for (k, v) in form_pairs(query.as_deref().unwrap_or(""))? {
        match k.as_str() {
            "margin" => {
                margin_ms = crate::time::parse_duration(&v)
                    .map_err(|e| bad("margin", e))?
                    .as_millis() as i64
            }
            other => return Err(bad(other, "unknown parameter (use margin)")),
        }
    }
    let store = state.store.clone();
    let answer = blocking(move || -> Result<Option<Value>, ApiError> {
        let spans = store.trace(&tenant, &trace)?;
        if spans.is_empty() {
            return Ok(None);
        }
        let from = spans.iter().map(|s| s.start.0).min().unwrap_or(0) / 1_000_000;
        let to = spans.iter().map(|s| s.end.0).max().unwrap_or(0) / 1_000_000;
        let served = served(&spans);
        let source = Source::new(store, tenant)?;
        // every canonical metric in one selection, answered in the vocabulary's order
        let shown: Vec<String> = CANONICAL
            .iter()
            .map(|c| metric_name(c.name, c.unit, MetricKind::Gauge, false))
            .collect();
        let selector = format!("{{__name__=~\"{}\"}}", shown.join("|"));
        let Ok(Expr::VectorSelector(vs)) = promql_parser::parser::parse(&selector) else {
            return Err(ApiError::Internal(format!(
                "selector {selector} does not parse"
            )));
        };
        let matchers = selector_matchers(&vs);
        let refs: Vec<&Matcher> = matchers.iter().collect();
        let mut loaded = source
            .select(&refs, from as i64 - margin_ms, to as i64 + margin_ms)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let position = |l: &weft_query::promql::Loaded| {
            let name = label(&l.labels, "__name__").unwrap_or("");
            shown.iter().position(|s| s == name).unwrap_or(usize::MAX)
        };
        loaded.sort_by_key(position);
        let mut series = Vec::new();
        for l in loaded.iter().filter(|l| belongs(&served, &l.labels)) {
            let Some(canonical) = CANONICAL.get(position(l)) else {
                continue;
            };
            let labels: serde_json::Map<String, Value> = l
                .labels
                .iter()
                .filter(|(k, _)| k != "__name__")
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            let points: Vec<Value> =
                l.ts.iter()
                    .zip(&l.vs)
                    .map(|(t, v)| json!([t * 1_000_000, v]))
                    .collect();
            series.push(json!({"metric": canonical.name, "labels": labels, "points": points}));
        }
        Ok(Some(json!({ "series": series })))
    })
    .await??;
    answer
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("trace {id} not found")))
}
