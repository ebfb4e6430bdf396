//! What every handler shares.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use weft_ingest::Ingester;
use weft_query::sql::SqlEngine;
use weft_storage::Store;
use weft_storage::model::TenantId;

use crate::error::ApiError;
use crate::metrics::RequestMetrics;

pub struct AppState {
    pub store: Arc<Store>,
    pub ingester: Arc<Ingester>,
    pub requests: RequestMetrics,
    pub sql: SqlEngine,
    /// The tokens requests must carry (`--auth-file`); `None` accepts every request.
    pub auth: Option<Arc<crate::auth::Auth>>,
    /// Spans a trace-by-id answer holds at most (`--max-trace-spans`; 0: all).
    pub max_trace_spans: usize,
}

pub type SharedState = Arc<AppState>;

/// The header (HTTP) and metadata key (gRPC) naming the tenant.
pub const TENANT_HEADER: &str = "x-scope-orgid";

/// The tenant a request names, or the default tenant when it names none.
pub fn tenant_from(value: Option<&str>) -> Result<TenantId, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(TenantId::default_tenant()),
        Some(name) => TenantId::new(name).map_err(|e| format!("X-Scope-OrgID: {e}")),
    }
}

/// The tenant a query request names (`X-Scope-OrgID`; absent means the default tenant), as
/// an extractor: a bad name is a 400 before the handler runs.
#[derive(Debug, Clone)]
pub struct Tenant(pub TenantId);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        tenant(&parts.headers).map(Tenant)
    }
}

/// Runs blocking work (RocksDB reads, decoding) on the blocking pool, off the async threads.
pub async fn blocking<T, F>(work: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::Internal(format!("blocking task failed: {e}")))
}

pub fn tenant(headers: &HeaderMap) -> Result<TenantId, ApiError> {
    let value = headers
        .get(TENANT_HEADER)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::BadRequest("X-Scope-OrgID is not ASCII".into()))
        })
        .transpose()?;
    tenant_from(value).map_err(ApiError::BadRequest)
}

/// A server's shared state over a fresh store in `dir`, for in-process handler tests.
#[cfg(test)]
pub fn test_state(dir: &std::path::Path) -> SharedState {
    let store = Arc::new(Store::open(dir, weft_storage::StoreOptions::default()).unwrap());
    Arc::new(AppState {
        ingester: Arc::new(Ingester::new(store.clone(), Default::default())),
        requests: RequestMetrics::default(),
        sql: SqlEngine::new(store.clone(), Default::default()),
        auth: None,
        max_trace_spans: 0,
        store,
    })
}
