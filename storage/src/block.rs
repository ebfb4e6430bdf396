//! Immutable columnar blocks: the rows of one tenant, one signal and one time window, stored as
//! one RocksDB value per column chunk. Span blocks ([`writer`], [`reader`]) are sorted by trace
//! id and start time; log blocks ([`logs`]) by trace and time; metric blocks ([`metrics`]) by series and time.

pub mod format;
pub mod logs;
pub mod metrics;
pub mod packed;
pub mod reader;
pub mod writer;

#[cfg(test)]
mod proptests;

pub use format::{BlockMeta, TraceEntry};
pub use reader::BlockReader;
pub use writer::BuiltBlock;
