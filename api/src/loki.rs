//! A Loki-compatible read API under `/loki` on the query port, so that Grafana's Loki data
//! source (URL `http://host:3200/loki`) reads Weft's `logs` table, and Grafana's trace view
//! links a span to its logs (trace-to-logs is built only for Loki-like sources):
//!
//! - `GET /loki/api/v1/query_range?query=&start=&end=&limit=&direction=` and
//!   `GET /loki/api/v1/query?query=&time=&limit=`: log queries in a LogQL subset, a stream
//!   selector `{label="v", label!="v", label=~"re", label!~"re"}` then line filters `|= "s"`,
//!   `!= "s"`, `|~ "re"`, `!~ "re"`; answered as `streams` (one per service, level and trace),
//!   newest first by default. Metric queries are refused with a 400 naming the part, except the
//!   `vector(1)+vector(1)` Grafana's health check sends.
//! - `GET /loki/api/v1/labels`, `GET /loki/api/v1/label/{name}/values`.
//!
//! Labels: `service_name` (also `service.name`, `service`), `level` (also `severity_text`,
//! `detected_level`), `trace_id`, `span_id`, `event_name`, `class`; any other name is the
//! record's attribute of that name, else its resource's.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use weft_query::analytics::exec::Run;
use weft_query::analytics::params::{lit, ts};

use crate::state::{SharedState, Tenant};
use crate::traces::search::Form;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/loki/api/v1/query_range", get(query_range))
        .route("/loki/api/v1/query", get(query_instant))
        .route("/loki/api/v1/labels", get(labels))
        .route("/loki/api/v1/label/{name}/values", get(label_values))
}

/// Loki's error: a status and a plain-text body.
#[derive(Debug)]
pub struct LokiError(StatusCode, String);

fn bad(m: impl Into<String>) -> LokiError {
    LokiError(StatusCode::BAD_REQUEST, m.into())
}

impl IntoResponse for LokiError {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

impl From<weft_query::analytics::AnalyticsError> for LokiError {
    fn from(e: weft_query::analytics::AnalyticsError) -> Self {
        LokiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

/// The SQL value of a label.
fn label_column(name: &str) -> String {
    match name {
        "service_name" | "service.name" | "service" => "service_name".into(),
        "level" | "severity_text" | "detected_level" => "lower(severity_text)".into(),
        "trace_id" | "traceID" | "traceId" => "trace_id".into(),
        "span_id" | "spanID" | "spanId" => "span_id".into(),
        "event_name" => "event_name".into(),
        "class" => "class".into(),
        other => format!(
            "coalesce(attributes[{0}], resource_attributes[{0}])",
            lit(other)
        ),
    }
}

/// A LogQL log query as SQL conditions.
fn logql(q: &str) -> Result<Vec<String>, LokiError> {
    let q = q.trim();
    let rest = q
        .strip_prefix('{')
        .ok_or_else(|| bad(format!("parse error: a log query starts with a stream selector `{{…}}`, not {q:?} (metric queries are not supported)")))?;
    let close = rest
        .find('}')
        .ok_or_else(|| bad("parse error: the stream selector has no closing `}`"))?;
    let (selector, mut rest) = (&rest[..close], &rest[close + 1..]);
    let mut conds = Vec::new();
    let mut s = selector.trim();
    while !s.is_empty() {
        let name_len = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(s.len());
        let name = &s[..name_len];
        if name.is_empty() {
            return Err(bad(format!("parse error: expected a label name at {s:?}")));
        }
        s = s[name_len..].trim_start();
        let op = ["=~", "!~", "!=", "="]
            .into_iter()
            .find(|op| s.starts_with(op))
            .ok_or_else(|| {
                bad(format!(
                    "parse error: expected =, !=, =~ or !~ after {name}"
                ))
            })?;
        s = s[op.len()..].trim_start();
        let (value, len) = quoted(s)?;
        s = s[len..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s).trim_start();
        let col = label_column(name);
        conds.push(match op {
            "=" if value.is_empty() => format!("({col} IS NULL OR {col} = '')"),
            "=" => format!("{col} = {}", lit(&label_value(name, &value))),
            "!=" => format!(
                "({col} IS NULL OR {col} <> {})",
                lit(&label_value(name, &value))
            ),
            "=~" => format!("{col} ~ {}", lit(&format!("^(?:{value})$"))),
            _ => format!(
                "({col} IS NULL OR {col} !~ {})",
                lit(&format!("^(?:{value})$"))
            ),
        });
    }
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let op = ["|=", "!=", "|~", "!~"]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .ok_or_else(|| {
                bad(format!(
                    "parse error: unsupported pipeline stage {rest:?} (line filters |=, !=, |~, !~ are supported)"
                ))
            })?;
        rest = rest[op.len()..].trim_start();
        let (value, len) = quoted(rest)?;
        rest = &rest[len..];
        conds.push(match op {
            "|=" => format!("strpos(body, {}) > 0", lit(&value)),
            "!=" => format!("strpos(body, {}) = 0", lit(&value)),
            "|~" => format!("body ~ {}", lit(&value)),
            _ => format!("body !~ {}", lit(&value)),
        });
    }
    Ok(conds)
}

/// Trace and span ids compare as stored (lower-case hex, trace ids left-padded).
fn label_value(name: &str, v: &str) -> String {
    match name {
        "trace_id" | "traceID" | "traceId" if v.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("{:0>32}", v.to_ascii_lowercase())
        }
        "level" | "severity_text" | "detected_level" => v.to_lowercase(),
        _ => v.to_owned(),
    }
}

/// A double- or back-quoted string at the start of `s`: its value and length.
fn quoted(s: &str) -> Result<(String, usize), LokiError> {
    let quote = s
        .chars()
        .next()
        .filter(|c| *c == '"' || *c == '`')
        .ok_or_else(|| bad(format!("parse error: expected a quoted string at {s:?}")))?;
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Ok((out, i + 1));
        }
        if c == '\\' && quote == '"' {
            if let Some((_, e)) = chars.next() {
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    other => other,
                });
            }
            continue;
        }
        out.push(c);
    }
    Err(bad("parse error: unterminated string"))
}

