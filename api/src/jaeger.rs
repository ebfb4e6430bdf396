//! Jaeger's query HTTP API under `/jaeger` on the query port, as Grafana's Jaeger data source
//! (URL `http://host:3200/jaeger`) and the Jaeger UI call it:
//!
//! - `GET /jaeger/api/services`, `/jaeger/api/services/{service}/operations`,
//!   `/jaeger/api/operations?service=&spanKind=`;
//! - `GET /jaeger/api/traces?service=&operation=&tags=(JSON)&minDuration=&maxDuration=&limit=
//!   &start=&end=(µs)&lookback=`: the newest matching traces, whole;
//! - `GET /jaeger/api/traces/{id}`;
//! - `GET /jaeger/api/dependencies?endTs=&lookback=` (ms): calls between services.
//!
//! Answers use Jaeger's envelope `{"data", "total", "limit", "offset", "errors"}`; errors are
//! `{"data": null, …, "errors": [{"code", "msg"}]}` with the same status. Times are
//! microseconds; span kinds, status and the instrumentation scope become tags as Jaeger's OTLP
//! receiver makes them; parents and links become `CHILD_OF` / `FOLLOWS_FROM` references.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value as Json_, json};
use weft_query::analytics::exec::{Rows, Run};
use weft_query::analytics::params::{lit, ts};
use weft_query::traceql::{self, SearchOptions};
use weft_storage::model::{
    KeyValue, SpanKind, SpanRecord, StatusCode as Status, TenantId, TraceId, Value,
};

use crate::state::{SharedState, Tenant, blocking};
use crate::traces::search::Form;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/jaeger/api/services", get(services))
        .route(
            "/jaeger/api/services/{service}/operations",
            get(service_operations),
        )
        .route("/jaeger/api/operations", get(operations))
        .route("/jaeger/api/traces", get(find_traces))
        .route("/jaeger/api/traces/{id}", get(trace_by_id))
        .route("/jaeger/api/dependencies", get(dependencies))
}

/// A Jaeger error in its envelope.
pub struct JaegerError(StatusCode, String);

impl JaegerError {
    fn bad(msg: impl Into<String>) -> Self {
        JaegerError(StatusCode::BAD_REQUEST, msg.into())
    }
}

impl IntoResponse for JaegerError {
    fn into_response(self) -> Response {
        (
            self.0,
            Json(json!({
                "data": null, "total": 0, "limit": 0, "offset": 0,
                "errors": [{"code": self.0.as_u16(), "msg": self.1}],
            })),
        )
            .into_response()
    }
}

impl From<crate::error::ApiError> for JaegerError {
    fn from(e: crate::error::ApiError) -> Self {
        JaegerError(e.class().http_status(), e.to_string())
    }
}

