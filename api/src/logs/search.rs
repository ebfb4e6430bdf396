//! `GET /api/v1/logs/search?q=&start=&end=&service=&severity=&limit=&cursor=` and
//! `GET /api/v1/traces/{trace_id}/logs`.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use serde_json::{Value, json};
use weft_query::logs::{LogCursor, LogSearch, TextQuery, search_logs, severity_number};
use weft_storage::model::TraceId;

use super::record_json;
use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};
use crate::time::parse_time;
use crate::traces::search::{bad, form_pairs, parse_limit};

pub fn parse_request(query: &str) -> Result<LogSearch, ApiError> {
    let mut req = LogSearch {
        limit: 20,
        ..Default::default()
    };
    for (key, value) in form_pairs(query)? {
        match key.as_str() {
            "q" if value.trim().is_empty() => {}
            "q" => req.q = Some(TextQuery::parse(&value)?),
            "service" => req.service = Some(value),
            "severity" => {
                req.min_severity = Some(severity_number(&value).ok_or_else(|| {
                    bad(
                        &key,
                        format!(
                            "{value:?} is not trace, debug, info, warn, error, fatal or 1 to 24"
                        ),
                    )
                })?)
            }
            "start" => req.start = Some(parse_time(&value).map_err(|e| bad(&key, e))?),
            "end" => req.end = Some(parse_time(&value).map_err(|e| bad(&key, e))?),
            "limit" => req.limit = parse_limit(&key, &value)?,
            "cursor" => req.cursor = Some(LogCursor::decode(&value)?),
            k => {
                return Err(bad(
                    k,
                    "unknown parameter (use q, start, end, service, severity, limit, cursor)",
                ));
            }
        }
    }
    if let (Some(s), Some(e)) = (req.start, req.end)
        && e <= s
    {
        return Err(bad("end", "must be after start"));
    }
    Ok(req)
}

pub async fn search(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let req = parse_request(query.as_deref().unwrap_or(""))?;
    let store = state.store.clone();
    let page = blocking(move || search_logs(&store, &tenant, &req)).await??;
    let logs: Vec<Value> = page.logs.iter().map(record_json).collect();
    Ok(Json(json!({
        "logs": logs,
        "next_cursor": page.next_cursor.map(|c| c.encode()),
    })))
}

pub async fn trace_logs(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id.len() != 32 {
        return Err(ApiError::BadRequest(format!(
            "trace id {id:?} must be 32 hex characters"
        )));
    }
    let trace = TraceId::from_hex(&id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let store = state.store.clone();
    let logs = blocking(move || weft_query::logs::trace_logs(&store, &tenant, &trace)).await??;
    let logs: Vec<Value> = logs.iter().map(record_json).collect();
    Ok(Json(json!({ "logs": logs })))
}