/// Loki's times: Unix nanoseconds, seconds (with a fraction) or RFC 3339.
fn loki_time(key: &str, v: &str) -> Result<u64, LokiError> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(if n < 100_000_000_000 {
            n.saturating_mul(1_000_000_000)
        } else {
            n
        });
    }
    if let Ok(f) = v.parse::<f64>()
        && f >= 0.0
    {
        return Ok((f * 1e9) as u64);
    }
    crate::time::parse_rfc3339(v).ok_or_else(|| bad(format!("invalid {key} {v:?}")))
}

struct Params {
    query: String,
    start: u64,
    end: u64,
    limit: usize,
    forward: bool,
}

fn params(raw: Option<&str>, instant: bool) -> Result<Params, LokiError> {
    let form = Form::parse(raw).map_err(bad)?;
    let get = |k: &str| form.get(k);
    let query = get("query").ok_or_else(|| bad("query parameter 'query' is required"))?;
    let now = crate::time::now();
    let (start, end) = if instant {
        let t = get("time")
            .map(|v| loki_time("time", v))
            .transpose()?
            .unwrap_or(now);
        (t.saturating_sub(3_600_000_000_000), t.saturating_add(1))
    } else {
        let end = get("end")
            .map(|v| loki_time("end", v))
            .transpose()?
            .unwrap_or(now);
        let start = get("start")
            .map(|v| loki_time("start", v))
            .transpose()?
            .unwrap_or(end.saturating_sub(3_600_000_000_000));
        (start, end.saturating_add(1))
    };
    if end <= start {
        return Err(bad("invalid query, end must be after start"));
    }
    let limit = match get("limit") {
        None => 100,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0 && *n <= 5000)
            .ok_or_else(|| bad(format!("invalid limit {v:?}: expected 1 to 5000")))?,
    };
    let forward = match get("direction") {
        None | Some("backward") | Some("BACKWARD") => false,
        Some("forward") | Some("FORWARD") => true,
        Some(other) => return Err(bad(format!("invalid direction {other:?}"))),
    };
    Ok(Params {
        query: query.to_owned(),
        start,
        end,
        limit,
        forward,
    })
}

