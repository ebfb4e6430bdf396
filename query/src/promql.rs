//! PromQL over Weft's metric series, for the Prometheus-compatible HTTP API.
//!
//! A query is parsed with `promql-parser`, the data of each selector (its series, through the
//! catalog's postings, and their points in the range the whole query needs) is read once, then
//! the expression is evaluated at each step ([`eval`]). Semantics are Prometheus 2's: a
//! selector takes the newest sample at or before the evaluation time and no older than the
//! lookback delta (5 minutes), a range `[d]` the samples in `[t - d, t]`, both skipping stale
//! markers; `rate`/`increase`/`delta` extrapolate as Prometheus does.

pub mod eval;
mod functions;
pub mod names;
pub mod source;
pub mod vocabulary;

use std::fmt;

pub use eval::{QueryResult, Value, instant_query, range_query};
pub use source::{Loaded, Source};

/// Label pairs sorted by name (`__name__` among them).
pub type Labels = Vec<(String, String)>;

/// Prometheus's error types, as its API names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    BadData,
    Execution,
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromError {
    pub kind: ErrorKind,
    pub message: String,
}

impl PromError {
    pub fn bad_data(m: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::BadData,
            message: m.into(),
        }
    }
    pub fn execution(m: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Execution,
            message: m.into(),
        }
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Internal,
            message: m.into(),
        }
    }

    /// The `errorType` of the API's error envelope.
    pub fn error_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::BadData => "bad_data",
            ErrorKind::Execution => "execution",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for PromError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PromError {}

#[cfg(test)]
mod tests;
