//! What every handler shares.

use std::sync::Arc;

use axum::http::HeaderMap;
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