impl From<traceql::TraceQlError> for JaegerError {
    fn from(e: traceql::TraceQlError) -> Self {
        match e {
            traceql::TraceQlError::Invalid(m) => JaegerError::bad(m),
            traceql::TraceQlError::Sql(e) => {
                JaegerError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        }
    }
}

fn envelope(data: Json_, total: usize) -> Json<Json_> {
    Json(json!({"data": data, "total": total, "limit": 0, "offset": 0, "errors": null}))
}

async fn rows(state: &SharedState, tenant: &TenantId, sql: &str) -> Result<Rows, JaegerError> {
    let run = Run::plain(&state.sql, tenant);
    Ok(run.sql(sql).await.map_err(traceql::TraceQlError::from)?)
}

/// The first column of `rows` (text) as Jaeger's list answer.
fn list(rows: &Rows) -> Json<Json_> {
    let names: Vec<String> = rows.strings(0).into_iter().flatten().collect();
    let n = names.len();
    envelope(json!(names), n)
}

async fn services(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
) -> Result<Json<Json_>, JaegerError> {
    let sql = "SELECT DISTINCT service_name FROM spans ORDER BY 1";
    Ok(list(&rows(&state, &tenant, sql).await?))
}

async fn service_operations(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(service): Path<String>,
) -> Result<Json<Json_>, JaegerError> {
    let sql = format!(
        "SELECT DISTINCT name FROM spans WHERE service_name = {} ORDER BY 1",
        lit(&service)
    );
    Ok(list(&rows(&state, &tenant, &sql).await?))
}

async fn operations(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Json_>, JaegerError> {
    let form = Form::parse(raw.as_deref()).map_err(JaegerError::bad)?;
    let get = |k: &str| form.get(k);
    let service =
        get("service").ok_or_else(|| JaegerError::bad("parameter 'service' is required"))?;
    let mut conds = vec![format!("service_name = {}", lit(service))];
    if let Some(kind) = get("spanKind") {
        let k = kind.to_ascii_uppercase();
        if !["SERVER", "CLIENT", "PRODUCER", "CONSUMER", "INTERNAL"].contains(&k.as_str()) {
            return Err(JaegerError::bad(format!(
                "unsupported span kind {kind:?} (server, client, producer, consumer, internal)"
            )));
        }
        conds.push(format!("kind = {}", lit(&k)));
    }
    let sql = format!(
        "SELECT DISTINCT name, kind FROM spans WHERE {} ORDER BY 1, 2",
        conds.join(" AND ")
    );
    let rows = rows(&state, &tenant, &sql).await?;
    let ops: Vec<Json_> = rows
        .strings(0)
        .into_iter()
        .zip(rows.strings(1))
        .filter_map(|(n, k)| Some(json!({"name": n?, "spanKind": k?.to_ascii_lowercase()})))
        .collect();
    let n = ops.len();
    Ok(envelope(json!(ops), n))
}

/// Jaeger's durations: `1.2s`, `100ms`, `500us`, `1µs`, `1m`, `1h`.
fn duration(key: &str, v: &str) -> Result<String, JaegerError> {
    traceql::parse::parse_duration(v)
        .map(|ns| format!("{ns}ns"))
        .ok_or_else(|| {
            JaegerError::bad(format!(
                "cannot parse {key} {v:?}: expected a duration such as 100ms"
            ))
        })
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

async fn find_traces(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Json_>, JaegerError> {
    let form = Form::parse(raw.as_deref()).map_err(JaegerError::bad)?;
    let get = |k: &str| form.get(k);
    let service =
        get("service").ok_or_else(|| JaegerError::bad("parameter 'service' is required"))?;
    let mut conds = vec![format!("resource.service.name = {}", quote(service))];
    if let Some(op) = get("operation") {
        conds.push(format!("name = {}", quote(op)));
    }
    if let Some(tags) = get("tags") {
        let map: BTreeMap<String, Json_> = serde_json::from_str(tags).map_err(|e| {
            JaegerError::bad(format!(
                "malformed 'tags' parameter: {e} (expected a JSON object)"
            ))
        })?;
        for (k, v) in map {
            let v = match v {
                Json_::String(s) => s,
                other => other.to_string(),
            };
            match k.as_str() {
                "error" if v == "true" => conds.push("status = error".into()),
                "error" => conds.push("status != error".into()),
                "span.kind" => conds.push(format!("kind = {}", v.to_ascii_lowercase())),
                _ => conds.push(format!(".{k} = {}", quote(&v))),
            }
        }
    }
    if let Some(v) = get("minDuration") {
        conds.push(format!("duration >= {}", duration("minDuration", v)?));
    }
    if let Some(v) = get("maxDuration") {
        conds.push(format!("duration <= {}", duration("maxDuration", v)?));
    }
    let micros = |k: &str| -> Result<Option<u64>, JaegerError> {
        get(k)
            .map(|v| {
                v.parse::<u64>()
                    .ok()
                    .and_then(|us| us.checked_mul(1000))
                    .ok_or_else(|| {
                        JaegerError::bad(format!(
                            "cannot parse {k} {v:?}: expected Unix microseconds"
                        ))
                    })
            })
            .transpose()
    };
    let mut end = micros("end")?;
    let mut start = micros("start")?;
    if start.is_none()
        && let Some(lb) = get("lookback").filter(|l| *l != "custom")
    {
        let ns = traceql::parse::parse_duration(lb)
            .ok_or_else(|| JaegerError::bad(format!("cannot parse lookback {lb:?}")))?;
        let e = *end.get_or_insert_with(crate::time::now);
        start = Some(e.saturating_sub(ns));
    }
    let limit = match get("limit") {
        None => 20,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0 && *n <= 1500)
            .ok_or_else(|| {
                JaegerError::bad(format!("cannot parse limit {v:?}: expected 1 to 1500"))
            })?,
    };
    let query = traceql::parse(&format!("{{ {} }}", conds.join(" && ")))?;
    let opts = SearchOptions {
        start,
        end: end.map(|e| e.saturating_add(1)),
        limit,
        spss: 1,
        ..Default::default()
    };
    let mut run = Run::plain(&state.sql, &tenant);
    let found = traceql::search(&mut run, &query, &opts).await?;
    let ids: Vec<String> = found.traces.iter().map(|t| t.trace_id.clone()).collect();
    let store = state.store.clone();
    let traces = blocking(
        move || -> Result<Vec<Vec<SpanRecord>>, weft_storage::StorageError> {
            ids.iter()
                .filter_map(|id| TraceId::from_hex(id).ok())
                .map(|id| store.trace(&tenant, &id))
                .collect()
        },
    )
    .await?
    .map_err(|e| JaegerError::from(crate::error::ApiError::from(e)))?;
    let data: Vec<Json_> = traces
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| trace_json(t))
        .collect();
    let n = data.len();
    Ok(envelope(json!(data), n))
}

async fn trace_by_id(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Json_>, JaegerError> {
    let trace = crate::traces::get::short_trace_id(&id).map_err(JaegerError::bad)?;
    let store = state.store.clone();
    let max = state.max_trace_spans;
    let (spans, truncated) = blocking(move || store.trace_limited(&tenant, &trace, max))
        .await?
        .map_err(|e| JaegerError::from(crate::error::ApiError::from(e)))?;
    if spans.is_empty() {
        return Err(JaegerError(StatusCode::NOT_FOUND, "trace not found".into()));
    }
    let mut trace = trace_json(&spans);
    if let Some(total) = truncated {
        trace["warnings"] = json!([crate::traces::get::truncation_note(
            total,
            state.max_trace_spans
        )]);
    }
    Ok(envelope(json!([trace]), 1))
}

async fn dependencies(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Json_>, JaegerError> {
    let form = Form::parse(raw.as_deref()).map_err(JaegerError::bad)?;
    let get = |k: &str| form.get(k);
    let ms = |k: &str| -> Result<Option<u64>, JaegerError> {
        get(k)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    JaegerError::bad(format!("cannot parse {k} {v:?}: expected milliseconds"))
                })
            })
            .transpose()
    };
    let end = ms("endTs")?
        .map(|e| e.saturating_mul(1_000_000))
        .unwrap_or_else(crate::time::now);
    let lookback = ms("lookback")?
        .unwrap_or(86_400_000)
        .saturating_mul(1_000_000);
    let start = end.saturating_sub(lookback);
    let sql = format!(
        "SELECT p.service_name, c.service_name, count(*) FROM spans c JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id \
         WHERE c.start_time >= {} AND c.start_time <= {} AND p.service_name <> c.service_name GROUP BY 1, 2 ORDER BY 1, 2",
        ts(start),
        ts(end)
    );
    let rows = rows(&state, &tenant, &sql).await?;
    let deps: Vec<Json_> = rows
        .strings(0)
        .into_iter()
        .zip(rows.strings(1))
        .zip(rows.i64(2))
        .map(|((parent, child), calls)| {
            json!({"parent": parent, "child": child, "callCount": calls.unwrap_or(0)})
        })
        .collect();
    let n = deps.len();
    Ok(envelope(json!(deps), n))
}

