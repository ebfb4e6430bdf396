//! Immutable columnar blocks: the rows of one tenant and one time window, sorted by trace id
//! and start time, stored as one RocksDB value per column chunk.

pub mod format;
pub mod packed;
pub mod reader;
pub mod writer;

#[cfg(test)]
mod proptests;

pub use format::{BlockMeta, ColumnMeta, TraceEntry};
pub use reader::BlockReader;
pub use writer::{BuiltBlock, build_block};
