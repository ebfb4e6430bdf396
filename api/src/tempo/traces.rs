//! `GET /api/traces/{id}` (OTLP `TracesData`) and `GET /api/v2/traces/{id}`
//! (`tempopb.TraceByIDResponse`): protobuf for `Accept: application/protobuf`, JSON (OTLP/JSON
//! for the trace) otherwise. Ids of 1 to 32 hex digits, left-padded; `start` / `end` (Unix
//! seconds) limit the answer to traces with a span in the range; 404 when none is found.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde::Deserialize;
use weft_ingest::otlp::export::to_request;
use weft_ingest::otlp::json::encode_request;

use super::proto::{Trace, TraceByIdMetrics, TraceByIdResponse};
use super::{TempoError, range};
use crate::state::{SharedState, Tenant, blocking};
use crate::traces::get::{short_trace_id, wants_protobuf};

#[derive(Deserialize)]
pub struct RangeParams {
    start: Option<String>,
    end: Option<String>,
}

/// The trace's OTLP message (at most `--max-trace-spans` spans) and, when it was cut, the
/// trace's span count; or 404.
async fn load(
    state: &SharedState,
    tenant: weft_storage::model::TenantId,
    id: &str,
    params: &RangeParams,
) -> Result<(ExportTraceServiceRequest, Option<usize>), TempoError> {
    let trace = short_trace_id(id).map_err(TempoError::bad)?;
    let (start, end) = range(params.start.as_deref(), params.end.as_deref(), true)?;
    let store = state.store.clone();
    let max = state.max_trace_spans;
    let (spans, truncated) = blocking(move || store.trace_limited(&tenant, &trace, max))
        .await?
        .map_err(|e| TempoError::from(crate::error::ApiError::from(e)))?;
    // a cut trace may have its spans in range past the cut
    let in_range = truncated.is_some()
        || spans
            .iter()
            .any(|s| start.is_none_or(|st| s.end.0 >= st) && end.is_none_or(|e| s.start.0 < e));
    if spans.is_empty() || !in_range {
        return Err(TempoError(
            StatusCode::NOT_FOUND,
            format!("trace not found: {}", trace.to_hex()),
        ));
    }
    Ok((to_request(&spans), truncated))
}

pub async fn v1(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<RangeParams>,
) -> Result<Response, TempoError> {
    let (message, truncated) = load(&state, tenant, &id, &params).await?;
    let mut resp = if wants_protobuf(&headers) {
        protobuf(message.encode_to_vec())
    } else {
        json(encode_request(&message))
    };
    if let Some(total) = truncated {
        resp.headers_mut().insert(
            crate::traces::get::TRUNCATED_HEADER,
            axum::http::HeaderValue::from(total),
        );
    }
    Ok(resp)
}

fn protobuf(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/protobuf")], body).into_response()
}

fn json(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub async fn v2(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(params): Query<RangeParams>,
) -> Result<Response, TempoError> {
    let (message, truncated) = load(&state, tenant, &id, &params).await?;
    // like Tempo past its trace size limit: status PARTIAL and a message
    let note =
        truncated.map(|total| crate::traces::get::truncation_note(total, state.max_trace_spans));
    Ok(if wants_protobuf(&headers) {
        let response = TraceByIdResponse {
            trace: Some(Trace {
                resource_spans: message.resource_spans,
            }),
            metrics: Some(TraceByIdMetrics::default()),
            status: i32::from(note.is_some()),
            message: note.unwrap_or_default(),
        };
        protobuf(response.encode_to_vec())
    } else {
        // proto3 JSON of the response: the trace as OTLP/JSON, the rest at its defaults
        let mut body = b"{\"trace\":".to_vec();
        body.extend(encode_request(&message));
        body.extend(b",\"metrics\":{}");
        if let Some(note) = note {
            body.extend(b",\"status\":\"PARTIAL\",\"message\":");
            body.extend(serde_json::to_vec(&note).unwrap_or_default());
        }
        body.push(b'}');
        json(body)
    })
}