async fn streams(
    state: &SharedState,
    tenant: &weft_storage::model::TenantId,
    p: &Params,
) -> Result<Value, LokiError> {
    let mut conds = logql(&p.query)?;
    conds.push(format!("time >= {}", ts(p.start)));
    conds.push(format!("time < {}", ts(p.end)));
    let run = Run::plain(&state.sql, tenant);
    let rows = run
        .sql(&format!(
            "SELECT CAST(time AS BIGINT) AS t, body, service_name, lower(severity_text) AS level, trace_id, span_id FROM logs WHERE {} ORDER BY time {}, body LIMIT {}",
            conds.join(" AND "),
            if p.forward { "ASC" } else { "DESC" },
            p.limit
        ))
        .await?;
    let (time, body, service, level, trace, span) = (
        rows.i64(0),
        rows.strings(1),
        rows.strings(2),
        rows.strings(3),
        rows.strings(4),
        rows.strings(5),
    );
    let mut streams: BTreeMap<Vec<(String, String)>, Vec<Value>> = BTreeMap::new();
    for i in 0..time.len() {
        let mut labels = Vec::new();
        let mut put = |k: &str, v: &Option<String>| {
            if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
                labels.push((k.to_owned(), v.clone()));
            }
        };
        put("level", &level[i]);
        put("service_name", &service[i]);
        put("span_id", &span[i]);
        put("trace_id", &trace[i]);
        streams.entry(labels).or_default().push(json!([
            time[i].unwrap_or(0).to_string(),
            body[i].clone().unwrap_or_default()
        ]));
    }
    Ok(Value::Array(
        streams
            .into_iter()
            .map(|(labels, values)| {
                let stream: serde_json::Map<String, Value> = labels
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                json!({ "stream": stream, "values": values })
            })
            .collect(),
    ))
}

fn success(result_type: &str, result: Value) -> Json<Value> {
    Json(json!({
        "status": "success",
        "data": { "resultType": result_type, "result": result, "stats": {} },
    }))
}

async fn query_range(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, LokiError> {
    let p = params(raw.as_deref(), false)?;
    Ok(success("streams", streams(&state, &tenant, &p).await?))
}

async fn query_instant(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, LokiError> {
    let p = params(raw.as_deref(), true)?;
    // Grafana's health check
    if p.query.replace(' ', "") == "vector(1)+vector(1)" {
        let t = (p.end - 1) as f64 / 1e9;
        return Ok(success(
            "vector",
            json!([{ "metric": {}, "value": [t, "2"] }]),
        ));
    }
    Ok(success("streams", streams(&state, &tenant, &p).await?))
}

/// The labels every record has a value of, and the attribute keys of recent records.
async fn labels(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(_raw): RawQuery,
) -> Result<Json<Value>, LokiError> {
    let run = Run::plain(&state.sql, &tenant);
    let rows = run
        .sql("SELECT DISTINCT unnest(map_keys(attributes)) FROM (SELECT attributes FROM logs ORDER BY time DESC LIMIT 10000) r")
        .await?;
    let mut names: Vec<String> = [
        "class",
        "event_name",
        "level",
        "service_name",
        "span_id",
        "trace_id",
    ]
    .map(String::from)
    .into();
    names.extend(rows.strings(0).into_iter().flatten());
    names.sort();
    names.dedup();
    Ok(Json(json!({ "status": "success", "data": names })))
}

async fn label_values(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, LokiError> {
    let form = Form::parse(raw.as_deref()).map_err(bad)?;
    let mut conds = vec!["TRUE".to_owned()];
    if let Some(q) = form.get("query") {
        conds.extend(logql(q)?);
    }
    let col = label_column(&name);
    let run = Run::plain(&state.sql, &tenant);
    let rows = run
        .sql(&format!(
            "SELECT DISTINCT {col} FROM logs WHERE {} AND {col} IS NOT NULL ORDER BY 1 LIMIT 1000",
            conds.join(" AND ")
        ))
        .await?;
    let values: Vec<String> = rows
        .strings(0)
        .into_iter()
        .flatten()
        .filter(|v| !v.is_empty())
        .collect();
    Ok(Json(json!({ "status": "success", "data": values })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_logql_subset() {
        let c = logql(
            r#"{service_name="llm-gateway", level=~"err.*"} |= "timeout" != "retry" |~ "a+""#,
        )
        .unwrap();
        assert_eq!(c.len(), 5, "{c:?}");
        assert_eq!(c[0], "service_name = 'llm-gateway'");
        let c = logql(r#"{trace_id="ABC"}"#).unwrap();
        assert_eq!(c[0], format!("trace_id = '{:0>32}'", "abc"));
        for (q, part) in [
            ("rate({a=\"b\"}[1m])", "stream selector"),
            ("{a=\"b\"", "closing"),
            ("{a~\"b\"}", "expected ="),
            ("{a=\"b\"} | json", "unsupported pipeline stage"),
            ("{a=\"b}", "unterminated"),
        ] {
            let e = logql(q).err().unwrap().1;
            assert!(e.contains(part), "{q}: {e}");
        }
    }
}
