use thiserror::Error;
use weft_storage::StorageError;

/// Why a request was not (wholly) taken, named for what the client can do about it.
#[derive(Debug, Error)]
pub enum IngestError {
    /// The body is not a valid OTLP message; fix the client.
    #[error("undecodable {format} body: {detail}")]
    Undecodable {
        format: &'static str,
        detail: String,
    },
    /// The body (after decompression) exceeds the configured limit.
    #[error("request body of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// Content type the receiver does not speak.
    #[error("unsupported content type {0:?}: use application/x-protobuf or application/json")]
    UnsupportedMediaType(String),
    /// The write path is saturated; retry after the hint.
    #[error("write path saturated, retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error("invalid tenant: {0}")]
    InvalidTenant(String),
    #[error("storage: {0}")]
    Storage(StorageError),
}

impl From<StorageError> for IngestError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Overloaded { retry_after_ms, .. } => Self::Overloaded { retry_after_ms },
            StorageError::InvalidTenant { .. } => Self::InvalidTenant(e.to_string()),
            other => Self::Storage(other),
        }
    }
}