/// A Jaeger tag: `{key, type, value}` with Jaeger's type names.
fn tag(key: &str, v: &Value) -> Json_ {
    let (ty, value) = match v {
        Value::Str(s) => ("string", json!(s)),
        Value::Bool(b) => ("bool", json!(b)),
        Value::Int(i) => ("int64", json!(i)),
        Value::Double(d) => ("float64", json!(d)),
        Value::Bytes(b) => ("binary", json!(base64_encode(b))),
        Value::Empty => ("string", json!("")),
        other => ("string", json!(array_text(other))),
    };
    json!({"key": key, "type": ty, "value": value})
}

fn tags(kvs: &[KeyValue]) -> Vec<Json_> {
    kvs.iter().map(|kv| tag(&kv.key, &kv.value)).collect()
}

fn array_text(v: &Value) -> String {
    match v {
        Value::Str(s) => serde_json::to_string(s).unwrap_or_default(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        Value::Empty => "null".into(),
        Value::Bytes(b) => serde_json::to_string(&base64_encode(b)).unwrap_or_default(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(array_text).collect::<Vec<_>>().join(",")
        ),
        Value::KvList(kvs) => format!(
            "{{{}}}",
            kvs.iter()
                .map(|kv| format!(
                    "{}:{}",
                    serde_json::to_string(&kv.key).unwrap_or_default(),
                    array_text(&kv.value)
                ))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// One trace as Jaeger's UI model: spans with references, tags and logs; one process per
/// distinct resource.
pub fn trace_json(spans: &[SpanRecord]) -> Json_ {
    let mut processes: Vec<(std::sync::Arc<weft_storage::model::Resource>, String)> = Vec::new();
    let mut process_of = |s: &SpanRecord| -> String {
        if let Some((_, id)) = processes.iter().find(|(r, _)| **r == *s.resource) {
            return id.clone();
        }
        let id = format!("p{}", processes.len() + 1);
        processes.push((s.resource.clone(), id.clone()));
        id
    };
    let trace_id = spans[0].trace_id.to_hex();
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        let mut refs = Vec::new();
        if let Some(p) = &s.parent_span_id {
            refs.push(json!({"refType": "CHILD_OF", "traceID": trace_id, "spanID": p.to_hex()}));
        }
        for l in &s.links {
            refs.push(json!({"refType": "FOLLOWS_FROM", "traceID": l.trace_id.to_hex(), "spanID": l.span_id.to_hex()}));
        }
        let mut t = tags(&s.attributes);
        let kind = match s.kind {
            SpanKind::Server => Some("server"),
            SpanKind::Client => Some("client"),
            SpanKind::Producer => Some("producer"),
            SpanKind::Consumer => Some("consumer"),
            SpanKind::Internal => Some("internal"),
            SpanKind::Unspecified => None,
        };
        if let Some(k) = kind {
            t.push(tag("span.kind", &Value::Str(k.into())));
        }
        match s.status_code {
            Status::Error => {
                t.push(tag("error", &Value::Bool(true)));
                t.push(tag("otel.status_code", &Value::Str("ERROR".into())));
            }
            Status::Ok => t.push(tag("otel.status_code", &Value::Str("OK".into()))),
            Status::Unset => {}
        }
        if !s.status_message.is_empty() {
            t.push(tag(
                "otel.status_description",
                &Value::Str(s.status_message.clone()),
            ));
        }
        if !s.scope.name.is_empty() {
            t.push(tag("otel.scope.name", &Value::Str(s.scope.name.clone())));
        }
        if !s.scope.version.is_empty() {
            t.push(tag(
                "otel.scope.version",
                &Value::Str(s.scope.version.clone()),
            ));
        }
        let logs: Vec<Json_> = s
            .events
            .iter()
            .map(|e| {
                let mut fields = vec![tag("event", &Value::Str(e.name.clone()))];
                fields.extend(tags(&e.attributes));
                json!({"timestamp": e.time.0 / 1000, "fields": fields})
            })
            .collect();
        out.push(json!({
            "traceID": trace_id,
            "spanID": s.span_id.to_hex(),
            "operationName": s.name,
            "references": refs,
            "startTime": s.start.0 / 1000,
            "duration": s.duration_ns() / 1000,
            "tags": t,
            "logs": logs,
            "processID": process_of(s),
            "warnings": null,
            "flags": s.flags & 0xff,
        }));
    }
    let processes: serde_json::Map<String, Json_> = processes
        .iter()
        .map(|(r, id)| {
            let rest: Vec<KeyValue> = r
                .attributes
                .iter()
                .filter(|kv| kv.key != "service.name")
                .cloned()
                .collect();
            (
                id.clone(),
                json!({"serviceName": r.service_name(), "tags": tags(&rest)}),
            )
        })
        .collect();
    json!({"traceID": trace_id, "spans": out, "processes": processes, "warnings": null})
}
