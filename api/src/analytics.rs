//! The native analytics API on the query port, one route per capability of
//! `weft_query::analytics` (the same parameters as its SQL table function):
//!
//! - `GET /api/v1/lineage/operations[?level=service]`, `/lineage/request`, `/lineage/dimensions`;
//! - `GET /api/v1/heatmap`, `/percentiles`, `/anomalies`, `/drift`, `/saturation`;
//! - `GET /api/v1/leaks?start=&end=` → `{"findings": [{"kind", "service", "carrier", "count",
//!   "example_trace_ids", "risk"}]}`, ranked by risk (the SQL table function `leaks(start, end)`
//!   gives the same rows).
//!
//! A parameter the capability does not know, or a value it cannot read, is a 400 naming it.

use axum::Json;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use weft_query::analytics::{AnalyticsError, answer, leaks};

use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};
use crate::time::parse_time;
use crate::traces::search::form_pairs;

/// Each capability's route.
const ROUTES: &[(&str, &str)] = &[
    ("/api/v1/lineage/operations", "lineage_operations"),
    ("/api/v1/lineage/request", "lineage_request"),
    ("/api/v1/lineage/dimensions", "lineage_dimensions"),
    ("/api/v1/heatmap", "heatmap"),
    ("/api/v1/percentiles", "percentiles"),
    ("/api/v1/anomalies", "anomalies"),
    ("/api/v1/drift", "drift"),
    ("/api/v1/saturation", "saturation"),
];

pub fn router() -> Router<SharedState> {
    ROUTES.iter().fold(
        Router::new().route("/api/v1/leaks", get(leak_scan)),
        |router, (path, name)| router.route(path, get(|s, t, q| capability(name, s, t, q))),
    )
}

async fn capability(
    name: &'static str,
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    RawQuery(query): RawQuery,
) -> Response {
    let pairs = match form_pairs(query.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match answer(&state.sql, &tenant, name, pairs).await {
        Ok(a) => Json(a.to_json()).into_response(),
        Err(AnalyticsError::Invalid(m)) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": m, "kind": "Invalid"})),
        )
            .into_response(),
        Err(AnalyticsError::Sql(e)) => crate::sql::http::error_response(&e),
    }
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
