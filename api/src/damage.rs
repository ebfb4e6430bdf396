//! Answers without damaged blocks (`--skip-corrupt-blocks`): a query that meets a damaged
//! block fails, and the store leaves that block out of every later snapshot (see
//! `weft_storage::store::damage`); this layer then asks again, so the client gets the answer
//! without it. Every answer for a tenant with damaged blocks says so: a `Weft-Warning` header
//! always, and, in JSON answers of the APIs that carry them (Weft's own, Prometheus's, Loki's),
//! a `warnings` member naming each block. Tempo's and Jaeger's JSON, read by strict decoders,
//! keep their shape (the header only). Without the option the layer passes requests through.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use weft_storage::model::TenantId;
use weft_storage::{DamagedBlock, Store};

use crate::state::SharedState;

/// The response header that says an answer leaves damaged blocks out.
pub const WARNING_HEADER: &str = "weft-warning";

/// How many times a query is asked again, each time after finding one more damaged block.
const MAX_TRIES: usize = 8;

/// Request bodies of the query port are small (a SQL statement, a PromQL form): held to be
/// sent again.
const MAX_QUERY_BODY: usize = 2 << 20;

/// JSON answers up to this size get the `warnings` member; larger ones the header only.
const MAX_REWRITTEN_BODY: usize = 16 << 20;

pub async fn leave_out_damaged(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    if !state.store.options().skip_corrupt_blocks {
        return next.run(req).await;
    }
    let Ok(tenant) = crate::state::tenant(req.headers()) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_QUERY_BODY).await {
        Ok(b) => b,
        Err(e) => {
            let message = format!(
                "a query request body must be under {} MiB: {e}",
                MAX_QUERY_BODY >> 20
            );
            let body = Json(serde_json::json!({ "error": message }));
            return (StatusCode::PAYLOAD_TOO_LARGE, body).into_response();
        }
    };
    let failed = |r: &Response| !r.status().is_success();
    let resp = answered_without_damage(&state.store, &tenant, failed, || {
        next.clone()
            .run(Request::from_parts(parts.clone(), Body::from(body.clone())))
    })
    .await;
    let damaged = state.store.damaged_blocks(&tenant);
    if damaged.is_empty() {
        return resp;
    }
    say_so(resp, parts.uri.path(), &damaged).await
}

/// Runs `answer`, and with `--skip-corrupt-blocks` again while it `failed` after finding a
/// damaged block (the tenant's damaged count grew meanwhile): the store leaves that block out
/// of the next answer. The query port and the PostgreSQL wire both ask through this.
pub async fn answered_without_damage<T, F: std::future::Future<Output = T>>(
    store: &Store,
    tenant: &TenantId,
    failed: impl Fn(&T) -> bool,
    mut answer: impl FnMut() -> F,
) -> T {
    let skip = store.options().skip_corrupt_blocks;
    let mut tries = 0;
    loop {
        let before = store.damaged_count(tenant);
        let out = answer().await;
        if !skip || !failed(&out) || tries == MAX_TRIES || store.damaged_count(tenant) == before {
            return out;
        }
        tries += 1;
        tracing::warn!(tenant = %tenant, "query met a damaged block: asked again without it");
    }
}

/// What an answer says of the damaged blocks it leaves out, one line each.
pub fn warnings(damaged: &[DamagedBlock]) -> Vec<String> {
    damaged
        .iter()
        .map(|d| {
            format!(
                "this answer leaves out a damaged {} block (--skip-corrupt-blocks): {}",
                d.signal.name(),
                d.error
            )
        })
        .collect()
}

/// The warnings for a tenant's answers (empty when it has no damaged blocks, or the store
/// does not leave them out).
pub fn warnings_for(state: &SharedState, tenant: &TenantId) -> Vec<String> {
    if !state.store.options().skip_corrupt_blocks {
        return Vec::new();
    }
    warnings(&state.store.damaged_blocks(tenant))
}

fn header_value(damaged: &[DamagedBlock]) -> HeaderValue {
    let named: Vec<String> = damaged
        .iter()
        .take(8)
        .map(|d| {
            format!(
                "{} block {}/{}",
                d.signal.name(),
                d.addr.window,
                d.addr.block
            )
        })
        .collect();
    let more = damaged.len().saturating_sub(named.len());
    let mut text = format!(
        "answer leaves out {} damaged block{} of this tenant (--skip-corrupt-blocks): {}",
        damaged.len(),
        if damaged.len() == 1 { "" } else { "s" },
        named.join(", ")
    );
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    HeaderValue::from_str(&text)
        .unwrap_or_else(|_| HeaderValue::from_static("damaged blocks left out"))
}

/// Whether JSON answers under `path` carry a `warnings` member (the SQL endpoint writes its
/// own, at the end of its stream).
fn carries_warnings(path: &str) -> bool {
    let own = path.starts_with("/api/v1/") && path != "/api/v1/sql";
    own || path.starts_with("/prometheus/") || path.starts_with("/loki/")
}

async fn say_so(resp: Response, path: &str, damaged: &[DamagedBlock]) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(WARNING_HEADER, header_value(damaged));
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let whole = axum::body::HttpBody::size_hint(&body)
        .exact()
        .is_some_and(|n| n as usize <= MAX_REWRITTEN_BODY);
    if !(json && whole && carries_warnings(path)) {
        return Response::from_parts(parts, body);
    }
    let bytes = match axum::body::to_bytes(body, MAX_REWRITTEN_BODY).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "answer could not be read to add its warnings");
            return (StatusCode::INTERNAL_SERVER_ERROR, "answer lost").into_response();
        }
    };
    let bytes = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut answer)) => {
            let list = answer.entry("warnings").or_insert(serde_json::Value::Null);
            if !list.is_array() {
                *list = serde_json::Value::Array(Vec::new());
            }
            if let serde_json::Value::Array(list) = list {
                list.extend(warnings(damaged).into_iter().map(serde_json::Value::String));
            }
            Bytes::from(serde_json::to_vec(&answer).unwrap_or_else(|_| bytes.to_vec()))
        }
        _ => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(bytes))
}
