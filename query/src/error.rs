use thiserror::Error;
use weft_storage::StorageError;

#[derive(Debug, Error)]
pub enum QueryError {
    /// A parameter the caller can fix.
    #[error("invalid {param}: {detail}")]
    InvalidParameter { param: &'static str, detail: String },
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// The row selection shared with SQL failed (its errors are storage errors underneath).
    #[error("row selection: {0}")]
    Selection(#[from] datafusion::error::DataFusionError),
}
