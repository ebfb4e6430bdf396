//! The native log API on the query port: `GET /api/v1/logs/search` (a text query and filters,
//! newest first, cursor paging) and `GET /api/v1/traces/{trace_id}/logs` (a trace's records,
//! oldest first). Both answer `{"logs": [...]}`, one object per record.

pub(crate) mod search;

use axum::Router;
use axum::routing::get;
use serde_json::{Map, Value, json};
use weft_storage::model::LogRecord;

use crate::state::SharedState;
use crate::time::format_rfc3339;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/api/v1/logs/search", get(search::search))
        .route("/api/v1/traces/{trace_id}/logs", get(search::trace_logs))
}

/// A record as the API shows it.
fn record_json(l: &LogRecord) -> Value {
    let attributes: Map<String, Value> = l
        .attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.text().map_or(Value::Null, Value::String),
            )
        })
        .collect();
    json!({
        "time": format_rfc3339(l.time.0),
        "time_unix_nano": l.time.0.to_string(),
        "observed_time": format_rfc3339(l.observed_time.0),
        "severity_number": l.severity_number,
        "severity_text": l.severity_text,
        "body": l.body_text(),
        "trace_id": l.trace_id.map(|t| t.to_hex()),
        "span_id": l.span_id.map(|s| s.to_hex()),
        "service_name": l.service_name(),
        "event_name": l.event_name,
        "class": l.semantics.class.as_str(),
        "attributes": attributes,
    })
}

#[cfg(test)]
mod tests;
