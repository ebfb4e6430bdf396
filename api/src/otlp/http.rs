//! OTLP/HTTP: `POST /v1/traces` with `application/x-protobuf` or `application/json` bodies,
//! optionally gzip-compressed. The answer uses the request's content type.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prost::Message;
use serde_json::json;
use weft_ingest::otlp::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use weft_ingest::{ExportOutcome, Format, IngestError, body};

use super::status::RpcStatus;
use crate::error::Class;
use crate::state::{SharedState, TENANT_HEADER, tenant_from};

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/v1/traces", post(export_traces))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::metrics::track_latency,
        ))
        .with_state(state)
}

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

fn format_of(headers: &HeaderMap) -> Result<Format, IngestError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        PROTOBUF => Ok(Format::Protobuf),
        JSON => Ok(Format::Json),
        _ => Err(IngestError::UnsupportedMediaType(ct.to_owned())),
    }
}

async fn export_traces(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let format = format_of(&headers);
    let answer_format = *format.as_ref().unwrap_or(&Format::Json);
    let result = match format {
        Ok(format) => ingest(&state, &headers, body, format).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(outcome) => success(answer_format, &outcome),
        Err(e) => failure(answer_format, &e),
    }
}

async fn ingest(
    state: &SharedState,
    headers: &HeaderMap,
    body: Body,
    format: Format,
) -> Result<ExportOutcome, IngestError> {
    let limit = state.ingester.limits().max_body_bytes;
    let tenant_header = headers
        .get(TENANT_HEADER)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let tenant = tenant_from(tenant_header).map_err(IngestError::InvalidTenant)?;
    let encoding = body::Encoding::from_header(
        headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    )?;
    let raw = Limited::new(body, limit).collect().await.map_err(|e| {
        if e.downcast_ref::<LengthLimitError>().is_some() {
            IngestError::TooLarge {
                size: limit + 1,
                limit,
            }
        } else {
            IngestError::Undecodable {
                format: "http body",
                detail: e.to_string(),
            }
        }
    })?;
    let decoded = body::decode(raw.to_bytes(), encoding, limit)?;
    state.ingester.export_bytes(tenant, decoded, format).await
}

fn success(format: Format, outcome: &ExportOutcome) -> Response {
    let partial = (outcome.rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: outcome.rejected as i64,
        error_message: outcome.error_message.clone().unwrap_or_default(),
    });
    match format {
        Format::Protobuf => {
            let body = ExportTraceServiceResponse {
                partial_success: partial,
            }
            .encode_to_vec();
            ([(header::CONTENT_TYPE, PROTOBUF)], body).into_response()
        }
        Format::Json => {
            let body = match partial {
                Some(p) => {
                    json!({ "partialSuccess": { "rejectedSpans": p.rejected_spans.to_string(), "errorMessage": p.error_message } })
                }
                None => json!({}),
            };
            ([(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
        }
    }
}

fn failure(format: Format, e: &IngestError) -> Response {
    let class = Class::of_ingest(e);
    if class == Class::Internal {
        tracing::error!(error = %e, "otlp/http export failed");
    }
    let status = RpcStatus {
        code: class.grpc_code() as i32,
        message: e.to_string(),
        details: Vec::new(),
    };
    let mut response = match format {
        Format::Protobuf => {
            ([(header::CONTENT_TYPE, PROTOBUF)], status.encode_to_vec()).into_response()
        }
        Format::Json => {
            let body = json!({ "code": status.code, "message": status.message });
            ([(header::CONTENT_TYPE, JSON)], body.to_string()).into_response()
        }
    };
    *response.status_mut() = class.http_status();
    if let Some(secs) = class.retry_after_secs() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if response.status() == StatusCode::OK {
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    }
    response
}
