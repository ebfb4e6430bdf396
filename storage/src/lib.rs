//! Weft's storage engine: the data model of spans, the RocksDB-backed columnar store with its
//! write-ahead head, and the indexes (trace id, roaring-bitmap postings) that later layers push
//! queries down to.
//!
//! It is not a query engine (that is `weft-query`) and knows nothing of OTLP (that is
//! `weft-ingest`): it stores [`model::SpanRecord`]s and hands back spans, columns and bitmaps.

pub mod background;
pub mod block;
mod cache;
pub mod clock;
pub mod codec;
pub mod disk;
pub mod error;
pub mod head;
pub mod keys;
pub mod model;
pub mod request;
pub mod retention;
pub mod schema;
pub mod seal;
pub mod signal;
pub mod store;
pub mod summary;
pub mod terms;
pub mod text;

pub use background::{Background, TaskStats};
pub use error::{Result, StorageError};
pub use store::{AppendOutcome, Store, StoreOptions, StoreStats};
