//! Tempo's HTTP API at the root of the query port (3200, Tempo's own), as Grafana's Tempo data
//! source calls it: a Tempo data source at `http://host:3200` works as with Tempo.
//!
//! - `GET /api/echo`, `GET /api/status/buildinfo`;
//! - `GET /api/traces/{id}` (OTLP `TracesData`), `GET /api/v2/traces/{id}`
//!   (`tempopb.TraceByIDResponse`): protobuf for `Accept: application/protobuf`, JSON otherwise;
//! - `GET /api/search` with TraceQL `q` (or the legacy `tags`, `minDuration`, `maxDuration`);
//! - `GET /api/v2/search/tags`, `/api/v2/search/tag/{tag}/values` and their v1 forms;
//! - `GET /api/metrics/query_range`, `/api/metrics/query` (TraceQL metrics).
//!
//! Errors are plain text, as Tempo answers them; `X-Scope-OrgID` names the tenant.

mod metrics;
mod proto;
mod search;
mod tags;
mod traces;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use weft_query::traceql::TraceQlError;

use crate::error::ApiError;
use crate::state::SharedState;

pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/api/echo", get(|| async { "echo" }))
        .route("/api/status/buildinfo", get(buildinfo))
        .route("/api/traces/{id}", get(traces::v1))
        .route("/api/v2/traces/{id}", get(traces::v2))
        .route("/api/search", get(search::search))
        .route("/api/search/tags", get(tags::tags_v1))
        .route("/api/v2/search/tags", get(tags::tags_v2))
        .route("/api/search/tag/{tag}/values", get(tags::values_v1))
        .route("/api/v2/search/tag/{tag}/values", get(tags::values_v2))
        .route("/api/metrics/query_range", get(metrics::query_range))
        .route("/api/metrics/query", get(metrics::query_instant))
}

async fn buildinfo() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": option_env!("WEFT_REVISION").unwrap_or("unknown"),
        "branch": "main",
        "buildUser": "weft",
        "buildDate": option_env!("WEFT_BUILD_DATE").unwrap_or("unknown"),
        "goVersion": "none (weft is written in Rust)",
    }))
}

/// The `metrics` of an answer computed in one job (Tempo's metadata and metrics responses).
fn one_job() -> serde_json::Value {
    serde_json::json!({"inspectedBytes": "0", "totalJobs": 1, "completedJobs": 1})
}

/// A Tempo error: its status and a plain-text body.
#[derive(Debug)]
pub struct TempoError(StatusCode, String);

impl TempoError {
    pub fn bad(msg: impl Into<String>) -> Self {
        TempoError(StatusCode::BAD_REQUEST, msg.into())
    }
}

impl IntoResponse for TempoError {
    fn into_response(self) -> Response {
        (
            self.0,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.1,
        )
            .into_response()
    }
}

impl From<ApiError> for TempoError {
    fn from(e: ApiError) -> Self {
        let status = e.class().http_status();
        TempoError(status, e.to_string())
    }
}

impl From<weft_query::analytics::AnalyticsError> for TempoError {
    fn from(e: weft_query::analytics::AnalyticsError) -> Self {
        TraceQlError::from(e).into()
    }
}

impl From<TraceQlError> for TempoError {
    fn from(e: TraceQlError) -> Self {
        match e {
            TraceQlError::Invalid(m) => TempoError(StatusCode::BAD_REQUEST, m),
            TraceQlError::Sql(e) => {
                let status = match e.kind {
                    weft_query::sql::SqlErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
                    weft_query::sql::SqlErrorKind::ResourcesExhausted => {
                        StatusCode::TOO_MANY_REQUESTS
                    }
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                TempoError(status, e.to_string())
            }
        }
    }
}

/// A Tempo time parameter: Unix seconds (Tempo's form, fractions allowed), or RFC 3339, or
/// Unix nanoseconds (a number too large to be seconds), into Unix ns.
pub fn tempo_time(key: &str, value: &str) -> Result<u64, TempoError> {
    let v = value.trim();
    if let Ok(n) = v.parse::<f64>()
        && n >= 0.0
    {
        // later than year 5000 in seconds: nanoseconds (or milliseconds / microseconds)
        return Ok(if n < 1e11 {
            (n * 1e9) as u64
        } else if n < 1e14 {
            (n * 1e6) as u64
        } else if n < 1e17 {
            (n * 1e3) as u64
        } else {
            n as u64
        });
    }
    crate::time::parse_rfc3339(v)
        .ok_or_else(|| TempoError::bad(format!("invalid {key} {value:?}: expected Unix seconds")))
}

/// A Tempo range from `start` / `end` parameters, when given. Search and lookups take a whole
/// second `end` as inclusive (`whole_second_inclusive`); metrics take it as the range's end.
pub fn range(
    start: Option<&str>,
    end: Option<&str>,
    whole_second_inclusive: bool,
) -> Result<(Option<u64>, Option<u64>), TempoError> {
    let s = start
        .filter(|s| !s.is_empty())
        .map(|v| tempo_time("start", v))
        .transpose()?;
    let e = end
        .filter(|s| !s.is_empty())
        .map(|v| tempo_time("end", v))
        .transpose()?
        // Tempo's end is a whole second, inclusive
        .map(|e| {
            if whole_second_inclusive && e % 1_000_000_000 == 0 {
                e.saturating_add(1_000_000_000)
            } else {
                e
            }
        });
    if let (Some(s), Some(e)) = (s, e)
        && e <= s
    {
        return Err(TempoError::bad(
            "invalid start and end: end must be after start",
        ));
    }
    Ok((s, e))
}
