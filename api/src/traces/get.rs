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
    let spans = blocking(move || store.trace(&tenant, &trace)).await??;
    if spans.is_empty() {
        return Err(ApiError::NotFound(format!(
            "trace {} not found",
            trace.to_hex()
        )));
    }
    let message = to_request(&spans);
    let wants_protobuf = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.contains("application/x-protobuf") || v.contains("application/protobuf")
        });
    Ok(if wants_protobuf {
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
    })
}
