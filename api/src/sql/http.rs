//! `POST /api/v1/sql`: `{"query": "...", "format": "json" | "csv" | "arrow"}`, results streamed.
//!
//! An answer is gathered until it is complete or passes 256 KiB: a small one goes out whole,
//! with its length, and any error before that point gets a proper status and a JSON body
//! naming the problem (and where in the query it is). A larger answer streams from there on;
//! an error after rows have been sent ends a JSON answer with an `"error"` member and cuts a
//! CSV or Arrow answer short (the client sees a broken stream, never a silently truncated
//! one).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use weft_query::sql::{SqlError, SqlErrorKind};

use super::encode::{Encoder, Format};
use crate::state::{SharedState, Tenant};

pub fn router() -> Router<SharedState> {
    Router::new().route("/api/v1/sql", post(sql))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    query: String,
    #[serde(default)]
    format: Option<String>,
}

fn status_of(e: &SqlError) -> StatusCode {
    match e.kind {
        SqlErrorKind::NotAQuery | SqlErrorKind::Invalid | SqlErrorKind::Execution => {
            StatusCode::BAD_REQUEST
        }
        SqlErrorKind::ResourcesExhausted => StatusCode::UNPROCESSABLE_ENTITY,
        SqlErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        SqlErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        SqlErrorKind::Busy => StatusCode::SERVICE_UNAVAILABLE,
    }
}

pub fn error_json(e: &SqlError) -> serde_json::Value {
    let mut v = json!({ "error": e.message, "kind": format!("{:?}", e.kind) });
    if let Some(l) = e.line {
        v["line"] = json!(l);
    }
    if let Some(c) = e.column {
        v["column"] = json!(c);
    }
    v
}

pub(crate) fn error_response(e: &SqlError) -> Response {
    if e.kind == SqlErrorKind::Internal {
        tracing::error!(error = %e.message, "query failed");
    }
    let mut resp = (status_of(e), Json(error_json(e))).into_response();
    if e.kind == SqlErrorKind::Busy {
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    resp
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": message, "kind": "Invalid" })),
    )
        .into_response()
}

async fn sql(State(state): State<SharedState>, Tenant(tenant): Tenant, body: Bytes) -> Response {
    let req: SqlRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad_request(format!(
                "request body must be JSON like {{\"query\": \"SELECT ...\", \"format\": \"json\"}}: {e}"
            ));
        }
    };
    let format = match req.format.as_deref().map(Format::parse).transpose() {
        Ok(f) => f.unwrap_or(Format::Json),
        Err(e) => return bad_request(e),
    };
    let engine = state.sql.clone();
    let limit = engine.config().timeout;
    let deadline = tokio::time::Instant::now() + limit;
    let query = match tokio::time::timeout_at(deadline, engine.query(&tenant, &req.query)).await {
        Ok(Ok(q)) => q,
        Ok(Err(e)) => return error_response(&e),
        Err(_) => return error_response(&SqlError::timeout(limit)),
    };
    let mut stream = query.stream;
    let mut encoder = match Encoder::new(format, query.schema) {
        Ok(e) => e,
        Err(e) => return error_response(&e),
    };
    // Answers are gathered until they pass `WHOLE_ANSWER_BYTES`: a small answer (most
    // dashboard and lookup queries) goes out as one body with its length, its errors with a
    // proper status; a larger one streams from there on.
    let mut held = encoder.begin();
    loop {
        match next_bytes(&mut stream, &mut encoder, deadline, limit).await {
            Ok(Some(bytes)) => {
                held.extend_from_slice(&bytes);
                if held.len() > WHOLE_ANSWER_BYTES {
                    break;
                }
            }
            Ok(None) => {
                let warnings = crate::damage::warnings_for(&state, &tenant);
                held.extend_from_slice(&encoder.end(None, &warnings));
                return answer(format, Body::from(held));
            }
            Err(e) => return error_response(&e),
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::spawn(async move {
        if tx.send(Ok(Bytes::from(held))).await.is_err() {
            return; // client went away: dropping the stream cancels the query
        }
        let failure = loop {
            match next_bytes(&mut stream, &mut encoder, deadline, limit).await {
                Ok(Some(bytes)) => {
                    if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        match failure {
            None => {
                let warnings = crate::damage::warnings_for(&state, &tenant);
                let _ = tx.send(Ok(Bytes::from(encoder.end(None, &warnings)))).await;
            }
            Some(e) => {
                tracing::warn!(error = %e.message, "query failed after its first rows were sent");
                let warnings = crate::damage::warnings_for(&state, &tenant);
                match encoder.end(Some(&error_json(&e)), &warnings) {
                    tail if format == Format::Json => {
                        let _ = tx.send(Ok(Bytes::from(tail))).await;
                    }
                    _ => {
                        let _ = tx.send(Err(std::io::Error::other(e.message))).await;
                    }
                }
            }
        }
    });
    answer(format, Body::from_stream(tokio_stream_from(rx)))
}

/// The next batch of the answer, encoded; `None` at its end. A failing batch, a batch that
/// cannot be encoded and the deadline passing are all errors of the query.
async fn next_bytes(
    stream: &mut SendableRecordBatchStream,
    encoder: &mut Encoder,
    deadline: tokio::time::Instant,
    limit: std::time::Duration,
) -> Result<Option<Vec<u8>>, SqlError> {
    match tokio::time::timeout_at(deadline, stream.next()).await {
        Ok(Some(Ok(b))) => encoder.batch(&b).map(Some),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err(SqlError::from_datafusion(e, false)),
        Err(_) => Err(SqlError::timeout(limit)),
    }
}

/// Encoded answers up to this size are sent whole (see `sql`).
pub(crate) const WHOLE_ANSWER_BYTES: usize = 256 * 1024;

fn answer(format: Format, body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, format.content_type())
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
