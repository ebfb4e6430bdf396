//! Weft's storage engine: the data model of spans, the RocksDB-backed columnar store with its
//! write-ahead head, and the indexes (trace id, roaring-bitmap postings) that later layers push
//! queries down to.
//!
//! It is not a query engine (that is `weft-query`) and knows nothing of OTLP (that is
//! `weft-ingest`): it stores spans, logs and metric points and hands them back through one
//! read path ([`scan`]); how blocks and keys are laid out (`block`, `keys`, `codec`) is private
//! to it.

pub mod background;
pub(crate) mod block;
mod cache;
pub mod clock;
pub(crate) mod codec;
pub mod disk;
pub mod error;
pub mod head;
pub mod heat;
pub(crate) mod keys;
pub mod model;
pub mod request;
pub mod requests;
pub mod retention;
pub mod rollup;
pub mod scan;
pub mod schema;
pub mod seal;
pub(crate) mod signal;
pub mod sketch;
pub mod store;
pub mod summary;
pub mod terms;
pub mod text;

pub use background::{Background, TaskStats};
pub use block::format::Compression;
pub use error::{Result, StorageError};
pub use keys::Signal;
pub use store::{AppendOutcome, DamagedBlock, Store, StoreOptions, StoreStats};

/// How many cases a fuzz target (the proptest targets named `no_panics…` in every crate) tries:
/// `PROPTEST_CASES` when it is set, else the short run's `default`. Proptest reads that
/// variable only for a configuration it builds itself, not for one that names its case count,
/// so the targets ask here; the long run of docs/testing.md depends on it.
#[doc(hidden)]
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}
