//! The one place where errors of every crate become HTTP statuses (and, in `otlp::grpc`, gRPC
//! codes, from the same classification).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use weft_ingest::IngestError;
use weft_query::QueryError;
use weft_storage::StorageError;

/// An error answered by the query API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("not ready: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a client should do: the classification shared by HTTP and gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    BadRequest,
    NotFound,
    TooLarge,
    UnsupportedMediaType,
    /// Retry after the hint (ms).
    Retry(u64),
    /// The disk is (nearly) full: 507, `RESOURCE_EXHAUSTED`; retry once space returns.
    DiskFull,
    Unavailable,
    Internal,
}

impl Class {
    pub fn of_ingest(e: &IngestError) -> Self {
        match e {
            IngestError::Undecodable { .. } | IngestError::InvalidTenant(_) => Self::BadRequest,
            IngestError::TooLarge { .. } => Self::TooLarge,
            IngestError::UnsupportedMediaType(_) => Self::UnsupportedMediaType,
            IngestError::Overloaded { retry_after_ms } => Self::Retry(*retry_after_ms),
            IngestError::Storage(s) => Self::of_storage(s),
        }
    }

    pub fn of_storage(e: &StorageError) -> Self {
        match e {
            StorageError::InvalidTenant { .. } | StorageError::InvalidId { .. } => Self::BadRequest,
            StorageError::Overloaded { retry_after_ms, .. } => Self::Retry(*retry_after_ms),
            StorageError::HeadsFull { .. } => Self::Retry(1000),
            StorageError::DiskFull { .. } => Self::DiskFull,
            StorageError::TooManyTenants { .. } => Self::Retry(60_000),
            StorageError::ShuttingDown => Self::Unavailable,
            _ => Self::Internal,
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Self::BadRequest => StatusCode::BAD_REQUEST,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Retry(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::DiskFull => StatusCode::INSUFFICIENT_STORAGE,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Self::BadRequest | Self::UnsupportedMediaType => tonic::Code::InvalidArgument,
            Self::NotFound => tonic::Code::NotFound,
            Self::TooLarge => tonic::Code::ResourceExhausted,
            Self::Retry(_) | Self::DiskFull => tonic::Code::ResourceExhausted,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Internal => tonic::Code::Internal,
        }
    }

    /// `Retry-After` in whole seconds, rounded up.
    pub fn retry_after_secs(self) -> Option<u64> {
        match self {
            Self::Retry(ms) => Some(ms.div_ceil(1000).max(1)),
            Self::Unavailable => Some(1),
            Self::DiskFull => Some(10),
            _ => None,
        }
    }
}

impl ApiError {
    pub fn class(&self) -> Class {
        match self {
            Self::BadRequest(_) => Class::BadRequest,
            Self::NotFound(_) => Class::NotFound,
            Self::Unavailable(_) => Class::Unavailable,
            Self::Ingest(e) => Class::of_ingest(e),
            Self::Query(QueryError::InvalidParameter { .. }) => Class::BadRequest,
            Self::Query(QueryError::Storage(s)) | Self::Storage(s) => Class::of_storage(s),
            Self::Query(QueryError::Selection(_)) => Class::Internal,
            Self::Internal(_) => Class::Internal,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let class = self.class();
        if class == Class::Internal {
            tracing::error!(error = %self, "request failed");
        }
        let mut resp = (
            class.http_status(),
            Json(json!({ "error": self.to_string() })),
        )
            .into_response();
        if let Some(secs) = class.retry_after_secs() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
