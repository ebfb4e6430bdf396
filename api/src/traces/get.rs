//! `GET /api/v1/traces/{trace_id}`: the whole trace as OTLP/JSON, or protobuf when the client
//! accepts `application/x-protobuf`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use prost::Message;
use weft_ingest::otlp::{export::to_request, json::encode_request};
use weft_storage::model::TraceId;

use crate::error::ApiError;
use crate::state::{SharedState, Tenant, blocking};

/// Whether the client asked for protobuf (`application/x-protobuf` or `application/protobuf`).
pub(crate) fn wants_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-protobuf") || v.contains("application/protobuf"))
}

/// A trace id as Tempo and Jaeger take it: 1 to 32 hex digits, left-padded with zeros.
pub(crate) fn short_trace_id(text: &str) -> Result<TraceId, String> {
    let t = text.trim();
    if t.is_empty() || t.len() > 32 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "invalid trace id {text:?}: expected 1 to 32 hex digits"
        ));
    }
    TraceId::from_hex(&format!("{:0>32}", t.to_ascii_lowercase())).map_err(|e| e.to_string())
}

/// The header that flags a trace-by-id answer cut at `--max-trace-spans`: the trace's span
/// count.
pub const TRUNCATED_HEADER: &str = "weft-trace-truncated";

/// What a truncated answer says about itself.
pub fn truncation_note(total: usize, max: usize) -> String {
    format!("trace truncated to its first {max} of {total} spans (--max-trace-spans)")
}

pub async fn trace_by_id(
    State(state): State<SharedState>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if id.len() != 32 {
        return Err(ApiError::BadRequest(format!(
            "trace id {id:?} must be 32 hex characters"
        )));
    }
    let trace = TraceId::from_hex(&id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let store = state.store.clone();
    let max = state.max_trace_spans;
    let (spans, truncated) = blocking(move || store.trace_limited(&tenant, &trace, max)).await??;
    if spans.is_empty() {
        return Err(ApiError::NotFound(format!(
            "trace {} not found",
            trace.to_hex()
        )));
    }
    let message = to_request(&spans);
    let mut resp = if wants_protobuf(&headers) {
        (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            message.encode_to_vec(),
        )
            .into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "application/json")],
            encode_request(&message),
        )
            .into_response()
    };
    if let Some(total) = truncated {
        resp.headers_mut()
            .insert(TRUNCATED_HEADER, axum::http::HeaderValue::from(total));
    }
    Ok(resp)
}
