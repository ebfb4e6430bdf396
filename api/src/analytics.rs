//! The native analytics API on the query port. For now the context-leak scan:
//! `GET /api/v1/leaks?start=&end=` → `{"findings": [{"kind", "service", "carrier", "count",
//! "example_trace_ids", "risk"}]}`, ranked by risk (the SQL table function `leaks(start, end)`
//! gives the same rows).

use axum::Json;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::routing::get;
use serde_json::{Value, json};
use weft_query::analytics::leaks;

use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};
use crate::time::parse_time;
use crate::traces::search::form_pairs;

pub fn router() -> Router<SharedState> {
    Router::new().route("/api/v1/leaks", get(leak_scan))
}

async fn leak_scan(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let (mut start, mut end) = (None, None);
    for (key, value) in form_pairs(query.as_deref().unwrap_or(""))? {
        let t = || parse_time(&value).map_err(|e| ApiError::BadRequest(format!("{key}: {e}")));
        match key.as_str() {
            "start" => start = Some(t()?),
            "end" => end = Some(t()?),
            k => {
                return Err(ApiError::BadRequest(format!(
                    "{k}: unknown parameter (use start, end)"
                )));
            }
        }
    }
    let store = state.store.clone();
    let found = blocking(move || leaks::scan(&store, &tenant, start, end)).await??;
    let findings: Vec<Value> = found
        .iter()
        .map(|f| {
            json!({
                "kind": f.kind,
                "service": f.service,
                "carrier": f.carrier,
                "count": f.count,
                "example_trace_ids": f.example_trace_ids,
                "risk": f.risk,
            })
        })
        .collect();
    Ok(Json(json!({ "findings": findings })))
}

#[cfg(test)]
mod tests;
