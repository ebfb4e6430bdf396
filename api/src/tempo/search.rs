//! `GET /api/search`: TraceQL search (`q`), or Tempo's legacy form (`tags` in logfmt,
//! `minDuration`, `maxDuration`), with `limit` (traces, default 20), `spss` (spans per spanset,
//! default 3), `start` / `end` (Unix seconds). The answer is Tempo's `SearchResponse` in proto3
//! JSON: 64-bit numbers as strings, trace ids without leading zeros.

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};
use weft_query::analytics::exec::Run;
use weft_query::traceql::{self, SearchOptions, eval::Val};

use super::{TempoError, range};
use crate::state::{SharedState, Tenant};
use crate::traces::search::Form;

const MAX_LIMIT: usize = 10_000;

pub async fn search(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, TempoError> {
    let form = Form::parse(raw.as_deref()).map_err(TempoError::bad)?;
    let get = |k: &str| form.get(k);
    let number = |k: &str, default: usize| -> Result<usize, TempoError> {
        match get(k) {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0 && *n <= MAX_LIMIT)
                .ok_or_else(|| {
                    TempoError::bad(format!("invalid {k} {v:?}: expected 1 to {MAX_LIMIT}"))
                }),
        }
    };
    let (start, end) = range(get("start"), get("end"), true)?;
    let text = match get("q").filter(|q| !q.trim().is_empty()) {
        Some(q) => q.to_owned(),
        None => legacy_query(get("tags"), get("minDuration"), get("maxDuration"))?,
    };
    let query = traceql::parse(&text)?;
    let opts = SearchOptions {
        start,
        end,
        limit: number("limit", 20)?,
        spss: number("spss", 3)?,
        ..Default::default()
    };
    let mut run = Run::plain(&state.sql, &tenant);
    let found = traceql::search(&mut run, &query, &opts).await?;
    let traces: Vec<Value> = found
        .traces
        .iter()
        .map(|t| {
            let sets: Vec<Value> = t.span_sets.iter().map(span_set).collect();
            let mut o = json!({
                "traceID": t.trace_id.trim_start_matches('0'),
                "startTimeUnixNano": t.start.to_string(),
                "durationMs": (t.duration_ns / 1_000_000).clamp(0, u32::MAX as i64),
            });
            if let Some(s) = &t.root_service {
                o["rootServiceName"] = json!(s);
            }
            if let Some(n) = &t.root_name {
                o["rootTraceName"] = json!(n);
            }
            if let Some(first) = sets.first() {
                o["spanSet"] = first.clone();
            }
            o["spanSets"] = json!(sets);
            o
        })
        .collect();
    Ok(Json(json!({
        "traces": traces,
        "metrics": {
            "inspectedTraces": found.inspected_traces,
            "inspectedBytes": "0",
            "inspectedSpans": found.inspected_spans.to_string(),
            "completedJobs": 1,
            "totalJobs": 1,
        },
    })))
}

fn span_set(s: &traceql::eval::FoundSpanSet) -> Value {
    let spans: Vec<Value> = s
        .spans
        .iter()
        .map(|sp| {
            json!({
                "spanID": sp.span_id,
                "name": sp.name,
                "startTimeUnixNano": sp.start.to_string(),
                "durationNanos": sp.duration_ns.to_string(),
                "attributes": key_values(&sp.attributes),
            })
        })
        .collect();
    let mut o = json!({ "spans": spans, "matched": s.matched });
    if !s.attributes.is_empty() {
        o["attributes"] = key_values(&s.attributes);
    }
    o
}

/// OTLP key-values in proto3 JSON (an `intValue` is a string, as for every 64-bit number).
pub fn key_values(kvs: &[(String, Val)]) -> Value {
    Value::Array(
        kvs.iter()
            .map(|(k, v)| json!({ "key": k, "value": any_value(v) }))
            .collect(),
    )
}

pub fn any_value(v: &Val) -> Value {
    match v {
        Val::Str(s) => json!({ "stringValue": s }),
        Val::Int(i) => json!({ "intValue": i.to_string() }),
        Val::Float(f) => json!({ "doubleValue": f }),
        Val::Bool(b) => json!({ "boolValue": b }),
    }
}

/// Tempo's search before TraceQL as a TraceQL query: `tags` (logfmt `key=value` pairs, each
/// matched on the span or its resource) and a duration range.
pub fn legacy_query(
    tags: Option<&str>,
    min: Option<&str>,
    max: Option<&str>,
) -> Result<String, TempoError> {
    let mut conds = Vec::new();
    for (k, v) in logfmt(tags.unwrap_or(""))? {
        let field = match k.as_str() {
            "name" => "name".to_owned(),
            "status.code" | "status" => {
                conds.push(format!("status = {}", v.to_ascii_lowercase()));
                continue;
            }
            k => format!(".{k}"),
        };
        conds.push(format!(
            "{field} = \"{}\"",
            v.replace('\\', "\\\\").replace('"', "\\\"")
        ));
    }
    for (key, value, op) in [("minDuration", min, ">="), ("maxDuration", max, "<=")] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            if weft_query::traceql::parse::parse_duration(v).is_none() {
                return Err(TempoError::bad(format!(
                    "invalid {key} {v:?}: expected a duration such as 100ms"
                )));
            }
            conds.push(format!("duration {op} {v}"));
        }
    }
    Ok(format!("{{ {} }}", conds.join(" && ")))
}

/// `key=value key2="quoted value"` pairs.
fn logfmt(text: &str) -> Result<Vec<(String, String)>, TempoError> {
    let mut out = Vec::new();
    let mut chars = text.trim().chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(out);
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        if chars.next() != Some('=') {
            return Err(TempoError::bad(format!(
                "invalid tags: {key:?} has no value (expected key=value)"
            )));
        }
        let value = if chars.peek() == Some(&'"') {
            chars.next();
            let mut v = String::new();
            loop {
                match chars.next() {
                    None => return Err(TempoError::bad("invalid tags: unterminated quote")),
                    Some('"') => break,
                    Some('\\') => v.extend(chars.next()),
                    Some(c) => v.push(c),
                }
            }
            v
        } else {
            std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect()
        };
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_tags_become_traceql() {
        let q = legacy_query(
            Some(r#"service.name=llm-gateway http.route="/v1/chat completions" status.code=error"#),
            Some("100ms"),
            Some("5s"),
        )
        .unwrap();
        assert_eq!(
            q,
            r#"{ .service.name = "llm-gateway" && .http.route = "/v1/chat completions" && status = error && duration >= 100ms && duration <= 5s }"#
        );
        traceql::parse(&q).unwrap();
        assert_eq!(legacy_query(None, None, None).unwrap(), "{  }");
        assert!(legacy_query(Some("novalue"), None, None).is_err());
        assert!(legacy_query(None, Some("fast"), None).is_err());
    }
}

#[cfg(test)]
mod no_panics {
    use proptest::prelude::*;

    use super::legacy_query;
    use crate::tempo::{range, tempo_time};
    use crate::traces::get::short_trace_id as trace_id;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(weft_storage::fuzz_cases(2000)))]

        #[test]
        fn tempo_parameters_never_panic(a in "\\PC{0,40}", b in "[0-9.eE+-]{0,30}", c in "\\PC{0,12}") {
            let _ = legacy_query(Some(&a), Some(&c), Some(&b));
            let _ = tempo_time("start", &b);
            let _ = range(Some(&b), Some(&b), true);
            let _ = range(Some(&a), Some(&c), false);
            let _ = trace_id(&a);
        }
    }
}
