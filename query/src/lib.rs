//! Weft's query layer: answers questions over the store. This first piece is trace search
//! (filters that must hold on one span of a trace, newest traces first, cursor paging), served
//! from the storage indexes: bitmap postings narrow rows before any column is decoded, and the
//! per-block trace summaries answer without re-reading traces.
//!
//! The second piece is SQL ([`sql`]): DataFusion over Weft's tables, with the same indexes
//! pushed down.
//!
//! The third is log search ([`logs`]): a text query and filters over log records, newest
//! first, and a trace's records.
//!
//! The fourth is PromQL ([`promql`]) over metric series, for the Prometheus-compatible API.
//!
//! It does not speak HTTP (that is `weft-api`) and does not decode OTLP.

pub mod analytics;
pub mod error;
pub mod logs;
pub mod promql;
pub mod search;
pub mod sql;
pub mod time;
pub mod traceql;

pub use error::QueryError;
pub use search::{SearchPage, SearchRequest, TraceSummary, search};
