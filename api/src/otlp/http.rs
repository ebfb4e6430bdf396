//! OTLP/HTTP: `POST /v1/traces`, `POST /v1/logs` and `POST /v1/metrics` with `application/x-protobuf` or
//! `application/json` bodies, optionally gzip-compressed. The answer uses the request's
//! content type.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prost::Message;
use serde_json::json;
use weft_ingest::otlp::logs::{ExportLogsPartialSuccess, ExportLogsServiceResponse};
use weft_ingest::otlp::metrics::{ExportMetricsPartialSuccess, ExportMetricsServiceResponse};
use weft_ingest::otlp::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use weft_ingest::{ExportOutcome, Format, IngestError, body};

use super::status::RpcStatus;
use crate::error::Class;
use crate::state::{SharedState, TENANT_HEADER, tenant_from};

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/v1/traces", post(export_traces))
        .route("/v1/logs", post(export_logs))
        .route("/v1/metrics", post(export_metrics))
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

/// The signal an export carries.
#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Logs,
    Metrics,
}

async fn export_traces(state: State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    export(state, headers, body, Signal::Traces).await
}

async fn export_logs(state: State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    export(state, headers, body, Signal::Logs).await
}

async fn export_metrics(state: State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    export(state, headers, body, Signal::Metrics).await
}

async fn export(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Body,
    signal: Signal,
) -> Response {
    let format = format_of(&headers);
    let answer_format = *format.as_ref().unwrap_or(&Format::Json);
    let result = match format {
        Ok(format) => ingest(&state, &headers, body, format, signal).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(outcome) => success(answer_format, &outcome, signal),
        Err(e) => failure(answer_format, &e),
    }
}

async fn ingest(
    state: &SharedState,
    headers: &HeaderMap,
    body: Body,
    format: Format,
    signal: Signal,
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
    // admission before the body is read: its declared length, then what streams in
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut held = None;
    state
        .ingester
        .admit_body(&mut held, declared.unwrap_or(64 << 10).min(limit))?;
    let mut raw = Vec::with_capacity(declared.unwrap_or(0));
    let mut frames = body.into_data_stream();
    while let Some(frame) = futures::StreamExt::next(&mut frames).await {
        let frame = frame.map_err(|e| IngestError::Undecodable {
            format: "http body",
            detail: e.to_string(),
        })?;
        if raw.len() + frame.len() > limit {
            return Err(IngestError::TooLarge {
                size: raw.len() + frame.len(),
                limit,
            });
        }
        raw.extend_from_slice(&frame);
        state.ingester.admit_body(&mut held, raw.len())?;
    }
    let decoded = body::decode(raw.into(), encoding, limit)?;
    match signal {
        Signal::Traces => state.ingester.export_bytes(tenant, decoded, format).await,
        Signal::Logs => {
            state
                .ingester
                .export_logs_bytes(tenant, decoded, format)
                .await
        }
        Signal::Metrics => {
            state
                .ingester
                .export_metrics_bytes(tenant, decoded, format)
                .await
        }
    }
}

fn success(format: Format, outcome: &ExportOutcome, signal: Signal) -> Response {
    let rejected = (outcome.rejected > 0).then_some(outcome.rejected as i64);
    let message = outcome.error_message.clone().unwrap_or_default();
    match format {
        Format::Protobuf => {
            let body = match signal {
                Signal::Traces => ExportTraceServiceResponse {
                    partial_success: rejected.map(|n| ExportTracePartialSuccess {
                        rejected_spans: n,
                        error_message: message,
                    }),
                }
                .encode_to_vec(),
                Signal::Logs => ExportLogsServiceResponse {
                    partial_success: rejected.map(|n| ExportLogsPartialSuccess {
                        rejected_log_records: n,
                        error_message: message,
                    }),
                }
                .encode_to_vec(),
                Signal::Metrics => ExportMetricsServiceResponse {
                    partial_success: rejected.map(|n| ExportMetricsPartialSuccess {
                        rejected_data_points: n,
                        error_message: message,
                    }),
                }
                .encode_to_vec(),
            };
            ([(header::CONTENT_TYPE, PROTOBUF)], body).into_response()
        }
        Format::Json => {
            let field = match signal {
                Signal::Traces => "rejectedSpans",
                Signal::Logs => "rejectedLogRecords",
                Signal::Metrics => "rejectedDataPoints",
            };
            let body = match rejected {
                Some(n) => {
                    json!({ "partialSuccess": { field: n.to_string(), "errorMessage": message } })
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
