use thiserror::Error;

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// What can go wrong in the store, named for what the caller can do about it.
#[derive(Debug, Error)]
pub enum StorageError {
    #[error("invalid tenant {name:?}: use 1 to 128 characters of A-Z a-z 0-9 _ . -")]
    InvalidTenant { name: String },
    #[error("invalid {what} {value:?}: expected lower-case hex of the right length")]
    InvalidId { what: &'static str, value: String },
    #[error(
        "write path saturated: {pending_rows} rows wait for flush; retry after {retry_after_ms} ms"
    )]
    Overloaded {
        pending_rows: usize,
        retry_after_ms: u64,
    },
    #[error(
        "the data directory's filesystem has {free} bytes free, under the {min_free} bytes --min-free-disk keeps: writes are refused until space returns (reads go on)"
    )]
    DiskFull { free: u64, min_free: u64 },
    #[error(
        "this store holds data of {max} tenants, the most --max-tenants allows: writes for another tenant are refused"
    )]
    TooManyTenants { max: usize },
    #[error(
        "write path saturated: the heads of all tenants hold {bytes} bytes waiting for flush, over the {max} bytes --head-memory allows them; retry after 1000 ms"
    )]
    HeadsFull { bytes: usize, max: usize },
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error(
        "corrupt data in {signal} block {block} of tenant {tenant} ({part}): {detail}; `weft check --data-dir DIR` on the stopped store lists what is damaged"
    )]
    CorruptBlock {
        tenant: String,
        signal: &'static str,
        block: String,
        part: String,
        detail: String,
    },
    #[error("unsupported format version {found} of {what} (this build reads up to {supported})")]
    UnsupportedVersion {
        what: &'static str,
        found: u8,
        supported: u8,
    },
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    #[error("column encoding: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("{what} panicked: {message}")]
    Panicked { what: String, message: String },
    #[error("store is shutting down")]
    ShuttingDown,
    #[error("tenant {tenant} has 4,294,967,295 metric series, the most a tenant can hold")]
    TooManySeries { tenant: String },
    #[error("text index: {0}")]
    Text(String),
}

impl StorageError {
    pub(crate) fn corrupt(what: &'static str, detail: impl Into<String>) -> Self {
        Self::Corrupt {
            what,
            detail: detail.into(),
        }
    }
}
